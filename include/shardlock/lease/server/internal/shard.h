// Shard: one shard of the lease server's state and the state machine that
// decides every request for its keys. No sockets, no clock, no locks: the
// caller passes the time in and serialises calls (LeaseServer holds one lock
// per shard), so tests drive it directly with an injected clock.
//
// Not API: LeaseServer's building block.
//
// Shard keeps the lease table, the FIFO hand-off and the owner checks; the
// rest is in units of its own, each with a narrow interface and its own
// tests, as the timer wheel, the dedup cache and the hot-key sketch are:
//   * watch_registry.h: the parked WATCHes; it reads the table through two
//     callbacks (a key's version, a HOLDERS_REPLY summary) and the shard
//     tells it which keys changed (touch()) and when to answer (wake()).
//   * multi_acquire.h: an ACQUIRE_MANY as the Dispatcher and the shards see
//     it, and the stalled list of its steps; the part operations (probe()
//     and the rest, below) are the table's, in shard_cluster.cc.
//   * replication_journal.h: the entries of replicated holders changed,
//     for the streams (take_journal()), and the entries of snapshots.
//   * client_usage.h: what each client holds, queues and parks here, and
//     the per-client bounds.
//   * shard_reply.h: the request path's RequestContext (client, peer,
//     request, key and hash, fingerprint, reply credit, time) and
//     ShardReply, the one builder every decision answers through: it fills
//     the reply, counts the outcome and remembers it (the answer log).
//   * deferred_reply.h: the answers decided later (hand-offs, timeouts,
//     woken WATCHes) and the steps handed back to the Dispatcher.
// shard.cc holds the request path and the table, shard_watch.cc the
// shard's side of WATCH, shard_cluster.cc the gate, tokens in epochs,
// replication, the hot-key rows and the ACQUIRE_MANY parts.
//
// State
//   * keys_: key -> KeyState { holders (each: client id, token, mode, grant
//     request id, its own expiry timer), FIFO list of waiters, and the
//     permit limit of a semaphore key (0 for a lock key) }. A key is present
//     only while it has a holder; waiters exist only behind holders.
//   * tokens_: the shard's strictly increasing counter (token_store.h).
//   * wheel_: one timer per holder (expiry), per waiter (wait_ms) and per
//     parked WATCH (the registry's).
//   * answers_: (client id, request id) -> the answer given, FIFO-bounded, so
//     a retransmitted ACQUIRE / RENEW / RELEASE gets the identical answer and
//     a retransmitted queued ACQUIRE is not queued twice. Each entry keeps a
//     fingerprint of the request's type and key: a client that reuses a
//     request id for a different request gets ERROR(kRequestIdReused), never
//     the other request's answer (which could be a GRANTED for another key).
//
// Lease kinds (protocol.h): a lock key has one exclusive holder or any
// number of shared holders; a semaphore key (ACQUIRE_PERMIT) has at most
// `permits` holders, the limit fixed by the acquirer that found it idle.
// Waiters are served strictly from the front of the key's FIFO, each when
// its mode fits the holders (exclusive: none; shared: no exclusive one;
// permit: fewer than the limit), so a request never overtakes an earlier
// one: a shared ACQUIRE behind a queued exclusive one waits for it. A new
// ACQUIRE is granted at once only when nobody waits and its mode fits.
//
// Multi-key (ACQUIRE_MANY) parts: the Dispatcher takes a request's keys in
// the global order (shard, hash, key) through probe() / take() / queue(),
// holding the locks of every shard involved. A part taken before the
// request completes is a pending holder that only the request's completion
// (confirm()) or abandonment (abandon()) changes; a queued part is a waiter
// like any other, and its hand-off or timeout is a DeferredReply carrying
// the request (DeferredReply::multi) for the Dispatcher to continue.
//
// A holder's requests apply in request-id order: KeyState keeps the newest
// applied id, and an older RENEW (a late duplicate, a replay) is answered
// RENEWED with the time left and moves nothing; an older ACQUIRE by the
// holder gets BUSY. A newer ACQUIRE by the holder is a new grant with a new
// token, so no two grants share a token. Deadlines are rounded up from the
// millisecond clock, and the ttl left reported is rounded down.
//
// Owner checks (RENEW, RELEASE):
//   * no live lease on the key                   -> EXPIRED
//   * a holder with this token and client id     -> ok (that holder)
//   * a pending holder's token (not a lease yet) -> NOT_OWNER
//   * any other token up to the newest granted on the key -> EXPIRED (a
//     lease that ended or was superseded; this is what a late retransmission
//     sees, so it is never a false NOT_OWNER, even when the lease that ended
//     was newer than the shared holders still there)
//   * otherwise                                  -> NOT_OWNER
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shardlock/lease/server/internal/client_usage.h"
#include "shardlock/lease/server/internal/cluster_gate.h"
#include "shardlock/lease/server/internal/deferred_reply.h"
#include "shardlock/lease/server/internal/grant_log.h"
#include "shardlock/lease/server/internal/hot_keys.h"
#include "shardlock/lease/server/internal/multi_acquire.h"
#include "shardlock/lease/server/internal/replication.h"
#include "shardlock/lease/server/internal/replication_journal.h"
#include "shardlock/lease/server/internal/shard_counters.h"
#include "shardlock/lease/server/internal/shard_reply.h"
#include "shardlock/lease/server/internal/tenant_usage.h"
#include "shardlock/lease/server/internal/timer_wheel.h"
#include "shardlock/lease/server/internal/token_store.h"
#include "shardlock/lease/server/internal/watch_registry.h"
#include "shardlock/lease/wire/internal/peer.h"
#include "shardlock/lease/wire/internal/string_key.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease::internal {

struct ShardLimits {
  std::uint32_t max_ttl_ms = 60'000;
  std::uint32_t max_wait_ms = 300'000;
  std::size_t dedup_capacity = 4096;
  // ACQUIRE answers RECOVERING while now < recovering_until_ms.
  std::int64_t recovering_until_ms = 0;
  // Bounds on this shard's memory. A request past one is answered
  // ERROR(kLimitExceeded) and counted in kLimitRejections. LeaseServer passes
  // each server-wide limit divided over the shards (see server.h).
  std::size_t max_keys = SIZE_MAX;                // leases held (each holder counts)
  std::size_t max_waiters = SIZE_MAX;             // queued ACQUIREs, all keys
  std::size_t max_waiters_per_key = SIZE_MAX;     // queued ACQUIREs on one key
  std::size_t max_leases_per_client = SIZE_MAX;   // keys one client id holds here
  std::size_t max_waiters_per_client = SIZE_MAX;  // ACQUIREs one client id has queued here
  std::size_t max_watches = SIZE_MAX;             // parked WATCHes, all keys
  std::size_t max_watches_per_key = SIZE_MAX;     // parked WATCHes on one key
  std::size_t max_watches_per_client = SIZE_MAX;  // WATCHes one client id has parked here
  // Under a tenant file: the server's per-tenant usage and bounds, shared by
  // its shards (tenant_usage.h); nullptr otherwise. Outlives the shard.
  TenantUsage* tenant_usage = nullptr;
  // Seeds every hash of remote input in the shard (key table, dedup index,
  // per-client tables); LeaseServer draws it from getrandom() at start.
  std::uint64_t hash_seed = 0;
  // The highest token an earlier run on the data dir may have issued
  // (TokenStore::token_floor()). In cluster mode nothing is granted in an
  // epoch at or below token_floor >> 32: every token composed there could
  // be at or below it (RECOVERING, and needs_new_epoch()).
  std::uint64_t token_floor = 0;
  // The busiest keys' sketch (hot_keys.h): slots per shard (0: none, HOT_KEYS
  // answers no keys) and its half-life (0: no decay), counted from the
  // shard's creation (every shard of a server is made at one now_ms).
  std::size_t hot_keys = 16;
  std::int64_t hot_key_half_life_ms = HotKeys::kDefaultHalfLifeMs;
};

// One of a shard's busiest keys (Shard::hot_keys()), with what it holds now.
struct HotKeyCount {
  std::string key;
  std::uint32_t requests = 0;  // HotKeys::Entry's
  std::uint32_t error = 0;
  std::uint32_t busy = 0;
  std::uint32_t holders = 0;  // now
  std::uint32_t waiters = 0;  // now
};

// Where the holder entries of a QUERY_HOLDERS answer go: as many as `room`
// bytes hold, appended to `entries`, which the HOLDERS_REPLY's holder_list
// views. The caller keeps it (and its capacity) across requests.
struct HolderPage {
  std::size_t room = 0;
  std::vector<std::uint8_t> entries;
};

class Shard {
 public:
  Shard(std::uint32_t index, const ShardLimits& limits, ShardTokens tokens, std::int64_t now_ms);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  // Decides `request` from `client` (answers go to `peer`) at `now_ms`.
  // Returns true with `reply` filled (its key views request.key) when there
  // is an answer now; false when the request was queued, or is a
  // retransmission of one still queued. Answers that this request triggers
  // for other clients (FIFO hand-off) are appended to `deferred`. STATS is
  // not a shard request (LeaseServer answers it). A queued request's later
  // answer carries `reply_credit` (DeferredReply::reply_credit).
  // `key_hash` is key_hash(request.key), computed once by the caller (which
  // also picks the shard with it) and used for every lookup here.
  // QUERY_HOLDERS lists the key's holders (oldest grant first, from
  // request.first_holder) into `page`; without one it answers the totals
  // alone. WATCH (protocol.h, "Watches") is answered at once, its newest
  // holders in `page` as far as page->room leaves room, when the key's
  // version differs from the request's or it does not wait; otherwise it is
  // parked (false), and its answer comes later through `deferred`.
  bool handle(const ClientId& client, const Peer& peer, const Message& request,
              std::uint64_t key_hash, std::int64_t now_ms, Message& reply,
              std::vector<DeferredReply>& deferred, std::uint16_t reply_credit = kMaxDatagramSize,
              HolderPage* page = nullptr);
  // The same, hashing the key here.
  bool handle(const ClientId& client, const Peer& peer, const Message& request, std::int64_t now_ms,
              Message& reply, std::vector<DeferredReply>& deferred,
              std::uint16_t reply_credit = kMaxDatagramSize, HolderPage* page = nullptr) {
    return handle(client, peer, request, key_hash(request.key), now_ms, reply, deferred,
                  reply_credit, page);
  }

  // Appends this shard's busiest keys (its sketch's slots, decayed to
  // `now_ms`), each with its holders and waiters now, to `out`, in no order.
  // Copies the keys: may throw std::bad_alloc.
  void hot_keys(std::int64_t now_ms, std::vector<HotKeyCount>& out);

  // The hash handle() expects for `key`: hash_key() under ShardLimits::hash_seed.
  [[nodiscard]] std::uint64_t key_hash(std::string_view key) const noexcept {
    return hash_key(key, limits_.hash_seed);
  }

  // Fires every expiry and wait timeout due by `now_ms`, and answers the
  // parked WATCHes of every key whose version changed since the last call
  // (ACQUIRE_MANY's take() and confirm(), and inherit(), change keys
  // without a `deferred` to answer into: their watchers hear at the next
  // advance(), which the server's tick drives while any WATCH is parked).
  void advance(std::int64_t now_ms, std::vector<DeferredReply>& deferred);

  // ---- ACQUIRE_MANY parts (see the top of this file) ----
  // kRedirect, kNotReady: the cluster gate refuses the key (gate()).
  enum class PartState { kFree, kBusy, kKindMismatch, kLimit, kRedirect, kNotReady };
  // Whether `part` of `m` could be taken now (firing due timers first);
  // kBusy sets `ttl_left` to the longest a holder has left.
  PartState probe(const MultiAcquire& m, const MultiAcquire::Part& part, std::int64_t now_ms,
                  std::uint32_t& ttl_left, std::vector<DeferredReply>& deferred);
  // The bound behind probe()'s kLimit for `m`: kLimitExceeded (the shard's
  // or the client's) or the tenant's own code (is_limit_exceeded()).
  [[nodiscard]] WireError part_limit(const MultiAcquire& m) const noexcept {
    return hold_refusal(m.client).value_or(WireError::kLimitExceeded);
  }
  // Whether the request `m` (its client and request id) already took `part`
  // in an earlier execution, as a single key's holder record tells (firing
  // due timers first): kThisRequest when a lease of its client was granted
  // by this very request id (a retransmission past the answer table; sets
  // `token` and `ttl_left`), kStale when the client applied a newer request
  // on the key since (sets `ttl_left`), else kNone.
  enum class PriorGrant { kNone, kThisRequest, kStale };
  PriorGrant prior_grant(const MultiAcquire& m, const MultiAcquire::Part& part, std::int64_t now_ms,
                         std::uint64_t& token, std::uint32_t& ttl_left,
                         std::vector<DeferredReply>& deferred);
  // Takes a part probe() found free: a pending holder until the request's
  // wait deadline plus its TTL. Returns its token, or 0 when none could be
  // issued (last_error()). May throw std::bad_alloc, with nothing changed.
  std::uint64_t take(const MultiAcquire& m, MultiAcquire::Part& part, std::int64_t now_ms);
  // Queues `m` for a busy part until m.wait_deadline_ms; nullopt when
  // queued, else the bound that refuses it (queue_refusal()). May throw
  // std::bad_alloc, with nothing changed.
  std::optional<WireError> queue(MultiAcquire& m, std::size_t part, std::int64_t now_ms);
  // The request completed: its pending holder of `part` becomes a lease
  // expiring TTL after `now_ms`.
  void confirm(const MultiAcquire& m, const MultiAcquire::Part& part, std::int64_t now_ms);
  // The request failed: its pending holder of `part` goes, handing off.
  void abandon(const MultiAcquire& m, const MultiAcquire::Part& part, std::int64_t now_ms,
               std::vector<DeferredReply>& deferred);
  [[nodiscard]] const ShardLimits& limits() const noexcept { return limits_; }
  // Whether `key` (of this shard) may be granted now: the gate's verdict,
  // kGrant without a gate.
  [[nodiscard]] ClusterGate::Verdict verdict(std::string_view key,
                                             std::int64_t now_ms) const noexcept {
    return gate_verdict(key, now_ms);
  }

  // ---- Cluster mode (cluster_gate.h) ----
  // From now on every grant and renew (ACQUIREs of all kinds, RENEW, waiters
  // handed a key, ACQUIRE_MANY parts) and every QUERY asks `gate` first; a
  // refusal is answered REDIRECT or RECOVERING and changes nothing. Tokens
  // are then compose_token(gate->epoch, counter), the counter counting from
  // 1 again in each epoch (still drawn from the durable per-shard counter,
  // so it only rises). Null: a single node, tokens are the bare counter.
  // An ACQUIRE_MANY waiting here with a key `gate` gives to another node
  // can never complete here, and its pending holds would keep the hand-off
  // of that bucket waiting: its wait ends at the next advance(), answered
  // REDIRECT (the Dispatcher then releases every part it took).
  void set_gate(std::shared_ptr<const ClusterGate> gate) noexcept;
  [[nodiscard]] const ClusterGate* gate() const noexcept { return gate_.get(); }
  // Fills `reply` with the REDIRECT or RECOVERING of a gate's refusal
  // `verdict`, and counts it. Precondition: gate() is set.
  void refuse_by_gate(ClusterGate::Verdict verdict, Message& reply) noexcept;
  // Whether the shard cannot grant in the gate's epoch until the cluster
  // publishes a newer one: the low half of the tokens ran out in it, or it
  // is at or below the data dir's token floor (ShardLimits::token_floor).
  [[nodiscard]] bool needs_new_epoch() const noexcept {
    if (!gate_) return false;
    return (counter_exhausted_ && gate_->epoch == token_epoch_) || below_floor(*gate_);
  }
  // Leases (holders, pending ones included) on keys for which `pred(key)`
  // is true: the hand-off's count of leases left in buckets given away.
  [[nodiscard]] std::size_t count_leases(
      const std::function<bool(std::string_view key)>& pred) const;
  // ACQUIRE_MANY steps that could not be handed out for want of memory (see
  // MultiAcquire::next_stalled); the Dispatcher takes them on its tick, and
  // puts one back with stall() if it still cannot.
  [[nodiscard]] bool has_stalled() const noexcept { return !stalled_.empty(); }
  [[nodiscard]] MultiAcquire* take_stalled() noexcept { return stalled_.take(); }
  void stall(MultiAcquire& m, MessageType step) noexcept { stalled_.stall(m, step); }
  // Counts a multi-key request's outcome in this shard's counters.
  void count_outcome(StatCounter c) noexcept { count(c); }
  // Records a request for `key` (of this shard; hash `key_hash`) in the
  // hot-key sketch, as handle() does its own: ACQUIRE_MANY's keys.
  void note_request(std::uint64_t key_hash, std::string_view key, bool busy,
                    std::int64_t now_ms) noexcept {
    hot_keys_.record(key_hash, key, busy, now_ms);
  }

  // ---- Replication (docs/cluster.md, "Replication") ----------------------
  // Under a gate that marks a key's bucket replicated, every holder added
  // (a grant, a hand-off, a part of an ACQUIRE_MANY) or dropped (released,
  // expired, abandoned) is journaled as a replication::Entry, in the order
  // it happened. The caller moves the journal into the replication streams
  // under this shard's lock, so entries of one key reach the backups in
  // order.
  void take_journal(std::vector<replication::Entry>& out);
  // An entry could not be journaled (no memory): the backups may miss a
  // holder, so the caller starts the streams of the node over, with
  // snapshots, before it answers another grant. Cleared by take_journal().
  [[nodiscard]] bool journal_lost() const noexcept { return journal_.lost(); }
  [[nodiscard]] bool journal_pending() const noexcept { return journal_.pending(); }
  // Appends a kGrant entry for every live holder, each naming its key's
  // bucket, for snapshots (one pass serves many buckets). The bucket comes
  // from the gate's routing or, under a gate without one (closed: a node
  // that registered again keeps its holders), from the last routing the
  // shard had: the cluster's buckets are the same in every map. False, and
  // nothing appended, when holders exist and no routing ever did: such a
  // snapshot would be incomplete, and must not be marked caught up.
  [[nodiscard]] bool snapshot_all(std::vector<replication::Entry>& out) const;
  // Takes over a holder a backup replicated (the takeover): it holds `key`
  // until `expiry_ms`, and the granting ACQUIRE's retransmission is
  // answered with the same grant. A holder already there (same owner and
  // token) keeps the later expiry. False, changing nothing, when the key's
  // holders cannot admit it (another kind of lease, or an exclusive holder
  // beside others): a replica never holds such a set.
  bool inherit(std::string_view key, const replication::ReplicaHolder& holder,
               std::int64_t expiry_ms);

  // Every grant, hand-off, release, expiry and abandonment from now on is
  // recorded in `log` (grant_log.h; not owned, outlives the shard); null:
  // none (the default).
  void set_grant_log(GrantLog* log) noexcept { grant_log_ = log; }

  [[nodiscard]] std::uint32_t index() const noexcept { return index_; }
  // The now_ms it was made at: the origin of its sketch's halvings.
  [[nodiscard]] std::int64_t created_ms() const noexcept { return hot_keys_.origin_ms(); }
  [[nodiscard]] std::uint64_t last_token() const noexcept { return tokens_.last(); }
  [[nodiscard]] const std::array<std::uint64_t, kStatCounterCount>& counters() const noexcept {
    return counters_.values();
  }
  [[nodiscard]] std::size_t held_keys() const noexcept { return keys_.size(); }
  [[nodiscard]] std::size_t leases() const noexcept { return leases_; }
  [[nodiscard]] std::size_t queued_waiters() const noexcept { return waiter_index_.size(); }
  [[nodiscard]] std::size_t parked_watches() const noexcept { return watches_.size(); }
  // Client ids with a lease held or an ACQUIRE queued here.
  [[nodiscard]] std::size_t tracked_clients() const noexcept { return usage_.clients(); }
  [[nodiscard]] std::size_t timers() const noexcept { return wheel_.size(); }
  // Waiter nodes kept for reuse (see spare_waiters_).
  [[nodiscard]] std::size_t spare_waiters() const noexcept { return spare_waiters_.size(); }
  static constexpr std::size_t kMaxSpareWaiters = 4096;
  // Why the last token reservation failed (ERROR(kInternal) answers).
  [[nodiscard]] const std::string& last_error() const noexcept { return last_error_; }

 private:
  enum TimerKind : std::uint8_t {
    kLeaseExpiry = 1,
    kWaitTimeout = 2,
    kWatchTimeout = WatchRegistry::kTimerKind,
  };
  struct KeyState;
  struct Waiter : TimerNode {
    ClientId client;
    std::uint64_t request_id = 0;
    Peer peer;
    std::uint32_t ttl_ms = 0;
    LeaseMode mode = LeaseMode::kExclusive;
    std::uint64_t fingerprint = 0;   // of its ACQUIRE, for the answer remembered later
    std::uint16_t reply_credit = 0;  // DeferredReply::reply_credit of its answer
    std::string value;               // its ACQUIRE's holder value, moved to the holder
    MultiAcquire* multi = nullptr;   // set for a part of an ACQUIRE_MANY
    std::size_t part = 0;            // which part of `multi`
    KeyState* state = nullptr;
    std::list<Waiter>::iterator self;
  };
  // One lease on a key; the node is its expiry timer.
  struct Holder : TimerNode {
    ClientId owner;
    std::uint64_t token = 0;
    std::uint64_t request_id = 0;  // of the ACQUIRE that was granted
    // The holder's newest applied request id: the grant's, then each applied
    // RENEW's. A holder's request at or below it (other than the granting
    // ACQUIRE itself) is stale and changes nothing.
    std::uint64_t last_request_id = 0;
    LeaseMode mode = LeaseMode::kExclusive;
    // Taken for an ACQUIRE_MANY that has not completed: no RENEW or RELEASE
    // applies to it until confirm().
    bool pending = false;
    // What the granting ACQUIRE attached (kItemFlagValue), at most
    // kMaxHolderValueLength bytes; renewals keep it. Replicated with the grant.
    std::string value;
    KeyState* state = nullptr;
    std::list<Holder>::iterator self;
  };
  struct KeyState {
    const HashedKey* key = nullptr;  // the map's key, stable for the node's life
    std::uint32_t permits = 0;       // a semaphore key's limit; 0 for a lock key
    // The newest token granted on the key since it entered keys_, held or
    // not: a token at or below it that no holder has is a lease that ended.
    std::uint64_t newest_token = 0;
    std::list<Holder> holders;  // oldest grant first
    std::list<Waiter> waiters;
    [[nodiscard]] bool exclusive() const noexcept {
      return !holders.empty() && holders.front().mode == LeaseMode::kExclusive;
    }
  };
  // The lease table as the watch registry reads it (watch_registry.h).
  class WatchedTable final : public WatchedKeys {
   public:
    explicit WatchedTable(const Shard& shard) noexcept : shard_(shard) {}
    [[nodiscard]] KeyVersion version(const KeyRef& key) const noexcept override;
    void describe(const KeyRef& key, std::size_t room, std::int64_t now_ms,
                  std::vector<std::uint8_t>& entries, Message& summary) const override;

   private:
    const Shard& shard_;
  };
  enum class OwnerCheck { kOk, kExpired, kNotOwner };

  void count(StatCounter c) noexcept { counters_.count(c); }
  // handle() but for the sketch, which handle() feeds the outcome.
  void answer(const RequestContext& ctx, ShardReply& out, std::vector<DeferredReply>& deferred,
              HolderPage* page);
  // The error that makes `request` invalid, if any.
  [[nodiscard]] std::optional<WireError> invalid(const Message& request) const noexcept;
  // A retransmission of a RENEW, RELEASE or ACQUIRE answered before (or
  // still queued): answered as before (true), or a new request (false).
  bool replay(const RequestContext& ctx, ShardReply& out) noexcept;
  // The gate's verdict on `key` now: kGrant without a gate.
  [[nodiscard]] ClusterGate::Verdict gate_verdict(std::string_view key,
                                                  std::int64_t now_ms) const noexcept {
    if (!gate_) return ClusterGate::Verdict::kGrant;
    const ClusterGate::Verdict verdict = gate_->check(key, now_ms);
    if (verdict == ClusterGate::Verdict::kGrant && below_floor(*gate_)) {
      return ClusterGate::Verdict::kNotReady;
    }
    return verdict;
  }
  // Whether the gate gives some key of `m` to another node.
  [[nodiscard]] bool lost_a_key(const MultiAcquire& m) const noexcept;
  // Whether `gate` is a map whose epoch could compose tokens at or below
  // the token floor.
  [[nodiscard]] bool below_floor(const ClusterGate& gate) const noexcept {
    return gate.routing != nullptr && floor_epoch_ != 0 && gate.epoch <= floor_epoch_;
  }
  // The next token (composed with the gate's epoch in cluster mode), or 0
  // with last_error_ set.
  std::uint64_t issue_token();
  KeyState* find_live(const KeyRef& key, std::int64_t now_ms, std::vector<DeferredReply>& deferred);
  // The holder RENEW/RELEASE with `token` from `client` acts on (set with kOk).
  static OwnerCheck check_owner(KeyState* state, const ClientId& client, std::uint64_t token,
                                Holder*& holder) noexcept;
  // handle() past validation, lock-delay and the dedup cache; may throw
  // std::bad_alloc, with the shard unchanged.
  void decide(const RequestContext& ctx, ShardReply& out, std::vector<DeferredReply>& deferred,
              HolderPage* page);
  // RENEW or RELEASE of a lease on `state` (null: free).
  void renew_or_release(const RequestContext& ctx, KeyState* state, ShardReply& out,
                        std::vector<DeferredReply>& deferred);
  // How `state`'s holders hold it (QUERY_REPLY's and HOLDERS_REPLY's mode).
  [[nodiscard]] static LeaseMode key_mode(const KeyState& state) noexcept;
  // QUERY_REPLY for `state` (null: free).
  static void query(const KeyState* state, std::int64_t now_ms, Message& reply) noexcept;
  // HOLDERS_REPLY for `request` on `state` (null: free); see handle().
  static void list_holders(const KeyState* state, const Message& request, std::int64_t now_ms,
                           HolderPage* page, Message& reply);
  // An ACQUIRE of any single-key kind, its key held as `state` (null when
  // free): answered, or parked when queued.
  void acquire(const RequestContext& ctx, KeyState* state, ShardReply& out);
  // Whether `ctx`'s client is a holder of `state` that this ACQUIRE is a
  // retransmission or a stale copy of: answered then (see acquire()).
  bool answer_holder(const RequestContext& ctx, const KeyState& state, ShardReply& out) noexcept;
  // Whether a new holder in `mode` fits `state`'s holders now (waiters aside).
  [[nodiscard]] static bool fits(const KeyState& state, LeaseMode mode) noexcept;
  // Whether `mode` with `permits` may use `state` at all (lock vs semaphore).
  [[nodiscard]] static bool same_kind(const KeyState& state, LeaseMode mode,
                                      std::uint32_t permits) noexcept;
  // The bound that keeps `client` from one more lease here (the shard's,
  // its own, its tenant's: ClientUsage::lease_refusal()), or nullopt.
  [[nodiscard]] std::optional<WireError> hold_refusal(const ClientId& client) const noexcept {
    if (leases_ >= limits_.max_keys) return WireError::kLimitExceeded;
    return usage_.lease_refusal(client);
  }
  [[nodiscard]] bool may_hold(const ClientId& client) const noexcept {
    return !hold_refusal(client);
  }
  // The bound that keeps `client` from queueing one more ACQUIRE on
  // `state`, or nullopt.
  [[nodiscard]] std::optional<WireError> queue_refusal(const ClientId& client,
                                                       const KeyState& state) const noexcept {
    if (waiter_index_.size() >= limits_.max_waiters ||
        state.waiters.size() >= limits_.max_waiters_per_key) {
      return WireError::kLimitExceeded;
    }
    return usage_.waiter_refusal(client);
  }
  // A new key entry, held by nobody yet. May throw; nothing changed then.
  KeyState& add_key(const KeyRef& key, LeaseMode mode, std::uint32_t permits);
  // A new token, or 0 with `out` answered ERROR(kInternal).
  std::uint64_t next_token(ShardReply& out);
  // A holder node at the back of `state`'s holders, counted in leases_ and
  // the client's usage: a spare node when there is one. May throw, with
  // nothing changed.
  Holder& add_holder(KeyState& state, const ClientId& client);
  // add_holder() on `state`, or on a new entry for `key` (`mode`, `permits`)
  // when null, which a throw then takes away: nothing changed.
  Holder& new_holder(KeyState* state, const KeyRef& key, LeaseMode mode, std::uint32_t permits,
                     const ClientId& client);
  // Sets `h` to hold with `token` until now + ttl.
  // `event`: what the grant log calls it (a grant or a hand-off).
  void hold(Holder& h, std::uint64_t request_id, std::uint64_t token, LeaseMode mode,
            std::uint32_t ttl_ms, std::int64_t now_ms,
            LeaseEvent event = LeaseEvent::kGrant) noexcept;
  // hold() for the ACQUIRE of `ctx`, answered GRANTED and remembered; `h`
  // takes `value` (request.value, copied by the caller before any change, so
  // this never allocates).
  void grant(Holder& h, const RequestContext& ctx, LeaseMode mode, std::uint64_t token,
             std::string&& value, ShardReply& out) noexcept;
  // `h` is gone (release, expiry, abandonment): serve the waiters it was
  // keeping out, and forget the key if nobody holds it then.
  void drop_holder(Holder& h, std::int64_t now_ms, std::vector<DeferredReply>& deferred,
                   LeaseEvent event = LeaseEvent::kRelease);
  void log_event(LeaseEvent event, const Holder& h, std::uint32_t ttl_ms,
                 std::int64_t now_ms) const noexcept;
  // Grants waiters from the front of `state`'s queue while each fits; forgets
  // the key when it ends with no holder.
  void serve_waiters(KeyState& state, std::int64_t now_ms, std::vector<DeferredReply>& deferred);
  // Hands the key to `w`, the front waiter of `state`, which fits: a holder
  // now, or (no token or no memory) answered ERROR. Never throws.
  void hand_off(KeyState& state, Waiter& w, std::int64_t now_ms,
                std::vector<DeferredReply>& deferred);
  void erase(KeyState& state);
  // A waiter node at the back of state's queue: a spare one spliced over when
  // there is one (no allocation), a new one otherwise. Fields are the caller's
  // to set.
  Waiter& new_waiter(KeyState& state);
  // Moves a waiter whose timer is cancelled out of state's queue into the
  // spares (or frees it when kMaxSpareWaiters are already kept).
  void retire_waiter(KeyState& state, std::list<Waiter>::iterator waiter);
  // Queues `client`'s request on `state`, all allocation first. May throw,
  // with nothing changed.
  Waiter& enqueue(KeyState& state, const ClientId& client, std::uint64_t request_id);
  void on_timer(TimerNode& node, std::int64_t now_ms, std::vector<DeferredReply>& deferred);
  // Appends an answer for waiter `w` of `state` to `deferred`. Never throws:
  // without memory the answer is not sent (it is remembered; the waiter's
  // retransmission gets it), and the failure is counted.
  void defer(const Waiter& w, const KeyState& state, MessageType type, std::uint64_t token,
             std::vector<DeferredReply>& deferred) noexcept;
  // Remembers `answer` for waiter `w` of a single-key ACQUIRE (a part of an
  // ACQUIRE_MANY is the Dispatcher's to answer).
  void remember(const Waiter& w, RememberedAnswer answer) noexcept {
    if (w.multi != nullptr) return;
    answer.fingerprint = w.fingerprint;
    answers_.remember(w.client, w.request_id, answer);
  }

  // ---- WATCH (protocol.h, "Watches"; the parked ones are watches_') ----
  [[nodiscard]] static KeyVersion version_of(const KeyState* state) noexcept;
  // WATCH past validation and the gate: answered now, or parked.
  void watch(const RequestContext& ctx, const KeyState* state, ShardReply& out, HolderPage* page);
  // HOLDERS_REPLY's fields for `state` (null: free) with its newest holders
  // that fit `room` bytes appended to `entries` (a tail page); the holder
  // list is left for the caller to point at `entries`.
  static void list_newest(const KeyState* state, std::size_t room, std::int64_t now_ms,
                          std::vector<std::uint8_t>& entries, Message& reply);
  // The version of `state`'s key may have changed. Never throws.
  void touch(const KeyState& state) noexcept {
    watches_.touch(KeyRef{state.key->text, state.key->hash});
  }
  // Whether the gate gives `key` to another node.
  [[nodiscard]] bool foreign(std::string_view key) const noexcept;
  // The deadline of a lease granted or renewed for `ttl_ms` at `now_ms`,
  // rounded up (see shard.cc), and the time surely left of one.
  [[nodiscard]] static std::int64_t deadline_for(std::int64_t now_ms,
                                                 std::uint32_t ttl_ms) noexcept;
  [[nodiscard]] static std::uint32_t ttl_left(const Holder& h, std::int64_t now_ms) noexcept;
  // The longest any holder of `state` has left.
  [[nodiscard]] static std::uint32_t ttl_left(const KeyState& s, std::int64_t now_ms) noexcept;
  // The pending holder `m` took for `part`.
  Holder* pending_holder(const MultiAcquire& m, const MultiAcquire::Part& part);

  // ---- Replication (the journal is journal_) ----
  // Journals a holder added (kGrant) or dropped (kRelease), when the key's
  // bucket is replicated. Never throws (see journal_lost()).
  void journal(replication::EntryKind kind, const Holder& h, std::uint32_t ttl_ms) noexcept {
    if (!ReplicationJournal::replicates(gate_.get())) return;
    if (!journal_.record(*gate_, kind, journaled(h), ttl_ms)) {
      count(StatCounter::kAllocationFailures);
    }
  }
  // What a journal entry of `h` carries.
  [[nodiscard]] static JournaledHolder journaled(const Holder& h) noexcept {
    return JournaledHolder{.key = h.state->key->text,
                           .owner = h.owner,
                           .token = h.token,
                           .request_id = h.request_id,
                           .mode = h.mode,
                           .permits = h.state->permits,
                           .value = h.value};
  }

  std::uint32_t index_;
  GrantLog* grant_log_ = nullptr;  // set_grant_log()
  ShardLimits limits_;
  ShardTokens tokens_;
  std::shared_ptr<const ClusterGate> gate_;
  // The routing of the last gate that had one (snapshot_all()).
  std::shared_ptr<const RouterSnapshot> last_routing_;
  ReplicationJournal journal_;
  // token_floor >> 32: the highest epoch that could compose a token at or
  // below the data dir's floor.
  std::uint64_t floor_epoch_ = 0;
  // The epoch of the last composed token (its counter base is tokens_'s).
  std::uint64_t token_epoch_ = 0;
  bool counter_exhausted_ = false;  // in token_epoch_
  ShardCounters counters_;
  TimerWheel wheel_;
  std::unordered_map<HashedKey, KeyState, HashedKeyHash, HashedKeyEqual> keys_;
  // Unused waiter and holder nodes. std::list::splice moves a node between
  // lists without allocating, so queueing and granting reuse nodes in steady
  // state.
  std::list<Waiter> spare_waiters_;
  std::list<Holder> spare_holders_;
  std::size_t leases_ = 0;  // holders over all keys
  StalledSteps stalled_;
  AnswerLog answers_;
  // Every queued waiter by (client id, request id), so a retransmitted
  // ACQUIRE still queued is found in O(1), however long the queue.
  std::unordered_map<RequestKey, Waiter*, SeededHash> waiter_index_;
  ClientUsage usage_;
  // After wheel_, usage_ and keys_: its destructor cancels its timers.
  WatchedTable watched_table_{*this};
  WatchRegistry watches_;
  std::string last_error_;
  HotKeys hot_keys_;  // every keyed request (note_request()), and whether it was answered BUSY
};

}  // namespace shardlock::lease::internal
