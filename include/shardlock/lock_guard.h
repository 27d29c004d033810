// LockGuard<L>: a scoped lock that Clang's thread-safety analysis follows.
//
//   shardlock::Mutex mu;
//   int value SHARDLOCK_GUARDED_BY(mu);
//   void set(int v) { shardlock::LockGuard guard(mu); value = v; }
//
// std::lock_guard and std::scoped_lock work with every shardlock lock, but
// libstdc++ does not annotate them, so code that marks its data
// SHARDLOCK_GUARDED_BY should lock through LockGuard (or SharedLockGuard for
// a shared lock) to keep the analysis' checks. Not movable; never fails.
#pragma once

#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lockable.h"

namespace shardlock {

template <BasicLockable L>
class SHARDLOCK_SCOPED_CAPABILITY LockGuard {
 public:
  // Blocks until `lock` is held; it is released when the guard is destroyed.
  explicit LockGuard(L& lock) noexcept SHARDLOCK_ACQUIRE(lock) : lock_(lock) { lock_.lock(); }
  ~LockGuard() SHARDLOCK_RELEASE() { lock_.unlock(); }
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;

 private:
  L& lock_;
};

template <SharedLockable L>
class SHARDLOCK_SCOPED_CAPABILITY SharedLockGuard {
 public:
  // Blocks until `lock` is held shared; released when the guard is destroyed.
  explicit SharedLockGuard(L& lock) noexcept SHARDLOCK_ACQUIRE_SHARED(lock) : lock_(lock) {
    lock_.lock_shared();
  }
  ~SharedLockGuard() SHARDLOCK_RELEASE() { lock_.unlock_shared(); }
  SharedLockGuard(const SharedLockGuard&) = delete;
  SharedLockGuard& operator=(const SharedLockGuard&) = delete;

 private:
  L& lock_;
};

}  // namespace shardlock
