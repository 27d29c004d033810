// SeqLock and SeqLocked<T>: optimistic reads of small, trivially copyable
// data. The in-process form of a database version-column lock: writers bump
// a version around their update; readers copy the data without writing
// anything shared and retry if the version moved.
//
//   shardlock::SeqLocked<Quote> quote;
//   quote.store({bid, ask});          // writer: serialized, never blocks readers
//   Quote q = quote.load();           // reader: wait-free unless a write overlaps
//
// Use it when reads vastly outnumber writes and the data is a few words: a
// reader never makes the cache line dirty, so readers scale across cores.
// Do not use it for pointers that readers dereference (a reader may see a
// pointer that a writer is about to free) or for large data (every overlap
// costs a full re-copy).
//
// Design
//   * SeqLock is 4 bytes: a version counter, odd while a writer is inside.
//     Writers serialize on it with a CAS from even to odd (so SeqLock is also
//     a Lockable writer lock) and release by storing the next even value.
//   * Race freedom: following Boehm ("Can seqlocks get along with
//     programming language memory models?", MSPC 2012), the protected data
//     lives in std::atomic<std::uint64_t> words accessed with relaxed loads
//     and stores, so overlapping reads and writes are not data races in the
//     C++ model (and TSan agrees). The data words are stored with release
//     and loaded with acquire (plain moves on x86): a reader that sees any
//     word of a new write therefore also sees that write's odd version when
//     it re-reads the version, and the acquire loads keep that re-read after
//     them. This needs no standalone fences (which TSan cannot model).
//   * Protocol for callers of the raw SeqLock: protect only atomics, store
//     them with memory_order_release inside lock()/unlock(), and load them
//     with memory_order_acquire between read_begin() and read_retry().
//   * Fairness: writers barge; readers can be delayed by a continuous stream
//     of writers (they retry), never by other readers.
//
// Measured (2-vCPU EPYC VM): writer lock+unlock pair 4.67 ns uncontended,
//   113 / 103 / 113 M/s contended at 2 / 4 / 8 writer threads.
//   Command: build/bench/bench/locks_benchmark --benchmark_min_time=0.3
//   (bench preset; full tables in docs/lock-benchmarks.md).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "shardlock/internal/backoff.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lockable.h"

namespace shardlock {

class SHARDLOCK_CAPABILITY("mutex") SeqLock {
 public:
  constexpr SeqLock() noexcept = default;
  SeqLock(const SeqLock&) = delete;
  SeqLock& operator=(const SeqLock&) = delete;

  // ---- readers ----

  // Starts an optimistic read: waits (spinning) while a writer is inside and
  // returns the even version to pass to read_retry().
  std::uint32_t read_begin() const noexcept {
    // Acquire pairs with the release store in unlock(): data written before
    // that version was published is visible to the reads that follow.
    std::uint32_t version = version_.load(std::memory_order_acquire);
    if ((version & 1) == 0) return version;
    internal::Backoff backoff;
    do {
      backoff.wait();
      version = version_.load(std::memory_order_acquire);
    } while ((version & 1) != 0);
    return version;
  }

  // Ends an optimistic read: true if a writer may have overlapped it, in
  // which case the data read must be discarded and the read repeated.
  [[nodiscard]] bool read_retry(std::uint32_t version) const noexcept {
    // Relaxed is enough: the caller's acquire data loads keep this load after
    // them, and a data value from a newer write carries (via its release
    // store) the newer version with it. See the class comment.
    return version_.load(std::memory_order_relaxed) != version;
  }

  // ---- writers (Lockable) ----

  // Blocks until the caller is the only writer; the version is then odd.
  void lock() noexcept SHARDLOCK_ACQUIRE() {
    if (!try_lock()) lock_slow();
  }

  [[nodiscard]] bool try_lock() noexcept SHARDLOCK_TRY_ACQUIRE(true) {
    std::uint32_t version = version_.load(std::memory_order_relaxed);
    // Acquire pairs with the previous writer's release store in unlock().
    if ((version & 1) != 0 ||
        !version_.compare_exchange_strong(version, version + 1, std::memory_order_acquire,
                                          std::memory_order_relaxed)) {
      return false;
    }
    return true;
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
    internal::Backoff backoff;
    while (!try_lock()) {
      if (Clock::now() >= deadline) return false;
      backoff.wait();
    }
    return true;
  }

  // Publishes the write: the version becomes even again.
  // Precondition: the caller holds the writer lock.
  void unlock() noexcept SHARDLOCK_RELEASE() {
    // Only the writer changes an odd version, so load+store is race-free.
    // Release pairs with read_begin()'s acquire and the next writer's CAS.
    version_.store(version_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  // Racy snapshot for tests and statistics.
  std::uint32_t version() const noexcept { return version_.load(std::memory_order_relaxed); }

 private:
  [[gnu::cold, gnu::noinline]] void lock_slow() noexcept SHARDLOCK_ACQUIRE() {
    internal::Backoff backoff;
    while (!try_lock()) backoff.wait();
  }

  // Even: no writer inside. Odd: a writer is inside. Wraps harmlessly.
  std::atomic<std::uint32_t> version_{0};
};

static_assert(sizeof(SeqLock) == 4);
static_assert(TimedLockable<SeqLock> && NoexceptLockable<SeqLock>);

// A value of type T protected by a SeqLock. T must be trivially copyable;
// keep it to a few words (readers copy it whole, possibly more than once).
template <class T>
requires std::is_trivially_copyable_v<T> && std::is_default_constructible_v<T>
class SeqLocked {
 public:
  SeqLocked() noexcept : SeqLocked(T{}) {}
  explicit SeqLocked(const T& initial) noexcept { write_words(initial); }
  SeqLocked(const SeqLocked&) = delete;
  SeqLocked& operator=(const SeqLocked&) = delete;

  // Returns a consistent copy. Never blocks writers; retries while a write
  // overlaps the copy.
  T load() const noexcept {
    std::array<std::uint64_t, kWords> copy;
    for (;;) {
      const std::uint32_t version = lock_.read_begin();
      for (std::size_t i = 0; i < kWords; ++i) {
        // Acquire pairs with write_words()' release stores: seeing a word of
        // a newer write makes read_retry() see its version. A torn copy is
        // detected and discarded.
        copy[i] = words_[i].load(std::memory_order_acquire);
      }
      if (!lock_.read_retry(version)) break;
    }
    T out;
    std::memcpy(&out, copy.data(), sizeof(T));
    return out;
  }

  // Replaces the value. Writers serialize; readers are never blocked.
  void store(const T& value) noexcept {
    lock_.lock();
    write_words(value);
    lock_.unlock();
  }

  // Read-modify-write under the writer lock: value = fn(value).
  template <class Fn>
  void update(Fn&& fn) noexcept(noexcept(fn(std::declval<T&>()))) {
    lock_.lock();
    T value = read_words_locked();
    fn(value);
    write_words(value);
    lock_.unlock();
  }

  // Current version; advances by 2 per store.
  std::uint32_t version() const noexcept { return lock_.version(); }

 private:
  static constexpr std::size_t kWords = (sizeof(T) + 7) / 8;

  T read_words_locked() const noexcept {
    std::array<std::uint64_t, kWords> copy;
    for (std::size_t i = 0; i < kWords; ++i) {
      copy[i] = words_[i].load(std::memory_order_relaxed);  // writer lock held
    }
    T out;
    std::memcpy(&out, copy.data(), sizeof(T));
    return out;
  }

  void write_words(const T& value) noexcept {
    std::array<std::uint64_t, kWords> copy{};
    std::memcpy(copy.data(), &value, sizeof(T));
    for (std::size_t i = 0; i < kWords; ++i) {
      // Release: orders the odd-version CAS before this store, so a reader
      // that loads this value (acquire) then sees the version has moved.
      words_[i].store(copy[i], std::memory_order_release);
    }
  }

  mutable SeqLock lock_;
  std::array<std::atomic<std::uint64_t>, kWords> words_{};
};

}  // namespace shardlock
