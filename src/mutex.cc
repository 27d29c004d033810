#include "shardlock/mutex.h"

#include "shardlock/internal/backoff.h"

namespace shardlock {
namespace {

// Pauses double from Backoff::kMinDelayNs up to this between two looks at the
// word (40, 80, ..., 640 ns): the spin phase lasts only kSpinNs, so it looks
// often rather than backing off to SpinLock's 2 us.
constexpr std::uint32_t kMaxSpinDelayNs = 640;

}  // namespace

bool Mutex::lock_slow(std::int64_t deadline_ns) noexcept {
  // Spin phase: bounded in time (kSpinNs, then park rather than yield),
  // retrying the CAS whenever the word reads 0.
  internal::Backoff backoff(kSpinNs, kMaxSpinDelayNs);
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
    if (deadline_ns >= 0 && internal::monotonic_nanos() >= deadline_ns) return false;
    if (backoff.spin()) break;
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
