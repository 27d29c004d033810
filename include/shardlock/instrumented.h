// Instrumented<L>: opt-in contention statistics for any shardlock lock.
//
//   shardlock::Instrumented<shardlock::SpinLock> lock;
//   { std::scoped_lock g(lock); ... }
//   shardlock::ContentionStats s = lock.stats();
//
// Counts acquisitions, contended acquisitions (the first try_lock failed),
// and the total and maximum time contended acquisitions spent waiting. It is
// a wrapper, so a plain SpinLock pays nothing for it: the cost exists only
// where a user names Instrumented<L>.
//
// Cost when used: an uncontended acquisition adds one try_lock attempt in
// place of lock() and one relaxed increment on a counter in the lock's own
// cache line. Contended acquisitions also read the monotonic clock twice
// (~40 ns, inside the wait they are measuring anyway).
//
// The counters are updated while the lock is held, by the holder only, so
// they need no atomic read-modify-write; they are relaxed atomics so that
// stats() may read them from any thread without a data race. A snapshot read
// concurrently with acquisitions is per-field consistent, not a cut across
// fields.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "shardlock/internal/cpu.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lockable.h"

namespace shardlock {

// A snapshot of one lock's counters.
struct ContentionStats {
  std::uint64_t acquisitions = 0;   // successful exclusive + shared acquisitions
  std::uint64_t contended = 0;      // of those, how many had to wait
  std::uint64_t total_wait_ns = 0;  // summed wait of the contended ones
  std::uint64_t max_wait_ns = 0;    // longest single wait

  ContentionStats& operator+=(const ContentionStats& other) noexcept {
    acquisitions += other.acquisitions;
    contended += other.contended;
    total_wait_ns += other.total_wait_ns;
    if (other.max_wait_ns > max_wait_ns) max_wait_ns = other.max_wait_ns;
    return *this;
  }
};

template <Lockable L>
class SHARDLOCK_CAPABILITY("mutex") Instrumented {
 public:
  using lock_type = L;

  constexpr Instrumented() noexcept = default;
  Instrumented(const Instrumented&) = delete;
  Instrumented& operator=(const Instrumented&) = delete;

  // As L::lock(), recording whether it had to wait and for how long.
  void lock() noexcept SHARDLOCK_ACQUIRE() {
    if (lock_.try_lock()) {
      record_uncontended();
      return;
    }
    const std::int64_t start = internal::monotonic_nanos();
    lock_.lock();
    record_contended(internal::monotonic_nanos() - start);
  }

  [[nodiscard]] bool try_lock() noexcept SHARDLOCK_TRY_ACQUIRE(true) {
    if (!lock_.try_lock()) return false;
    record_uncontended();
    return true;
  }

  template <class Rep, class Period>
  requires TimedLockable<L>
  [[nodiscard]] bool try_lock_for(const std::chrono::duration<Rep, Period>& timeout) noexcept
      SHARDLOCK_TRY_ACQUIRE(true) {
    return try_lock_until(std::chrono::steady_clock::now() + timeout);
  }

  template <class Clock, class Duration>
  requires TimedLockable<L>
  [[nodiscard]] bool try_lock_until(
      const std::chrono::time_point<Clock, Duration>& deadline) noexcept
      SHARDLOCK_TRY_ACQUIRE(true) {
    if (lock_.try_lock()) {
      record_uncontended();
      return true;
    }
    const std::int64_t start = internal::monotonic_nanos();
    if (!lock_.try_lock_until(deadline)) return false;
    record_contended(internal::monotonic_nanos() - start);
    return true;
  }

  void unlock() noexcept SHARDLOCK_RELEASE() { lock_.unlock(); }

  // Shared mode, when L has it. Readers run concurrently, so their counters
  // use relaxed fetch_add instead of the holder-only update.
  template <class Self = L>
  requires SharedLockable<Self>
  void lock_shared() noexcept SHARDLOCK_ACQUIRE_SHARED() {
    if (lock_.try_lock_shared()) {
      acquisitions_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const std::int64_t start = internal::monotonic_nanos();
    lock_.lock_shared();
    const auto waited = static_cast<std::uint64_t>(internal::monotonic_nanos() - start);
    acquisitions_.fetch_add(1, std::memory_order_relaxed);
    contended_.fetch_add(1, std::memory_order_relaxed);
    total_wait_ns_.fetch_add(waited, std::memory_order_relaxed);
    std::uint64_t seen = max_wait_ns_.load(std::memory_order_relaxed);
    while (waited > seen &&
           !max_wait_ns_.compare_exchange_weak(seen, waited, std::memory_order_relaxed)) {
    }
  }

  template <class Self = L>
  requires SharedLockable<Self>
  [[nodiscard]] bool try_lock_shared() noexcept SHARDLOCK_TRY_ACQUIRE_SHARED(true) {
    if (!lock_.try_lock_shared()) return false;
    acquisitions_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  template <class Self = L>
  requires SharedLockable<Self>
  void unlock_shared() noexcept SHARDLOCK_RELEASE_SHARED() { lock_.unlock_shared(); }

  // A snapshot of the counters. Safe from any thread, never blocks.
  ContentionStats stats() const noexcept {
    ContentionStats s;
    s.acquisitions = acquisitions_.load(std::memory_order_relaxed);
    s.contended = contended_.load(std::memory_order_relaxed);
    s.total_wait_ns = total_wait_ns_.load(std::memory_order_relaxed);
    s.max_wait_ns = max_wait_ns_.load(std::memory_order_relaxed);
    return s;
  }

  // Zeroes the counters. Racy against concurrent acquisitions by design: a
  // benchmark calls it between phases.
  void reset_stats() noexcept {
    acquisitions_.store(0, std::memory_order_relaxed);
    contended_.store(0, std::memory_order_relaxed);
    total_wait_ns_.store(0, std::memory_order_relaxed);
    max_wait_ns_.store(0, std::memory_order_relaxed);
  }

  L& underlying() noexcept { return lock_; }

 private:
  // Called with the lock held (exclusive), so load+store cannot lose counts
  // to another exclusive holder; it can race only with shared-mode fetch_add,
  // which uses RMW. Relaxed: the lock's own acquire/release orders them.
  void bump(std::atomic<std::uint64_t>& counter, std::uint64_t by) noexcept {
    if constexpr (SharedLockable<L>) {
      counter.fetch_add(by, std::memory_order_relaxed);
    } else {
      counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
    }
  }
  void record_uncontended() noexcept { bump(acquisitions_, 1); }
  void record_contended(std::int64_t waited_ns) noexcept {
    const auto waited = static_cast<std::uint64_t>(waited_ns);
    bump(acquisitions_, 1);
    bump(contended_, 1);
    bump(total_wait_ns_, waited);
    if (waited > max_wait_ns_.load(std::memory_order_relaxed)) {
      if constexpr (SharedLockable<L>) {
        std::uint64_t seen = max_wait_ns_.load(std::memory_order_relaxed);
        while (waited > seen &&
               !max_wait_ns_.compare_exchange_weak(seen, waited, std::memory_order_relaxed)) {
        }
      } else {
        max_wait_ns_.store(waited, std::memory_order_relaxed);
      }
    }
  }

  L lock_;
  std::atomic<std::uint64_t> acquisitions_{0};
  std::atomic<std::uint64_t> contended_{0};
  std::atomic<std::uint64_t> total_wait_ns_{0};
  std::atomic<std::uint64_t> max_wait_ns_{0};
};

}  // namespace shardlock
