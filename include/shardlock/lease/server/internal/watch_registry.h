// WatchRegistry: one shard's parked WATCHes (protocol.h, "Watches"), by key
// and by (client id, request id), and the keys whose version may have moved
// since the watchers were last looked at.
//
// The lease table stays the shard's: the registry reads it through
// WatchedKeys, two narrow callbacks (a key's version, and a HOLDERS_REPLY
// summary of it), the way etcd's lease queue sees its lessor. The shard
// tells it which keys changed (touch(), on the request path: a test of an
// empty table while nothing is parked) and when to answer (wake(), after
// each request and timer pass). Each parked WATCH is a timer node in the
// shard's wheel (kind kTimerKind); the shard hands a fired one back through
// expire() or redirect().
//
// A watched key may be free, so the lists are kept apart from the lease
// table. touched_'s capacity is kept at one slot per list, so touch() never
// allocates; park() reserves it before it adds a list.
//
// Not API: Shard's building block. Not thread-safe (the shard lock guards
// it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "shardlock/lease/server/internal/client_usage.h"
#include "shardlock/lease/server/internal/shard_counters.h"
#include "shardlock/lease/server/internal/timer_wheel.h"
#include "shardlock/lease/wire/internal/peer.h"
#include "shardlock/lease/wire/internal/string_key.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease::internal {

struct DeferredReply;

// A key's version (protocol.h, "Watches"): its newest holder's token and
// its holder count; {0, 0} while free.
struct KeyVersion {
  std::uint64_t token = 0;
  std::uint32_t holders = 0;
  friend bool operator==(const KeyVersion&, const KeyVersion&) = default;
};

// What the registry asks of the lease table.
class WatchedKeys {
 public:
  [[nodiscard]] virtual KeyVersion version(const KeyRef& key) const noexcept = 0;
  // HOLDERS_REPLY's fields for `key` in `summary`, with its newest holders
  // that fit `room` bytes appended to `entries` (Shard::list_newest()). May
  // throw std::bad_alloc.
  virtual void describe(const KeyRef& key, std::size_t room, std::int64_t now_ms,
                        std::vector<std::uint8_t>& entries, Message& summary) const = 0;

 protected:
  ~WatchedKeys() = default;
};

class WatchRegistry {
 public:
  // The TimerNode::kind of a parked WATCH's wait timer.
  static constexpr std::uint8_t kTimerKind = 3;
  struct Limits {
    std::size_t max_watches = SIZE_MAX;          // parked WATCHes, all keys
    std::size_t max_watches_per_key = SIZE_MAX;  // parked WATCHes on one key
  };

  // Every reference must outlive the registry; `wheel` holds its timers,
  // `usage` counts each client's parked WATCHes (and bounds them), `keys`
  // answers them, `counters` counts redirects and allocation failures.
  // `seed` keys the (client id, request id) index.
  WatchRegistry(const Limits& limits, std::uint64_t seed, TimerWheel& wheel, ClientUsage& usage,
                const WatchedKeys& keys, ShardCounters& counters);
  // Cancels the timers of the WATCHes still parked (their answers are lost).
  ~WatchRegistry();
  WatchRegistry(const WatchRegistry&) = delete;
  WatchRegistry& operator=(const WatchRegistry&) = delete;

  enum class Park { kParked, kAlreadyParked, kRefused, kTenantRefused };
  // Parks `request` (a WATCH of `client` on `key`, its answer for `peer`
  // within `reply_credit` bytes) until its version moves from
  // {request.token, request.holders} or request.wait_ms pass.
  // kAlreadyParked: a retransmission, nothing changed. kRefused: a bound
  // (the registry's or the client's) is reached; kTenantRefused: the
  // client's tenant's max-watches (ClientUsage). May throw std::bad_alloc,
  // with nothing changed.
  Park park(const ClientId& client, const Peer& peer, const Message& request, const KeyRef& key,
            std::uint16_t reply_credit, std::int64_t now_ms);

  // `key`'s version may have changed: its watchers are looked at by the
  // next wake(). Never throws.
  void touch(const KeyRef& key) noexcept {
    if (!lists_.empty()) touch_list(key);
  }
  // Answers, into `deferred`, the WATCHes of every touched key whose
  // version moved from what they saw. Never throws: an answer that cannot
  // be allocated is not sent (the client's retransmission is answered
  // afresh) and counted.
  void wake(std::int64_t now_ms, std::vector<DeferredReply>& deferred) noexcept {
    if (!touched_.empty()) wake_touched(now_ms, deferred);
  }
  // A parked WATCH's timer `node` (kind kTimerKind) fired: it is answered
  // with its key's state now, or REDIRECT in `epoch`, and forgotten.
  void expire(TimerNode& node, std::int64_t now_ms, std::vector<DeferredReply>& deferred) noexcept;
  void redirect(TimerNode& node, std::uint64_t epoch,
                std::vector<DeferredReply>& deferred) noexcept;
  // The key a parked WATCH's timer `node` waits on.
  [[nodiscard]] static std::string_view key_of(const TimerNode& node) noexcept;

  // Fires, at the wheel's next advance(), the timer of every WATCH parked
  // on a key for which `ends(key)` is true (the cluster gate gave it away).
  template <class Ends>
  void end_early(Ends&& ends) noexcept {
    for (const auto& [id, w] : index_) {
      if (ends(w->list->key->text)) wheel_.schedule(*w, wheel_.now());
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return index_.size(); }
  [[nodiscard]] bool parked(const ClientId& client, std::uint64_t request_id) const {
    return index_.contains(RequestKey{client, request_id});
  }

 private:
  struct WatchList;
  // A parked WATCH; the node is its wait timer.
  struct Watch : TimerNode {
    ClientId client;
    std::uint64_t request_id = 0;
    Peer peer;
    KeyVersion since;                // what its sender last saw
    std::uint16_t reply_credit = 0;  // DeferredReply::reply_credit of its answer
    WatchList* list = nullptr;
    std::list<Watch>::iterator self;
  };
  // The parked WATCHes of one key.
  struct WatchList {
    const HashedKey* key = nullptr;  // lists_'s key
    std::list<Watch> watches;
    bool touched = false;  // in touched_
  };

  void touch_list(const KeyRef& key) noexcept;
  void wake_touched(std::int64_t now_ms, std::vector<DeferredReply>& deferred) noexcept;
  // Answers `w` (REDIRECT in `epoch` when `redirect`) and forgets it.
  void answer(Watch& w, bool redirect, std::uint64_t epoch, std::int64_t now_ms,
              std::vector<DeferredReply>& deferred) noexcept;
  // Forgets `w` (its timer already cancelled or fired), and its key's list
  // once empty and untouched.
  void retire(Watch& w) noexcept;

  Limits limits_;
  TimerWheel& wheel_;
  ClientUsage& usage_;
  const WatchedKeys& keys_;
  ShardCounters& counters_;
  std::unordered_map<HashedKey, WatchList, HashedKeyHash, HashedKeyEqual> lists_;
  std::unordered_map<RequestKey, Watch*, SeededHash> index_;
  std::vector<WatchList*> touched_;
};

}  // namespace shardlock::lease::internal
