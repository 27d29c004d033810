// Time-budgeted spin-wait policy shared by shardlock's spinning locks. Not API.
//
// A pause costs about 19-24 ns on this project's AMD EPYC (Zen 4) machine and
// about 140 cycles (~40 ns) on Skylake, but only ~10 cycles on older Intel
// parts, so counting pauses gives wildly different wait times per CPU. The
// delays here are written in nanoseconds and converted to pause counts with a
// per-process calibration (pause_nanos(), measured once at start-up in short
// bursts, so pause-loop exiting under a hypervisor does not skew it; see
// src/backoff.cc).
#pragma once

#include <sched.h>

#include <algorithm>
#include <cstdint>

#include "shardlock/internal/cpu.h"

namespace shardlock::internal {

// Measured cost of one cpu_relax() in nanoseconds, at least 1. Calibrated
// once per process by a static initializer in src/backoff.cc.
std::uint32_t pause_nanos() noexcept;

// Pauses for roughly `nanos` nanoseconds.
inline void pause_for(std::uint32_t nanos) noexcept {
  for (std::uint32_t i = nanos / pause_nanos() + 1; i != 0; --i) cpu_relax();
}

// Exponential backoff from kMinDelay to kMaxDelay nanoseconds per round.
// Once `spin_budget_ns` has passed since the first wait, every wait() round
// also yields the CPU, so a preempted lock holder gets to run when threads
// outnumber cores. A waiter that has a better place to go once the budget is
// spent (Mutex parks on its futex) calls spin() instead, which never yields.
class Backoff {
 public:
  static constexpr std::uint32_t kMinDelayNs = 40;
  static constexpr std::uint32_t kMaxDelayNs = 2'000;

  explicit Backoff(std::int64_t spin_budget_ns = 20'000,
                   std::uint32_t max_delay_ns = kMaxDelayNs) noexcept
      : budget_ns_(spin_budget_ns), max_delay_ns_(max_delay_ns) {}

  // One round of waiting. Returns true once the spin budget is spent.
  bool wait() noexcept {
    if (!spin()) return false;
    sched_yield();
    return true;
  }

  // One round of pausing, without yielding. Returns true once the spin
  // budget is spent.
  bool spin() noexcept {
    if (start_ns_ == 0) start_ns_ = monotonic_nanos();
    pause_for(delay_ns_);
    delay_ns_ = std::min(delay_ns_ * 2, max_delay_ns_);
    return monotonic_nanos() - start_ns_ >= budget_ns_;
  }

  // Nanoseconds since the first wait() (0 before it).
  std::int64_t waited_ns() const noexcept {
    return start_ns_ == 0 ? 0 : monotonic_nanos() - start_ns_;
  }

  // The pause the next wait() makes, in nanoseconds: what makes the
  // doubling and its cap testable (tests/backoff_test.cc).
  std::uint32_t next_delay_ns() const noexcept { return delay_ns_; }

 private:
  std::int64_t budget_ns_;
  std::uint32_t max_delay_ns_;
  std::int64_t start_ns_ = 0;
  std::uint32_t delay_ns_ = kMinDelayNs;
};

}  // namespace shardlock::internal
