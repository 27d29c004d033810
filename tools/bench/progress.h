// progress.h: the main thread's part of a shardlock-bench run while the
// workers run: wait out --duration, show progress on stderr, measure the
// process's CPU time. Not API.
#pragma once

#include <atomic>
#include <functional>

#include "bench/config.h"
#include "bench/results.h"

namespace shardlock::bench {

// Progress on stderr: on a terminal, one line rewritten each second; else a
// plain line every 5 s, so logs stay short.
class Progress {
 public:
  explicit Progress(bool quiet);
  void tick(double elapsed, double total, const Totals& now);
  void finish();

 private:
  bool tty_;
  bool quiet_;
  Totals last_;
  double last_time_ = 0;
  double last_print_ = 0;
};

// Runs for config.duration, ticking `progress` with what `collect` sums
// about once a second, then sets `stop`. Returns the seconds it ran and sets
// result.cpu_seconds to the CPU time the process used meanwhile.
double run_for(const Config& config, Progress& progress, std::atomic<bool>& stop,
               const std::function<Totals()>& collect, Result& result);

}  // namespace shardlock::bench
