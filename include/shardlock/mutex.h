// Mutex: the general-purpose lock. Spins briefly, then parks on a private
// Linux futex.
//
// Use Mutex unless you have measured a reason not to. It behaves like a
// spinlock when critical sections are short and the holder is running, and
// like std::mutex when the holder is slow or descheduled: waiters sleep in the
// kernel instead of burning the time slice the holder needs.
//
// Design
//   * Size: 4 bytes, one futex word (static_assert'ed).
//   * State (Drepper, "Futexes Are Tricky", mutex #2):
//       0 = unlocked, 1 = locked with no sleepers, 2 = locked, maybe sleepers.
//   * lock(): one CAS 0 -> 1. On failure, spin on a relaxed load for up to
//     kSpinNs (time-budgeted: a PAUSE is 19 ns here and ~40 ns on Skylake),
//     retrying the CAS whenever the word reads 0. Then park: exchange the
//     word to 2 and FUTEX_WAIT while it stays 2.
//   * unlock(): one atomic exchange to 0, then FUTEX_WAKE(1) only if the old
//     state was 2. No system call unless someone may be sleeping. (It is an
//     exchange rather than a plain store because the unlocker must observe a
//     sleeper that registered concurrently; a plain store followed by a load
//     can be reordered on x86 and lose the wake-up. On x86 the exchange costs
//     what the store plus the needed fence would.)
//   * Fairness: barging, like std::mutex. A running thread can re-take the
//     lock before a woken sleeper is scheduled; the sleeper is not starved
//     because the spin phase is short and the wake is unconditional.
//   * Threads > cores: at most kSpinNs of wasted spinning per acquisition,
//     then the waiter sleeps and the holder gets the core.
//   * Timed waits use FUTEX_WAIT_BITSET with an absolute CLOCK_MONOTONIC
//     deadline, so spurious wake-ups do not extend them.
//
// Measured (2-vCPU EPYC VM, one run, peers in the same binary):
//   uncontended pair 4.48 ns vs std::mutex 6.09 ns; contended counter
//   1.38x / 3.63x / 3.80x / 3.37x std::mutex at 1 / 2 / 4 / 8 threads,
//   1.02-1.07x with ~100 ns private work; spread <= 1.45 at 2-8 threads.
//   Command: build/bench/bench/locks_benchmark --benchmark_min_time=0.3
//   (bench preset; full tables in docs/lock-benchmarks.md).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "shardlock/internal/cpu.h"
#include "shardlock/internal/futex.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lockable.h"

namespace shardlock {

class SHARDLOCK_CAPABILITY("mutex") Mutex {
 public:
  // How long a waiter spins before parking.
  static constexpr std::int64_t kSpinNs = 4'000;

  constexpr Mutex() noexcept = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  // Blocks until the caller holds the lock. Precondition: the caller does
  // not already hold it (see Recursive<L> for reentrancy).
  void lock() noexcept SHARDLOCK_ACQUIRE() {
    std::uint32_t expected = kUnlocked;
    // Acquire on success pairs with the release exchange in unlock(). Relaxed
    // on failure: we only learn the current state.
    if (state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire,
                                       std::memory_order_relaxed)) {
      return;
    }
    lock_slow(-1);
  }

  // Takes the lock if it is free. Never blocks.
  [[nodiscard]] bool try_lock() noexcept SHARDLOCK_TRY_ACQUIRE(true) {
    std::uint32_t expected = kUnlocked;
    // Same pairing as lock().
    return state_.load(std::memory_order_relaxed) == kUnlocked &&
           state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire,
                                          std::memory_order_relaxed);
  }

  // Blocks for at most `timeout`; returns whether the lock is now held.
  template <class Rep, class Period>
  [[nodiscard]] bool try_lock_for(const std::chrono::duration<Rep, Period>& timeout) noexcept
      SHARDLOCK_TRY_ACQUIRE(true) {
    return try_lock_until(std::chrono::steady_clock::now() + timeout);
  }

  // Blocks until `deadline` at most; returns whether the lock is now held.
  template <class Clock, class Duration>
  [[nodiscard]] bool try_lock_until(
      const std::chrono::time_point<Clock, Duration>& deadline) noexcept
      SHARDLOCK_TRY_ACQUIRE(true) {
    if (try_lock()) return true;
    return lock_slow(internal::deadline_nanos(deadline));
  }

  // Releases the lock, waking one sleeper if there may be one.
  // Precondition: the caller holds the lock.
  void unlock() noexcept SHARDLOCK_RELEASE() {
    // Release publishes the critical section to the next acquirer's acquire
    // CAS/exchange; the RMW also observes a concurrent 1 -> 2 transition.
    if (state_.exchange(kUnlocked, std::memory_order_release) == kLockedMaybeSleepers) {
      wake_one();
    }
  }

  // A racy snapshot, for assertions and statistics only.
  bool is_locked() const noexcept { return state_.load(std::memory_order_relaxed) != kUnlocked; }

 private:
  static constexpr std::uint32_t kUnlocked = 0;
  static constexpr std::uint32_t kLocked = 1;
  static constexpr std::uint32_t kLockedMaybeSleepers = 2;

  // Returns false only when `deadline_ns` (CLOCK_MONOTONIC; < 0 = none) passed.
  [[gnu::cold, gnu::noinline]] bool lock_slow(std::int64_t deadline_ns) noexcept;
  [[gnu::cold, gnu::noinline]] void wake_one() noexcept;

  // The futex word; values above. Only lock_slow() stores 2.
  std::atomic<std::uint32_t> state_{kUnlocked};
};

static_assert(sizeof(Mutex) == 4);
static_assert(TimedLockable<Mutex> && NoexceptLockable<Mutex>);

}  // namespace shardlock
