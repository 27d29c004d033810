// workloads.h: the two workloads shardlock-bench runs (its --mode). Each
// runs for config.duration and fills `result`; returns 0, or the exit code
// of a run that could not be set up or finished (config.h). Not API.
//
//   lease  (lease_workload.cc)  --clients owners running acquire+release
//          pairs over UDP against the embedded LeaseServer or --server
//   table  (table_workload.cc)  --clients threads locking LockTable stripes
#pragma once

#include "bench/config.h"
#include "bench/results.h"

namespace shardlock::bench {

[[nodiscard]] int run_lease(const Config& config, Result& result);
[[nodiscard]] int run_table(const Config& config, Result& result);

}  // namespace shardlock::bench
