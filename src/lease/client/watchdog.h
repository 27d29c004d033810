// Lease renewal: LeaseState, the shared state of one Lease (its expiry and
// renewal bookkeeping), and Watchdog, the thread that renews watched leases
// and runs their lost callbacks. Private to src/lease/.
//
// Threading: a LeaseState's mutable fields are guarded by its `mutex`;
// `callback_mutex` is held while its on_lost runs and is taken before
// `mutex`, never while holding it. The Watchdog's list and flags are guarded
// by its mutex_, which is never held while a LeaseState's locks are taken.
// Callbacks and renewal decisions run on the watchdog thread; renewal
// answers arrive on the call engine's I/O thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/call_engine.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lease/client/call.h"
#include "shardlock/mutex.h"

namespace shardlock::lease::internal {

// How far below the server's deadline the client puts a lease's expiry.
struct DriftMargin {
  double factor = 0.01;
  Clock::duration allowance = std::chrono::milliseconds(2);

  // The expiry of a lease granted or renewed for `ttl` by a request first
  // sent at `sent`.
  [[nodiscard]] Clock::time_point expiry(Clock::time_point sent,
                                         std::chrono::milliseconds ttl) const noexcept {
    const auto scaled = std::chrono::duration_cast<Clock::duration>(ttl * factor);
    return sent + ttl - scaled - allowance;
  }
};

// Shared state of one Lease (the handle is Lease; the watchdog and the I/O
// thread's renewal completions hold it too).
struct LeaseState {
  using milliseconds = std::chrono::milliseconds;
  enum class Status : std::uint8_t { kHeld, kReleased, kLost };

  // A RENEW sent and not yet superseded by a confirmed newer one: the server
  // may still apply it, so its TTL bounds the expiry.
  struct SentRenewal {
    std::uint64_t request_id = 0;
    Clock::time_point sent;  // no later than its first transmission
    milliseconds ttl{};
  };

  // How a lease holds its key; renewal and loss are the same for every mode.
  struct Kind {
    LeaseMode mode = LeaseMode::kExclusive;
    std::uint32_t permits = 0;  // kPermit only
  };

  LeaseState(std::string lease_key, std::uint64_t lease_token, Kind lease_kind,
             ClientId lease_owner, LeaseOptions lease_options, DriftMargin lease_margin,
             const CallResult& grant, milliseconds requested_ttl)
      : key(std::move(lease_key)),
        token(lease_token),
        kind(lease_kind),
        owner(lease_owner),
        options(std::move(lease_options)),
        margin(lease_margin),
        node(grant.node),
        expiry(margin.expiry(grant.first_sent, milliseconds(grant.ttl_ms))),
        ttl(requested_ttl),
        next_renew(grant.first_sent + std::chrono::duration_cast<Clock::duration>(
                                          milliseconds(grant.ttl_ms) * options.renew_fraction)),
        confirmed_request_id(grant.request_id) {}

  // Before a RENEW for `renew_ttl` leaves: once the server applies it, its
  // deadline may be as early as `now` + renew_ttl, so the expiry comes in now.
  void note_renewal_sent(std::uint64_t request_id, Clock::time_point now, milliseconds renew_ttl)
      SHARDLOCK_REQUIRES(mutex);

  // Applies the answer to RENEW `request_id` for `requested` (from the
  // watchdog or Lease::renew()). Returns true when the lease has just become
  // lost. RECOVERING puts the next renewal retry_delay(retry_after_ms) away.
  bool apply_renewal(const CallResult& r, std::uint64_t request_id, milliseconds requested,
                     Clock::time_point now) SHARDLOCK_REQUIRES(mutex);

  const std::string key;
  const std::uint64_t token;
  const Kind kind;
  const ClientId owner;
  const LeaseOptions options;
  const DriftMargin margin;
  // The node that granted it: its renewals and its release go there, not to
  // wherever a newer cluster map routes the key.
  const Endpoint* const node;

  mutable Mutex mutex;
  Status status SHARDLOCK_GUARDED_BY(mutex) = Status::kHeld;
  Clock::time_point expiry SHARDLOCK_GUARDED_BY(mutex);
  milliseconds ttl SHARDLOCK_GUARDED_BY(mutex);
  Clock::time_point next_renew SHARDLOCK_GUARDED_BY(mutex);
  bool renew_in_flight SHARDLOCK_GUARDED_BY(mutex) = false;
  // The grant's request id, then the newest confirmed renewal's.
  std::uint64_t confirmed_request_id SHARDLOCK_GUARDED_BY(mutex);
  std::vector<SentRenewal> unconfirmed SHARDLOCK_GUARDED_BY(mutex);
  // Set once when the lease becomes lost; the watchdog thread fires it.
  bool lost_fired SHARDLOCK_GUARDED_BY(mutex) = false;
  LeaseLost lost SHARDLOCK_GUARDED_BY(mutex);
  // Held by the watchdog thread while on_lost runs; release() and the
  // destructor take it after marking the lease released, so they return only
  // once a running callback has returned, and no callback starts after.
  Mutex callback_mutex;
};

// A call about `state`'s own lease (RENEW, RELEASE): its key, its token and
// the owner it was granted to, routed as make_call() routes the key.
[[nodiscard]] std::unique_ptr<Call> make_lease_call(const CallEngine& engine, MessageType type,
                                                    const LeaseState& state);

// A RENEW of `state` for `ttl` with its request id reserved and noted in the
// state (its expiry comes in first if `ttl` is shorter). Takes state.mutex.
[[nodiscard]] std::unique_ptr<Call> make_renewal(CallEngine& engine, LeaseState& state,
                                                 std::chrono::milliseconds ttl);

// The renewal thread of one LeaseClient, started by the first watch().
class Watchdog {
 public:
  // `engine` sends the renewals; it must outlive the watchdog.
  explicit Watchdog(CallEngine& engine) noexcept : engine_(engine) {}
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Looks after `state` until it is released or lost: renews it when its
  // options ask for that, and fires its lost callback. Starts the thread on
  // first use; does nothing after stop(). Never blocks for long.
  void watch(std::shared_ptr<LeaseState> state) SHARDLOCK_EXCLUDES(mutex_);
  // Makes the thread look at its leases now (a renewal was answered, or a
  // lease was lost).
  void nudge() SHARDLOCK_EXCLUDES(mutex_);
  // Whether the caller is the watchdog thread (where on_lost runs).
  [[nodiscard]] bool on_thread() const noexcept;
  // Stops and joins the thread, then drops the watched leases (and the
  // lost callbacks they hold). Not from the watchdog thread.
  void stop() SHARDLOCK_EXCLUDES(mutex_);

 private:
  void run() SHARDLOCK_EXCLUDES(mutex_);
  void issue_renewal(const std::shared_ptr<LeaseState>& state, std::chrono::milliseconds ttl,
                     Clock::time_point expiry, Clock::time_point now);

  CallEngine& engine_;
  std::atomic<std::thread::id> thread_id_{};

  Mutex mutex_;
  // condition_variable_any waits on the annotated Mutex itself, so the
  // analysis sees mutex_ held across the wait (as it is on return).
  std::condition_variable_any wake_;
  bool stop_ SHARDLOCK_GUARDED_BY(mutex_) = false;
  bool dirty_ SHARDLOCK_GUARDED_BY(mutex_) = false;
  std::vector<std::shared_ptr<LeaseState>> watched_ SHARDLOCK_GUARDED_BY(mutex_);
  std::thread thread_ SHARDLOCK_GUARDED_BY(mutex_);
};

}  // namespace shardlock::lease::internal
