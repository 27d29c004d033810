// worker.h: one worker process of a torture run. It runs `clients` lease
// clients, each on its own thread with its own LeaseClient (its own owner
// identity), looping over the workload until end_ns:
//
//   acquire a key of a small set (try-acquire or a bounded wait),
//   sometimes renew it, read the key's counter from the fenced resource,
//   write counter + 1 with the lease's token, release.
//
// Every step is recorded (history.h) in the client's own file, with the
// client-side expiry it relied on converted to CLOCK_MONOTONIC.
#pragma once

#include <cstdint>
#include <string>

namespace shardlock::torture {

struct WorkerOptions {
  int index = 0;            // the worker process's index
  int clients = 1;          // lease clients (threads) in this process
  std::string server;       // HOST:PORT the clients send to (the proxy)
  std::string resource;     // the resource's abstract socket name
  std::string history_dir;  // where client-<n>.log files go
  std::uint64_t seed = 1;
  std::int64_t end_ns = 0;  // CLOCK_MONOTONIC time to stop at
  int keys = 8;
  int ttl_ms = 500;
  int max_wait_ms = 1000;
  int request_timeout_ms = 1000;
  int initial_retransmit_ms = 5;
  // Per million cycles: the client stalls for 1.5 x ttl_ms between its last
  // validity check and its write (Kleppmann's GC pause), so the write often
  // reaches the resource after another client took the key over.
  int stall_per_million = 0;
};

// Runs the workload; returns the process exit status (0, or 3 on a setup
// failure such as an unreachable resource).
int run_worker(const WorkerOptions& options);

}  // namespace shardlock::torture
