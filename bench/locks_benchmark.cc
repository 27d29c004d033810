// Lock primitives side by side with their peers, in one binary and one run.
//
//   build/bench/bench/locks_benchmark                      # everything
//   build/bench/bench/locks_benchmark --benchmark_filter=Fairness
//
// Workloads
//   Uncontended/<lock>     lock+unlock pairs on one thread while another
//                          thread is alive (glibc skips atomics in a
//                          single-threaded process, which flatters std::mutex).
//   Contended/<lock>/threads:N    a shared counter incremented under the lock.
//   PrivateWork/<lock>/threads:N  the same with ~100 ns of pauses outside.
//   Arith/<lock>/threads:N the same with ~60 iterations of private
//                          arithmetic outside (the cross-CPU profile's "+work": unlike
//                          pauses, it keeps the core's pipeline busy).
//   LongSection/<lock>/threads:N  critical sections of ~7 us (100 x Arith's
//                          work), longer than Mutex's spin budget: spinning
//                          cannot win (Mutex and std::mutex only).
//   Fairness/<lock>/N      N threads for 150 ms; reports spread (most/least
//                          acquisitions per thread), the longest wait and
//                          acquisitions per second.
//   FairnessArith/<lock>/N the same with Arith's private work.
//
// Every run prints the CPU model in its context, and after the table a
// summary of the ratios the issues set goals on (Mutex / std::mutex per
// thread count, SpinLock's spread), from the median repetition among those
// whose threads really ran at the same time (ratio_support.h). On a shared
// machine run repetitions in random interleaved order:
//
//   locks_benchmark --benchmark_min_time=0.1 --benchmark_repetitions=5
//                   --benchmark_enable_random_interleaving=true
// Peers: std::mutex, pthread_spinlock_t, a textbook TTAS and a bare
// exchange+store pair always; tbb::spin_mutex, absl::Mutex and Concurrency
// Kit's FAS and ticket locks when installed (SHARDLOCK_HAVE_*).
#include <benchmark/benchmark.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ratio_support.h"
#include "shardlock/internal/backoff.h"
#include "shardlock/internal/cpu.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/mutex.h"
#include "shardlock/rw_spin_lock.h"
#include "shardlock/seq_lock.h"
#include "shardlock/spin_lock.h"
#include "shardlock/ticket_lock.h"

#if defined(SHARDLOCK_HAVE_TBB)
#include <tbb/spin_mutex.h>
#endif
#if defined(SHARDLOCK_HAVE_ABSL)
#include <absl/synchronization/mutex.h>
#endif
#if defined(SHARDLOCK_HAVE_CK)
// Only the two locks measured: ck_spinlock.h also pulls in the CLH/MCS
// headers, which rely on C's implicit void* conversion and do not compile
// as C++.
#include <spinlock/fas.h>
#include <spinlock/ticket.h>
#endif

namespace {

using shardlock::internal::cpu_relax;
using shardlock::internal::kFalseSharingRange;

// ---- baselines and adapters ------------------------------------------------

// The floor for any lock: one exchange to take, one store to release.
class BareExchange {
 public:
  void lock() noexcept {
    while (word_.exchange(1, std::memory_order_acquire) != 0) cpu_relax();
  }
  void unlock() noexcept { word_.store(0, std::memory_order_release); }

 private:
  std::atomic<std::uint32_t> word_{0};
};

// Textbook test-and-test-and-set: spin on a load with pause, no backoff.
class TextbookTtas {
 public:
  void lock() noexcept {
    for (;;) {
      if (word_.exchange(1, std::memory_order_acquire) == 0) return;
      while (word_.load(std::memory_order_relaxed) != 0) cpu_relax();
    }
  }
  void unlock() noexcept { word_.store(0, std::memory_order_release); }

 private:
  std::atomic<std::uint32_t> word_{0};
};

class PthreadSpin {
 public:
  PthreadSpin() { pthread_spin_init(&lock_, PTHREAD_PROCESS_PRIVATE); }
  ~PthreadSpin() { pthread_spin_destroy(&lock_); }
  void lock() noexcept { pthread_spin_lock(&lock_); }
  void unlock() noexcept { pthread_spin_unlock(&lock_); }

 private:
  pthread_spinlock_t lock_;
};

#if defined(SHARDLOCK_HAVE_TBB)
using TbbSpinMutex = tbb::spin_mutex;
#endif
#if defined(SHARDLOCK_HAVE_ABSL)
// absl::Mutex carries its own annotations; this adapter only renames its
// verbs, which the analysis cannot see through, so it is exempt.
class AbslMutex {
 public:
  void lock() noexcept SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS { mu_.Lock(); }
  void unlock() noexcept SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }

 private:
  absl::Mutex mu_;
};
#endif
#if defined(SHARDLOCK_HAVE_CK)
class CkFas {
 public:
  void lock() noexcept { ck_spinlock_fas_lock(&lock_); }
  void unlock() noexcept { ck_spinlock_fas_unlock(&lock_); }

 private:
  ck_spinlock_fas_t lock_ = CK_SPINLOCK_FAS_INITIALIZER;
};
class CkTicket {
 public:
  void lock() noexcept { ck_spinlock_ticket_lock(&lock_); }
  void unlock() noexcept { ck_spinlock_ticket_unlock(&lock_); }

 private:
  ck_spinlock_ticket_t lock_ = CK_SPINLOCK_TICKET_INITIALIZER;
};
#endif

// One lock and the data it guards per lock type, on their own cache lines.
template <class L>
struct alignas(kFalseSharingRange) Shared {
  L lock;
  alignas(kFalseSharingRange) std::uint64_t counter = 0;
};
// kInstance separates workloads that must not share a lock's learnt state
// (Mutex's spin budget), such as LongSection's failing spins.
template <class L, int kInstance = 0>
Shared<L>& shared() {
  static Shared<L> instance;
  return instance;
}

// Keeps the process multi-threaded for the whole run (see file comment).
struct IdleThread {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread thread{[this] {
    std::unique_lock lock(mu);
    cv.wait(lock, [this] { return stop; });
  }};
  ~IdleThread() {
    {
      std::scoped_lock lock(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }
};
IdleThread g_idle_thread;

// ---- workloads ---------------------------------------------------------------

// Locks that adapt their spinning (shardlock::Mutex) report where their
// spin budget ended up, so a run shows what the adaptation learnt.
template <class L>
void report_spin_budget(benchmark::State& state, const L& lock) {
  if constexpr (requires { lock.spin_budget_ns(); }) {
    if (state.thread_index() == 0) {
      state.counters["spin_budget_ns"] = static_cast<double>(lock.spin_budget_ns());
    }
  }
}

template <class L>
void Uncontended(benchmark::State& state) {
  L lock;
  for (auto _ : state) {
    lock.lock();
    benchmark::ClobberMemory();
    lock.unlock();
  }
  state.SetItemsProcessed(state.iterations());
}

template <class L>
void Contended(benchmark::State& state) {
  auto& s = shared<L>();
  for (auto _ : state) {
    s.lock.lock();
    ++s.counter;
    s.lock.unlock();
  }
  state.SetItemsProcessed(state.iterations());
  report_spin_budget(state, s.lock);
}

// ~60 iterations of a multiply-add chain: about 200 cycles of private work
// that, unlike pause_for(), occupies the core. The empty asm keeps the
// compiler from folding the chain into one affine map.
inline std::uint64_t private_arithmetic(std::uint64_t x) noexcept {
  for (int i = 0; i < 60; ++i) {
    x = x * 6364136223846793005u + 1442695040888963407u;
    asm volatile("" : "+r"(x));
  }
  return x;
}

template <class L>
void Arith(benchmark::State& state) {
  auto& s = shared<L>();
  std::uint64_t x = static_cast<std::uint64_t>(state.thread_index()) + 1;
  for (auto _ : state) {
    s.lock.lock();
    ++s.counter;
    s.lock.unlock();
    x = private_arithmetic(x);
  }
  benchmark::DoNotOptimize(x);
  state.SetItemsProcessed(state.iterations());
  report_spin_budget(state, s.lock);
}

template <class L>
void LongSection(benchmark::State& state) {
  auto& s = shared<L, 1>();
  std::uint64_t x = static_cast<std::uint64_t>(state.thread_index()) + 1;
  for (auto _ : state) {
    s.lock.lock();
    for (int i = 0; i < 100; ++i) s.counter = private_arithmetic(s.counter);
    s.lock.unlock();
    x = private_arithmetic(x);
  }
  benchmark::DoNotOptimize(x);
  state.SetItemsProcessed(state.iterations());
  report_spin_budget(state, s.lock);
}

template <class L>
void PrivateWork(benchmark::State& state) {
  auto& s = shared<L>();
  for (auto _ : state) {
    s.lock.lock();
    ++s.counter;
    s.lock.unlock();
    shardlock::internal::pause_for(100);  // ~100 ns of work outside the lock
  }
  state.SetItemsProcessed(state.iterations());
  report_spin_budget(state, s.lock);
}

// N threads hammer one lock for 150 ms (with private arithmetic between
// acquisitions when kWork); reports the spread of per-thread acquisition
// counts, the longest single wait and the total rate, and cpu_spread, the
// same ratio for the CPU time the threads got: on a shared machine the
// scheduler hands out CPU unevenly, which no lock can make up for, so a
// spread close to cpu_spread is the scheduler's, not the lock's.
// CPU time this thread has used, in nanoseconds.
std::int64_t thread_cpu_nanos() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

template <class L, bool kWork>
void Fairness(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  constexpr auto kRun = std::chrono::milliseconds(150);
  double spread = 0, max_wait_us = 0, rate = 0, cpu_spread = 0;
  for (auto _ : state) {
    L lock;
    std::uint64_t counter = 0;
    std::atomic<bool> go{false}, stop{false};
    std::vector<std::uint64_t> counts(static_cast<std::size_t>(threads));
    std::vector<std::int64_t> max_wait(static_cast<std::size_t>(threads));
    std::vector<std::int64_t> cpu_ns(static_cast<std::size_t>(threads));
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        while (!go.load(std::memory_order_acquire)) cpu_relax();
        const std::int64_t cpu_start = thread_cpu_nanos();
        std::uint64_t mine = 0;
        std::int64_t worst = 0;
        std::uint64_t x = static_cast<std::uint64_t>(t) + 1;
        while (!stop.load(std::memory_order_relaxed)) {
          const std::int64_t start = shardlock::internal::monotonic_nanos();
          lock.lock();
          const std::int64_t waited = shardlock::internal::monotonic_nanos() - start;
          ++counter;
          lock.unlock();
          worst = std::max(worst, waited);
          ++mine;
          if constexpr (kWork) x = private_arithmetic(x);
        }
        benchmark::DoNotOptimize(x);
        counts[static_cast<std::size_t>(t)] = mine;
        max_wait[static_cast<std::size_t>(t)] = worst;
        cpu_ns[static_cast<std::size_t>(t)] = thread_cpu_nanos() - cpu_start;
      });
    }
    const auto begin = std::chrono::steady_clock::now();
    go.store(true, std::memory_order_release);
    std::this_thread::sleep_for(kRun);
    stop.store(true, std::memory_order_relaxed);
    for (auto& w : workers) w.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    const auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
    spread = *lo == 0 ? 1e9 : static_cast<double>(*hi) / static_cast<double>(*lo);
    max_wait_us = static_cast<double>(*std::max_element(max_wait.begin(), max_wait.end())) / 1e3;
    rate = static_cast<double>(counter) / seconds;
    const auto [cpu_lo, cpu_hi] = std::minmax_element(cpu_ns.begin(), cpu_ns.end());
    cpu_spread = *cpu_lo <= 0 ? 1e9 : static_cast<double>(*cpu_hi) / static_cast<double>(*cpu_lo);
    state.SetIterationTime(seconds);
  }
  state.counters["spread"] = spread;
  state.counters["cpu_spread"] = cpu_spread;
  state.counters["max_wait_us"] = max_wait_us;
  state.counters["acq_per_s"] = rate;
}

// ---- registration --------------------------------------------------------------

// A lock that collapses when threads outnumber cores (a spinning ticket
// lock runs at a few hundred acquisitions per second here) would keep Google
// Benchmark's iteration search going for many minutes, and a fixed small
// iteration count never overlaps the threads. Such locks run the
// Contended/PrivateWork loops at 1-2 threads only; the fixed-time Fairness
// run measures them oversubscribed.
enum class Collapse { kNo, kWhenOversubscribed };

template <class L>
void register_lock(const char* name, bool fairness = true, Collapse collapse = Collapse::kNo) {
  using benchmark::RegisterBenchmark;
  const int max_threads = collapse == Collapse::kWhenOversubscribed ? 2 : 8;
  RegisterBenchmark((std::string("Uncontended/") + name).c_str(), Uncontended<L>);
  RegisterBenchmark((std::string("Contended/") + name).c_str(), Contended<L>)
      ->ThreadRange(1, max_threads)
      ->UseRealTime();
  RegisterBenchmark((std::string("PrivateWork/") + name).c_str(), PrivateWork<L>)
      ->ThreadRange(1, max_threads)
      ->UseRealTime();
  RegisterBenchmark((std::string("Arith/") + name).c_str(), Arith<L>)
      ->ThreadRange(1, max_threads)
      ->UseRealTime();
  if (fairness) {
    for (const bool work : {false, true}) {
      RegisterBenchmark((std::string(work ? "FairnessArith/" : "Fairness/") + name).c_str(),
                        work ? Fairness<L, true> : Fairness<L, false>)
          ->Arg(2)
          ->Arg(4)
          ->Arg(8)
          ->Iterations(1)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

// Locks meant for critical sections that may run long (the parking ones).
template <class L>
void register_long_section(const char* name) {
  benchmark::RegisterBenchmark((std::string("LongSection/") + name).c_str(), LongSection<L>)
      ->Threads(2)
      ->Threads(4)
      ->Threads(8)
      ->UseRealTime();
}

// ---- the ratio summary ---------------------------------------------------

// Console output as usual, plus every run's throughput and spread kept for
// a summary of the ratios the issues set goals on.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      // "Contended/shardlock::Mutex" at run.threads, or
      // "Fairness/shardlock::SpinLock" with args "8".
      const std::string& name = run.run_name.function_name;
      const auto slash = name.find('/');
      if (slash == std::string::npos) continue;
      const std::string workload = name.substr(0, slash);
      const std::string lock = name.substr(slash + 1);
      if (const auto it = run.counters.find("items_per_second"); it != run.counters.end()) {
        const std::pair<std::string, int> key{workload, static_cast<int>(run.threads)};
        ++repetitions_[key][lock];
        if (shardlock::bench::ran_concurrently(run)) rates_[key][lock].push_back(it->second.value);
      }
      if (const auto it = run.counters.find("spread"); it != run.counters.end()) {
        spreads_[{workload, std::atoi(run.run_name.args.c_str())}][lock].push_back(
            it->second.value);
      }
      if (const auto it = run.counters.find("cpu_spread"); it != run.counters.end()) {
        cpu_spreads_[{workload, std::atoi(run.run_name.args.c_str())}][lock].push_back(
            it->second.value);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }

  void print_summary() const {
    std::printf("\nRatios (median repetition; %s):\n",
                shardlock::internal::cpu_model_name().c_str());
    std::printf(
        "  shardlock::Mutex throughput / std::mutex throughput, same run, counting only\n"
        "  the repetitions whose threads kept min(threads, CPUs) cores busy (>= 90%%):\n"
        "  on a shared machine the others measure the other load, not the locks.\n"
        "  [used/run] repetitions of shardlock::Mutex after each ratio.\n");
    std::printf("    %-12s %14s %14s %14s %14s\n", "workload", "1 thr", "2", "4", "8");
    for (const char* workload : {"Contended", "PrivateWork", "Arith", "LongSection"}) {
      std::printf("    %-12s", workload);
      for (const int threads : {1, 2, 4, 8}) {
        const auto it = rates_.find({workload, threads});
        const double mine = it == rates_.end() ? 0 : median(it->second, "shardlock::Mutex");
        const double peer = it == rates_.end() ? 0 : median(it->second, "std::mutex");
        const auto count = repetitions_.find({workload, threads});
        const int ran = count == repetitions_.end() ? 0 : lookup_count(count->second);
        const int used = it == rates_.end() ? 0 : static_cast<int>(used_count(it->second));
        if (mine == 0 || peer == 0) {
          std::printf(" %7s [%d/%d]", "-", used, ran);
        } else {
          std::printf(" %6.2fx [%d/%d]", mine / peer, used, ran);
        }
      }
      std::printf("\n");
    }
    std::printf(
        "  spread (most / least acquisitions per thread), and in parentheses the same\n"
        "  ratio for the CPU time the threads got (the scheduler's share of it)\n");
    std::printf("    %-40s %14s %14s %14s\n", "workload/lock", "2 thr", "4", "8");
    for (const char* workload : {"Fairness", "FairnessArith"}) {
      for (const char* lock : {"shardlock::SpinLock", "shardlock::Mutex", "std::mutex"}) {
        std::printf("    %-40s", (std::string(workload) + "/" + lock).c_str());
        for (const int threads : {2, 4, 8}) {
          const auto it = spreads_.find({workload, threads});
          const auto cpu = cpu_spreads_.find({workload, threads});
          const double spread = it == spreads_.end() ? 0 : median(it->second, lock);
          const double cpu_spread = cpu == cpu_spreads_.end() ? 0 : median(cpu->second, lock);
          if (spread == 0) {
            std::printf(" %14s", "-");
          } else {
            std::printf(" %6.2f (%5.2f)", spread, cpu_spread);
          }
        }
        std::printf("\n");
      }
    }
  }

 private:
  using ByLock = std::map<std::string, std::vector<double>>;

  static int lookup_count(const std::map<std::string, int>& by_lock) {
    const auto it = by_lock.find("shardlock::Mutex");
    return it == by_lock.end() ? 0 : it->second;
  }
  static std::size_t used_count(const ByLock& by_lock) {
    const auto it = by_lock.find("shardlock::Mutex");
    return it == by_lock.end() ? 0 : it->second.size();
  }

  static double median(const ByLock& by_lock, const std::string& lock) {
    return shardlock::bench::median_of(by_lock, lock);
  }

  std::map<std::pair<std::string, int>, ByLock> rates_;
  std::map<std::pair<std::string, int>, std::map<std::string, int>> repetitions_;
  std::map<std::pair<std::string, int>, ByLock> spreads_;
  std::map<std::pair<std::string, int>, ByLock> cpu_spreads_;
};

}  // namespace

int main(int argc, char** argv) {
  register_lock<BareExchange>("bare_exchange_store", false);
  register_lock<shardlock::SpinLock>("shardlock::SpinLock");
  register_lock<shardlock::UnfairSpinLock>("shardlock::UnfairSpinLock");
  register_lock<shardlock::TicketLock>("shardlock::TicketLock");
  register_lock<shardlock::Mutex>("shardlock::Mutex");
  register_lock<shardlock::RwSpinLock>("shardlock::RwSpinLock", false);
  register_lock<shardlock::SeqLock>("shardlock::SeqLock(writer)", false);
  register_lock<std::mutex>("std::mutex");
  register_long_section<shardlock::Mutex>("shardlock::Mutex");
  register_long_section<std::mutex>("std::mutex");
  register_lock<PthreadSpin>("pthread_spinlock_t", false);
  register_lock<TextbookTtas>("textbook_ttas");
#if defined(SHARDLOCK_HAVE_TBB)
  register_lock<TbbSpinMutex>("tbb::spin_mutex");
#endif
#if defined(SHARDLOCK_HAVE_ABSL)
  register_lock<AbslMutex>("absl::Mutex");
#endif
#if defined(SHARDLOCK_HAVE_CK)
  register_lock<CkFas>("ck_spinlock_fas", false);
  register_lock<CkTicket>("ck_spinlock_ticket", true, Collapse::kWhenOversubscribed);
#endif
  benchmark::AddCustomContext("cpu_model", shardlock::internal::cpu_model_name());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_summary();
  benchmark::Shutdown();
  return 0;
}
