// Lock-table throughput against the memory system's own limit.
//
// Every contender runs the same loop: take the next key from a precomputed
// per-thread sequence (uniform or Zipf 0.99 over 2^20 keys), then, under
// whatever exclusion the contender provides, read-modify-write that key's
// counter in a separate 8 MB array. The yardstick ("racy") runs the loop with
// no exclusion at all: relaxed atomic load + store, so it loses updates but
// is not undefined behaviour. It is the cost of the counter's cache misses
// alone, at the same thread count, on the same machine, in the same run.
//
// After the usual table, the binary prints each contender's throughput as a
// ratio of the racy loop's at the same thread count and key distribution
// (with and without prefetching), and as a multiple of one global
// std::mutex, counting only the runs whose threads really ran at the same
// time (ratio_support.h). On a machine shared with other work, run
// repetitions in random interleaved order: the summary compares each
// benchmark's median repetition, so a burst of outside load cannot land on
// one contender only.
//
//   lock_table_benchmark --benchmark_min_time=0.05 --benchmark_repetitions=8
//                        --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ratio_support.h"
#include "shardlock/internal/cpu.h"
#include "shardlock/lock_table.h"
#include "shardlock/mutex.h"
#include "shardlock/spin_lock.h"
#include "shardlock/workload/zipf.h"

#if defined(SHARDLOCK_HAVE_TBB)
#include <tbb/concurrent_hash_map.h>
#endif

namespace {

using shardlock::LockTable;

constexpr std::uint32_t kKeyBits = 20;
constexpr std::uint32_t kKeys = 1u << kKeyBits;  // 2^20 keys, 8 MB of counters
constexpr std::size_t kSequenceLength = 1u << 20;
constexpr int kMaxThreads = 8;
constexpr std::size_t kPrefetchDistance = 8;

enum Distribution : int { kUniform = 0, kZipf = 1 };

// The per-key counters every contender updates, one 8-byte word per key.
// Deliberately leaked: benchmark threads may outlive static destruction.
std::atomic<std::uint64_t>* const g_counters = new std::atomic<std::uint64_t>[kKeys]();

// kMaxThreads independent key sequences per distribution, built once.
// Zipf ranks are scattered over the key space (rank * odd constant mod
// 2^20, a bijection), as YCSB's ScrambledZipfian does, so that the hottest
// keys' counters do not share cache lines by construction.
const std::vector<std::uint32_t>& key_sequence(Distribution distribution, int thread) {
  static const auto sequences = [] {
    std::vector<std::vector<std::uint32_t>> all(2 * kMaxThreads);
    const shardlock::workload::ZipfDistribution zipf(kKeys, 0.99);
    for (int t = 0; t < kMaxThreads; ++t) {
      shardlock::workload::SplitMix64 uniform(1000 + static_cast<std::uint64_t>(t));
      shardlock::workload::SplitMix64 zipf_bits(2000 + static_cast<std::uint64_t>(t));
      auto& u = all[static_cast<std::size_t>(t)];
      auto& z = all[static_cast<std::size_t>(kMaxThreads + t)];
      u.resize(kSequenceLength);
      z.resize(kSequenceLength);
      for (std::size_t i = 0; i < kSequenceLength; ++i) {
        u[i] = static_cast<std::uint32_t>(uniform.uniform(kKeys));
        const auto rank = static_cast<std::uint32_t>(zipf(zipf_bits.next()));
        z[i] = (rank * 0x9e3779b1u) & (kKeys - 1);
      }
    }
    return all;
  }();
  return sequences[static_cast<std::size_t>(distribution * kMaxThreads + thread % kMaxThreads)];
}

// The critical section: read-modify-write of the key's counter. Relaxed
// load + store (plain moves on x86): the contender supplies the exclusion.
inline void bump(std::uint32_t key) {
  std::atomic<std::uint64_t>& c = g_counters[key];
  c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

// Runs the benchmark loop, calling `op(key)` once per iteration, and
// `ahead(key)` on the key kPrefetchDistance iterations later (a no-op
// unless the contender prefetches).
struct NoPrefetch {
  void operator()(std::uint32_t) const noexcept {}
};

template <class Op, class Ahead = NoPrefetch>
void run_loop(benchmark::State& state, Op op, Ahead ahead = {}) {
  const auto& keys = key_sequence(static_cast<Distribution>(state.range(0)), state.thread_index());
  const std::uint32_t* key = keys.data();
  std::size_t i = 0;
  for (auto _ : state) {
    ahead(key[(i + kPrefetchDistance) & (kSequenceLength - 1)]);
    op(key[i]);
    i = (i + 1) & (kSequenceLength - 1);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(state.range(0) == kUniform ? "uniform" : "zipf0.99");
}

// Requests the counter's line in exclusive state (the RMW will write it).
inline void prefetch_counter(std::uint32_t key) {
  shardlock::internal::prefetch_for_write(&g_counters[key]);
}

// ---- contenders ----------------------------------------------------------

void BM_Racy(benchmark::State& state) {
  run_loop(state, [](std::uint32_t key) { bump(key); });
}

// The yardstick given the same prefetches as BM_LockTablePrefetch, so that
// contender is compared like for like.
void BM_RacyPrefetch(benchmark::State& state) {
  run_loop(
      state, [](std::uint32_t key) { bump(key); }, prefetch_counter);
}

template <class Lock>
LockTable<Lock>& shared_table() {
  static LockTable<Lock> table;  // default stripes (64 x hardware threads)
  return table;
}

template <class Lock>
void BM_LockTable(benchmark::State& state) {
  LockTable<Lock>& table = shared_table<Lock>();
  run_loop(state, [&](std::uint32_t key) {
    auto guard = table.lock(key);
    bump(key);
  });
}

// The same, for a caller that knows its next keys (a batch of requests):
// table.prefetch() and a counter prefetch kPrefetchDistance keys ahead put
// the lock's and the data's misses in flight together, behind the current
// operation, instead of one after the other after the lock's fence.
template <class Lock>
void BM_LockTablePrefetch(benchmark::State& state) {
  LockTable<Lock>& table = shared_table<Lock>();
  run_loop(
      state,
      [&](std::uint32_t key) {
        auto guard = table.lock(key);
        bump(key);
      },
      [&](std::uint32_t key) {
        table.prefetch(key);
        prefetch_counter(key);
      });
}

template <class Lock>
void BM_LockTableWithLock(benchmark::State& state) {
  LockTable<Lock>& table = shared_table<Lock>();
  run_loop(state, [&](std::uint32_t key) { table.with_lock(key, [key] { bump(key); }); });
}

void BM_GlobalStdMutex(benchmark::State& state) {
  static std::mutex global;
  run_loop(state, [](std::uint32_t key) {
    std::lock_guard guard(global);
    bump(key);
  });
}

// The naive approach: a mutex per key, created on first use, in a map behind
// one global mutex.
void BM_NaiveMutexMap(benchmark::State& state) {
  static std::mutex map_lock;
  static std::unordered_map<std::uint32_t, std::mutex> per_key;
  run_loop(state, [](std::uint32_t key) {
    std::mutex* m;
    {
      std::lock_guard guard(map_lock);
      m = &per_key[key];  // node-based: the address is stable across rehashes
    }
    std::lock_guard guard(*m);
    bump(key);
  });
}

#if defined(SHARDLOCK_HAVE_TBB)
// The peer with per-key locking built in: an accessor on a
// tbb::concurrent_hash_map holds that element's own reader-writer lock.
void BM_TbbConcurrentHashMapAccessor(benchmark::State& state) {
  static tbb::concurrent_hash_map<std::uint32_t, char> map;
  run_loop(state, [](std::uint32_t key) {
    tbb::concurrent_hash_map<std::uint32_t, char>::accessor holder;
    map.insert(holder, key);  // finds or inserts, then locks the element
    bump(key);
  });
}
#endif

#define SHARDLOCK_LOCK_TABLE_BENCH(...) \
  BENCHMARK(__VA_ARGS__)                \
      ->ArgName("zipf")                 \
      ->Arg(kUniform)                   \
      ->Arg(kZipf)                      \
      ->Threads(1)                      \
      ->Threads(2)                      \
      ->Threads(4)                      \
      ->Threads(8)                      \
      ->UseRealTime()

// The yardstick first: the summary reads its results when the others finish.
SHARDLOCK_LOCK_TABLE_BENCH(BM_Racy);
SHARDLOCK_LOCK_TABLE_BENCH(BM_RacyPrefetch);
SHARDLOCK_LOCK_TABLE_BENCH(BM_LockTable<shardlock::SpinLock>);
SHARDLOCK_LOCK_TABLE_BENCH(BM_LockTablePrefetch<shardlock::SpinLock>);
SHARDLOCK_LOCK_TABLE_BENCH(BM_LockTableWithLock<shardlock::SpinLock>);
SHARDLOCK_LOCK_TABLE_BENCH(BM_LockTable<shardlock::Mutex>);
SHARDLOCK_LOCK_TABLE_BENCH(BM_GlobalStdMutex);
SHARDLOCK_LOCK_TABLE_BENCH(BM_NaiveMutexMap);
#if defined(SHARDLOCK_HAVE_TBB)
SHARDLOCK_LOCK_TABLE_BENCH(BM_TbbConcurrentHashMapAccessor);
#endif

// ---- the ratio summary ---------------------------------------------------

// Console output as usual, plus every run's items/s kept for the summary.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      const auto it = run.counters.find("items_per_second");
      if (it == run.counters.end()) continue;
      // "BM_LockTable<shardlock::SpinLock>/zipf:1/real_time/threads:2"
      const std::string name = run.run_name.function_name;
      const std::string args = run.run_name.args;  // "zipf:0" or "zipf:1"
      if (std::find(order_.begin(), order_.end(), name) == order_.end()) order_.push_back(name);
      ++repetitions_[{args, static_cast<int>(run.threads)}];
      if (!shardlock::bench::ran_concurrently(run)) continue;
      results_[{args, static_cast<int>(run.threads)}][name].push_back(it->second.value);
    }
    ConsoleReporter::ReportRuns(runs);
  }

  void print_summary() const {
    std::printf(
        "\nThroughput as a multiple of the racy loop without and with prefetching\n"
        "(same keys, same threads, same run; median of the repetitions) and of one\n"
        "global std::mutex. Only runs whose threads kept min(threads, CPUs) cores\n"
        "busy (>= 90%%) count: on a shared machine the others measure the other\n"
        "load, not the locks. CPU: %s\n",
        shardlock::internal::cpu_model_name().c_str());
    for (const auto& [key, by_name] : results_) {
      const double racy = lookup(by_name, "BM_Racy");
      const double racy_prefetch = lookup(by_name, "BM_RacyPrefetch");
      const double global = lookup(by_name, "BM_GlobalStdMutex");
      if (racy == 0) continue;
      std::size_t kept = 0;
      for (const auto& [name, values] : by_name) kept += values.size();
      const auto ran = repetitions_.find(key);
      std::printf(
          "  %-8s threads=%d  racy %.1f M/s, racy+prefetch %.1f M/s  (%zu of %d runs kept)\n",
          key.first == "zipf:0" ? "uniform" : "zipf0.99", key.second, racy / 1e6,
          racy_prefetch / 1e6, kept, ran == repetitions_.end() ? 0 : ran->second);
      for (const std::string& name : order_) {
        const double mine = lookup(by_name, name);
        if (mine == 0 || name.rfind("BM_Racy", 0) == 0) continue;
        std::printf("    %-45s %5.2fx racy", name.c_str(), mine / racy);
        if (racy_prefetch != 0) std::printf("  %5.2fx racy+prefetch", mine / racy_prefetch);
        if (global != 0) std::printf("  %6.2fx global", mine / global);
        std::printf("\n");
      }
    }
  }

 private:
  static double lookup(const std::map<std::string, std::vector<double>>& by_name,
                       const std::string& name) {
    return shardlock::bench::median_of(by_name, name);
  }

  std::map<std::pair<std::string, int>, std::map<std::string, std::vector<double>>> results_;
  // Runs per distribution and thread count, kept or not.
  std::map<std::pair<std::string, int>, int> repetitions_;
  std::vector<std::string> order_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::AddCustomContext("cpu_model", shardlock::internal::cpu_model_name());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // Build the key sequences before any timing starts.
  (void)key_sequence(kUniform, 0);
  // glibc drops the lock prefix from pthread mutexes while a process has
  // never created a thread, which would flatter std::mutex in a run filtered
  // to threads:1. Create one, so every contender pays for real atomics.
  std::thread([] {}).join();
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_summary();
  benchmark::Shutdown();
  return 0;
}
