// sim.h: a deterministic, single-threaded simulation of a shardlock cluster
// (docs/simulation.md), the approach of FoundationDB's simulator and
// TigerBeetle's VOPR. One seed decides everything: the scheduler's ties,
// every node's clock rate, the network's losses, duplicates and delays, the
// faults, the clients' requests and retransmission rates. The nodes run the
// real Dispatcher, Shard, Replicator, ClusterGate, BucketActivation and
// NodeDriver; etcd, the network, the clocks and Membership's I/O are
// simulated. The history is written in the torture checker's format
// (tests/torture/history.h) and judged by its check().
//
//   SimOptions options;
//   options.seed = 7;
//   SimResult result = run_simulation(options);
//   if (!result.safe()) std::puts(result.report.text().c_str());
//
// Not thread-safe; each run is self-contained (its data dirs live under
// options.scratch_dir and are removed at the end), so runs may go on
// several threads at once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checker.h"
#include "history.h"

namespace shardlock::sim {

struct SimOptions {
  std::uint64_t seed = 1;
  // Simulated seconds of faults, then a quiet tail for liveness.
  double fault_seconds = 12.0;
  double tail_seconds = 6.0;
  int nodes = 3;  // started one by one (bootstrapping), plus joins
  int clients = 6;
  int keys = 8;
  // Where the nodes' data dirs go (token and epoch files); a tmpfs keeps
  // fsync cheap.
  std::string scratch_dir = "/dev/shm";
  // Keep the trace lines (the history, one event a line) in the result.
  bool keep_trace = false;
  // Whether backups send the answers they relay (ReplicatorOptions::
  // relay_replies); unset: on for three seeds in four, so both paths run.
  std::optional<bool> relay_replies;
  // Whether acks ride in REPLICATEs (ReplicatorOptions::carry_acks); unset:
  // on for two seeds in three (apart from relay_replies' choice).
  std::optional<bool> carry_acks;
};

struct SimResult {
  std::uint64_t seed = 0;
  std::vector<torture::Event> history;
  torture::CheckReport report;
  std::uint64_t history_hash = 0;  // XXH3 of the formatted history
  std::vector<std::string> trace;  // with keep_trace: the nodes' log lines and the history
  std::uint64_t events = 0;        // scheduler events run
  double simulated_seconds = 0;
  // Maps a node adopted with an epoch jump, so its history started over
  // (NodeDriverStats::maps_missed): with the map key's history read back,
  // none unless a node missed more than kMaxMapHistoryReads maps.
  std::uint64_t maps_missed = 0;
  // Violations of the safety properties (overlap, token order, duplicate
  // token, owner, permit limit, all-or-nothing, fencing).
  [[nodiscard]] std::size_t safety_violations() const;
  [[nodiscard]] bool safe() const { return safety_violations() == 0; }
};

[[nodiscard]] SimResult run_simulation(const SimOptions& options);

}  // namespace shardlock::sim
