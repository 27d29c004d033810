// See workloads.h. Table mode: --clients threads, each locking the
// LockTable stripe of a Zipf-drawn key and unlocking it at once (try_lock
// first, so contention is counted as busy).
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/progress.h"
#include "bench/workloads.h"
#include "shardlock/lock_table.h"
#include "shardlock/workload/zipf.h"

namespace shardlock::bench {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

int run_table(const Config& config, Result& result) {
  LockTable<> table;
  result.target =
      "in-process LockTable<SpinLock>, " + std::to_string(table.stripe_count()) + " stripes";
  std::atomic<bool> stop{false};
  const workload::ZipfGenerator base(config.keys, config.theta, config.seed);
  std::vector<std::unique_ptr<LiveCounters>> live;
  std::vector<Histogram> histograms(config.clients);
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < config.clients; ++i) live.push_back(std::make_unique<LiveCounters>());
  for (unsigned i = 0; i < config.clients; ++i) {
    threads.emplace_back([&, i] {
      workload::ZipfGenerator zipf = base.fork(config.seed * 1'000'003 + i);
      LiveCounters& c = *live[i];
      Histogram& h = histograms[i];
      while (!stop.load(std::memory_order_relaxed)) {
        const std::uint64_t key = zipf.next();
        const auto begin = Clock::now();
        auto guard = table.try_lock(key);
        if (!guard) {
          c.busy.fetch_add(1, std::memory_order_relaxed);
          guard = table.lock(key);
        }
        guard.unlock();
        h.record(static_cast<std::uint64_t>((Clock::now() - begin).count()));
        c.grants.fetch_add(1, std::memory_order_relaxed);
        c.pairs.fetch_add(1, std::memory_order_relaxed);
        c.requests.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  Progress progress(config.json);
  const auto collect = [&] {
    Totals t;
    for (const auto& c : live) t.add(*c);
    return t;
  };
  result.seconds = run_for(config, progress, stop, collect, result);
  for (auto& t : threads) t.join();
  result.totals = collect();
  progress.finish();
  for (const auto& h : histograms) {
    result.request_latency.merge(h);
    result.pair_latency.merge(h);
  }
  return 0;
}

}  // namespace shardlock::bench
