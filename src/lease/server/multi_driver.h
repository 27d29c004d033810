// MultiDriver: ACQUIRE_MANY across the shards of its keys, for the
// Dispatcher (dispatcher.h). No sockets: it decides, the Dispatcher sends.
//
// An ACQUIRE_MANY's keys are sorted into the global order (shard index,
// key hash, key) and every step runs with the locks of all its shards,
// taken in ascending shard order (as lock_many() takes stripes), so a step
// is atomic with respect to every other request on those keys:
//   * first, every key is probed: all free -> all taken and confirmed
//     (GRANTED_MANY); a kind mismatch or a limit -> ERROR; otherwise, with
//     no wait, BUSY_MANY naming the first busy key, and nothing was taken;
//   * with a wait, the free keys before the first busy one are taken as
//     pending holds and the request queues on that key. Its hand-off (a
//     DeferredReply with `multi`) continues the walk from there; its
//     timeout, or an error, abandons every pending hold.
// A request waits on one key at a time and holds only keys before it in
// the global order, so no two requests wait for each other in a cycle.
// In-progress requests and recent answers live in a table of their own
// (mu_, never held with a shard lock), so a retransmission is not taken
// twice and gets the answer given.
//
// Threading: any number of threads at once; a shard's state is only
// touched under its lock.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "server/shard_slot.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lease/server/internal/dedup_cache.h"
#include "shardlock/lease/server/internal/shard.h"
#include "shardlock/lease/server/internal/shard_counters.h"
#include "shardlock/lease/wire/internal/peer.h"
#include "shardlock/lease/wire/protocol.h"
#include "shardlock/mutex.h"

namespace shardlock::lease::internal {

// An ACQUIRE_MANY's answer: how it ended, kept for retransmissions.
struct MultiAnswer {
  // kGrantedMany, kBusyMany, kTimeout, kError; kRedirect and kRecovering
  // (the cluster gate refused a key, or the lock-delay runs), remembered
  // too: the client asks again under a fresh request id.
  MessageType type = MessageType::kError;
  std::uint32_t ttl_ms = 0;  // kGrantedMany, kBusyMany; retry_after_ms for kRecovering
  std::uint64_t epoch = 0;   // kRedirect
  std::uint8_t index = 0;    // kBusyMany
  WireError error = WireError::kInternal;
  std::uint8_t count = 0;  // tokens, in the request's key order
  std::array<std::uint64_t, kMaxKeysPerRequest> tokens{};
  std::uint64_t fingerprint = 0;  // of the request (mode, ttl-free: its keys in order)
};

class MultiDriver {
 public:
  // What the driver works on, all owned by the Dispatcher and outliving
  // the driver: the shards (filled before the first request), shard 0's
  // limits, the key seed, the replicator (null: none) each shard's journal
  // is drained into as its lock is released, the log, the counters.
  struct Env {
    const ShardSlots& shards;
    const ShardLimits& limits;
    std::uint64_t key_seed = 0;
    Replicator* replicator = nullptr;
    const std::function<void(std::string_view)>& log;
    DispatchCounters& counters;
  };
  explicit MultiDriver(Env env);

  // ACQUIRE_MANY `m` of `owner`: false when it was queued (or is already in
  // progress), else `reply` is the answer, its tokens in `tokens`.
  bool acquire(const ClientId& owner, const Peer& peer, const Message& m, std::uint16_t credit,
               std::int64_t now, std::span<std::uint8_t> tokens, Message& reply,
               std::vector<DeferredReply>& deferred);
  // Continues `d.multi` after its queued part was granted, or gives it up:
  // nullopt while it waits on its next key, else its answer, for the caller
  // to send before it calls finish().
  std::optional<MultiAnswer> resume(const DeferredReply& d, std::int64_t now,
                                    std::vector<DeferredReply>& deferred);
  // Remembers `answer` for m's retransmissions and forgets m (destroying it).
  void finish(const MultiAcquire& m, MultiAnswer answer);
  // `answer` as a reply message; its tokens go to `tokens`.
  static void fill(const MultiAnswer& answer, std::span<std::uint8_t> tokens, Message& reply);

 private:
  // The request `m` as a MultiAcquire, its parts in the global order.
  [[nodiscard]] std::unique_ptr<MultiAcquire> build(const ClientId& owner, const Peer& peer,
                                                    const Message& m, std::uint16_t credit,
                                                    std::int64_t now) const;
  // A remembered answer, as Shard::handle() answers a single key's again:
  // in cluster mode a grant only while each of its keys may be granted here.
  void answer_again(const MultiAcquire& m, const MultiAnswer& cached, std::int64_t now,
                    std::span<std::uint8_t> tokens, Message& reply);
  // One step of `m` under all its shards' locks: nullopt while it waits.
  std::optional<MultiAnswer> step(MultiAcquire& m, bool first, std::int64_t now,
                                  std::vector<DeferredReply>& deferred);
  // The answer to `m` when an earlier execution of it (or a newer request of
  // its client) shows in the keys' leases, as a single key's holder record
  // shows a retransmitted ACQUIRE: nullopt when none does.
  std::optional<MultiAnswer> prior_answer(MultiAcquire& m, std::int64_t now,
                                          std::vector<DeferredReply>& deferred);
  // Gives up `m`: every pending hold goes.
  void abandon(MultiAcquire& m, std::int64_t now, std::vector<DeferredReply>& deferred);
  // The shards of `m`'s parts, locked in ascending order / unlocked.
  void lock_parts(const MultiAcquire& m);
  void unlock_parts(const MultiAcquire& m);
  Shard& shard_at(std::uint32_t index);

  Env env_;
  mutable Mutex mu_;
  std::unordered_map<RequestKey, std::unique_ptr<MultiAcquire>, SeededHash> active_
      SHARDLOCK_GUARDED_BY(mu_);
  DedupCache<MultiAnswer> answers_ SHARDLOCK_GUARDED_BY(mu_);
};

}  // namespace shardlock::lease::internal
