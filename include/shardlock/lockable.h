// Concepts for the std lock requirements that std::lock_guard,
// std::scoped_lock, std::unique_lock and std::shared_lock rely on. Every lock
// in shardlock static_asserts the strongest one it models, so a missing or
// misspelled member fails at the definition rather than in a user's template.
#pragma once

#include <chrono>
#include <concepts>

namespace shardlock {

// [thread.req.lockable.basic]: lock() and unlock().
template <class L>
concept BasicLockable = requires(L& l) {
  l.lock();
  l.unlock();
};

// [thread.req.lockable.req]: plus a non-blocking try_lock().
template <class L>
concept Lockable = BasicLockable<L> && requires(L& l) {
  { l.try_lock() } -> std::convertible_to<bool>;
};

// [thread.req.lockable.timed]: plus try_lock_for / try_lock_until.
template <class L>
concept TimedLockable = Lockable<L> && requires(L& l) {
  { l.try_lock_for(std::chrono::milliseconds(1)) } -> std::convertible_to<bool>;
  { l.try_lock_until(std::chrono::steady_clock::now()) } -> std::convertible_to<bool>;
};

// [thread.req.lockable.shared]: what std::shared_lock needs.
template <class L>
concept SharedLockable = requires(L& l) {
  l.lock_shared();
  l.unlock_shared();
  { l.try_lock_shared() } -> std::convertible_to<bool>;
};

// Lock primitives never throw: their members are noexcept.
template <class L>
concept NoexceptLockable = Lockable<L> && requires(L& l) {
  { l.lock() }
  noexcept;
  { l.try_lock() }
  noexcept;
  { l.unlock() }
  noexcept;
};

}  // namespace shardlock
