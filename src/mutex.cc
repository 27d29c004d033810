#include "shardlock/mutex.h"

#include <cstdint>

#include "shardlock/internal/backoff.h"

namespace shardlock {
namespace {

// Pauses double from Backoff::kMinDelayNs up to this between two looks at the
// word (40, 80, ..., 640 ns): the spin phase lasts a few microseconds at
// most, so it looks often rather than backing off to SpinLock's 2 us.
constexpr std::uint32_t kMaxSpinDelayNs = 640;

// The moving average's weights: a winner moves it 1/4 of the way up, a
// waiter that parks 1/16 of the way down. Spinning stays the default and
// stops only where it keeps failing: the rate settles near
// 4w / (4w + p) for fractions w of winners and p of parkers, so it falls
// low only when most spinners park. The asymmetry also keeps a burst of
// preemptions (another process taking the CPUs for a few milliseconds)
// from talking the lock out of spinning for long after the burst, which a
// symmetric 1/8 did in a run on this project's EPYC: stuck at the probe,
// Arith at 2 threads ran at 15 M/s, against 30 M/s at the full budget.
constexpr std::uint32_t kWinShift = 2;
constexpr std::uint32_t kParkShift = 4;

// The success rate after one more spinner won (`won`) or parked.
constexpr std::uint32_t next_rate(std::uint32_t rate, bool won) noexcept {
  return won ? rate + ((Mutex::kSpinRateOne - rate) >> kWinShift) : rate - (rate >> kParkShift);
}

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
        if (const std::uint32_t next = next_rate(rate, true); next != rate) {
          spin_success_rate_.store(next, std::memory_order_relaxed);
        }
        return true;
      }
      continue;
    }
    if (deadline_ns >= 0 && internal::monotonic_nanos() >= deadline_ns) return false;
    if (backoff.spin()) break;
  }
  // The budget ran out with the lock still held: the holder is descheduled
  // or its critical section is long. Deadline failures return above and do
  // not count: they say nothing about the holder.
  spin_success_rate_.store(next_rate(rate, false), std::memory_order_relaxed);

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
