// shardlock-bench: the hot-key load generator and the project's main job.
//
//   shardlock-bench                         embedded server, 10 s, Zipf 0.99
//   shardlock-bench --server 127.0.0.1:7420 --clients 50 --duration 30s
//   shardlock-bench --mode table --json     the in-process LockTable instead
//
// Lease mode: --clients independent owners (each its own random 128-bit
// client id), each running acquire+release pairs back to back on
// Zipf-distributed keys (ACQUIRE with wait 0, then RELEASE of what was
// granted), one request in flight per owner. The owners are multiplexed over
// --client-threads LeaseClients (sockets and I/O threads), as redis-benchmark
// multiplexes its connections over one event loop. With --batch B an owner
// asks for B distinct keys per datagram and releases them in one.
// --read-fraction F makes that fraction of the acquires shared
// (ACQUIRE_SHARED) instead of exclusive; --keys-per-op K makes each acquire
// one ACQUIRE_MANY over K distinct keys (all or nothing), released key by
// key, and a pair one such acquire with its K releases.
// Table mode: --clients threads locking LockTable stripes by Zipf key.
// Output: a live progress line on stderr, then a table (or --json).
//
// A run fails loudly (exit 4, the reason on stderr) when no acquire was
// granted or when errors are more than half of the answered requests: a
// throughput of refusals is not a result. An error is any answer that is
// neither a grant, a release nor BUSY (BUSY is contention, the workload's
// normal outcome): ERROR replies by their wire code, unreachable,
// recovering, timeout, refused releases.
//
// The pieces (tools/bench/): config.* reads the command line, workloads.h
// declares the two modes (lease_workload.cc, table_workload.cc), progress.*
// waits out the run with the live line, results.* counts and judges it,
// report.* prints the table or the JSON.
#include <cstdio>
#include <string>

#include "bench/config.h"
#include "bench/report.h"
#include "bench/results.h"
#include "bench/workloads.h"
#include "common/command_line.h"

namespace {

using namespace shardlock::bench;

int run(int argc, char** argv) {
  Config config;
  if (const auto status = read_command_line(argc, argv, config)) return *status;
  Result result;
  const int rc = config.mode == "lease" ? run_lease(config, result) : run_table(config, result);
  if (rc != 0) return rc;
  if (config.json) {
    print_json(config, result);
  } else {
    print_table(config, result);
  }
  if (const std::string why = failure_reason(result); !why.empty()) {
    std::fprintf(stderr, "shardlock-bench: the run failed: %s\n", why.c_str());
    return kExitErrorsDominate;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return shardlock::tools::run_main(kTool, kExitRunFailed, run, argc, argv);
}
