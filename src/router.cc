// Router: snapshot building (full and incremental) and snapshot publication.
// The design note is in include/shardlock/router.h.
#include "shardlock/router.h"

#include <sys/mman.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <new>
#include <numeric>
#include <thread>
#include <utility>

namespace shardlock {

std::string_view to_string(RouterStatus status) noexcept {
  switch (status) {
    case RouterStatus::kOk:
      return "ok";
    case RouterStatus::kDuplicateNode:
      return "duplicate node";
    case RouterStatus::kUnknownNode:
      return "unknown node";
    case RouterStatus::kInvalidWeight:
      return "invalid weight (must be 1..1024)";
    case RouterStatus::kInvalidNodeId:
      return "invalid node id (must not be empty)";
    case RouterStatus::kTooManyNodes:
      return "too many nodes (at most 65535)";
  }
  return "unknown status";
}

namespace {

using internal::BucketPermutation;

// XXH3 of a little-endian 8-byte encoding of `value`: the byte order is fixed
// so the derived constants are the same on every platform.
std::uint64_t hash_u64(std::uint64_t value, std::uint64_t seed) noexcept {
  std::array<unsigned char, 8> bytes;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<unsigned char>(value >> (8 * i));
  }
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), seed);
}

// Inverse of an odd number modulo 2^64 by Newton's iteration: each step
// doubles the number of correct low bits (3 -> 6 -> 12 -> 24 -> 48 -> 96).
std::uint64_t odd_inverse(std::uint64_t odd) noexcept {
  std::uint64_t x = odd;
  for (int i = 0; i < 5; ++i) x *= 2 - odd * x;
  return x;
}

int shift_for(int bits) noexcept { return (bits + 1) / 2; }
std::uint64_t mask_for(int bits) noexcept { return (std::uint64_t{1} << bits) - 1; }

BucketPermutation make_permutation(std::uint64_t node_hash, std::uint32_t copy, int bits) {
  const std::uint64_t mask = mask_for(bits);
  BucketPermutation p{};
  for (int r = 0; r < BucketPermutation::kRounds; ++r) {
    const std::uint64_t round = std::uint64_t{copy} * 16 + static_cast<std::uint64_t>(r) * 2;
    p.multiplier[r] = (hash_u64(round, node_hash) | 1) & mask;
    p.multiplier_inverse[r] = odd_inverse(p.multiplier[r]) & mask;
    p.addend[r] = hash_u64(round + 1, node_hash) & mask;
  }
  p.tiebreak = hash_u64(std::uint64_t{copy} * 16 + 15, node_hash);
  return p;
}

// A node copy's score for a bucket. Higher wins; the order is total and
// depends only on (bucket, node id, copy): level, then tiebreak, then the
// smaller node index (indices follow the id order), then the smaller copy.
struct Score {
  std::uint64_t level = 0;
  std::uint64_t tiebreak = 0;
  std::uint32_t node = 0xFFFFFFFF;
  std::uint32_t copy = 0;
  bool valid() const noexcept { return node != 0xFFFFFFFF; }
};

bool better(const Score& a, const Score& b) noexcept {
  if (!b.valid()) return a.valid();
  if (!a.valid()) return false;
  if (a.level != b.level) return a.level > b.level;
  if (a.tiebreak != b.tiebreak) return a.tiebreak > b.tiebreak;
  if (a.node != b.node) return a.node < b.node;
  return a.copy < b.copy;
}

bool node_id_less(const Node& a, const Node& b) noexcept { return a.id < b.id; }

}  // namespace

void RouterSnapshot::TableDeleter::operator()(std::uint16_t* table) const noexcept {
  std::free(table);
}

// Tables of 2 MiB and more are 2 MiB-aligned and advised as huge pages: a
// lookup touches a random bucket, and with 4 KiB pages an 8 MiB table
// overflows the data TLB, which measured as 25 ns more per lookup.
RouterSnapshot::Table RouterSnapshot::allocate_table(std::size_t buckets) {
  constexpr std::size_t kHugePage = std::size_t{2} << 20;
  const std::size_t bytes = buckets * sizeof(std::uint16_t);
  const std::size_t alignment = bytes >= kHugePage ? kHugePage : 64;
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* memory = std::aligned_alloc(alignment, rounded);
  if (memory == nullptr) throw std::bad_alloc();
  if (alignment == kHugePage) {
    // Advisory: without transparent huge pages this fails and changes nothing.
    static_cast<void>(madvise(memory, rounded, MADV_HUGEPAGE));
  }
  return Table(static_cast<std::uint16_t*>(memory));
}

const NodeId& RouterSnapshot::empty_id() noexcept {
  static const NodeId kEmpty;
  return kEmpty;
}

// Builds snapshots. Everything here runs under Router::change_mutex_ (or on
// a snapshot no one else can see yet), so nothing is shared.
class RouterSnapshotBuilder {
 public:
  // A snapshot with `nodes` (validated, sorted) and its permutations, but no
  // table yet.
  static std::shared_ptr<RouterSnapshot> skeleton(std::vector<Node> nodes, std::uint64_t seed,
                                                  int bits) {
    auto s = std::make_shared<RouterSnapshot>();
    s->seed_ = seed;
    s->bucket_bits_ = bits;
    s->nodes_ = std::move(nodes);
    s->copy_begin_.reserve(s->nodes_.size() + 1);
    s->copy_begin_.push_back(0);
    for (const Node& node : s->nodes_) {
      const std::uint64_t node_hash = XXH3_64bits_withSeed(node.id.data(), node.id.size(), seed);
      for (std::uint32_t c = 0; c < node.weight; ++c) {
        s->permutations_.push_back(make_permutation(node_hash, c, bits));
      }
      s->copy_begin_.push_back(static_cast<std::uint32_t>(s->permutations_.size()));
    }
    if (!s->nodes_.empty()) s->table_ = RouterSnapshot::allocate_table(s->bucket_count());
    return s;
  }

  // Best copy of node `i` for bucket `b`.
  static Score node_score(const RouterSnapshot& s, std::uint32_t i, std::uint64_t b) noexcept {
    const std::uint64_t mask = mask_for(s.bucket_bits_);
    const int shift = shift_for(s.bucket_bits_);
    Score best;
    for (std::uint32_t c = s.copy_begin_[i]; c < s.copy_begin_[i + 1]; ++c) {
      const BucketPermutation& p = s.permutations_[c];
      const Score candidate{p.forward(b, mask, shift), p.tiebreak, i, c - s.copy_begin_[i]};
      if (better(candidate, best)) best = candidate;
    }
    return best;
  }

  static Score argmax(const RouterSnapshot& s, std::uint64_t b) noexcept {
    Score best;
    for (std::uint32_t i = 0; i < s.nodes_.size(); ++i) {
      const Score candidate = node_score(s, i, b);
      if (better(candidate, best)) best = candidate;
    }
    return best;
  }

  // Full build: walk the levels from the top. At each level every copy, in
  // descending priority, claims the bucket it scores at that level if no one
  // has: the first claim of a bucket is by its highest score. A level costs
  // one step per copy and claims copies * unclaimed / B buckets, so once
  // fewer than B / copies buckets are left, ranking each of them directly
  // (one step per copy) is cheaper; the result is the same. Total work is
  // about B * (ln(copies) + 1) steps, whatever the node count.
  static void fill_table(RouterSnapshot& s) {
    if (s.nodes_.empty()) return;
    const std::uint64_t mask = mask_for(s.bucket_bits_);
    const int shift = shift_for(s.bucket_bits_);
    struct Claimer {
      const BucketPermutation* permutation;
      std::uint32_t node;
      std::uint32_t copy;
    };
    std::vector<Claimer> order;
    order.reserve(s.permutations_.size());
    for (std::uint32_t i = 0; i < s.nodes_.size(); ++i) {
      for (std::uint32_t c = s.copy_begin_[i]; c < s.copy_begin_[i + 1]; ++c) {
        order.push_back({&s.permutations_[c], i, c - s.copy_begin_[i]});
      }
    }
    // Same tie order as better(): tiebreak desc, node asc, copy asc.
    std::sort(order.begin(), order.end(), [](const Claimer& a, const Claimer& b) {
      if (a.permutation->tiebreak != b.permutation->tiebreak) {
        return a.permutation->tiebreak > b.permutation->tiebreak;
      }
      if (a.node != b.node) return a.node < b.node;
      return a.copy < b.copy;
    });
    const std::size_t buckets = s.bucket_count();
    std::uint16_t* table = s.table_.get();
    // The claimed set as a bitmap (B / 8 bytes) so the probes stay in cache.
    std::vector<std::uint64_t> claimed(buckets / 64 + 1, 0);
    std::size_t unclaimed = buckets;
    std::uint64_t level = mask;
    while (unclaimed * order.size() >= buckets) {
      for (const Claimer& claimer : order) {
        const std::uint64_t b = claimer.permutation->inverse(level, mask, shift);
        const std::uint64_t bit = std::uint64_t{1} << (b & 63);
        if ((claimed[b >> 6] & bit) == 0) {
          claimed[b >> 6] |= bit;
          table[b] = static_cast<std::uint16_t>(claimer.node);
          --unclaimed;
        }
      }
      if (level == 0) break;
      --level;
    }
    s.min_owner_level_ = level;
    for (std::size_t b = 0; unclaimed > 0 && b < buckets; ++b) {
      if ((claimed[b >> 6] >> (b & 63) & 1) == 0) {
        const Score best = argmax(s, b);
        table[b] = static_cast<std::uint16_t>(best.node);
        s.min_owner_level_ = std::min(s.min_owner_level_, best.level);
        --unclaimed;
      }
    }
  }

  // Incremental build after one node changed: `next` differs from `prev`
  // only in node `id`, whose weight went from old_weight (0 = absent) to
  // new_weight (0 = removed). The result equals fill_table() on `next`
  // (tests check this):
  //   * every other node keeps its scores, so a bucket it owned stays its
  //     unless the changed node now outscores it;
  //   * if the changed node lost copies, the buckets it owned are ranked
  //     from scratch (B * old share buckets, one step per copy each);
  //   * if it gained copies, each new copy walks its levels downward only
  //     as far as the lowest owner level of any bucket, below which it
  //     cannot win: about B ln(B) / copies steps instead of B.
  static void update_table(const RouterSnapshot& prev, RouterSnapshot& next, std::string_view id,
                           std::uint32_t old_weight, std::uint32_t new_weight) {
    if (next.nodes_.empty()) return;
    if (prev.nodes_.empty()) {
      fill_table(next);
      return;
    }
    // Old index -> new index, and the changed node's index on each side.
    std::vector<std::uint16_t> remap(prev.nodes_.size(), RouterSnapshot::kNoOwner);
    std::uint32_t changed_old = kAbsent;
    std::uint32_t changed_new = kAbsent;
    for (std::uint32_t i = 0, j = 0; i < prev.nodes_.size(); ++i) {
      while (j < next.nodes_.size() && next.nodes_[j].id < prev.nodes_[i].id) ++j;
      if (j < next.nodes_.size() && next.nodes_[j].id == prev.nodes_[i].id) {
        remap[i] = static_cast<std::uint16_t>(j);
      }
      if (prev.nodes_[i].id == id) changed_old = i;
    }
    for (std::uint32_t j = 0; j < next.nodes_.size(); ++j) {
      if (next.nodes_[j].id == id) changed_new = j;
    }
    const std::uint16_t* old_table = prev.table_.get();
    std::uint16_t* table = next.table_.get();
    const std::size_t buckets = next.bucket_count();
    next.min_owner_level_ = prev.min_owner_level_;
    if (new_weight < old_weight) {
      for (std::size_t b = 0; b < buckets; ++b) {
        const std::uint16_t old_owner = old_table[b];
        if (old_owner == changed_old) {
          const Score best = argmax(next, b);
          table[b] = static_cast<std::uint16_t>(best.node);
          next.min_owner_level_ = std::min(next.min_owner_level_, best.level);
        } else {
          table[b] = remap[old_owner];
        }
      }
      return;
    }
    const std::uint64_t mask = mask_for(next.bucket_bits_);
    const std::uint64_t levels = mask - next.min_owner_level_ + 1;
    if (levels * (new_weight - old_weight) >= buckets) {
      // Few nodes: the owners' levels reach far down, so comparing the
      // changed node with the owner of every bucket is cheaper.
      for (std::size_t b = 0; b < buckets; ++b) {
        const std::uint16_t owner = remap[old_table[b]];
        table[b] = better(node_score(next, changed_new, b), node_score(next, owner, b))
                       ? static_cast<std::uint16_t>(changed_new)
                       : owner;
      }
      return;
    }
    for (std::size_t b = 0; b < buckets; ++b) table[b] = remap[old_table[b]];
    const int shift = shift_for(next.bucket_bits_);
    const std::uint32_t first = next.copy_begin_[changed_new];
    for (std::uint32_t c = old_weight; c < new_weight; ++c) {
      const BucketPermutation& p = next.permutations_[first + c];
      for (std::uint64_t level = mask;; --level) {
        const std::uint64_t b = p.inverse(level, mask, shift);
        const Score candidate{level, p.tiebreak, changed_new, c};
        if (table[b] != changed_new && better(candidate, node_score(next, table[b], b))) {
          table[b] = static_cast<std::uint16_t>(changed_new);
        }
        if (level == next.min_owner_level_) break;
      }
    }
  }

  static constexpr std::uint32_t kAbsent = 0xFFFFFFFF;
};

std::vector<std::uint16_t> RouterSnapshot::ranking_of_bucket(std::size_t bucket,
                                                             std::size_t n) const {
  std::vector<Score> scores(nodes_.size());
  for (std::uint32_t i = 0; i < nodes_.size(); ++i) {
    scores[i] = RouterSnapshotBuilder::node_score(*this, i, bucket);
  }
  n = std::min(n, scores.size());
  std::partial_sort(scores.begin(), scores.begin() + static_cast<std::ptrdiff_t>(n), scores.end(),
                    better);
  std::vector<std::uint16_t> ranking(n);
  for (std::size_t k = 0; k < n; ++k) ranking[k] = static_cast<std::uint16_t>(scores[k].node);
  return ranking;
}

std::vector<std::uint16_t> RouterSnapshot::replica_set(std::size_t bucket, std::size_t replicas,
                                                       const std::vector<bool>& learners) const {
  auto learner = [&](std::uint16_t node) { return node < learners.size() && learners[node]; };
  const auto learner_count =
      static_cast<std::size_t>(std::count(learners.begin(), learners.end(), true));
  std::vector<std::uint16_t> set;
  std::size_t members = 0;
  const std::vector<std::uint16_t> ranking = ranking_of_bucket(bucket, replicas + learner_count);
  for (std::size_t rank = 0; rank < ranking.size() && members < replicas; ++rank) {
    const std::uint16_t node = ranking[rank];
    if (!learner(node)) {
      set.push_back(node);
      ++members;
    } else if (rank < replicas) {
      set.push_back(node);
    }
  }
  // The primary first: a learner ranked above it moves behind it.
  const auto primary =
      std::find_if(set.begin(), set.end(), [&](std::uint16_t n) { return !learner(n); });
  if (primary == set.end()) return {};
  std::rotate(set.begin(), primary, primary + 1);
  return set;
}

std::vector<NodeId> RouterSnapshot::owners(std::string_view key, std::size_t n) const {
  std::vector<NodeId> result;
  if (nodes_.empty() || n == 0) return result;
  const std::size_t bucket = bucket_of_hash(hash(key));
  if (n == 1) {
    result.push_back(nodes_[table_[bucket]].id);
    return result;
  }
  for (const std::uint16_t i : ranking_of_bucket(bucket, n)) result.push_back(nodes_[i].id);
  return result;
}

std::size_t RouterSnapshot::owner_indices(std::span<const std::string_view> keys,
                                          std::span<std::uint16_t> out) const noexcept {
  const std::size_t count = std::min(keys.size(), out.size());
  if (nodes_.empty()) {
    std::fill_n(out.begin(), count, kNoOwner);
    return count;
  }
  // Software pipeline: key i is hashed and its bucket prefetched kDistance
  // keys before its bucket is read, so about kDistance misses are in flight
  // and each is covered by the hashing of the keys in between.
  constexpr std::size_t kDistance = 32;  // a power of two
  std::array<std::size_t, kDistance> buckets;
  const std::uint16_t* table = table_.get();
  for (std::size_t i = 0; i < count + kDistance; ++i) {
    if (i >= kDistance) out[i - kDistance] = table[buckets[i % kDistance]];
    if (i < count) {
      buckets[i % kDistance] = bucket_of_hash(hash(keys[i]));
      __builtin_prefetch(table + buckets[i % kDistance]);
    }
  }
  return count;
}

std::uint16_t RouterSnapshot::owner_index_bounded(std::string_view key,
                                                  std::span<const std::uint64_t> loads,
                                                  double c) const {
  if (nodes_.empty() || loads.size() != nodes_.size()) return kNoOwner;
  if (!(c > 1.0)) c = 1.25;  // also rejects NaN
  const std::uint64_t total = std::accumulate(loads.begin(), loads.end(), std::uint64_t{0});
  const auto total_weight = static_cast<double>(permutations_.size());
  const std::size_t bucket = bucket_of_hash(hash(key));
  const auto has_room = [&](std::uint16_t i) {
    const double capacity = std::ceil(c * static_cast<double>(total + 1) *
                                      static_cast<double>(nodes_[i].weight) / total_weight);
    return static_cast<double>(loads[i]) + 1.0 <= capacity;
  };
  // The owner usually has room; rank the rest only when it does not.
  const std::uint16_t owner = table_[bucket];
  if (has_room(owner)) return owner;
  for (const std::uint16_t i : ranking_of_bucket(bucket, nodes_.size())) {
    if (has_room(i)) return i;
  }
  // Unreachable: the capacities sum to more than total + 1. Kept total.
  return owner;
}

std::vector<std::uint64_t> RouterSnapshot::bucket_counts() const {
  std::vector<std::uint64_t> counts(nodes_.size(), 0);
  for (const std::uint16_t owner : table()) ++counts[owner];
  return counts;
}

std::size_t RouterSnapshot::memory_bytes() const noexcept {
  std::size_t bytes = sizeof(*this) + table().size_bytes() +
                      permutations_.capacity() * sizeof(internal::BucketPermutation) +
                      copy_begin_.capacity() * sizeof(std::uint32_t) +
                      nodes_.capacity() * sizeof(Node);
  for (const Node& node : nodes_) {
    if (node.id.capacity() > 15) bytes += node.id.capacity() + 1;  // beyond the SSO buffer
  }
  return bytes;
}

// ---------------------------------------------------------------------------
// Router

namespace {

std::atomic<std::uint64_t> next_router_id{1};

RouterOptions clamp(RouterOptions options) noexcept {
  options.bucket_bits = std::clamp(options.bucket_bits, kMinBucketBits, kMaxBucketBits);
  return options;
}

RouterStatus validate(const Node& node) noexcept {
  if (node.id.empty()) return RouterStatus::kInvalidNodeId;
  if (node.weight == 0 || node.weight > RouterSnapshot::kMaxWeight) {
    return RouterStatus::kInvalidWeight;
  }
  return RouterStatus::kOk;
}

}  // namespace

Router::Router(RouterOptions options)
    : options_(clamp(options)),
      // Relaxed: the counter only has to hand out distinct values.
      id_(next_router_id.fetch_add(1, std::memory_order_relaxed)) {
  auto empty = RouterSnapshotBuilder::skeleton({}, options_.seed, options_.bucket_bits);
  // Relaxed: the constructor runs before any reader can see this Router.
  current_.store(new Published{std::move(empty)}, std::memory_order_relaxed);
}

Router::Router(std::span<const Node> nodes, RouterOptions options) : Router(options) {
  // A failed status leaves the router empty, as documented.
  static_cast<void>(assign(nodes));
}

Router::~Router() {
  // Relaxed: destruction must not race with any other call (precondition).
  delete current_.load(std::memory_order_relaxed);
  CacheHints& hints = cache_hints();
  for (std::size_t i = 0; i < kCacheSlots; ++i) {
    if (hints[i].router_id == id_) {
      hints[i] = CacheHint{};
      cache_owners()[i].reset();
    }
  }
}

std::shared_ptr<const RouterSnapshot> Router::snapshot() const {
  // Read section of a two-phase sleepable RCU. seq_cst on the phase load,
  // the increment and the pointer load pairs with the seq_cst exchange,
  // phase flip and counter poll in publish(): either our increment comes
  // before the writer's poll (the writer waits for our decrement) or after
  // it, and then our pointer load comes after the writer's exchange and
  // cannot return the holder being freed.
  const std::uint32_t phase = reader_phase_.load(std::memory_order_seq_cst);
  std::atomic<std::int64_t>& count = readers_[phase & 1].value;
  count.fetch_add(1, std::memory_order_seq_cst);
  std::shared_ptr<const RouterSnapshot> result = current_.load(std::memory_order_seq_cst)->snapshot;
  // Release: our copy of the holder's shared_ptr happens-before the
  // writer's poll that reads this decrement, and so before it deletes it.
  count.fetch_sub(1, std::memory_order_release);
  return result;
}

Router::CacheOwners& Router::cache_owners() noexcept {
  thread_local CacheOwners owners;
  return owners;
}

const RouterSnapshot& Router::refresh_cache() const {
  thread_local std::size_t next_victim = 0;
  CacheHints& hints = cache_hints();
  std::size_t slot = kCacheSlots;
  for (std::size_t i = 0; i < kCacheSlots; ++i) {
    if (hints[i].router_id == id_) slot = i;
  }
  if (slot == kCacheSlots) {
    slot = next_victim;
    next_victim = (next_victim + 1) % kCacheSlots;
  }
  std::shared_ptr<const RouterSnapshot> fresh = snapshot();
  hints[slot] = CacheHint{id_, fresh->epoch(), fresh.get()};
  // Dropping the previous snapshot here may free it: a plain free of memory
  // no other thread reaches through this thread's cache.
  cache_owners()[slot] = std::move(fresh);
  return *hints[slot].snapshot;
}

void Router::publish(std::shared_ptr<RouterSnapshot> next) {
  // Caller holds change_mutex_, so epochs are assigned in publish order.
  next->epoch_ = epoch_.load(std::memory_order_relaxed) + 1;  // only writers store it
  const std::uint64_t epoch = next->epoch_;
  const Published* fresh = new Published{std::move(next)};
  // The epoch goes first. Stored after the exchange, a reader could get the
  // new snapshot from snapshot() and then, still seeing the old epoch, the
  // old one from its thread cache in current(): epochs going backwards on one
  // thread. Stored before, a reader that got the new snapshot (its seq_cst
  // load reads this exchange, which the store is sequenced before) also sees
  // the new epoch, so current() refreshes. The cost: for the instant of a
  // publish, epoch() may name a snapshot that snapshot() does not return yet.
  // Release: pairs with the acquire load in epoch().
  epoch_.store(epoch, std::memory_order_release);
  // seq_cst: pairs with the reader's seq_cst pointer load (see snapshot()).
  const Published* old = current_.exchange(fresh, std::memory_order_seq_cst);
  // Grace period: flip the phase so new readers count on the other counter,
  // then wait for the readers counted on the old one; then the same again
  // for the other counter. One flip is not enough: a reader that loaded the
  // phase before an earlier publish's flip may increment its (now stale)
  // counter after that publish polled it, load the pointer this publish is
  // retiring, and be counted on the counter a single flip here would not
  // wait for (TSan caught that use-after-free in
  // RouterTest.LookupsRunWhileMembershipChanges). Waiting on both, each
  // after a flip, covers every reader that can still hold `old`, as SRCU's
  // synchronize does. seq_cst pairs with the reader's phase load and
  // increment (see snapshot()).
  for (int pass = 0; pass < 2; ++pass) {
    const std::uint32_t phase = reader_phase_.fetch_add(1, std::memory_order_seq_cst);
    while (readers_[phase & 1].value.load(std::memory_order_seq_cst) != 0) {
      std::this_thread::yield();
    }
  }
  delete old;
}

RouterStatus Router::assign(std::span<const Node> nodes) {
  std::vector<Node> sorted(nodes.begin(), nodes.end());
  for (const Node& node : sorted) {
    if (const RouterStatus status = validate(node); status != RouterStatus::kOk) return status;
  }
  if (sorted.size() > RouterSnapshot::kMaxNodes) return RouterStatus::kTooManyNodes;
  std::sort(sorted.begin(), sorted.end(), node_id_less);
  if (std::adjacent_find(sorted.begin(), sorted.end(), [](const Node& a, const Node& b) {
        return a.id == b.id;
      }) != sorted.end()) {
    return RouterStatus::kDuplicateNode;
  }
  auto next =
      RouterSnapshotBuilder::skeleton(std::move(sorted), options_.seed, options_.bucket_bits);
  RouterSnapshotBuilder::fill_table(*next);
  const std::lock_guard<std::mutex> lock(change_mutex_);
  publish(std::move(next));
  return RouterStatus::kOk;
}

RouterStatus Router::change_node(std::string_view id, std::uint32_t weight, bool must_exist,
                                 bool must_be_absent) {
  if (id.empty()) return RouterStatus::kInvalidNodeId;
  if (weight > RouterSnapshot::kMaxWeight || (weight == 0 && !must_exist)) {
    return RouterStatus::kInvalidWeight;
  }
  const std::lock_guard<std::mutex> lock(change_mutex_);
  // Relaxed: only writers store current_, and we hold their mutex.
  const RouterSnapshot& prev = *current_.load(std::memory_order_relaxed)->snapshot;
  std::vector<Node> nodes(prev.nodes_.begin(), prev.nodes_.end());
  const auto it =
      std::lower_bound(nodes.begin(), nodes.end(), id,
                       [](const Node& node, std::string_view key) { return node.id < key; });
  const bool exists = it != nodes.end() && it->id == id;
  if (must_exist && !exists) return RouterStatus::kUnknownNode;
  if (must_be_absent && exists) return RouterStatus::kDuplicateNode;
  const std::uint32_t old_weight = exists ? it->weight : 0;
  if (!exists) {
    if (nodes.size() >= RouterSnapshot::kMaxNodes) return RouterStatus::kTooManyNodes;
    nodes.insert(it, Node{NodeId(id), weight});
  } else if (weight == 0) {
    nodes.erase(it);
  } else {
    it->weight = weight;
  }
  auto next =
      RouterSnapshotBuilder::skeleton(std::move(nodes), options_.seed, options_.bucket_bits);
  RouterSnapshotBuilder::update_table(prev, *next, id, old_weight, weight);
  publish(std::move(next));
  return RouterStatus::kOk;
}

RouterStatus Router::add(std::string_view id, std::uint32_t weight) {
  if (weight == 0) return RouterStatus::kInvalidWeight;
  return change_node(id, weight, /*must_exist=*/false, /*must_be_absent=*/true);
}

RouterStatus Router::remove(std::string_view id) {
  return change_node(id, 0, /*must_exist=*/true, /*must_be_absent=*/false);
}

RouterStatus Router::set_weight(std::string_view id, std::uint32_t weight) {
  if (weight == 0) return RouterStatus::kInvalidWeight;
  return change_node(id, weight, /*must_exist=*/true, /*must_be_absent=*/false);
}

}  // namespace shardlock
