// How soon a client learns that a key was released: a WATCH parked at the
// server (KeyWatch) beside the QUERY polling it replaces, every 10 ms and
// every 100 ms. One holder client, one watching client and a LeaseServer on
// loopback, in one process; each iteration times one release, from just
// before RELEASE is sent to the moment the watcher sees the key free, and
// the counters give the p50 and p99 of those times (microseconds).
//
//   build/bench/bench/watch_benchmark
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "shardlock/internal/cpu.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/client/watch.h"
#include "shardlock/lease/server/server.h"

namespace {

using namespace std::chrono_literals;
using shardlock::lease::KeyVersion;
using shardlock::lease::KeyWatch;
using shardlock::lease::LeaseClient;
using shardlock::lease::LeaseClientOptions;
using shardlock::lease::LeaseServer;
using shardlock::lease::LeaseServerOptions;
using Clock = std::chrono::steady_clock;

struct Loopback {
  Loopback() {
    LeaseServerOptions options;
    options.bind_address = "127.0.0.1:0";
    options.lock_delay = 0ms;
    options.shards = 4;
    options.log = [](std::string_view) {};
    server = std::make_unique<LeaseServer>(options);
    if (server->start()) return;
    LeaseClientOptions client_options;
    client_options.nodes = {"127.0.0.1:" + std::to_string(server->port())};
    holder = std::make_unique<LeaseClient>(client_options);
    watcher = std::make_unique<LeaseClient>(client_options);
    ok = !holder->start() && !watcher->start();
  }
  std::unique_ptr<LeaseServer> server;
  std::unique_ptr<LeaseClient> holder;
  std::unique_ptr<LeaseClient> watcher;
  bool ok = false;
};

void report(benchmark::State& state, std::vector<double>& micros) {
  if (micros.empty()) return;
  std::sort(micros.begin(), micros.end());
  const auto at = [&](double q) {
    const auto rank = static_cast<std::size_t>(q * static_cast<double>(micros.size()));
    return micros[std::min(micros.size() - 1, rank)];
  };
  state.counters["p50_us"] = at(0.50);
  state.counters["p99_us"] = at(0.99);
}

// What the observing thread (a watch or a poller) reports: the newest token
// it saw held, and when it first saw the key free after freed_at was reset.
struct Sightings {
  std::atomic<std::int64_t> freed_at{0};
  std::atomic<std::uint64_t> seen_token{0};
  void held(std::uint64_t token) { seen_token.store(token, std::memory_order_release); }
  void free() {
    if (freed_at.load(std::memory_order_relaxed) == 0) {
      freed_at.store(Clock::now().time_since_epoch().count(), std::memory_order_release);
    }
  }
};

// The timed loop both benchmarks share: take `key`, wait until the observer
// has seen the grant, wait `settle(round)`, then time RELEASE -> the
// observer seeing the key free.
template <class Settle>
void time_releases(benchmark::State& state, Loopback& net, std::string_view key, Sightings& seen,
                   const Settle& settle) {
  std::vector<double> micros;
  std::int64_t round = 0;
  for (auto _ : state) {
    auto lease = net.holder->try_acquire(key, 30s);
    if (!lease) {
      state.SkipWithError("acquire failed");
      break;
    }
    while (seen.seen_token.load(std::memory_order_acquire) != lease.lease.token()) {
      std::this_thread::yield();
    }
    std::this_thread::sleep_for(settle(++round));
    seen.freed_at.store(0, std::memory_order_relaxed);
    const auto start = Clock::now();
    (void)lease.lease.release();
    std::int64_t stamp = 0;
    while ((stamp = seen.freed_at.load(std::memory_order_acquire)) == 0) std::this_thread::yield();
    const auto elapsed = Clock::duration(stamp) - start.time_since_epoch();
    state.SetIterationTime(std::chrono::duration<double>(elapsed).count());
    micros.push_back(std::chrono::duration<double, std::micro>(elapsed).count());
  }
  report(state, micros);
}

// The watcher follows the key with a KeyWatch on its own thread and stamps
// each time it sees the key free; the timed part is release -> that stamp.
void BM_WakeUpAfterRelease_Watch(benchmark::State& state) {
  Loopback net;
  if (!net.ok) {
    state.SkipWithError("no loopback server");
    return;
  }
  Sightings seen;
  KeyWatch watch(*net.watcher, "bench/watched");
  std::thread follower([&] {
    for (;;) {
      auto event = watch.next(1h);
      if (!event) return;  // cancelled
      if (event->error) continue;
      if (event->held()) {
        seen.held(event->version.token);
      } else {
        seen.free();
      }
    }
  });
  // The watcher has seen the grant and re-armed from its version: 2 ms for
  // its WATCH to park at the server.
  time_releases(state, net, "bench/watched", seen, [](std::int64_t) { return 2ms; });
  watch.cancel();
  follower.join();
}
BENCHMARK(BM_WakeUpAfterRelease_Watch)
    ->UseManualTime()
    ->Iterations(300)
    ->Unit(benchmark::kMicrosecond);

// The same, learned by QUERY every `interval` ms (Arg), as a client without
// watches would.
void BM_WakeUpAfterRelease_QueryPolling(benchmark::State& state) {
  Loopback net;
  if (!net.ok) {
    state.SkipWithError("no loopback server");
    return;
  }
  const std::chrono::milliseconds interval(state.range(0));
  std::atomic<bool> stop{false};
  Sightings seen;
  std::thread poller([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const auto r = net.watcher->query("bench/polled");
      if (!r.error) {
        if (r.held) {
          seen.held(r.token);
        } else {
          seen.free();
        }
      }
      std::this_thread::sleep_for(interval);
    }
  });
  // A phase spread over the poller's period, as a real release has.
  time_releases(state, net, "bench/polled", seen, [&](std::int64_t round) {
    return std::chrono::microseconds(round * 7919 % (interval.count() * 1000));
  });
  stop = true;
  poller.join();
}
BENCHMARK(BM_WakeUpAfterRelease_QueryPolling)
    ->Arg(10)
    ->Arg(100)
    ->UseManualTime()
    ->Iterations(100)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("cpu_model", shardlock::internal::cpu_model_name());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
