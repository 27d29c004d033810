// AtomicLatencyHistogram: a fixed-bucket latency histogram that one or more
// threads record into without a lock and any thread reads. The buckets are
// LatencyHistogram's (server_types.h); a snapshot is what metrics export.
//
// Not API: the lease server's building block.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "shardlock/lease/server/server_types.h"

namespace shardlock::lease::internal {

class AtomicLatencyHistogram {
 public:
  void record(std::chrono::nanoseconds elapsed) noexcept {
    const std::int64_t ns = elapsed.count() < 0 ? 0 : elapsed.count();
    std::size_t b = 0;
    while (b < LatencyHistogram::kUpperBoundsUs.size() &&
           ns > std::int64_t{LatencyHistogram::kUpperBoundsUs[b]} * 1000) {
      ++b;
    }
    // Relaxed: statistics. A reader may see a count without its sum (or the
    // reverse) for one sample; nothing is ordered by them.
    counts_[b].fetch_add(1, std::memory_order_relaxed);
    sum_ns_.fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
  }
  // Adds this histogram's samples to `out`.
  void add_to(LatencyHistogram& out) const noexcept {
    for (std::size_t b = 0; b < counts_.size(); ++b) {
      const std::uint64_t n = counts_[b].load(std::memory_order_relaxed);  // see record()
      out.counts[b] += n;
      out.count += n;
    }
    out.sum_seconds += static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  }

 private:
  std::array<std::atomic<std::uint64_t>, LatencyHistogram::kUpperBoundsUs.size() + 1> counts_{};
  std::atomic<std::uint64_t> sum_ns_{0};
};

}  // namespace shardlock::lease::internal
