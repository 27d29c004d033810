#include "shardlock/mutex.h"

#include <cstdint>

#include "shardlock/internal/backoff.h"

namespace shardlock {
namespace {

// Pauses double from Backoff::kMinDelayNs up to this between two looks at the
// word (40, 80, ..., 640 ns): the spin phase lasts a few microseconds at
// most, so it looks often rather than backing off to SpinLock's 2 us.
constexpr std::uint32_t kMaxSpinDelayNs = 640;

// A spin phase that overran its budget by more than this lost its CPU on the
// way (one round is at most ~0.7 us; a time slice is hundreds of us).
constexpr std::int64_t kLostCpuNs = 20'000;

}  // namespace

bool Mutex::lock_slow(std::int64_t deadline_ns) noexcept {
  // Relaxed, here and below: the rate only steers how long waiters spin; no
  // data is published through it, and a lost update between two waiters
  // only drops one sample from the average.
  const std::uint32_t rate = spin_success_rate_.load(std::memory_order_relaxed);
  // Spin phase: bounded in time (the adaptive budget, then park rather than
  // yield), retrying the CAS whenever the word reads 0.
  internal::Backoff backoff(spin_budget_for(rate), kMaxSpinDelayNs);
  for (;;) {
    std::uint32_t seen = state_.load(std::memory_order_relaxed);
    if (seen == kUnlocked) {
      // Acquire pairs with unlock()'s release exchange.
      if (state_.compare_exchange_weak(seen, kLocked, std::memory_order_acquire,
                                       std::memory_order_relaxed)) {
        // Store only when the average moves: at a 100% rate, the common
        // case under short critical sections, winners write nothing.
        if (const std::uint32_t next =
                internal::next_spin_success_rate(rate, internal::SpinOutcome::kWon);
            next != rate) {
          spin_success_rate_.store(next, std::memory_order_relaxed);
        }
        return true;
      }
      continue;
    }
    if (deadline_ns >= 0 && internal::monotonic_nanos() >= deadline_ns) return false;
    if (backoff.spin()) break;
  }
  // The budget ran out with the lock still held. Whether that says spinning
  // is wasteful depends on whether this waiter kept its CPU: see
  // SpinOutcome. Deadline failures return above and do not count.
  const internal::SpinOutcome outcome = backoff.waited_ns() > spin_budget_for(rate) + kLostCpuNs
                                            ? internal::SpinOutcome::kParkedAfterLosingCpu
                                            : internal::SpinOutcome::kParkedWhileRunning;
  if (const std::uint32_t next = internal::next_spin_success_rate(rate, outcome); next != rate) {
    spin_success_rate_.store(next, std::memory_order_relaxed);
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
