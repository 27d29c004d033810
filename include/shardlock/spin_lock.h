// SpinLock: a test-and-test-and-set spinlock with time-budgeted backoff and
// eventual fairness.
//
// Use it for very short critical sections (a few dozen instructions, no
// system calls, no allocation) on data that is rarely contended for long.
// For anything that may block or run long, use shardlock::Mutex, which parks
// waiters instead of burning their time slices.
//
// Design
//   * Size: 2 bytes (a lock byte and an heir byte); static_assert'ed <= 4.
//   * Fast path: a write prefetch, one relaxed load of the heir byte (same
//     line) and one atomic exchange. Unlock is one release store.
//   * Waiting: spin on a relaxed load (the "test" before "test-and-set"), so
//     waiters share the line in S state instead of bouncing it, with
//     exponential backoff measured in nanoseconds (internal/backoff.h). After
//     a 20 us spin budget every round also yields, so with more threads than
//     cores a preempted holder gets the CPU back.
//   * Fairness: plain TTAS lets the releasing thread re-take the lock from its
//     own cache while waiters are still seeing the old value; measured here,
//     tbb::spin_mutex and textbook TTAS give one thread 100-450x the
//     acquisitions of another. SpinLock bounds that the way WebKit's
//     WTF::Lock and Rust's parking_lot do, with an occasional forced hand-off:
//     a waiter that has waited longer than kHandoffNs claims the heir byte.
//     While it is set, the fast path and every other waiter stand back, so
//     the heir is the next to acquire. At most one heir exists at a time.
//     Hand-offs happen at most once per kHandoffNs, so they cost throughput
//     only in proportion to kHandoffNs^-1. BasicSpinLock<0> disables them
//     (pure TTAS). The curve is in docs/lock-benchmarks.md ("SpinLock fairness knob").
//   * Threads > cores: the yield after the spin budget keeps throughput up;
//     an heir that is descheduled can hold up the lock for up to one
//     scheduler slice, which the 100 us default makes rare.
//
// Measured (the first lock-table tuning run: 2-vCPU AMD EPYC, family 25 model 17, one run,
// peers in the same binary; the cross-CPU figures per CPU family are in
// docs/lock-benchmarks.md):
//   uncontended pair 2.19 ns = 1.03x a bare exchange+store; contended
//   counter 1.28x / 1.04x / 1.12x tbb::spin_mutex at 2 / 4 / 8 threads,
//   2.1-2.2x with ~100 ns private work; per-thread spread over 150 ms
//   1.29 / 3.89 / 1.71 (textbook TTAS: 3.7 / 3.7 / 149,441).
//   Command: build/bench/bench/locks_benchmark --benchmark_min_time=0.3
//   (bench preset; full tables in docs/lock-benchmarks.md).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "shardlock/internal/backoff.h"
#include "shardlock/internal/cpu.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lockable.h"

namespace shardlock {

// kHandoffNs: how long a waiter waits before it claims the next acquisition.
// 0 disables hand-offs.
template <std::int64_t kHandoffNs>
class SHARDLOCK_CAPABILITY("mutex") BasicSpinLock {
 public:
  static constexpr std::int64_t kHandoffAfterNs = kHandoffNs;

  constexpr BasicSpinLock() noexcept = default;
  BasicSpinLock(const BasicSpinLock&) = delete;
  BasicSpinLock& operator=(const BasicSpinLock&) = delete;

  // Blocks (spinning, then yielding) until the lock is held by the caller.
  // Precondition: the caller does not hold it (no recursion; see
  // Recursive<L>).
  void lock() noexcept SHARDLOCK_ACQUIRE() {
    // Ask for the line in exclusive state first: the heir load alone would
    // fetch it shared and the exchange would then need a second coherence
    // round trip when another core released the lock last. (This was
    // __builtin_prefetch(&locked_, 1), which GCC compiles to a read
    // prefetch for the default x86-64 target; see prefetch_for_write.)
    internal::prefetch_for_write(&locked_);
    // Relaxed heir check: it is only a courtesy signal; exclusion rests on
    // the exchange. The acquire exchange pairs with unlock()'s release store.
    if (heir_.load(std::memory_order_relaxed) == 0 &&
        locked_.exchange(1, std::memory_order_acquire) == 0) {
      return;
    }
    lock_slow(-1);
  }

  // Takes the lock if it is free and no waiter has claimed the hand-off.
  // Never blocks. May fail spuriously, as std::mutex::try_lock may.
  [[nodiscard]] bool try_lock() noexcept SHARDLOCK_TRY_ACQUIRE(true) {
    // Relaxed loads first so a failing try_lock does not take the line in
    // exclusive state; acquire exchange pairs with unlock().
    return locked_.load(std::memory_order_relaxed) == 0 &&
           heir_.load(std::memory_order_relaxed) == 0 &&
           locked_.exchange(1, std::memory_order_acquire) == 0;
  }

  // Like lock(), but gives up once `timeout` has passed. Returns whether the
  // lock is now held. A timeout <= 0 behaves like try_lock().
  template <class Rep, class Period>
  [[nodiscard]] bool try_lock_for(const std::chrono::duration<Rep, Period>& timeout) noexcept
      SHARDLOCK_TRY_ACQUIRE(true) {
    return try_lock_until(std::chrono::steady_clock::now() + timeout);
  }

  // Like lock(), but gives up once `deadline` has passed.
  template <class Clock, class Duration>
  [[nodiscard]] bool try_lock_until(
      const std::chrono::time_point<Clock, Duration>& deadline) noexcept
      SHARDLOCK_TRY_ACQUIRE(true) {
    if (try_lock()) return true;
    return lock_slow(internal::deadline_nanos(deadline));
  }

  // Releases the lock. Precondition: the caller holds it.
  void unlock() noexcept SHARDLOCK_RELEASE() {
    // Release: publishes the critical section to the next acquire exchange.
    locked_.store(0, std::memory_order_release);
  }

  // A racy snapshot for assertions and statistics only.
  bool is_locked() const noexcept { return locked_.load(std::memory_order_relaxed) != 0; }

 private:
  // Returns false only when `deadline_ns` (CLOCK_MONOTONIC, <0 = none) passed.
  [[gnu::cold, gnu::noinline]] bool lock_slow(std::int64_t deadline_ns) noexcept {
    internal::Backoff backoff;
    const std::int64_t start_ns = internal::monotonic_nanos();
    bool is_heir = false;
    // When this waiter first saw the lock free but reserved for an heir; an
    // heir that sits on its claim longer than kHeirGraceNs (it was
    // descheduled) is bypassed, so a preempted heir cannot idle the lock.
    std::int64_t reserved_since_ns = 0;
    for (;;) {
      if (locked_.load(std::memory_order_relaxed) == 0) {
        bool may_try = is_heir || heir_.load(std::memory_order_relaxed) == 0;
        if (!may_try) {
          const std::int64_t now = internal::monotonic_nanos();
          if (reserved_since_ns == 0) reserved_since_ns = now;
          may_try = now - reserved_since_ns >= kHeirGraceNs;
        }
        // Acquire pairs with unlock()'s release store.
        if (may_try && locked_.exchange(1, std::memory_order_acquire) == 0) {
          if (is_heir) {
            // Relaxed: the heir byte only steers who tries; the lock byte's
            // acquire/release carries all synchronization.
            heir_.store(0, std::memory_order_relaxed);
          }
          return true;
        }
      } else {
        reserved_since_ns = 0;
      }
      if (deadline_ns >= 0 && internal::monotonic_nanos() >= deadline_ns) {
        if (is_heir) heir_.store(0, std::memory_order_relaxed);  // hand the claim back
        return false;
      }
      if (kHandoffNs > 0 && !is_heir && internal::monotonic_nanos() - start_ns >= kHandoffNs &&
          heir_.load(std::memory_order_relaxed) == 0) {
        std::uint8_t expected = 0;
        // Relaxed: the CAS only decides which waiter is heir (see above).
        is_heir = heir_.compare_exchange_strong(expected, 1, std::memory_order_relaxed);
        if (is_heir) {
          // The lock is reserved for us now: poll it closely, and keep the
          // CPU rather than yield it, or the reservation idles the lock.
          backoff = internal::Backoff(kHeirGraceNs, internal::Backoff::kMinDelayNs * 2);
        }
      }
      backoff.wait();
    }
  }

  // How long a reservation may sit on a free lock before others bypass it.
  static constexpr std::int64_t kHeirGraceNs = 20'000;

  // Lock byte: 0 = free, 1 = held.
  std::atomic<std::uint8_t> locked_{0};
  // Heir byte: 1 while a starved waiter has claimed the next acquisition.
  std::atomic<std::uint8_t> heir_{0};
};

// The default: hand off to a waiter that has waited 100 us.
using SpinLock = BasicSpinLock<100'000>;
// Pure TTAS without hand-offs: highest raw throughput, unbounded unfairness.
using UnfairSpinLock = BasicSpinLock<0>;

static_assert(sizeof(SpinLock) <= 4);
static_assert(TimedLockable<SpinLock> && NoexceptLockable<SpinLock>);

}  // namespace shardlock
