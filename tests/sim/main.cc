// shardlock-sim: runs the cluster simulation (sim.h) over a range of seeds,
// or replays one. Exit 0 when every seed is safe, 1 when one is not.
//
//   shardlock-sim --seeds 1000            seeds 1..1000, a line per unsafe one
//   shardlock-sim --seed 42 --trace       one seed: its history and the nodes' log
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <optional>

#include "sim.h"

int main(int argc, char** argv) {
  CLI::App app{"shardlock-sim: a deterministic simulation of a shardlock cluster"};
  std::uint64_t seed = 0;
  std::uint64_t first = 1;
  std::uint64_t seeds = 100;
  bool trace = false;
  bool stop_at_first = false;
  shardlock::sim::SimOptions options;
  app.add_option("--seed", seed, "replay this one seed (prints its history hash)");
  app.add_option("--first-seed", first, "the first seed of a range");
  app.add_option("--seeds", seeds, "how many seeds from --first-seed");
  app.add_flag("--trace", trace, "print the history and the nodes' log lines");
  app.add_flag("--stop", stop_at_first, "stop at the first unsafe seed");
  app.add_option("--fault-seconds", options.fault_seconds, "simulated seconds of faults");
  app.add_option("--tail-seconds", options.tail_seconds, "simulated seconds after them");
  app.add_option("--nodes", options.nodes, "nodes (started one by one)");
  app.add_option("--clients", options.clients, "clients");
  app.add_option("--keys", options.keys, "keys");
  app.add_option("--scratch-dir", options.scratch_dir, "where the data dirs go (a tmpfs)");
  // Unset: chosen per seed (SimOptions).
  std::optional<bool> relays;
  std::optional<bool> carry_acks;
  app.add_option("--relays", relays,
                 "whether backups send the answers they relay (true/false; default: per seed)");
  app.add_option("--carry-acks", carry_acks,
                 "whether acks ride in REPLICATEs (true/false; default: per seed)");
  CLI11_PARSE(app, argc, argv);
  options.relay_replies = relays;
  options.carry_acks = carry_acks;
  if (seed != 0) {
    first = seed;
    seeds = 1;
  }
  options.keep_trace = trace;
  const auto started = std::chrono::steady_clock::now();
  std::uint64_t unsafe = 0;
  double simulated = 0;
  std::uint64_t maps_missed = 0;
  for (std::uint64_t s = first; s < first + seeds; ++s) {
    options.seed = s;
    const shardlock::sim::SimResult r = shardlock::sim::run_simulation(options);
    simulated += r.simulated_seconds;
    maps_missed += r.maps_missed;
    if (trace) {
      for (const std::string& line : r.trace) std::printf("%s\n", line.c_str());
    }
    if (seeds == 1) {
      std::printf("seed %llu: history hash %016llx, %zu events, %llu scheduler events, %s\n%s",
                  static_cast<unsigned long long>(s),
                  static_cast<unsigned long long>(r.history_hash), r.history.size(),
                  static_cast<unsigned long long>(r.events), r.safe() ? "safe" : "UNSAFE",
                  r.report.text().c_str());
    } else if (!r.safe()) {
      std::printf("seed %llu UNSAFE: %s\n", static_cast<unsigned long long>(s),
                  r.report.json().c_str());
    }
    if (!r.safe()) {
      ++unsafe;
      if (stop_at_first) {
        seeds = s - first + 1;
        break;
      }
    }
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::fprintf(stderr,
               "%llu seeds, %llu unsafe, %.0f simulated s, %.1f s wall, %.0f seeds/min, "
               "%llu maps adopted after a missed epoch\n",
               static_cast<unsigned long long>(seeds), static_cast<unsigned long long>(unsafe),
               simulated, wall, static_cast<double>(seeds) / wall * 60.0,
               static_cast<unsigned long long>(maps_missed));
  return unsafe == 0 ? 0 : 1;
}
