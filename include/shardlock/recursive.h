// Recursive<L>: makes any shardlock lock reentrant.
//
//   shardlock::Recursive<shardlock::Mutex> lock;
//   void a() { std::scoped_lock g(lock); b(); }
//   void b() { std::scoped_lock g(lock); ... }   // same thread: no deadlock
//
// Prefer restructuring code so it does not need reentrancy; use this when a
// callback or a layered API makes that impractical.
//
// Design: the underlying lock plus the owner's identity and a depth. The
// owner is identified by the address of a thread_local (unique among live
// threads, no syscall), never by a value another thread could share.
// Unlocking from a thread that is not the owner is a precondition violation,
// asserted in debug builds. Size: sizeof(L) plus 16 bytes.
#pragma once

#include <atomic>
#include <cassert>
#include <chrono>
#include <cstdint>

#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lockable.h"

namespace shardlock {

namespace internal {
// A per-thread identity: the address of a thread_local, never 0.
inline std::uintptr_t this_thread_tag() noexcept {
  static thread_local char tag;
  return reinterpret_cast<std::uintptr_t>(&tag);
}
}  // namespace internal

template <Lockable L>
class SHARDLOCK_CAPABILITY("mutex") Recursive {
 public:
  constexpr Recursive() noexcept = default;
  Recursive(const Recursive&) = delete;
  Recursive& operator=(const Recursive&) = delete;

  // Acquires, or re-enters if the calling thread already holds the lock.
  void lock() noexcept SHARDLOCK_ACQUIRE() {
    const std::uintptr_t me = internal::this_thread_tag();
    // Relaxed: only this thread can have stored `me`, so equality is stable;
    // any other value means "not mine" whatever its staleness.
    if (owner_.load(std::memory_order_relaxed) == me) {
      ++depth_;
      return;
    }
    lock_.lock();
    owner_.store(me, std::memory_order_relaxed);  // published by lock_'s release
    depth_ = 1;
  }

  [[nodiscard]] bool try_lock() noexcept SHARDLOCK_TRY_ACQUIRE(true) {
    const std::uintptr_t me = internal::this_thread_tag();
    if (owner_.load(std::memory_order_relaxed) == me) {
      ++depth_;
      return true;
    }
    if (!lock_.try_lock()) return false;
    owner_.store(me, std::memory_order_relaxed);
    depth_ = 1;
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
    const std::uintptr_t me = internal::this_thread_tag();
    if (owner_.load(std::memory_order_relaxed) == me) {
      ++depth_;
      return true;
    }
    if (!lock_.try_lock_until(deadline)) return false;
    owner_.store(me, std::memory_order_relaxed);
    depth_ = 1;
    return true;
  }

  // Leaves one level; releases the underlying lock at the outermost level.
  // Precondition: the calling thread holds the lock (asserted in debug).
  void unlock() noexcept SHARDLOCK_RELEASE() {
    assert(owned_by_this_thread() && "Recursive::unlock by a thread that does not hold the lock");
    if (--depth_ == 0) {
      // Relaxed: cleared before lock_.unlock()'s release publishes it.
      owner_.store(0, std::memory_order_relaxed);
      lock_.unlock();
    }
  }

  bool owned_by_this_thread() const noexcept {
    return owner_.load(std::memory_order_relaxed) == internal::this_thread_tag();
  }
  // Nesting depth; meaningful only to the owning thread.
  std::uint32_t depth() const noexcept { return owned_by_this_thread() ? depth_ : 0; }

 private:
  L lock_;
  std::atomic<std::uintptr_t> owner_{0};
  std::uint32_t depth_ = 0;  // touched only by the owner
};

}  // namespace shardlock
