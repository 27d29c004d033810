// Thin wrappers over the Linux futex(2) system call, private (per-process)
// futexes only. Not API.
#pragma once

#include <atomic>
#include <cstdint>

namespace shardlock::internal {

// Sleeps while `*word == expected`, until woken, until a signal arrives, or
// until CLOCK_MONOTONIC passes `deadline_ns` (no deadline when negative).
// Spurious returns are allowed; callers re-check their condition in a loop.
// Returns false only when the deadline has passed.
bool futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                std::int64_t deadline_ns = -1) noexcept;

// Wakes up to `count` threads waiting on `word`. Returns how many woke.
int futex_wake(std::atomic<std::uint32_t>* word, int count) noexcept;

}  // namespace shardlock::internal
