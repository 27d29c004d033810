// shardlock::Router: maps a key to the node that owns it, or to N distinct
// replica nodes in preference order, over a membership that can change.
//
// Use it wherever several processes must agree, without talking to each
// other, on which node is responsible for a key: the lease client routes each
// key to its lease server with it, and sharded applications route requests.
// Lookups are lock-free and never wait for a membership change.
//
// Design
//   * Mapping. The 64-bit key space (XXH3 of the key bytes, fixed seed) is cut
//     into B = 2^bucket_bits equal buckets (default 2^22). Every bucket ranks
//     the nodes by weighted rendezvous (highest random weight): node y has
//     weight w copies, copy c scores bucket b with sigma_{y,c}(b), a keyed
//     bijection of [0, B), and y's score is the best of its copies. The
//     bucket's owner is the top-ranked node, the replicas are the next ones.
//     A lookup is one hash and one load from a table of 16-bit node indices.
//   * Why a per-bucket ranking. The issue asks for (1) a pure function of the
//     membership and (2) a change of one node to move only keys that belonged
//     to or now go to that node. Together these force a fixed ranking of all
//     possible nodes per key: if adding x never moves a key between two other
//     nodes, then choice(S) = choice(S \ {w}) for every loser w, which is
//     Sen's property alpha, and single-valued choice functions with it are
//     exactly "the best element under a fixed order". So ring, rendezvous and
//     this table are all rankings; Maglev, bounded-load assignment and
//     least-loaded balancing passes are not (they move third-party keys), and
//     AnchorHash, MementoHash and DxHash depend on the history of removals,
//     not only on the membership. Jump cannot remove a middle node.
//   * Why stratified permutations. With independent scores per (bucket, node)
//     a node's bucket count is binomial; sigma_{y,c} being a bijection gives
//     every copy exactly one bucket at each level, which cuts the variance of
//     the counts about threefold (measured at 1000 nodes and 2^20 buckets:
//     peak/mean 1.061 instead of 1.12 with independent XXH3 scores). It also
//     makes a full build cheap: walking the levels downward and letting each
//     copy claim sigma^-1(level) if it is still free visits about
//     B (ln copies + 1) (bucket, copy) pairs instead of B * copies.
//   * Balance is the exact key-space share: bucket counts over B, no
//     sampling. It is limited by the bucket count, because the owner of each
//     bucket is still a random variable. At 1000 equal nodes the most loaded
//     node owns 1.030x the mean share with 2^22 buckets (8 MiB, the default),
//     1.023x with 2^23 and 1.018x with 2^24 (32 MiB). Meeting 1.02 therefore
//     costs a 32 MiB table that no longer stays in the last-level cache, and
//     the lookup target (20 ns) does not survive that; the default keeps the
//     lookup fast and the options let a caller buy balance with memory.
//     docs/router.md has the alternatives measured (independent scores,
//     tiered and multi-probe tables) and why a ranking-based table needs
//     tens of thousands of buckets per node to reach 1.02.
//   * Movement is exactly minimal by construction: adding or removing node x
//     changes only buckets whose owner was or becomes x, and removing x only
//     promotes each of its buckets' next-ranked node. The fraction moved is
//     x's share, at most the peak share above.
//   * Weights are positive integers up to kMaxWeight: weight w is w copies,
//     so a weight-2 node owns twice the share in expectation.
//   * Concurrency. Every change builds a new immutable RouterSnapshot off to
//     the side (incrementally from the previous one: B + B * w_x score
//     evaluations) and publishes it with one atomic exchange. Readers find it
//     through a thread-local cache keyed by the epoch, so the hot path is a
//     relaxed load of the epoch and a compare. A cache miss takes a
//     std::shared_ptr to the current snapshot inside a two-counter
//     sleepable-RCU read section (two uncontended atomic increments, no
//     loop, no lock), so lookups are wait-free. The writer waits for the
//     read sections of the retired phase to drain before it frees the
//     holder; snapshots themselves die with their last shared_ptr. Retired
//     snapshots are therefore kept alive by readers still using them and
//     freed as soon as no one does. std::atomic<std::shared_ptr> would be
//     simpler, but libstdc++ 12 implements it with a spin lock bit that a
//     preempted writer can hold, so readers could wait on a change.
//   * Epochs count published snapshots, starting at 1; they only increase.
//   * Determinism: node ids and keys are hashed as bytes with XXH3-64 and
//     the seed; every derived integer is computed arithmetically, never
//     from memory layout, so the mapping is the same on every platform,
//     independent of insertion order (nodes are kept sorted by id).
//     tests/data/router_golden.txt pins it; changing those vectors is a
//     breaking change and needs a release note.
//
// Numbers (AMD EPYC Zen 4 VM, 2 vCPUs, g++ 12 -O2, 1000 nodes, 2^22 buckets):
// snapshot owner() 9.4 ns and Router::owner() 20 ns against 51 ns for jump
// consistent hash on the same keys; 10.6 ns vs 51 ns when every key is new
// and the whole table is in play; add 5.3 ms, remove 33 ms, full build
// 245 ms; 8 MiB + ~130 bytes per node. Command and table: docs/router.md.
#pragma once

#include <xxhash.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shardlock {

// A node's identity as the application spells it, e.g. "10.0.0.7:7700".
using NodeId = std::string;

struct Node {
  NodeId id;
  std::uint32_t weight = 1;

  friend bool operator==(const Node&, const Node&) = default;
};

// "SHARDLK1". Part of the mapping: changing it moves every key.
inline constexpr std::uint64_t kDefaultRouterSeed = 0x5348'4152'444C'4B31ULL;
inline constexpr int kDefaultBucketBits = 22;
inline constexpr int kMinBucketBits = 8;
inline constexpr int kMaxBucketBits = 26;

struct RouterOptions {
  // Seeds both the key hash and the node scores.
  std::uint64_t seed = kDefaultRouterSeed;
  // log2 of the bucket count; clamped to [kMinBucketBits, kMaxBucketBits].
  // Memory is 2 bytes per bucket; balance improves as sqrt(buckets).
  int bucket_bits = kDefaultBucketBits;
};

enum class RouterStatus {
  kOk,
  kDuplicateNode,  // add() of an id already present, or a repeated id in assign()
  kUnknownNode,    // remove() or set_weight() of an id not present
  kInvalidWeight,  // weight 0 or above kMaxWeight
  kInvalidNodeId,  // empty id
  kTooManyNodes,   // more than kMaxNodes nodes
};

std::string_view to_string(RouterStatus status) noexcept;

namespace internal {

// A keyed bijection of [0, 2^bits): four rounds of multiply-by-odd,
// xor-shift-right by at least bits/2 (an involution) and add, all mod 2^bits.
// forward() maps a bucket to the level at which this node copy scores it;
// inverse() maps a level back to its bucket for the level-descending build.
struct BucketPermutation {
  static constexpr int kRounds = 4;
  // Plain arrays, not std::array: these loops are the whole cost of a table
  // build, and unoptimised (sanitizer) builds would call operator[] per step.
  std::uint64_t multiplier[kRounds];          // NOLINT(modernize-avoid-c-arrays)
  std::uint64_t multiplier_inverse[kRounds];  // NOLINT(modernize-avoid-c-arrays)
  std::uint64_t addend[kRounds];              // NOLINT(modernize-avoid-c-arrays)
  std::uint64_t tiebreak;                     // orders copies that score a bucket at the same level

  std::uint64_t forward(std::uint64_t x, std::uint64_t mask, int shift) const noexcept {
    x = ((x * multiplier[0]) & mask);
    x = ((x ^ (x >> shift)) + addend[0]) & mask;
    x = ((x * multiplier[1]) & mask);
    x = ((x ^ (x >> shift)) + addend[1]) & mask;
    x = ((x * multiplier[2]) & mask);
    x = ((x ^ (x >> shift)) + addend[2]) & mask;
    x = ((x * multiplier[3]) & mask);
    return ((x ^ (x >> shift)) + addend[3]) & mask;
  }
  std::uint64_t inverse(std::uint64_t x, std::uint64_t mask, int shift) const noexcept {
    x = (x - addend[3]) & mask;
    x = ((x ^ (x >> shift)) * multiplier_inverse[3]) & mask;
    x = (x - addend[2]) & mask;
    x = ((x ^ (x >> shift)) * multiplier_inverse[2]) & mask;
    x = (x - addend[1]) & mask;
    x = ((x ^ (x >> shift)) * multiplier_inverse[1]) & mask;
    x = (x - addend[0]) & mask;
    return ((x ^ (x >> shift)) * multiplier_inverse[0]) & mask;
  }
};

}  // namespace internal

// A membership file: one "node [weight]" per line, weight a decimal integer
// 1..kMaxWeight (default 1); blank lines and everything after '#' ignored.
// Pure: bytes in, nodes or the first error (with its 1-based line) out;
// never throws on bad input.
struct MembershipParseResult {
  std::vector<Node> nodes;  // in file order
  std::size_t error_line = 0;
  std::string error;  // empty on success
  bool ok() const noexcept { return error.empty(); }
};
MembershipParseResult parse_membership(std::string_view text);

// One immutable membership and its lookup table. Obtain it from
// Router::snapshot(); every method is const, thread-safe and non-blocking,
// and references it returns stay valid as long as the snapshot is held.
class RouterSnapshot {
 public:
  static constexpr std::uint32_t kMaxWeight = 1024;
  static constexpr std::size_t kMaxNodes = 65535;  // 16-bit table entries, one value reserved
  static constexpr std::uint16_t kNoOwner = 0xFFFF;

  // The published snapshot number; 0 only for the empty snapshot that a
  // default-constructed Router starts from.
  std::uint64_t epoch() const noexcept { return epoch_; }
  std::size_t size() const noexcept { return nodes_.size(); }
  bool empty() const noexcept { return nodes_.empty(); }
  // Sorted by id (bytewise), so indices are the same for equal memberships.
  std::span<const Node> nodes() const noexcept { return nodes_; }
  std::uint64_t seed() const noexcept { return seed_; }
  int bucket_bits() const noexcept { return bucket_bits_; }
  std::size_t bucket_count() const noexcept { return std::size_t{1} << bucket_bits_; }

  std::uint64_t hash(std::string_view key) const noexcept {
    return XXH3_64bits_withSeed(key.data(), key.size(), seed_);
  }
  // The bucket of a key hash: its top bucket_bits bits.
  std::size_t bucket_of_hash(std::uint64_t key_hash) const noexcept {
    return static_cast<std::size_t>(key_hash >> (64 - bucket_bits_));
  }
  // Index into nodes() of the owner, or kNoOwner when the snapshot is empty.
  std::uint16_t owner_index(std::string_view key) const noexcept {
    if (nodes_.empty()) return kNoOwner;
    return table_[bucket_of_hash(hash(key))];
  }
  // owner_index() of many keys at once: out[i] = owner_index(keys[i]) for
  // i < min(keys.size(), out.size()), which it returns. It hashes a group of
  // keys and prefetches their buckets before reading any, so the cache misses
  // of a group overlap. A single lookup cannot do that, and with tables larger
  // than the last-level cache (bucket_bits 23 and 24) it pays most of a miss.
  // docs/router.md (Batch lookups) has the numbers.
  std::size_t owner_indices(std::span<const std::string_view> keys,
                            std::span<std::uint16_t> out) const noexcept;
  // The owner's id; an empty id when the snapshot has no nodes.
  const NodeId& owner(std::string_view key) const noexcept {
    const std::uint16_t index = owner_index(key);
    return index == kNoOwner ? empty_id() : nodes_[index].id;
  }

  // The first min(n, size()) nodes of the key's ranking, best first: distinct,
  // and owners(key, 1)[0] == owner(key). O(total weight) per call (about
  // 11 us at 1000 nodes), unlike owner(), which is O(1); n == 1 is O(1).
  std::vector<NodeId> owners(std::string_view key, std::size_t n) const;
  // The same ranking as indices into nodes(), for a bucket.
  std::vector<std::uint16_t> ranking_of_bucket(std::size_t bucket, std::size_t n) const;
  // The replica set of a bucket when the nodes flagged in `learners` (indexed
  // like nodes(); missing entries are false) may back buckets up but own
  // none: the primary first (the best-ranked other node, so the owner of a
  // snapshot built without the learners), then its backups: the next
  // `replicas` - 1 other nodes, and every learner ranked among the first
  // `replicas` nodes of all. Rankings are per node, so a learner leaves the
  // others' order alone, and once promoted it is a backup or the primary
  // exactly where it was a learner. Empty when every node is a learner.
  std::vector<std::uint16_t> replica_set(std::size_t bucket, std::size_t replicas,
                                         const std::vector<bool>& learners) const;

  // Bounded-load lookup (Mirrokni, Thorup, Zadimoghaddam 2018): the first
  // node in the key's ranking whose load is below its capacity
  // ceil(c * (total + 1) * weight / total_weight). loads[i] is the caller's
  // current load of nodes()[i]; loads.size() must equal size(). c must be
  // > 1; values <= 1 are treated as 1.25. Returns kNoOwner when empty or
  // when loads has the wrong size.
  std::uint16_t owner_index_bounded(std::string_view key, std::span<const std::uint64_t> loads,
                                    double c = 1.25) const;

  // Buckets owned per node (index as nodes()): the exact key-space share is
  // bucket_counts()[i] / bucket_count().
  std::vector<std::uint64_t> bucket_counts() const;
  // The owner of every bucket, for tools and tests that diff two snapshots.
  std::span<const std::uint16_t> table() const noexcept {
    return {table_.get(), nodes_.empty() ? 0 : bucket_count()};
  }
  // Approximate heap bytes held by this snapshot.
  std::size_t memory_bytes() const noexcept;

 private:
  friend class Router;
  friend class RouterSnapshotBuilder;

  static const NodeId& empty_id() noexcept;

  std::uint64_t seed_ = kDefaultRouterSeed;
  int bucket_bits_ = kDefaultBucketBits;
  std::uint64_t epoch_ = 0;
  std::vector<Node> nodes_;
  // Node i's copies are permutations_[copy_begin_[i] .. copy_begin_[i + 1]).
  std::vector<internal::BucketPermutation> permutations_;
  std::vector<std::uint32_t> copy_begin_;
  struct TableDeleter {
    void operator()(std::uint16_t* table) const noexcept;
  };
  using Table = std::unique_ptr<std::uint16_t[], TableDeleter>;
  static Table allocate_table(std::size_t buckets);
  Table table_;
  // No bucket's owner scores below this level (a lower bound, exact after a
  // full build): a new copy cannot win a bucket at a lower level.
  std::uint64_t min_owner_level_ = 0;
};

// The mutable, shareable router. Membership changes are serialised among
// themselves (they take an internal mutex and may block each other);
// lookups never block and may run concurrently with anything except the
// destructor.
class Router {
 public:
  explicit Router(RouterOptions options = {});
  // Starts with `nodes` (published as epoch 1). Invalid input leaves the
  // router empty; use assign() to see the status.
  explicit Router(std::span<const Node> nodes, RouterOptions options = {});
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Membership changes. Each one that returns kOk publishes exactly one new
  // snapshot with the next epoch; any other status changes nothing. They
  // build the new table before publishing (tens of milliseconds at the
  // default 2^22 buckets) and block only other changes.
  [[nodiscard]] RouterStatus add(std::string_view id, std::uint32_t weight = 1);
  [[nodiscard]] RouterStatus remove(std::string_view id);
  [[nodiscard]] RouterStatus set_weight(std::string_view id, std::uint32_t weight);
  // Replaces the whole membership in one epoch (a full build, O(B log B)).
  [[nodiscard]] RouterStatus assign(std::span<const Node> nodes);

  // The owner of `key` in the current snapshot, or an empty id when there are
  // no nodes. Lock-free, wait-free on the fast path. Returns a copy: loops
  // over many keys should use current().owner(key) or a held snapshot, which
  // return references and measure 2-4x faster (docs/router.md, Benchmarks).
  NodeId owner(std::string_view key) const { return current().owner(key); }
  std::vector<NodeId> owners(std::string_view key, std::size_t n) const {
    return current().owners(key, n);
  }
  std::size_t size() const { return current().size(); }
  std::vector<Node> nodes() const {
    const RouterSnapshot& s = current();
    return {s.nodes().begin(), s.nodes().end()};
  }
  // The epoch of the newest change; during a publish it may run one ahead of
  // the snapshot that snapshot() returns (see publish()).
  std::uint64_t epoch() const noexcept { return epoch_.load(std::memory_order_acquire); }

  // The current snapshot, to do several consistent lookups or to keep
  // references. Wait-free: two uncontended atomic increments.
  std::shared_ptr<const RouterSnapshot> snapshot() const;

  // The snapshot this thread last used, refreshed if a change was published
  // since. Valid until this thread's next lookup on any Router (the
  // per-thread cache holds four routers). A thread keeps the last snapshot
  // of each router it used alive until it exits or uses four other routers,
  // so an idle thread can pin one retired table per router.
  const RouterSnapshot& current() const {
    // Relaxed is enough: the load only detects that a newer snapshot exists;
    // the snapshot itself is reached through a shared_ptr this thread owns.
    // A change that happens-before this call is seen by coherence.
    const std::uint64_t epoch = epoch_.load(std::memory_order_relaxed);
    for (const CacheHint& hint : cache_hints()) {
      if (hint.router_id == id_ && hint.epoch == epoch) return *hint.snapshot;
    }
    return refresh_cache();
  }

 private:
  struct Published {
    std::shared_ptr<const RouterSnapshot> snapshot;
  };
  // The thread cache: hints[i] describes owners[i]. The hints are trivially
  // destructible, so the fast path reads them without the thread_local
  // initialisation guard that the shared_ptrs would need.
  struct CacheHint {
    std::uint64_t router_id;
    std::uint64_t epoch;
    const RouterSnapshot* snapshot;
  };
  static constexpr std::size_t kCacheSlots = 4;
  using CacheHints = std::array<CacheHint, kCacheSlots>;
  using CacheOwners = std::array<std::shared_ptr<const RouterSnapshot>, kCacheSlots>;
  // One read-section counter per RCU phase, each on its own line pair so
  // readers of one phase do not invalidate the writer's poll of the other.
  struct alignas(128) ReaderCount {
    std::atomic<std::int64_t> value{0};
  };

  static CacheHints& cache_hints() noexcept {
    thread_local CacheHints hints{};
    return hints;
  }
  static CacheOwners& cache_owners() noexcept;
  const RouterSnapshot& refresh_cache() const;
  void publish(std::shared_ptr<RouterSnapshot> next);
  RouterStatus change_node(std::string_view id, std::uint32_t weight, bool must_exist,
                           bool must_be_absent);

  const RouterOptions options_;
  const std::uint64_t id_;   // unique per Router in this process; keys the thread caches
  std::mutex change_mutex_;  // serialises membership changes and publish()
  std::atomic<const Published*> current_;
  std::atomic<std::uint64_t> epoch_{0};
  std::atomic<std::uint32_t> reader_phase_{0};
  mutable std::array<ReaderCount, 2> readers_;
};

}  // namespace shardlock
