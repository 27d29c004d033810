// See workloads.h. Lease mode: --clients owners, each with its own random
// 128-bit client id, multiplexed over --client-threads LeaseClients; each
// owner's acquire+release pairs are one completion chain run on its
// client's I/O thread (LeaseBench), one request in flight per owner.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench/progress.h"
#include "bench/workloads.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/duration.h"
#include "shardlock/lease/server/server.h"
#include "shardlock/lease/tenants.h"
#include "shardlock/workload/zipf.h"

namespace shardlock::bench {
namespace {

using namespace shardlock::lease;
using Clock = std::chrono::steady_clock;

// One owner and its completion chain.
struct BenchClient {
  LeaseClient* client = nullptr;
  ClientId owner;
  workload::ZipfGenerator zipf;
  LiveCounters live;
  // I/O thread only (completions of this client run there, one at a time).
  Histogram request_latency;
  Histogram pair_latency;
  std::vector<std::string> keys;
  std::vector<std::uint64_t> tokens;
  std::vector<bool> granted;
  std::vector<bool> shared;   // per acquire of the round: ACQUIRE_SHARED
  workload::SplitMix64 coin;  // draws shared or exclusive
  unsigned outstanding = 0;
  unsigned granted_count = 0;
  unsigned released_count = 0;  // multi-key rounds: RELEASEs answered yes
  Clock::time_point round_start;
  Clock::time_point release_start;
  // Set by the I/O thread when it stops issuing; release pairs with the
  // acquire load in the main thread, which then reads the histograms.
  std::atomic<bool> idle{false};

  BenchClient(workload::ZipfGenerator generator, std::uint64_t coin_seed)
      : zipf(std::move(generator)), coin(coin_seed) {}
};

class LeaseBench {
 public:
  LeaseBench(const Config& config, std::atomic<bool>& stop) : config_(config), stop_(stop) {}

  // What the first error answer said (for the failure message); empty if
  // there was none. Call after the owners are idle.
  std::string first_error() const {
    std::lock_guard lock(first_error_mutex_);
    return first_error_;
  }

  void start_round(BenchClient& c) {
    if (stop_.load(std::memory_order_relaxed)) {
      c.idle.store(true, std::memory_order_release);
      return;
    }
    if (config_.keys_per_op > 1) {
      start_multi_key_round(c);
      return;
    }
    const unsigned b = config_.batch;
    c.round_start = Clock::now();
    c.outstanding = b;
    c.granted_count = 0;
    for (unsigned i = 0; i < b; ++i) {
      // Distinct keys within a round: a repeated key would be granted twice
      // to the same owner (same token) and released twice.
      std::string key;
      for (int attempt = 0; attempt < 64; ++attempt) {
        key = "k:" + std::to_string(c.zipf.next());
        if (std::find(c.keys.begin(), c.keys.begin() + i, key) == c.keys.begin() + i) break;
      }
      c.keys[i] = std::move(key);
      c.shared[i] = draw_shared(c);
    }
    for (unsigned i = 0; i < b; ++i) {
      c.client->acquire_async(
          c.keys[i], c.shared[i] ? LeaseMode::kShared : LeaseMode::kExclusive, 0, config_.ttl,
          milliseconds(0), [this, &c, i](const CallResult& r) { on_acquired(c, i, r); }, c.owner);
    }
  }

  void on_acquired(BenchClient& c, unsigned i, const CallResult& r) {
    const auto now = Clock::now();
    c.request_latency.record(static_cast<std::uint64_t>((now - c.round_start).count()));
    count_acquire(c, c.shared[i], c.keys[i], r);
    c.granted[i] = !r.error;
    if (!r.error) {
      c.tokens[i] = r.token;
      ++c.granted_count;
    }
    if (--c.outstanding != 0) return;
    if (c.granted_count == 0) {
      start_round(c);
      return;
    }
    c.outstanding = c.granted_count;
    c.release_start = Clock::now();
    for (unsigned k = 0; k < config_.batch; ++k) {
      if (!c.granted[k]) continue;
      c.client->release_async(
          c.keys[k], c.tokens[k], [this, &c, k](const CallResult& rr) { on_released(c, k, rr); },
          c.owner);
    }
  }

  // One ACQUIRE_MANY over keys_per_op distinct keys of one node.
  void start_multi_key_round(BenchClient& c) {
    const unsigned k = config_.keys_per_op;
    c.round_start = Clock::now();
    c.outstanding = 1;
    std::size_t node = 0;
    for (unsigned i = 0; i < k; ++i) {
      // Distinct (the server refuses a key twice) and, over several nodes,
      // owned by the first key's node (one node grants all or nothing).
      std::string key;
      for (int attempt = 0; attempt < 256; ++attempt) {
        key = "k:" + std::to_string(c.zipf.next());
        if (std::find(c.keys.begin(), c.keys.begin() + i, key) != c.keys.begin() + i) continue;
        if (i == 0 || c.client->node_for(key) == node) break;
      }
      if (i == 0) node = c.client->node_for(key);
      c.keys[i] = std::move(key);
    }
    c.shared[0] = draw_shared(c);
    std::vector<std::string_view> keys(c.keys.begin(), c.keys.begin() + k);
    c.client->acquire_many_async(
        keys, c.shared[0] ? LeaseMode::kShared : LeaseMode::kExclusive, config_.ttl,
        milliseconds(0), [this, &c](const CallResult& r) { on_acquired_many(c, r); }, c.owner);
  }

  void on_acquired_many(BenchClient& c, const CallResult& r) {
    const auto now = Clock::now();
    c.request_latency.record(static_cast<std::uint64_t>((now - c.round_start).count()));
    count_acquire(c, c.shared[0], c.keys[0], r);
    if (r.error) {
      start_round(c);
      return;
    }
    // The engine takes a GRANTED_MANY only with a token per key asked.
    c.outstanding = config_.keys_per_op;
    c.released_count = 0;
    c.release_start = Clock::now();
    for (unsigned i = 0; i < config_.keys_per_op; ++i) {
      c.client->release_async(
          c.keys[i], r.tokens[i], [this, &c, i](const CallResult& rr) { on_released(c, i, rr); },
          c.owner);
    }
  }

  void on_released(BenchClient& c, unsigned i, const CallResult& r) {
    const auto now = Clock::now();
    c.request_latency.record(static_cast<std::uint64_t>((now - c.release_start).count()));
    c.live.requests.fetch_add(1, std::memory_order_relaxed);
    const bool multi_key = config_.keys_per_op > 1;
    if (r.error) {
      count_error(c, c.keys[i], r);
    } else if (multi_key) {
      ++c.released_count;
    } else {
      c.live.pairs.fetch_add(1, std::memory_order_relaxed);
      c.pair_latency.record(static_cast<std::uint64_t>((now - c.round_start).count()));
    }
    if (--c.outstanding != 0) return;
    // A multi-key pair: the ACQUIRE_MANY and every one of its RELEASEs.
    if (multi_key && c.released_count == config_.keys_per_op) {
      c.live.pairs.fetch_add(1, std::memory_order_relaxed);
      c.pair_latency.record(static_cast<std::uint64_t>((now - c.round_start).count()));
    }
    start_round(c);
  }

 private:
  // Whether the next acquire is shared: true with probability read_fraction.
  bool draw_shared(BenchClient& c) const noexcept {
    if (config_.read_fraction <= 0.0) return false;
    return static_cast<double>(c.coin.next() >> 11) * 0x1.0p-53 < config_.read_fraction;
  }

  // Counts one acquire answer (relaxed: statistics, see LiveCounters).
  void count_acquire(BenchClient& c, bool shared, std::string_view key, const CallResult& r) {
    c.live.requests.fetch_add(1, std::memory_order_relaxed);
    c.live.acquires.fetch_add(1, std::memory_order_relaxed);
    if (shared) c.live.shared_acquires.fetch_add(1, std::memory_order_relaxed);
    if (!r.error) {
      c.live.grants.fetch_add(1, std::memory_order_relaxed);
    } else if (r.error == LeaseErrc::kBusy) {
      c.live.busy.fetch_add(1, std::memory_order_relaxed);
    } else {
      count_error(c, key, r);
    }
  }

  // Counts one error answer by kind (relaxed: statistics) and keeps the
  // first one's text.
  void count_error(BenchClient& c, std::string_view key, const CallResult& r) {
    c.live.errors.fetch_add(1, std::memory_order_relaxed);
    c.live.errors_by_kind[error_kind(r)].fetch_add(1, std::memory_order_relaxed);
    // Relaxed: only skips the lock once some error was kept; the text
    // itself is read and written under first_error_mutex_.
    if (have_first_error_.load(std::memory_order_relaxed)) return;
    std::string text = describe_error(*c.client, key, r);
    std::lock_guard lock(first_error_mutex_);
    if (first_error_.empty()) first_error_ = std::move(text);
    have_first_error_.store(true, std::memory_order_relaxed);
  }

  // The failure message's account of one error answer: the server's own
  // words where it gave some.
  std::string describe_error(LeaseClient& client, std::string_view key, const CallResult& r) const {
    if (r.error == LeaseErrc::kServerError) {
      std::string text = "the server answered ERROR: " + std::string(to_string(r.wire_error));
      if (r.wire_error == WireError::kTtlOutOfRange) {
        text += " (--ttl " + to_string(config_.ttl) + " is above the server's --max-ttl)";
      }
      return text;
    }
    if (r.error == LeaseErrc::kUnreachable) {
      const std::string node = client.address_for(key);
      return "unreachable: no answer from " + (node.empty() ? std::string("the server") : node);
    }
    if (r.error == LeaseErrc::kRecovering) {
      return "recovering: the server is in its lock-delay (retry after " +
             std::to_string(r.retry_after_ms) + " ms)";
    }
    if (r.error.category() == lease_category()) {
      return std::string(to_string(static_cast<LeaseErrc>(r.error.value())));
    }
    return r.error.message();
  }

  const Config& config_;
  std::atomic<bool>& stop_;
  mutable std::mutex first_error_mutex_;
  std::string first_error_;  // guarded by first_error_mutex_
  std::atomic<bool> have_first_error_{false};
};

// --tenant on the embedded server: a table of that one tenant, with the
// run's key, encrypted with --encrypt, every right on every key (so the
// run measures the seal and the tenant checks, never a refusal).
int serve_one_tenant(const Config& config, LeaseServerOptions& options) {
  Tenant tenant;
  tenant.name = "bench";
  tenant.key_id = *config.tenant;
  tenant.key = *config.auth_key;
  tenant.encrypt = config.encrypt;
  tenant.rules.push_back(PrefixRule{"", Rights::kAll});
  std::vector<Tenant> tenants;
  tenants.push_back(std::move(tenant));
  TenantTableResult built = TenantTable::build(std::move(tenants));
  if (!built.ok()) {
    std::fprintf(stderr, "shardlock-bench: the embedded server's tenant: %s\n",
                 built.message().c_str());
    return kExitRunFailed;
  }
  options.tenants = std::move(built.table);
  return 0;
}

// The target: the embedded server, started on loopback (`server`), or the
// --server nodes. Fills `nodes` and result.target; returns 0 or an exit code.
int start_target(const Config& config, std::unique_ptr<LeaseServer>& server,
                 std::vector<std::string>& nodes, Result& result) {
  if (!config.server.empty()) {
    nodes = split_node_list(config.server);
    result.target = config.server;
    return 0;
  }
  LeaseServerOptions options;
  options.bind_address = "127.0.0.1:0";
  // A fresh in-process server has granted nothing before, so the lock-delay
  // that protects leases from before a restart has nothing to protect.
  options.lock_delay = milliseconds(0);
  options.max_ttl = std::max<milliseconds>(options.max_ttl, config.ttl);
  options.io_threads = config.server_threads;
  options.io = config.server_io == "uring"    ? IoBackend::kUring
               : config.server_io == "socket" ? IoBackend::kSocket
                                              : IoBackend::kAuto;
  options.log = [](std::string_view) {};  // its lock-delay warning is ours to explain
  if (config.tenant) {
    if (const int status = serve_one_tenant(config, options)) return status;
  } else {
    options.auth_key = config.auth_key;
  }
  options.busy_poll = std::chrono::microseconds(config.busy_poll_us);
  server = std::make_unique<LeaseServer>(options);
  if (std::error_code ec = server->start()) {
    std::fprintf(stderr, "shardlock-bench: embedded server failed: %s (%s)\n", ec.message().c_str(),
                 server->error_detail().c_str());
    return kExitRunFailed;
  }
  nodes.push_back(server->listen_address());
  result.target = "embedded " + nodes[0];
  if (!config.json) {
    std::fprintf(stderr,
                 "shardlock-bench: embedded LeaseServer on %s (%s I/O, %u thread%s), lock-delay 0: "
                 "a fresh server with no earlier leases to protect\n",
                 nodes[0].c_str(), std::string(to_string(server->backend())).c_str(),
                 config.server_threads, config.server_threads == 1 ? "" : "s");
  }
  return 0;
}

// Starts the LeaseClients the owners share (--client-threads, at most one
// per owner) into `connections`; returns 0 or an exit code.
int start_connections(const Config& config, const std::vector<std::string>& nodes,
                      std::vector<std::unique_ptr<LeaseClient>>& connections) {
  for (unsigned t = 0; t < std::min(config.client_threads, config.clients); ++t) {
    LeaseClientOptions options;
    options.nodes = nodes;
    options.discover_cluster = config.discover;
    // Requests of different owners share datagrams (kItemFlagOwner) up to
    // --pack per datagram; each owner still has one request in flight.
    options.max_batch = config.pack;
    options.auth_key = config.auth_key;
    options.tenant = config.tenant;
    options.encrypt = config.encrypt;
    options.cipher = config.cipher;
    options.busy_poll = std::chrono::microseconds(config.busy_poll_us);
    auto connection = std::make_unique<LeaseClient>(options);
    if (std::error_code ec = connection->start()) {
      std::fprintf(stderr, "shardlock-bench: client failed: %s (%s)\n", ec.message().c_str(),
                   connection->error_detail().c_str());
      if (ec == LeaseErrc::kBadAddress) return kExitUsage;
      // --discover: no seed answered with the cluster's map.
      return ec == LeaseErrc::kUnreachable ? kExitNoAnswer : kExitRunFailed;
    }
    connections.push_back(std::move(connection));
  }
  return 0;
}

// The --clients owners, each on a connection in turn, each with its own
// fork of the key stream.
std::vector<std::unique_ptr<BenchClient>> make_owners(
    const Config& config, const std::vector<std::unique_ptr<LeaseClient>>& connections) {
  const workload::ZipfGenerator base(config.keys, config.theta, config.seed);
  std::vector<std::unique_ptr<BenchClient>> clients;
  for (unsigned i = 0; i < config.clients; ++i) {
    auto c = std::make_unique<BenchClient>(base.fork(config.seed * 1'000'003 + i),
                                           config.seed * 7'000'003 + i);
    c->client = connections[i % connections.size()].get();
    c->owner = random_client_id();
    if (config.tenant) {
      // The server forces an owner's top 32 bits to its tenant's key id
      // (LeaseServerOptions::tenants); the bench names its owners so, as
      // LeaseClient does its own id.
      c->owner.hi =
          (c->owner.hi & 0x0000'0000'FFFF'FFFFULL) | (std::uint64_t{*config.tenant} << 32);
    }
    const unsigned slots = std::max(config.batch, config.keys_per_op);
    c->keys.resize(slots);
    c->tokens.resize(slots);
    c->granted.resize(slots);
    c->shared.resize(slots);
    clients.push_back(std::move(c));
  }
  return clients;
}

// Waits until every owner is idle: every round ends within its calls'
// deadlines. False when one did not in time.
bool drain(const std::vector<std::unique_ptr<BenchClient>>& clients) {
  const auto drain_until =
      Clock::now() + LeaseClientOptions{}.request_timeout * 2 + milliseconds(500);
  for (const auto& c : clients) {
    while (!c->idle.load(std::memory_order_acquire) && Clock::now() < drain_until) {
      std::this_thread::sleep_for(milliseconds(2));
    }
  }
  return std::all_of(clients.begin(), clients.end(),
                     [](const auto& c) { return c->idle.load(std::memory_order_acquire); });
}

}  // namespace

int run_lease(const Config& config, Result& result) {
  std::unique_ptr<LeaseServer> server;
  std::vector<std::string> nodes;
  if (const int status = start_target(config, server, nodes, result)) return status;
  std::atomic<bool> stop{false};
  LeaseBench bench(config, stop);
  std::vector<std::unique_ptr<LeaseClient>> connections;
  if (const int status = start_connections(config, nodes, connections)) return status;
  std::vector<std::unique_ptr<BenchClient>> clients = make_owners(config, connections);
  // Fail fast on a wrong --server rather than benchmarking timeouts.
  if (const CallResult probe = connections[0]->query("k:0"); probe.error) {
    std::fprintf(stderr, "shardlock-bench: %s does not answer: %s\n", result.target.c_str(),
                 probe.error.message().c_str());
    return kExitNoAnswer;
  }
  for (auto& c : clients) {
    BenchClient* raw = c.get();
    c->client->post([&bench, raw] { bench.start_round(*raw); });
  }
  Progress progress(config.json);
  const auto collect = [&] {
    Totals t;
    for (const auto& c : clients) t.add(c->live);
    return t;
  };
  result.seconds = run_for(config, progress, stop, collect, result);
  result.totals = collect();  // throughput counts what finished inside the run
  progress.finish();
  if (!drain(clients)) {
    std::fprintf(stderr, "shardlock-bench: a client did not drain in time\n");
    return kExitRunFailed;
  }
  for (const auto& c : clients) {
    result.request_latency.merge(c->request_latency);
    result.pair_latency.merge(c->pair_latency);
  }
  result.first_error = bench.first_error();
  for (const auto& connection : connections) {
    result.retransmissions += connection->retransmissions();
    result.datagrams += connection->datagrams_sent();
  }
  connections.clear();  // stops the I/O threads before the owners go
  clients.clear();
  if (server) server->stop();
  return 0;
}

}  // namespace shardlock::bench
