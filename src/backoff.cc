#include "shardlock/internal/backoff.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace shardlock::internal {
namespace {

// Times short bursts of pauses rather than one long run. Under KVM on Intel
// hosts, pause-loop exiting traps a vCPU that executes PAUSE back to back
// for longer than ple_window (4096 cycles by default, ~29 Skylake PAUSEs),
// so a long run measures VM exits as well as pauses and overstates the
// cost, which then makes every backoff delay too short. The lock slow paths
// pause in short bursts themselves (pause_for(640 ns) is 16-34 PAUSEs), so
// a 16-PAUSE burst (~2,200 cycles on Skylake, ~400 ns on Zen 4) is also
// what they experience. AMD's pause filter counts PAUSEs (3,000 by default)
// and gives the same answer either way: 23.8 ns per PAUSE from bursts, 24.4
// from a 2,000-PAUSE run on this project's EPYC (family 25 model 17).
std::uint32_t calibrate_pause_nanos() noexcept {
  constexpr int kBurst = 16;
  constexpr int kRuns = 100;
  std::int64_t best_burst = INT64_MAX;
  std::int64_t best_empty = INT64_MAX;
  // Best of many: an interrupt or preemption only ever inflates a run.
  for (int run = 0; run < kRuns; ++run) {
    // The clock's own cost, subtracted below (~20 ns through the vDSO).
    std::int64_t start = monotonic_nanos();
    best_empty = std::min(best_empty, monotonic_nanos() - start);
    start = monotonic_nanos();
    for (int i = 0; i < kBurst; ++i) cpu_relax();
    best_burst = std::min(best_burst, monotonic_nanos() - start);
  }
  return static_cast<std::uint32_t>(std::max<std::int64_t>(1, (best_burst - best_empty) / kBurst));
}

// Relaxed is enough: any value in [1, true cost] is a safe answer, and the
// initializer runs before main() in practice; a racing first reader that sees
// 0 falls back to 1.
std::atomic<std::uint32_t> g_pause_nanos{calibrate_pause_nanos()};

}  // namespace

std::uint32_t pause_nanos() noexcept {
  return std::max<std::uint32_t>(1, g_pause_nanos.load(std::memory_order_relaxed));
}

}  // namespace shardlock::internal
