#include "shardlock/internal/backoff.h"

#include <atomic>

namespace shardlock::internal {
namespace {

std::uint32_t calibrate_pause_nanos() noexcept {
  constexpr int kPauses = 2'000;
  std::int64_t best = INT64_MAX;
  // Best of a few runs: an interrupt or preemption only ever inflates a run.
  for (int run = 0; run < 5; ++run) {
    const std::int64_t start = monotonic_nanos();
    for (int i = 0; i < kPauses; ++i) cpu_relax();
    best = std::min(best, monotonic_nanos() - start);
  }
  return static_cast<std::uint32_t>(std::max<std::int64_t>(1, best / kPauses));
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
