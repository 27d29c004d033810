// Helpers the benchmarks' ratio summaries share: the median repetition and
// the test for a run whose threads really ran at the same time. Not API.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace shardlock::bench {

// The median of `name`'s values, or 0 when there are none. With random
// interleaving every contender's repetitions sample the same mix of outside
// load, so medians compare fairly where single runs (or the luckiest run)
// would not.
inline double median_of(const std::map<std::string, std::vector<double>>& by_name,
                        const std::string& name) {
  const auto it = by_name.find(name);
  if (it == by_name.end() || it->second.empty()) return 0.0;
  std::vector<double> values = it->second;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

// Whether the run's threads kept min(threads, CPUs) cores busy (>= 90%):
// the CPU time Google Benchmark sums over the threads, over the real time.
// When other processes hold the CPUs, "2 threads" take turns on one core,
// the lock is hardly contended, and the run measures the other load.
inline bool ran_concurrently(const benchmark::BenchmarkReporter::Run& run) {
  if (run.real_accumulated_time <= 0) return false;
  const double cpus = std::max(1u, std::thread::hardware_concurrency());
  const double wanted = 0.9 * std::min(static_cast<double>(run.threads), cpus);
  return run.cpu_accumulated_time / run.real_accumulated_time >= wanted;
}

}  // namespace shardlock::bench
