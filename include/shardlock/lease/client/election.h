// election.h: leader election on a lease key, the recipe etcd's
// concurrency.Election, Curator's LeaderLatch / LeaderSelector and
// `consul lock` give.
//
//   shardlock::lease::Election election(client, "scheduler/nightly");
//   election.on_lost([] { stop_leading(); });          // before campaign()
//   if (!election.campaign("10.0.0.7:8080 pid 4242")) {  // waits until elected
//     run_as_leader(election.term());                  // the term fences writes
//     election.resign();
//   }
//
//   shardlock::lease::LeaderObserver observer(client, "scheduler/nightly");
//   while (auto change = observer.next(std::chrono::minutes(1))) {
//     if (change->leader) route_to(change->leader->value);
//   }
//
// Design (README, "Leader election"; docs/client.md)
//   * An election is a key; its leader is the key's exclusive holder, and
//     the leader's value (an address, a host and pid) is the holder value
//     its acquire attached. campaign() is an exclusive acquire that waits
//     (FIFO at the key's node) and then holds with the watchdog.
//   * The term is the grant's fencing token: strictly rising over every
//     leader of a name (a restart and a failover included), so a deposed
//     leader's writes can be refused by term, as with any lease.
//   * Leadership ends on resign(), on destruction, or when the lease is
//     lost (a renewal refused or not confirmed before the client-side
//     expiry): the on_lost callback says so, exactly once, on the client's
//     watchdog thread. A leader must stop acting as one then; the lease
//     errs early (client-side expiry), so the next leader cannot be
//     elected before this one's callback is due.
//   * Observers follow the key with a watch (watch.h): each change of
//     leader is reported once, in term order; one that was away sees the
//     newest leader, not each one between.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/client/watch.h"
#include "shardlock/mutex.h"

namespace shardlock::lease {

// A leader as others see it (Election::leader(), LeaderObserver).
struct LeaderInfo {
  std::string value;  // what its campaign() attached
  ClientId owner;     // its campaign's lease owner (owner_client(): its client's)
  std::uint64_t term = 0;
  std::chrono::milliseconds ttl_left{0};  // as the server counted it
  friend bool operator==(const LeaderInfo&, const LeaderInfo&) = default;
};

struct ElectionOptions {
  // The leadership lease's TTL: how long a leader that dies silently keeps
  // the others waiting. Renewed at ttl / 3 by the watchdog.
  std::chrono::milliseconds ttl{10'000};
};

// One campaigner for one name. Its methods may be called from any thread,
// but not concurrently with its destruction. The client must outlive it.
class Election {
 public:
  Election(LeaseClient& client, std::string name, ElectionOptions options = {});
  // Resigns if leading.
  ~Election();
  Election(const Election&) = delete;
  Election& operator=(const Election&) = delete;

  // Called once if leadership is lost rather than resigned, on the client's
  // watchdog thread (see the top of this file). Set it before campaign().
  void on_lost(std::function<void(const LeaseLost&)> callback);
  // Waits up to `wait` (FIFO behind earlier campaigners) to become leader
  // with `value` (at most kMaxHolderValueLength bytes), then holds it with
  // the watchdog. Empty on success (leading() and term() tell the term);
  // kTimeout when `wait` ran out; kBadArgument for a bad name or value;
  // kBusy from a second campaign() while leading. Blocks.
  std::error_code campaign(std::string_view value,
                           std::chrono::milliseconds wait = std::chrono::hours(24 * 365));
  // Gives leadership up (RELEASE): the next campaigner is elected at once.
  // kLeaseInactive when not leading. Blocks up to request_timeout.
  std::error_code resign();
  // Whether this campaigner leads now, as the client can prove.
  [[nodiscard]] bool leading() const;
  // This campaigner's term while leading, else 0.
  [[nodiscard]] std::uint64_t term() const;
  // This campaigner's owner while leading (its lease's own, as
  // LeaderInfo::owner shows it), else all zero.
  [[nodiscard]] ClientId owner() const;
  // The current leader of the name (anyone's), or nullopt when there is
  // none; `error` is set when the server could not be asked. Blocks.
  [[nodiscard]] std::optional<LeaderInfo> leader(std::error_code* error = nullptr);
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

 private:
  LeaseClient& client_;
  std::string name_;
  ElectionOptions options_;
  mutable Mutex mutex_;
  std::function<void(const LeaseLost&)> on_lost_ SHARDLOCK_GUARDED_BY(mutex_);
  bool campaigning_ SHARDLOCK_GUARDED_BY(mutex_) = false;
  Lease lease_ SHARDLOCK_GUARDED_BY(mutex_);
};

// One change of leader (LeaderObserver::next()).
struct LeaderChange {
  std::optional<LeaderInfo> leader;  // nullopt: no leader now
};

// Follows the leader of one name through a watch: each change once, in
// term order. One thread calls next() at a time; cancel() from any.
class LeaderObserver {
 public:
  LeaderObserver(LeaseClient& client, std::string name, KeyWatchOptions options = {});
  // The leader now on the first call; afterwards the next change of leader
  // (another term, or none). Blocks up to `timeout`: nullopt when nothing
  // changed by then, or after cancel(); nullopt with `*error` set when the
  // server could not be read for the whole timeout.
  [[nodiscard]] std::optional<LeaderChange> next(std::chrono::milliseconds timeout,
                                                 std::error_code* error = nullptr);
  void cancel() noexcept { watch_.cancel(); }

 private:
  KeyWatch watch_;
  bool reported_ = false;
  std::uint64_t last_term_ = 0;  // 0: none (or nothing reported yet)
};

// The leader a watch event or a holders listing shows: its exclusive
// holder, if any (a pending or shared holder is no leader).
[[nodiscard]] std::optional<LeaderInfo> leader_of(LeaseMode mode,
                                                  const std::vector<HolderInfo>& holders);

}  // namespace shardlock::lease
