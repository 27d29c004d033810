// Mutex: the general-purpose lock. Spins briefly, then parks on a private
// Linux futex.
//
// Use Mutex unless you have measured a reason not to. It behaves like a
// spinlock when critical sections are short and the holder is running, and
// like std::mutex when the holder is slow or descheduled: waiters sleep in the
// kernel instead of burning the time slice the holder needs.
//
// Design
//   * Size: 8 bytes: the futex word and the spin success rate
//     (static_assert'ed).
//   * State (Drepper, "Futexes Are Tricky", mutex #2):
//       0 = unlocked, 1 = locked with no sleepers, 2 = locked, maybe sleepers.
//   * lock(): one CAS 0 -> 1. On failure, spin on a relaxed load, retrying
//     the CAS whenever the word reads 0, for an adaptive budget (below).
//     Then park: exchange the word to 2 and FUTEX_WAIT while it stays 2.
//   * Adaptive spinning, as glibc's PTHREAD_MUTEX_ADAPTIVE_NP, WebKit's
//     WTF::Lock and the kernel's "spin while the owner is running": spin
//     only while spinning does not take the CPU from someone who needs it.
//     Each lock keeps a moving average, the spin success rate, and the
//     budget scales with it from kMaxSpinNs down to kMinSpinNs, a probe of
//     four looks at the word, so the lock notices when spinning works
//     again. A winner moves the rate 1/4 of the way up. A waiter that spent
//     its budget and parks moves it 1/16 of the way down only if it lost its
//     CPU while spinning (its spin overran the budget by a time slice): then
//     threads outnumber cores, and spinning burns time slices that holders
//     need. A waiter that parks having kept its CPU leaves the rate alone:
//     its core had nothing better to do, and the holder was running. On this
//     project's EPYC, with 2 threads on 2 cores, such failed spins are
//     common (an owner that re-locks at once rarely leaves a gap) and still
//     pay: parking sooner there cost throughput (docs/lock-benchmarks.md),
//     because a park and wake-up costs several microseconds and the owner
//     pays a FUTEX_WAKE for each parked waiter.
//     The budget is in nanoseconds, not PAUSE counts (a PAUSE is 19-24 ns
//     on Zen 4 and ~40 ns on Skylake and later).
//   * unlock(): one atomic exchange to 0, then FUTEX_WAKE(1) only if the old
//     state was 2. No system call unless someone may be sleeping. (It is an
//     exchange rather than a plain store because the unlocker must observe a
//     sleeper that registered concurrently; a plain store followed by a load
//     can be reordered on x86 and lose the wake-up. On x86 the exchange costs
//     what the store plus the needed fence would.)
//   * Fairness: barging, like std::mutex. A running thread can re-take the
//     lock before a woken sleeper is scheduled; the sleeper is not starved
//     because the spin phase is short and the wake is unconditional.
//   * Threads > cores: at most kMaxSpinNs of wasted spinning per
//     acquisition, and less once the rate has learnt that spinners lose
//     their CPUs; then the waiter sleeps and the holder gets the core.
//   * Timed waits use FUTEX_WAIT_BITSET with an absolute CLOCK_MONOTONIC
//     deadline, so spurious wake-ups do not extend them.
//
// Measured: docs/lock-benchmarks.md, with the CPU model of each run.
//   Command: build/bench/bench/locks_benchmark --benchmark_min_time=0.1
//   --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
//   (bench preset).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "shardlock/internal/cpu.h"
#include "shardlock/internal/futex.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lockable.h"

namespace shardlock {

namespace internal {

// How one waiter's spin phase ended, as Mutex's adaptive spinning counts it.
enum class SpinOutcome {
  kWon,                   // got the lock by spinning
  kParkedWhileRunning,    // spent the budget on its own CPU, then parked
  kParkedAfterLosingCpu,  // spent the budget, was descheduled meanwhile
};

// The spin success rate (in units of 1 << 16) after one more waiter's
// outcome: winners move it 1/4 of the way up, waiters that lost their CPU
// 1/16 of the way down, and waiters that kept theirs leave it alone (see
// Mutex's design note).
constexpr std::uint32_t next_spin_success_rate(std::uint32_t rate, SpinOutcome outcome) noexcept {
  constexpr std::uint32_t kOne = 1u << 16;
  switch (outcome) {
    case SpinOutcome::kWon:
      return rate + ((kOne - rate) >> 2);
    case SpinOutcome::kParkedAfterLosingCpu:
      return rate - (rate >> 4);
    case SpinOutcome::kParkedWhileRunning:
      break;
  }
  return rate;
}

}  // namespace internal

class SHARDLOCK_CAPABILITY("mutex") Mutex {
 public:
  // How long a waiter spins before parking: kMaxSpinNs while spinning pays,
  // down to kMinSpinNs where spinners keep losing their CPUs (see Design).
  static constexpr std::int64_t kMaxSpinNs = 4'000;
  static constexpr std::int64_t kMinSpinNs = 600;
  // The success rate is kept in units of 1/kSpinRateOne.
  static constexpr std::uint32_t kSpinRateOne = 1u << 16;
  // What the rate maps to: the budget a waiter spins before parking.
  static constexpr std::int64_t spin_budget_for(std::uint32_t success_rate) noexcept {
    return kMinSpinNs + (kMaxSpinNs - kMinSpinNs) * static_cast<std::int64_t>(success_rate) /
                            static_cast<std::int64_t>(kSpinRateOne);
  }

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

  // How long the next waiter would spin before parking, in nanoseconds. A
  // racy snapshot, for statistics and tests only.
  std::int64_t spin_budget_ns() const noexcept {
    // Relaxed: the estimate is a hint that publishes nothing.
    return spin_budget_for(spin_success_rate_.load(std::memory_order_relaxed));
  }

 private:
  static constexpr std::uint32_t kUnlocked = 0;
  static constexpr std::uint32_t kLocked = 1;
  static constexpr std::uint32_t kLockedMaybeSleepers = 2;

  // Returns false only when `deadline_ns` (CLOCK_MONOTONIC; < 0 = none) passed.
  [[gnu::cold, gnu::noinline]] bool lock_slow(std::int64_t deadline_ns) noexcept;
  [[gnu::cold, gnu::noinline]] void wake_one() noexcept;

  // The futex word; values above. Only lock_slow() stores 2.
  std::atomic<std::uint32_t> state_{kUnlocked};
  // The spin success rate (internal::next_spin_success_rate), in units of
  // 1/kSpinRateOne; a new lock assumes spinning works. Written only by waiters (lock_slow), and
  // only when the average moves, in the same cache line as state_: a winner writes it right after
  // its CAS, when it owns that line anyway.
  std::atomic<std::uint32_t> spin_success_rate_{kSpinRateOne};
};

static_assert(sizeof(Mutex) == 8);
static_assert(Mutex::kSpinRateOne == 1u << 16, "next_spin_success_rate's unit");
static_assert(TimedLockable<Mutex> && NoexceptLockable<Mutex>);

}  // namespace shardlock
