// poll_until: waits for state another thread makes observable, with a
// deadline, instead of sleeping and hoping that thread got there first.
#pragma once

#include <chrono>
#include <thread>

namespace shardlock::test_support {

// Generous: sanitizer builds run oversubscribed on two shared cores. A test
// that hits it has failed; it only keeps a broken test from hanging.
inline constexpr std::chrono::seconds kPollTimeout{20};

// Calls `done` until it returns true or `timeout` has passed; returns its
// last answer. Between calls it yields, or sleeps `interval` when that is
// non-zero (for predicates that cost a round trip).
template <class Predicate>
[[nodiscard]] bool poll_until(Predicate&& done,
                              std::chrono::steady_clock::duration timeout = kPollTimeout,
                              std::chrono::steady_clock::duration interval = {}) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return done();
    if (interval > std::chrono::steady_clock::duration::zero()) {
      std::this_thread::sleep_for(interval);
    } else {
      std::this_thread::yield();
    }
  }
  return true;
}

}  // namespace shardlock::test_support
