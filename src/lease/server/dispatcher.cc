// The request path between the I/O loops and the shards. See dispatcher.h.
#include "server/dispatcher.h"

#include <algorithm>
#include <map>
#include <new>
#include <set>
#include <utility>

#include "shardlock/lease/wire/internal/string_key.h"
#include "shardlock/lock_guard.h"
#include "shardlock_version.h"

namespace shardlock::lease::internal {

Dispatcher::Dispatcher(DispatcherOptions options, std::vector<std::unique_ptr<Shard>> shards)
    : options_(std::move(options)),
      clock_(options_.clock),
      limits_(shards.empty() ? ShardLimits{} : shards.front()->limits()),
      started_ms_(shards.empty() ? now_ms() : shards.front()->created_ms()),
      many_({.shards = shards_,
             .limits = limits_,
             .key_seed = options_.key_seed,
             .replicator = options_.replicator,
             .log = options_.log,
             .counters = counters_}) {
  shards_.reserve(shards.size());
  for (auto& shard : shards) {
    auto slot = std::make_unique<ShardSlot>();
    LockGuard lock(slot->mu);
    slot->shard = std::move(shard);
    slot->shard->set_grant_log(options_.grant_log);
    shards_.push_back(std::move(slot));
  }
  for (unsigned w = 0; w < std::max(1U, options_.workers); ++w) {
    auto& worker = workers_.emplace_back(std::make_unique<Worker>());
    if (options_.tenants) worker->tenants.emplace(*options_.tenants);
  }
}

Dispatcher::~Dispatcher() = default;

std::int64_t Dispatcher::now_ms() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(clock_.now()).count();
}

namespace {

// STATS' version gauge.
constexpr std::uint64_t kPackedVersion = pack_version(kVersion);
static_assert(kPackedVersion != 0, "PROJECT_VERSION is not MAJOR.MINOR.PATCH");

}  // namespace

std::size_t Dispatcher::shard_of(std::string_view key) const noexcept {
  return shard_index(hash_key(key, options_.key_seed), shards_.size());
}

void Dispatcher::handle(unsigned worker, std::span<const std::uint8_t> bytes, const Peer& peer,
                        std::vector<OutDatagram>& replies) noexcept {
  Worker& w = *workers_[worker];
  const std::chrono::nanoseconds start = clock_.now();
  try {
    decide(w, bytes, peer, start, replies);
    w.latency.record(clock_.now() - start);
  } catch (const std::bad_alloc&) {
    // Given up: the client retransmits. Answers already decided for waiters
    // still go out if they can (and are remembered by their shards), and the
    // ACQUIRE_MANY steps among them are taken.
    count(counters_.allocation_failures);
    send_deferred(w, replies);
  }
}

void Dispatcher::tick(unsigned worker, std::vector<OutDatagram>& replies) noexcept {
  Worker& w = *workers_[worker];
  try {
    const std::int64_t now = now_ms();
    for (std::size_t s = worker; s < shards_.size(); s += workers_.size()) {
      ShardSlot& slot = *shards_[s];
      if (slot.timers.load(std::memory_order_relaxed) == 0) continue;  // see ShardSlot::timers
      LockGuard lock(slot.mu);
      slot.shard->advance(now, w.deferred);
      while (MultiAcquire* m = slot.shard->take_stalled()) {
        try {
          DeferredReply step;
          step.multi = m;
          step.type = m->stalled_step;
          if (const ClusterGate* gate = slot.shard->gate()) {
            step.epoch = gate->epoch;                    // a REDIRECT's
            step.retry_after_ms = gate->retry_after_ms;  // a RECOVERING's
          }
          w.deferred.push_back(std::move(step));
        } catch (const std::bad_alloc&) {
          slot.shard->stall(*m, m->stalled_step);  // the next tick tries again
          count(counters_.allocation_failures);
          break;
        }
      }
      slot.drain_journal(options_.replicator);
      slot.note_timers();
    }
    if (options_.replicator != nullptr) {
      const std::int64_t ticked = clock_.now().count();
      // Relaxed: a time stamp, read by worker 0 as a hint of liveness only.
      w.ticked_ns.store(ticked, std::memory_order_relaxed);
      if (worker == 0) {
        std::int64_t oldest = ticked;
        for (const auto& other : workers_) {
          oldest = std::min(oldest, other->ticked_ns.load(std::memory_order_relaxed));
        }
        options_.replicator->loop_ran(oldest);
        options_.replicator->poll(ticked, replies);
      }
    }
  } catch (const std::bad_alloc&) {
    count(counters_.allocation_failures);
  }
  send_deferred(w, replies);
}

void Dispatcher::end_batch(std::vector<OutDatagram>& replies) noexcept {
  if (options_.replicator == nullptr) return;
  try {
    // The batch's grants are held until the backups have them: send them now
    // (one REPLICATE per backup for the whole batch), not at the next tick.
    options_.replicator->poll(clock_.now().count(), replies);
  } catch (const std::bad_alloc&) {
    count(counters_.allocation_failures);  // the next tick sends them
  }
}

void Dispatcher::replicate_buckets(
    const std::vector<std::pair<std::uint16_t, std::uint32_t>>& pairs) {
  Replicator* r = options_.replicator;
  if (r == nullptr || pairs.empty()) return;
  // Which buckets each peer is owed.
  std::map<std::uint16_t, std::set<std::uint32_t>> owed;
  for (const auto& [peer, bucket] : pairs) owed[peer].insert(bucket);
  for (const auto& [peer, bucket] : pairs) r->begin_snapshot(peer, bucket);
  std::vector<replication::Entry> holders;
  std::vector<replication::Entry> part;
  bool complete = true;
  for (const auto& slot : shards_) {
    LockGuard lock(slot->mu);
    slot->drain_journal(options_.replicator);
    holders.clear();
    if (!slot->shard->snapshot_all(holders)) complete = false;
    for (const auto& [peer, buckets] : owed) {
      part.clear();
      for (const replication::Entry& e : holders) {
        if (buckets.contains(e.bucket)) part.push_back(e);
      }
      if (!part.empty()) r->append_snapshot(peer, part);
    }
  }
  if (!complete) {
    // A shard could not name its holders' buckets: these snapshots are not
    // marked caught up (so no backup takes a bucket over from them), and
    // every stream starts over at the next restart_streams().
    r->start_over();
    return;
  }
  // Whether this node has each bucket active: a backup that takes it over
  // from here then need not wait for history it did not see.
  std::shared_ptr<const ClusterGate> gate;
  {
    LockGuard lock(gate_mu_);
    gate = gate_;
  }
  for (const auto& [peer, bucket] : pairs) {
    const bool active =
        gate && bucket < gate->buckets.size() && gate->buckets[bucket] == ClusterGate::kActive;
    r->end_snapshot(peer, bucket, active);
  }
}

std::optional<std::size_t> Dispatcher::inherit(
    const std::vector<std::pair<std::string, replication::ReplicaHolder>>& holders,
    std::int64_t expiry_ms) {
  // Per key, in token order (installed newest first, a key's
  // holders were listed that way and its version, the last holder's
  // token, went back, so a watch reported a change that did not happen).
  // Only the holders that can coexist with the key's newest grant are
  // live: a replica may know older ones whose release had not reached it,
  // and every grant after an exclusive one, or an exclusive one after any,
  // was made once they were over. So the newest exclusive holder alone, or
  // every holder of the newest one's kind.
  std::vector<const std::pair<std::string, replication::ReplicaHolder>*> order;
  order.reserve(holders.size());
  for (const auto& h : holders) order.push_back(&h);
  std::stable_sort(order.begin(), order.end(), [](const auto* x, const auto* y) {
    return x->first != y->first ? x->first < y->first : x->second.token < y->second.token;
  });
  std::vector<const std::pair<std::string, replication::ReplicaHolder>*> live;
  live.reserve(order.size());
  for (std::size_t begin = 0; begin < order.size();) {
    std::size_t end = begin;
    while (end < order.size() && order[end]->first == order[begin]->first) ++end;
    const replication::ReplicaHolder& newest = order[end - 1]->second;
    for (std::size_t i = begin; i < end; ++i) {
      const replication::ReplicaHolder& h = order[i]->second;
      const bool coexists = newest.mode == LeaseMode::kExclusive
                                ? i + 1 == end
                                : h.mode == newest.mode && h.permits == newest.permits;
      if (coexists) live.push_back(order[i]);
    }
    begin = end;
  }
  std::size_t installed = 0;
  std::size_t refused = 0;
  for (const auto* entry : live) {
    const std::string& key = entry->first;
    const replication::ReplicaHolder& holder = entry->second;
    ShardSlot& slot = *shards_[shard_of(key)];
    LockGuard lock(slot.mu);
    bool ok = false;
    try {
      ok = slot.shard->inherit(key, holder, expiry_ms);
    } catch (const std::bad_alloc&) {
      count(counters_.allocation_failures);
    }
    slot.drain_journal(options_.replicator);
    slot.note_timers();
    if (ok) {
      ++installed;
      if (options_.grant_log != nullptr) {
        options_.grant_log->record(LeaseEvent::kTakeover, key, holder.owner, holder.token,
                                   holder.ttl_ms, /*cluster=*/true, now_ms());
      }
    } else {
      ++refused;
    }
  }
  if (refused == 0) return installed;
  // Simulation seed 7852: the bucket went active with the replicated holder
  // missing, and once this node's own stale holder expired it granted the
  // key beside the holder it had not installed.
  const std::int64_t now = now_ms();
  const std::int64_t logged = takeover_refusal_logged_ms_.load(std::memory_order_relaxed);
  if (logged != std::numeric_limits<std::int64_t>::min() && now - logged < 1000) {
    return std::nullopt;
  }
  takeover_refusal_logged_ms_.store(now, std::memory_order_relaxed);
  options_.log("takeover: " + std::to_string(refused) +
               " replicated holders could not be installed beside this node's own (left from "
               "an earlier ownership of the bucket); the takeover waits until those expire");
  return std::nullopt;
}

void Dispatcher::send_reply(Worker& w, std::size_t budget, const Peer& peer,
                            std::vector<OutDatagram>& replies,
                            std::span<const std::uint32_t> buckets, bool relayable) {
  const Datagram& d = w.reply;
  // No source ever gets more reply bytes than it sent (before the envelope).
  if (encoded_size(d) > budget) {
    count(counters_.amplification_drops);
    return;
  }
  OutDatagram& o = replies.emplace_back();
  std::size_t written = 0;
  // Room for the seal its request came in (a legacy tag is 16 bytes, as
  // before the envelope; an encrypted one 44).
  const std::size_t room = o.bytes.size() - (w.tenants ? seal_overhead(peer.seal) : 0);
  if (encode(d, std::span(o.bytes).first(room), written) != ProtocolError::kOk) {
    replies.pop_back();  // cannot happen for replies within the request's size
    return;
  }
  if (w.tenants) {
    // Sealed as its request was; 0: its tenant is gone (a reload).
    written = w.tenants->seal(peer.seal, o.bytes, written);
    if (written == 0) {
      replies.pop_back();
      return;
    }
  }
  o.peer = peer;
  o.length = static_cast<std::uint16_t>(written);
  o.any_order = true;  // answers carry their request ids: a client matches them in any order
#if defined(SHARDLOCK_FAULT_EARLY_GRANT)
  // UNSAFE, the torture harness's broken build (CMake option
  // SHARDLOCK_FAULT_EARLY_GRANT): grants are answered at once, before any
  // backup has them, to show the checker catches it. Never in a preset.
  constexpr bool kHoldGrants = false;
#else
  constexpr bool kHoldGrants = true;
#endif
  if (kHoldGrants && options_.replicator != nullptr) {
    // A grant or a release is answered only once every backup has it: the
    // datagram waits in the replicator (replies to other items in it wait
    // along). A RELEASED answered before its backup had it
    // told the client the key was free while a takeover would
    // bring the holder back for a whole TTL.
    const auto items = d.items();
    const bool replicated = std::any_of(items.begin(), items.end(), [](const Message& m) {
      return m.type == MessageType::kGranted || m.type == MessageType::kGrantedMany ||
             m.type == MessageType::kReleased;
    });
    if (replicated && options_.replicator->hold(o, buckets, relayable)) replies.pop_back();
  }
}

void Dispatcher::send_deferred(Worker& w, std::vector<OutDatagram>& replies) noexcept {
  // A step of an ACQUIRE_MANY may hand keys off and append more answers, so
  // this walks by index over a list that can grow. Every record is taken
  // whatever happened to the one before: a reply that cannot be sent for want
  // of memory is lost (its answer is remembered for the retransmission), but
  // an ACQUIRE_MANY step is never skipped, or its request would wait forever.
  for (std::size_t i = 0; i < w.deferred.size(); ++i) {
    try {
      if (w.deferred[i].multi != nullptr) {
        const DeferredReply step = w.deferred[i];  // no key: copying allocates nothing
        continue_many(w, step, replies);
        continue;
      }
      const DeferredReply& d = w.deferred[i];
      if (d.type == MessageType::kError) {
        options_.log("cannot issue a token to a waiter on a key; answered ERROR(internal)");
      }
      w.reply.count = 0;
      w.reply.batch = false;
      w.reply.client_id = d.client;
      (void)w.reply.push(d.message());
      w.reply.request_id = d.request_id;
      // A waiter's grant: its first answer.
      send_reply(w, d.reply_credit, d.peer, replies, {}, true);
    } catch (const std::bad_alloc&) {
      count(counters_.allocation_failures);
    }
  }
  w.deferred.clear();
}

void Dispatcher::refuse_unpadded(Worker& w, std::size_t budget, const Peer& peer,
                                 std::vector<OutDatagram>& replies) {
  // ERROR items are smaller than request items, but not than reply-type
  // items sent here (RELEASED has an empty body): send_reply() withholds
  // what does not fit.
  for (const Message& m : w.request.items()) {
    Message e;
    e.type = MessageType::kError;
    e.request_id = m.request_id;
    e.error = WireError::kRequestTooSmall;
    (void)w.reply.push(e);
    count(counters_.errors);
  }
  send_reply(w, budget, peer, replies);
}

bool Dispatcher::admit(Worker& w, std::span<const std::uint8_t>& bytes, Peer& peer,
                       std::vector<OutDatagram>& replies, std::size_t& bound) {
  // 1. A sealed datagram reaching a server without a key fails too: it
  // cannot be checked, and its sender expects sealed replies.
  bool rejected =
      bytes.size() > kHeaderFlagsOffset && (bytes[kHeaderFlagsOffset] & kFlagAuthenticated) != 0;
  w.tenant = nullptr;
  if (w.tenants) {
    const auto opened = w.tenants->open(bytes, w.opened);
    rejected = !opened;
    if (opened) {
      bytes = opened->plain;
      w.tenant = opened->tenant;
      w.tenant_counters = opened->counters;
      peer.seal = opened->seal;
    }
  }
  if (rejected) {
    count(counters_.auth_failures);
    return false;
  }
  // 2.
  const ProtocolError err = decode(bytes, w.request);
  w.reply.count = 0;
  w.reply.batch = w.request.batch;
  w.reply.client_id = w.request.client_id;
  w.reply.request_id = w.request.request_id;
  if (err == ProtocolError::kUnsupportedVersion) {
    // Answered in our version so the sender learns why; only if it fits.
    count(counters_.errors);
    Message m;
    m.type = MessageType::kError;
    m.request_id = w.request.request_id;
    m.error = WireError::kUnsupportedVersion;
    w.reply.batch = false;
    (void)w.reply.push(m);
    send_reply(w, bytes.size(), peer, replies);
    return false;
  }
  if (err != ProtocolError::kOk) {
    count(counters_.malformed);
    return false;
  }
  if (w.tenant != nullptr) scope_owners(w);
  // 3.
  bound = max_immediate_reply_size(w.request);
  if (bound > bytes.size()) {
    refuse_unpadded(w, bytes.size(), peer, replies);
    return false;
  }
  return true;
}

void Dispatcher::decide(Worker& w, std::span<const std::uint8_t> bytes, const Peer& from,
                        std::chrono::nanoseconds arrived, std::vector<OutDatagram>& replies) {
  // Node-to-node replication datagrams have their own magic and their own
  // checks (server/replicator.h).
  if (options_.replicator != nullptr &&
      options_.replicator->on_datagram(bytes, from, arrived.count(), replies)) {
    return;
  }
  Peer peer = from;  // admit() adds how its answers are sealed
  std::size_t bound = 0;
  if (!admit(w, bytes, peer, replies, bound)) return;
  // The padding beyond the bound pays either for queued ACQUIREs' later
  // answers (deferred_reply_credit) or for one STATS page, never both.
  std::size_t stats_slack = bytes.size() - bound;
  for (const Message& m : w.request.items()) {
    if (may_answer_later(m)) stats_slack = 0;
  }
  // 4.
  const std::int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(arrived).count();
  // A client with a newer map than this node's: the node has not seen it
  // yet, and must not grant by the older one (docs/cluster.md, Clients).
  // Relaxed: see gate_epoch_.
  const std::uint64_t gate_epoch = gate_epoch_.load(std::memory_order_relaxed);
  const bool behind = gate_epoch != 0 && w.request.epoch.value_or(0) > gate_epoch;
  bool holders_paged = false;  // one holder page per datagram, like STATS
  w.reply_buckets.clear();
  w.reply_buckets_known = true;
  w.reply_relayable = true;
  for (std::size_t i = 0; i < w.request.count; ++i) {
    const Message& m = w.request.messages[i];
    Message r;
    r.request_id = m.request_id;
    if (w.tenant != nullptr) count(w.tenant_counters->requests);
    if (w.tenant != nullptr && !permitted(*w.tenant, m)) {
      // Authenticated, so no oracle to strangers: only the tenant learns it.
      r.type = MessageType::kError;
      r.error = WireError::kPermissionDenied;
      count(counters_.errors);
      count(w.tenant_counters->permission_denied);
    } else if (m.type == MessageType::kStats) {
      fill_stats(w, m, stats_slack, r);
      stats_slack = 0;  // one page per datagram
    } else if (m.type == MessageType::kMap) {
      fill_map(w, m, stats_slack, r);
      stats_slack = 0;
    } else if (m.type == MessageType::kHotKeys) {
      fill_hot_keys(w, stats_slack, now, r);
      stats_slack = 0;
    } else if (behind && is_request(m.type) && m.type != MessageType::kRelease) {
      r.type = MessageType::kRecovering;
      r.retry_after_ms = kBehindRetryMs;
      count(counters_.behind_maps);
    } else if (!is_request(m.type)) {
      r.type = MessageType::kError;
      r.error = WireError::kNotARequest;
      count(counters_.errors);
    } else if (m.type == MessageType::kAcquireMany) {
      const auto credit = static_cast<std::uint16_t>(
          std::min(deferred_reply_credit(w.request, bytes.size(), i), kMaxDatagramSize));
      w.reply_buckets_known = false;  // its keys' buckets: every stream
      w.reply_relayable = false;
      if (!many_.acquire(m.owner.value_or(w.request.client_id), peer, m, credit, now,
                         w.many_tokens[i], r, w.deferred)) {
        continue;
      }
    } else if (!decide_key(w, m, i, bytes.size(), peer, now, stats_slack, holders_paged, r)) {
      continue;
    }
    (void)w.reply.push(r);
  }
  // 5.
  if (w.reply.count > 0) {
    send_reply(w, bytes.size(), peer, replies,
               w.reply_buckets_known ? std::span<const std::uint32_t>(w.reply_buckets)
                                     : std::span<const std::uint32_t>(),
               w.reply_relayable);
  }
  send_deferred(w, replies);
}

void Dispatcher::scope_owners(Worker& w) noexcept {
  if (!w.tenants->scoped()) return;
  w.request.client_id = w.tenants->scope(*w.tenant, w.request.client_id);
  for (std::size_t i = 0; i < w.request.count; ++i) {
    std::optional<ClientId>& owner = w.request.messages[i].owner;
    if (owner) owner = w.tenants->scope(*w.tenant, *owner);
  }
}

bool Dispatcher::decide_key(Worker& w, const Message& m, std::size_t item,
                            std::size_t datagram_size, const Peer& peer, std::int64_t now,
                            std::size_t& slack, bool& paged, Message& reply) {
  const std::uint64_t key_hash = hash_key(m.key, options_.key_seed);
  ShardSlot& slot = *shards_[shard_index(key_hash, shards_.size())];
  const ClientId owner = m.owner.value_or(w.request.client_id);
  const auto credit = static_cast<std::uint16_t>(
      std::min(deferred_reply_credit(w.request, datagram_size, item), kMaxDatagramSize));
  // QUERY_HOLDERS: the padding pays for its holders (its reply bound
  // counts none), as for a MAP page.
  HolderPage* page = nullptr;
  if (m.type == MessageType::kQueryHolders && !std::exchange(paged, true)) {
    w.holder_page.room = std::exchange(slack, 0);
    page = &w.holder_page;
  } else if (m.type == MessageType::kWatch && !std::exchange(paged, true)) {
    // A WATCH that waits is paid by its credit (its answer may come
    // later); one that does not, by the padding, as QUERY_HOLDERS.
    w.holder_page.room =
        m.wait_ms > 0 ? watch_reply_room(credit, m.key.size()) : std::exchange(slack, 0);
    page = &w.holder_page;
  }
  LockGuard lock(slot.mu);
  // Read under slot.mu, in this scope, so the thread-safety analysis
  // sees the lock (a lambda would not inherit it).
  const auto& counters = slot.shard->counters();
  constexpr auto kRetransmitIndex = static_cast<std::size_t>(StatCounter::kRetransmits);
  const std::uint64_t retransmits_before = counters[kRetransmitIndex];
  const bool answered =
      slot.shard->handle(owner, peer, m, key_hash, now, reply, w.deferred, credit, page);
  // Answered from the dedup cache: its first answer may have been
  // relayed and lost (or never reach a client behind a NAT).
  if (counters[kRetransmitIndex] != retransmits_before) w.reply_relayable = false;
  slot.drain_journal(options_.replicator);
  slot.note_timers();
  if (!answered) return false;
  if (options_.replicator != nullptr &&
      (reply.type == MessageType::kGranted || reply.type == MessageType::kReleased)) {
    // The bucket the shard journaled the grant or release under. A
    // closed gate (before the first map, after a re-registration) has
    // no routing, yet answers a holder's RELEASE.
    if (const ClusterGate* gate = slot.shard->gate(); gate != nullptr && gate->routing) {
      w.reply_buckets.push_back(static_cast<std::uint32_t>(gate->bucket_of(m.key)));
    } else {
      w.reply_buckets_known = false;
    }
  }
  if (reply.type == MessageType::kError && reply.error == WireError::kInternal) {
    options_.log("shard " + std::to_string(slot.shard->index()) +
                 ": cannot issue a token: " + slot.shard->last_error());
  }
  return true;
}

void Dispatcher::fill_stats(Worker& w, const Message& request, std::size_t slack, Message& reply) {
  reply.type = MessageType::kStatsReply;
  reply.shard_count = static_cast<std::uint32_t>(shards_.size());
  reply.first_shard = request.first_shard;
  std::array<std::uint64_t, kStatCounterCount> counters{};
  for (const auto& slot : shards_) {
    LockGuard lock(slot->mu);
    add_shard_values(*slot->shard, counters);
  }
  add_own_values(counters);
  for (std::size_t i = 0; i < kStatCounterCount; ++i) {
    for (std::size_t b = 0; b < 8; ++b) {
      w.stats_counters[i * 8 + b] = static_cast<std::uint8_t>(counters[i] >> (8 * b));
    }
  }
  reply.counters_le = w.stats_counters;
  w.stats_tokens.clear();
  for (std::size_t s = request.first_shard;
       s < shards_.size() && w.stats_tokens.size() + 8 <= slack; ++s) {
    std::uint64_t token = 0;
    {
      LockGuard lock(shards_[s]->mu);
      token = shards_[s]->shard->last_token();
    }
    for (int b = 0; b < 8; ++b) {
      w.stats_tokens.push_back(static_cast<std::uint8_t>(token >> (8 * b)));
    }
  }
  reply.shard_tokens_le = w.stats_tokens;
}

void Dispatcher::add_shard_values(const Shard& shard,
                                  std::array<std::uint64_t, kStatCounterCount>& counters) noexcept {
  const auto& c = shard.counters();
  for (std::size_t i = 0; i < kStatCounterCount; ++i) counters[i] += c[i];
  const auto add = [&](StatCounter gauge, std::size_t value) {
    counters[static_cast<std::size_t>(gauge)] += value;
  };
  add(StatCounter::kLeases, shard.leases());
  add(StatCounter::kKeys, shard.held_keys());
  add(StatCounter::kWaiters, shard.queued_waiters());
}

void Dispatcher::add_own_values(
    std::array<std::uint64_t, kStatCounterCount>& counters) const noexcept {
  const std::int64_t now = now_ms();
  const auto set = [&](StatCounter gauge, std::int64_t value) {
    counters[static_cast<std::size_t>(gauge)] =
        static_cast<std::uint64_t>(std::max<std::int64_t>(value, 0));
  };
  set(StatCounter::kUptimeMs, now - started_ms_);
  set(StatCounter::kLockDelayLeftMs, limits_.recovering_until_ms - now);
  counters[static_cast<std::size_t>(StatCounter::kVersion)] = kPackedVersion;
  const auto add = [&](StatCounter c, const std::atomic<std::uint64_t>& value) {
    // Relaxed: statistics, with no ordering against anything else.
    counters[static_cast<std::size_t>(c)] += value.load(std::memory_order_relaxed);
  };
  add(StatCounter::kMalformed, counters_.malformed);
  add(StatCounter::kErrors, counters_.errors);
  add(StatCounter::kAuthFailures, counters_.auth_failures);
  if (options_.replicator != nullptr) {
    // Node-to-node datagrams whose seal failed: forgeries of the stream are
    // seen where forged requests are.
    counters[static_cast<std::size_t>(StatCounter::kAuthFailures)] +=
        options_.replicator->auth_failures();
  }
  add(StatCounter::kAllocationFailures, counters_.allocation_failures);
  add(StatCounter::kAmplificationDrops, counters_.amplification_drops);
  add(StatCounter::kSendDrops, counters_.send_drops);
  add(StatCounter::kRequests, counters_.requests);
  add(StatCounter::kRecovering, counters_.behind_maps);
}

void Dispatcher::fill_map(Worker& w, const Message& request, std::size_t slack, Message& reply) {
  reply.type = MessageType::kMapReply;
  std::shared_ptr<const ClusterGate> gate;
  {
    LockGuard lock(gate_mu_);
    gate = gate_;
  }
  w.map_members.clear();
  if (!gate) return;  // not a cluster node: epoch 0, no members
  reply.epoch = gate->epoch;
  reply.member_count = static_cast<std::uint32_t>(gate->members.size());
  reply.first_member = request.first_member;
  std::vector<MemberEntry> page;
  std::size_t bytes = 0;
  for (std::size_t i = request.first_member; i < gate->members.size() && page.size() < 255; ++i) {
    const ClusterGate::Member& member = gate->members[i];
    bytes += 2 + member.id.size() + 2 + member.address.size() + 4;
    if (bytes > slack) break;
    page.push_back({member.id, member.address, member.weight});
  }
  if (!encode_member_list(page, w.map_members)) page.clear();  // ids and addresses are bounded
  reply.member_list_count = static_cast<std::uint8_t>(page.size());
  reply.member_list = w.map_members;
}

void Dispatcher::fill_hot_keys(Worker& w, std::size_t slack, std::int64_t now, Message& reply) {
  reply.type = MessageType::kHotKeysReply;
  const std::int64_t window = HotKeys::window_ms(started_ms_, now, limits_.hot_key_half_life_ms);
  reply.window_ms = static_cast<std::uint32_t>(std::clamp<std::int64_t>(window, 0, UINT32_MAX));
  w.hot_keys.clear();
  for (const auto& slot : shards_) {
    LockGuard lock(slot->mu);
    slot->shard->hot_keys(now, w.hot_keys);
  }
  // The busiest first; equal counts by key, so a page reads the same twice.
  std::sort(w.hot_keys.begin(), w.hot_keys.end(), [](const HotKeyCount& a, const HotKeyCount& b) {
    return a.requests != b.requests ? a.requests > b.requests : a.key < b.key;
  });
  w.hot_key_entries.clear();
  std::size_t listed = 0;
  for (const HotKeyCount& k : w.hot_keys) {
    const HotKeyEntry entry{k.key, k.requests, k.error, k.busy, k.holders, k.waiters};
    if (listed == 0xFF || w.hot_key_entries.size() + hot_key_entry_size(entry) > slack) break;
    if (append_hot_key_entry(entry, w.hot_key_entries)) ++listed;  // keys are 1..256 bytes
  }
  reply.hot_key_count = static_cast<std::uint8_t>(listed);
  reply.hot_key_list = w.hot_key_entries;
}

void Dispatcher::publish_gate(std::shared_ptr<const ClusterGate> gate) {
  if (gate && !gate->clock) {
    // The gate decides by the clock at the decision (ClusterGate::clock).
    auto timed = std::make_shared<ClusterGate>(*gate);
    timed->clock = [clock = clock_] { return clock.now(); };
    gate = std::move(timed);
  }
  std::shared_ptr<const ClusterGate> before;
  {
    LockGuard lock(gate_mu_);
    before = gate_;
  }
  for (const auto& slot : shards_) {
    LockGuard lock(slot->mu);
    slot->shard->set_gate(gate);
    // The holders installed so far (a takeover's) go to the backups before
    // the activation mark below.
    slot->drain_journal(options_.replicator);
  }
  if (options_.replicator != nullptr && gate) {
    // A backup of a bucket this gate activates may take it over complete
    // from now on (before, a node that came back was promoted on
    // a snapshot taken before its primary activated the bucket, and then
    // waited for its whole lock-delay).
    try {
      std::vector<std::uint32_t> activated;
      for (std::size_t b = 0; b < gate->buckets.size(); ++b) {
        const bool was =
            before && b < before->buckets.size() && before->buckets[b] == ClusterGate::kActive;
        if (gate->buckets[b] == ClusterGate::kActive && !was) {
          activated.push_back(static_cast<std::uint32_t>(b));
        }
      }
      options_.replicator->activated(activated);
    } catch (const std::bad_alloc&) {
      count(counters_.allocation_failures);  // a learner then waits for its fallback
    }
  }
  const std::uint64_t epoch = gate ? gate->epoch : 0;
  LockGuard lock(gate_mu_);
  gate_ = std::move(gate);
  gate_epoch_.store(epoch, std::memory_order_relaxed);  // relaxed: see gate_epoch_
}

std::size_t Dispatcher::count_leases(const std::function<bool(std::string_view key)>& pred) const {
  std::size_t n = 0;
  for (const auto& slot : shards_) {
    LockGuard lock(slot->mu);
    n += slot->shard->count_leases(pred);
  }
  return n;
}

bool Dispatcher::needs_new_epoch() const {
  for (const auto& slot : shards_) {
    LockGuard lock(slot->mu);
    if (slot->shard->needs_new_epoch()) return true;
  }
  return false;
}

ServerStats Dispatcher::stats() const {
  ServerStats s;
  for (const auto& slot : shards_) {
    LockGuard lock(slot->mu);
    add_shard_values(*slot->shard, s.counters);
    s.shard_tokens.push_back(slot->shard->last_token());
  }
  add_own_values(s.counters);
  for (const auto& w : workers_) w->latency.add_to(s.request_latency);
  s.leases = s.counter(StatCounter::kLeases);
  s.keys = s.counter(StatCounter::kKeys);
  s.waiters = s.counter(StatCounter::kWaiters);
  s.lock_delay_left = std::chrono::milliseconds(s.counter(StatCounter::kLockDelayLeftMs));
  return s;
}

void Dispatcher::continue_many(Worker& w, const DeferredReply& d,
                               std::vector<OutDatagram>& replies) {
  const MultiAcquire& m = *d.multi;
  const std::optional<MultiAnswer> answer = many_.resume(d, now_ms(), w.deferred);
  if (!answer) return;  // queued on its next key
  w.reply.count = 0;
  w.reply.batch = false;
  w.reply.client_id = m.client;
  w.reply.request_id = m.request_id;
  Message reply;
  reply.request_id = m.request_id;
  MultiDriver::fill(*answer, w.deferred_tokens, reply);
  (void)w.reply.push(reply);
  try {
    send_reply(w, m.reply_credit, m.peer, replies);
  } catch (const std::bad_alloc&) {
    count(counters_.allocation_failures);  // lost; the retransmission gets the answer below
  }
  many_.finish(m, *answer);
}

}  // namespace shardlock::lease::internal
