#include "shardlock/mutex.h"

#include "shardlock/internal/backoff.h"

namespace shardlock {

bool Mutex::lock_slow(std::int64_t deadline_ns) noexcept {
  // Spin phase: bounded in time, retrying the CAS whenever the word reads 0.
  const std::int64_t spin_until = internal::monotonic_nanos() + kSpinNs;
  std::uint32_t delay_ns = internal::Backoff::kMinDelayNs;
  for (;;) {
    std::uint32_t seen = state_.load(std::memory_order_relaxed);
    if (seen == kUnlocked) {
      // Acquire pairs with unlock()'s release exchange.
      if (state_.compare_exchange_weak(seen, kLocked, std::memory_order_acquire,
                                       std::memory_order_relaxed)) {
        return true;
      }
      continue;
    }
    const std::int64_t now = internal::monotonic_nanos();
    if (now >= spin_until) break;
    if (deadline_ns >= 0 && now >= deadline_ns) return false;
    internal::pause_for(delay_ns);
    if (delay_ns < 512) delay_ns *= 2;
  }

  // Park phase. Exchanging in 2 (rather than CAS 0 -> 1) is what makes a
  // sleeper visible to unlock(); it may leave a spurious 2 behind after the
  // last sleeper leaves, which costs one unneeded FUTEX_WAKE, never a hang.
  // Acquire pairs with unlock()'s release exchange.
  while (state_.exchange(kLockedMaybeSleepers, std::memory_order_acquire) != kUnlocked) {
    if (!internal::futex_wait(&state_, kLockedMaybeSleepers, deadline_ns)) return false;
  }
  return true;
}

void Mutex::wake_one() noexcept { internal::futex_wake(&state_, 1); }

}  // namespace shardlock
