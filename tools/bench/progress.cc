// See progress.h.
#include "bench/progress.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <thread>

namespace shardlock::bench {
namespace {

using Clock = std::chrono::steady_clock;

// User + system CPU time this process has used so far.
double process_cpu_seconds() {
  rusage u{};
  (void)::getrusage(RUSAGE_SELF, &u);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

}  // namespace

Progress::Progress(bool quiet) : tty_(!quiet && ::isatty(STDERR_FILENO) == 1), quiet_(quiet) {}

void Progress::tick(double elapsed, double total, const Totals& now) {
  if (quiet_) return;
  const double dt = elapsed - last_time_;
  if (dt <= 0) return;
  const double rate = static_cast<double>(now.requests - last_.requests) / dt;
  const double pair_rate = static_cast<double>(now.pairs - last_.pairs) / dt;
  if (tty_) {
    std::fprintf(stderr,
                 "\r  %5.1f/%.0fs  %10.0f ops/s  %9.0f pairs/s  grants %" PRIu64 "  busy %" PRIu64
                 "  errors %" PRIu64 "   ",
                 elapsed, total, rate, pair_rate, now.grants, now.busy, now.errors);
    std::fflush(stderr);
    last_ = now;
    last_time_ = elapsed;
  } else if (elapsed - last_print_ >= 5.0) {
    std::fprintf(stderr, "  %5.1f/%.0fs  %.0f ops/s  %.0f pairs/s\n", elapsed, total, rate,
                 pair_rate);
    last_print_ = elapsed;
    last_ = now;
    last_time_ = elapsed;
  }
}

void Progress::finish() {
  if (tty_) std::fprintf(stderr, "\n");
}

double run_for(const Config& config, Progress& progress, std::atomic<bool>& stop,
               const std::function<Totals()>& collect, Result& result) {
  const double cpu_begin = process_cpu_seconds();
  const auto begin = Clock::now();
  const auto end = begin + config.duration;
  while (Clock::now() < end) {
    std::this_thread::sleep_for(std::min<Clock::duration>(milliseconds(200), end - Clock::now()));
    const double elapsed = std::chrono::duration<double>(Clock::now() - begin).count();
    if (elapsed - std::floor(elapsed) < 0.2 || Clock::now() >= end) {
      progress.tick(elapsed, std::chrono::duration<double>(config.duration).count(), collect());
    }
  }
  stop.store(true, std::memory_order_relaxed);  // workers poll it; no data rides on it
  result.cpu_seconds = process_cpu_seconds() - cpu_begin;
  return std::chrono::duration<double>(Clock::now() - begin).count();
}

}  // namespace shardlock::bench
