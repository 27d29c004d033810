// ServerClock: the one clock the lease server measures every duration on
// (lease expiry, wait timeouts, lock-delay, the cluster's etcd-lease
// deadline through LeaseServer::now()).
//
// Default: CLOCK_BOOTTIME, which keeps counting while the machine is
// suspended, as the client's expiry clock does (client.h). CLOCK_MONOTONIC
// stops during a suspend, so a host that slept past its leases, its
// lock-delay or its etcd lease would wake up believing them still running
// and grant beside holders elsewhere whose time did pass.
//
// Tests inject a function instead. The default path reads the clock
// directly (clock_gettime is a vDSO call), with no std::function call.
//
// Not API: LeaseServer's and the Dispatcher's building block.
#pragma once

#include <time.h>

#include <chrono>
#include <functional>
#include <utility>

namespace shardlock::lease::internal {

// The kernel clock the server runs on when none is injected.
inline constexpr clockid_t kServerClockId = CLOCK_BOOTTIME;

class ServerClock {
 public:
  using Function = std::function<std::chrono::nanoseconds()>;

  // `injected` empty: kServerClockId.
  explicit ServerClock(Function injected = {}) : injected_(std::move(injected)) {}

  [[nodiscard]] std::chrono::nanoseconds now() const {
    return injected_ ? injected_() : boot_time();
  }

  // kServerClockId now. Never fails on Linux >= 2.6.39 with a valid pointer.
  [[nodiscard]] static std::chrono::nanoseconds boot_time() noexcept {
    timespec ts{};
    (void)::clock_gettime(kServerClockId, &ts);
    return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
  }

 private:
  Function injected_;
};

}  // namespace shardlock::lease::internal
