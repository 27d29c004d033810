// RwSpinLock: a writer-preferring reader-writer spinlock.
//
// Use it for short read-mostly critical sections where readers should run in
// parallel. For long or blocking sections prefer std::shared_mutex.
//
// Design
//   * Size: 4 bytes, one word (static_assert'ed):
//       bit  0      writer holds the lock
//       bits 1..15  writers waiting (count, in units of kWaiter)
//       bits 16..31 readers holding the lock (count, in units of kReader)
//   * Readers: one fetch_add of kReader. If a writer holds or is waiting,
//     the reader backs its increment out and waits, so a stream of readers
//     cannot starve a writer (writer preference).
//   * Writers: CAS 0 -> kWriter. Otherwise register as waiting (which stops
//     new readers), wait for the readers to drain, and CAS the waiting count
//     down and the writer bit up in one step. A writer that times out
//     deregisters, so a timed-out writer never strands readers.
//   * Waiting: time-budgeted exponential backoff, yielding after 20 us.
//   * Fairness: writers first; among writers and among readers, none.
//   * Limits: at most 32767 waiting writers and 65535 concurrent readers.
//     Precondition: a thread must not re-acquire a shared lock it holds while
//     a writer may be waiting (the second acquisition waits for the writer,
//     which waits for the first: deadlock), as with any writer-preferring lock.
//
// Measured (2-vCPU EPYC VM): uncontended exclusive pair 4.14 ns; exclusive
//   contended counter 63 / 56 / 47 M/s at 2 / 4 / 8 threads.
//   Command: build/bench/bench/locks_benchmark --benchmark_min_time=0.3
//   (bench preset; full tables in docs/lock-benchmarks.md).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "shardlock/internal/backoff.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lockable.h"

namespace shardlock {

class SHARDLOCK_CAPABILITY("mutex") RwSpinLock {
 public:
  constexpr RwSpinLock() noexcept = default;
  RwSpinLock(const RwSpinLock&) = delete;
  RwSpinLock& operator=(const RwSpinLock&) = delete;

  // ---- exclusive (writer) side ----

  // Blocks until the caller holds the lock exclusively.
  void lock() noexcept SHARDLOCK_ACQUIRE() {
    std::uint32_t expected = 0;
    // Acquire pairs with the release in unlock() and unlock_shared().
    if (word_.compare_exchange_strong(expected, kWriter, std::memory_order_acquire,
                                      std::memory_order_relaxed)) {
      return;
    }
    lock_slow(-1);
  }

  // Takes the lock exclusively if nobody holds it. Never blocks.
  [[nodiscard]] bool try_lock() noexcept SHARDLOCK_TRY_ACQUIRE(true) {
    std::uint32_t expected = 0;
    return word_.compare_exchange_strong(expected, kWriter, std::memory_order_acquire,
                                         std::memory_order_relaxed);
  }

  template <class Rep, class Period>
  [[nodiscard]] bool try_lock_for(const std::chrono::duration<Rep, Period>& timeout) noexcept
      SHARDLOCK_TRY_ACQUIRE(true) {
    return try_lock_until(std::chrono::steady_clock::now() + timeout);
  }

  template <class Clock, class Duration>
  [[nodiscard]] bool try_lock_until(
      const std::chrono::time_point<Clock, Duration>& deadline) noexcept
      SHARDLOCK_TRY_ACQUIRE(true) {
    if (try_lock()) return true;
    return lock_slow(internal::deadline_nanos(deadline));
  }

  // Precondition: the caller holds the lock exclusively.
  void unlock() noexcept SHARDLOCK_RELEASE() {
    // RMW, not a store: waiting writers and backing-out readers may change
    // other bits concurrently. Release pairs with the acquire of the next
    // holder, reader or writer.
    word_.fetch_sub(kWriter, std::memory_order_release);
  }

  // ---- shared (reader) side ----

  // Blocks until the caller holds the lock shared.
  void lock_shared() noexcept SHARDLOCK_ACQUIRE_SHARED() {
    // Acquire pairs with unlock()'s release when no writer was involved.
    const std::uint32_t before = word_.fetch_add(kReader, std::memory_order_acquire);
    if ((before & kWriterMask) == 0) return;
    lock_shared_slow();
  }

  // Takes the lock shared unless a writer holds or waits for it.
  [[nodiscard]] bool try_lock_shared() noexcept SHARDLOCK_TRY_ACQUIRE_SHARED(true) {
    std::uint32_t seen = word_.load(std::memory_order_relaxed);
    while ((seen & kWriterMask) == 0) {
      // Acquire pairs with unlock()'s release.
      if (word_.compare_exchange_weak(seen, seen + kReader, std::memory_order_acquire,
                                      std::memory_order_relaxed)) {
        return true;
      }
    }
    return false;
  }

  // Precondition: the caller holds the lock shared.
  void unlock_shared() noexcept SHARDLOCK_RELEASE_SHARED() {
    // Release: the reader's loads happen before a later writer's stores.
    word_.fetch_sub(kReader, std::memory_order_release);
  }

  // Racy snapshots, for assertions and statistics only.
  std::uint32_t readers() const noexcept { return word_.load(std::memory_order_relaxed) / kReader; }
  std::uint32_t waiting_writers() const noexcept {
    return (word_.load(std::memory_order_relaxed) & kWaitingMask) / kWaiter;
  }
  bool is_locked() const noexcept { return (word_.load(std::memory_order_relaxed) & kWriter) != 0; }

 private:
  static constexpr std::uint32_t kWriter = 1;
  static constexpr std::uint32_t kWaiter = 2;
  static constexpr std::uint32_t kWaitingMask = 0xFFFE;
  static constexpr std::uint32_t kWriterMask = kWriter | kWaitingMask;
  static constexpr std::uint32_t kReader = 1u << 16;

  [[gnu::cold, gnu::noinline]] bool lock_slow(std::int64_t deadline_ns) noexcept {
    // Relaxed: registration only steers readers away; it publishes nothing.
    word_.fetch_add(kWaiter, std::memory_order_relaxed);
    internal::Backoff backoff;
    for (;;) {
      std::uint32_t seen = word_.load(std::memory_order_relaxed);
      // Free of readers and of a writer: trade our waiting count for the bit.
      if ((seen & ~kWaitingMask) == 0 &&
          word_.compare_exchange_weak(seen, seen - kWaiter + kWriter, std::memory_order_acquire,
                                      std::memory_order_relaxed)) {  // pairs with unlock*()
        return true;
      }
      if (deadline_ns >= 0 && internal::monotonic_nanos() >= deadline_ns) {
        word_.fetch_sub(kWaiter, std::memory_order_relaxed);
        return false;
      }
      backoff.wait();
    }
  }

  [[gnu::cold, gnu::noinline]] void lock_shared_slow() noexcept {
    // Back out, so a waiting writer is not held up by our transient count.
    word_.fetch_sub(kReader, std::memory_order_relaxed);
    internal::Backoff backoff;
    for (;;) {
      std::uint32_t seen = word_.load(std::memory_order_relaxed);
      if ((seen & kWriterMask) == 0 &&
          word_.compare_exchange_weak(seen, seen + kReader, std::memory_order_acquire,
                                      std::memory_order_relaxed)) {  // pairs with unlock()
        return;
      }
      backoff.wait();
    }
  }

  // Bit layout in the class comment.
  std::atomic<std::uint32_t> word_{0};
};

static_assert(sizeof(RwSpinLock) == 4);
static_assert(TimedLockable<RwSpinLock> && SharedLockable<RwSpinLock> &&
              NoexceptLockable<RwSpinLock>);

}  // namespace shardlock
