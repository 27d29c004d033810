// shardlockd: the lease server daemon, a thin main() around LeaseServer.
//
// Prints one JSON line to stdout once the socket is bound:
//   {"event":"ready","listen":"127.0.0.1:7420","port":7420,...,
//    "lock_delay_ends":"2026-11-25T12:01:00.250Z","lock_delay_remaining_s":60.000,...}
// logs to stderr (including "granting: ..." once ACQUIRE can be granted),
// and stops cleanly on SIGTERM or SIGINT.
// lock_delay_ends is when the lock-delay after this start ends, on the wall
// clock (UTC); in cluster mode the later of the server's and the cluster's
// (counted from about now, when the node adopts its first map), the earliest
// its buckets can become active.
// Exit codes: 0 clean stop or --help, 1 start-up failure (or the ready line
// could not be written to stdout), 2 bad flags.
#include <pthread.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <tuple>

#include "common/allocator.h"
#include "common/command_line.h"
#include "common/json.h"
#include "prometheus_exporter.h"
#include "shardlock/lease/server/server.h"
#ifdef SHARDLOCK_HAVE_CLUSTER
#include <thread>

#include "cluster_node.h"
#endif

namespace {

using shardlock::lease::IoBackend;
using shardlock::lease::LeaseServer;
using shardlock::lease::LeaseServerOptions;
using shardlock::tools::json_string;
using shardlock::tools::ZeroDuration;

constexpr const char* kTool = "shardlockd";
constexpr int kExitStartFailed = 1;

int usage_error(std::string_view message) { return shardlock::tools::usage_error(kTool, message); }

// "2026-11-25T12:01:00.250Z".
std::string utc_iso8601(std::chrono::system_clock::time_point t) {
  const auto ms = std::chrono::floor<std::chrono::milliseconds>(t.time_since_epoch());
  const auto seconds = std::chrono::floor<std::chrono::seconds>(ms);
  const auto time = static_cast<std::time_t>(seconds.count());
  std::tm utc{};
  gmtime_r(&time, &utc);
  std::array<char, 40> text{};
  const std::size_t n = std::strftime(text.data(), text.size(), "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(text.data() + n, text.size() - n, ".%03dZ",
                static_cast<int>((ms - seconds).count()));
  return text.data();
}

// Seconds with millisecond precision, "59.998".
std::string seconds_text(std::chrono::nanoseconds d) {
  std::array<char, 32> text{};
  std::snprintf(text.data(), text.size(), "%.3f",
                std::chrono::duration<double>(std::max(d, std::chrono::nanoseconds{0})).count());
  return text.data();
}

// Waits for SIGTERM or SIGINT (blocked in every thread) and returns it.
// Until `granting` returns a line, asks it every 50 ms; logs that line once.
int wait_for_stop(const sigset_t& stop_signals,
                  const std::function<std::optional<std::string>()>& granting,
                  const std::function<void(std::string_view)>& log) {
  bool told = false;
  for (;;) {
    if (!told) {
      if (const auto line = granting()) {
        log(*line);
        told = true;
      }
    }
    if (told) {
      int signal_number = 0;
      if (sigwait(&stop_signals, &signal_number) == 0) return signal_number;
      continue;
    }
    constexpr timespec kPoll{.tv_sec = 0, .tv_nsec = 50'000'000};
    const int signal_number = sigtimedwait(&stop_signals, nullptr, &kPoll);
    if (signal_number > 0) return signal_number;
    // -1: EAGAIN (the poll is over) or EINTR; look again.
  }
}

#ifdef SHARDLOCK_HAVE_CLUSTER
// Joins the cluster; 0 or an exit code. A member key still held by this
// node's previous run (killed before its etcd lease ran out) is waited out.
int join_cluster(const shardlock::cluster::ClusterNodeOptions& options,
                 shardlock::lease::LeaseServer& server,
                 std::unique_ptr<shardlock::cluster::ClusterNode>& node) {
  const auto give_up =
      std::chrono::steady_clock::now() + 2 * options.lease_ttl + std::chrono::seconds(1);
  bool told = false;
  for (;;) {
    std::string detail;
    const std::error_code ec =
        shardlock::cluster::ClusterNode::start(options, server, node, detail);
    if (!ec) return 0;
    if (ec != shardlock::cluster::MembershipErrc::kMemberExists ||
        std::chrono::steady_clock::now() >= give_up) {
      std::cerr << "shardlockd: cannot join the cluster: " << detail << " (" << ec.message()
                << ")\n";
      return kExitStartFailed;
    }
    if (!told) {
      std::cerr << "shardlockd: " << detail << "; waiting for it to expire\n";
      told = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}
#endif

int run(int argc, char** argv) {
  CLI::App app{
      "shardlockd: UDP lease server with fencing tokens that survive kill -9.\n"
      "Durations are written like 500ms, 30s, 2m, 1m30s."};
  app.set_version_flag("--version", "shardlockd 0.1.0");
  app.footer(
      "Exit codes: 0 clean stop (SIGTERM, SIGINT); 1 start-up failure, or the ready line could "
      "not be written to stdout; 2 bad flags.");
  LeaseServerOptions options;
  options.bind_address = "127.0.0.1:7420";
  std::string max_ttl = "60s";
  std::string max_wait = "5m";
  std::optional<std::string> lock_delay;
  std::string io = "auto";
  app.add_option("--listen", options.bind_address,
                 "HOST:PORT to bind (IPv4, or [IPv6]:PORT); port 0 picks a free port")
      ->capture_default_str();
  app.add_option("--shards", options.shards, "number of shards (1..65536)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 65536u));
  std::string metrics_address;
  app.add_option("--metrics", metrics_address,
                 "serve Prometheus metrics at http://HOST:PORT/metrics (off by default; "
                 "give 127.0.0.1:PORT unless other hosts must scrape it; port 0 picks one)");
  app.add_option("--data-dir", options.data_dir,
                 "directory for the durable token high-water marks; without it tokens restart "
                 "from 1 after a restart");
  app.add_option("--max-ttl", max_ttl, "largest TTL a client may ask for")->capture_default_str();
  app.add_option("--max-wait", max_wait, "largest wait a client may ask for")
      ->capture_default_str();
  app.add_option("--lock-delay", lock_delay,
                 "refuse ACQUIRE (RECOVERING) this long after start-up; default: --max-ttl. "
                 "0 is for tests only");
  app.add_option("--io", io, "I/O back end: uring, socket or auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "uring", "socket"}));
  app.add_option("--io-threads", options.io_threads, "I/O threads, each with its own socket")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  auto busy_poll_us = static_cast<unsigned>(options.busy_poll.count());
  app.add_option("--busy-poll-us", busy_poll_us,
                 "microseconds an I/O thread keeps polling after a datagram before it sleeps: "
                 "lower latency for some CPU while traffic flows; 0 = off")
      ->capture_default_str()
      ->check(CLI::Range(0u, 10'000u));
  std::string auth_key_file;
  app.add_option("--auth-key", auth_key_file,
                 "file with the shared key (64 hex digits, from `shardlockctl keygen`): every "
                 "datagram must then carry a valid tag, and replies are sealed");
  app.add_option("--token-block", options.token_block,
                 "tokens reserved per durable write (advanced)")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  // Memory bounds: past one, a request is answered ERROR(limit exceeded).
  constexpr std::size_t kMaxBound = std::size_t{1} << 40;
  for (const auto& [flag, field, what] :
       {std::tuple<const char*, std::size_t*, const char*>{
            "--max-keys", &options.max_keys,
            "leases held, all shards (each shared or permit holder counts)"},
        {"--max-waiters", &options.max_waiters, "queued ACQUIREs, all keys"},
        {"--max-waiters-per-key", &options.max_waiters_per_key, "queued ACQUIREs on one key"},
        {"--max-leases-per-client", &options.max_leases_per_client,
         "leases one client id may hold (enforced per shard as ceil(n / shards))"},
        {"--max-waiters-per-client", &options.max_waiters_per_client,
         "ACQUIREs one client id may have queued (per shard as ceil(n / shards))"}}) {
    app.add_option(flag, *field, what)
        ->capture_default_str()
        ->check(CLI::Range(std::size_t{1}, kMaxBound));
  }

#ifdef SHARDLOCK_HAVE_CLUSTER
  shardlock::cluster::ClusterNodeOptions cluster;
  std::string cluster_url;
  std::string etcd_lease_ttl = "5s";
  auto* cluster_flag = app.add_option(
      "--cluster", cluster_url,
      "etcd://HOST:PORT[,HOST:PORT...]: join this cluster (docs/cluster.md); needs --node-id "
      "and --data-dir. Without it the node serves every key itself");
  app.add_option("--node-id", cluster.node_id, "this node's id in the cluster ([A-Za-z0-9._-])")
      ->needs(cluster_flag);
  app.add_option("--advertise", cluster.advertise,
                 "HOST:PORT clients reach this node at (default: the bound address)")
      ->needs(cluster_flag);
  app.add_option("--weight", cluster.weight, "this node's share of the buckets, relative")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000u))
      ->needs(cluster_flag);
  app.add_option("--cluster-name", cluster.cluster_name,
                 "the cluster's name: its keys in etcd live under /shardlock/NAME/")
      ->capture_default_str()
      ->needs(cluster_flag);
  app.add_option("--etcd-lease-ttl", etcd_lease_ttl,
                 "TTL of this node's etcd lease: how soon a dead node's keys move")
      ->capture_default_str()
      ->needs(cluster_flag);
#endif

#ifndef SHARDLOCK_HAVE_CLUSTER
  app.footer(app.get_footer() +
             "\nThis shardlockd was built without cluster support: --cluster and its flags are "
             "refused (build it with gRPC installed: tools/install-deps.sh --release).");
  // CLI11 would call the cluster flags "not expected", naming their values
  // first; say what is missing instead.
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    for (const std::string_view flag : {"--cluster", "--node-id", "--advertise", "--weight",
                                        "--cluster-name", "--etcd-lease-ttl"}) {
      if (arg == flag || (arg.starts_with(flag) && arg[flag.size()] == '=')) {
        return usage_error(
            std::string(flag) +
            ": this shardlockd was built without cluster support (gRPC not found at configure "
            "time, or configured with -DSHARDLOCK_BUILD_CLUSTER=OFF); install gRPC with "
            "tools/install-deps.sh --release and rebuild (the release preset builds the cluster "
            "layer), or run it without the cluster flags");
      }
    }
  }
#endif
  if (const auto status = shardlock::tools::parse_command_line(app, argc, argv, kTool)) {
    return *status;
  }
  options.busy_poll = std::chrono::microseconds(busy_poll_us);

  // The wire carries TTLs and waits as u32 milliseconds (the flags' upper
  // bound); a lock-delay beyond the longest lease is meaningless and would
  // overflow the clock.
  const auto max_ttl_flag =
      shardlock::tools::parse_duration_flag("--max-ttl", max_ttl, ZeroDuration::kRejected);
  if (!max_ttl_flag.error.empty()) return usage_error(max_ttl_flag.error);
  options.max_ttl = max_ttl_flag.value;
  const auto max_wait_flag =
      shardlock::tools::parse_duration_flag("--max-wait", max_wait, ZeroDuration::kAllowed);
  if (!max_wait_flag.error.empty()) return usage_error(max_wait_flag.error);
  options.max_wait = max_wait_flag.value;
  if (lock_delay) {
    const auto lock_delay_flag =
        shardlock::tools::parse_duration_flag("--lock-delay", *lock_delay, ZeroDuration::kAllowed);
    if (!lock_delay_flag.error.empty()) return usage_error(lock_delay_flag.error);
    options.lock_delay = lock_delay_flag.value;
  }
  options.io = *shardlock::lease::parse_io_backend(io);
  const auto auth = shardlock::tools::load_auth_key_flag(auth_key_file);
  if (!auth.error.empty()) return usage_error(auth.error);
  options.auth_key = auth.key;
  options.log = [](std::string_view line) {
    std::fprintf(stderr, "shardlockd: %.*s\n", static_cast<int>(line.size()), line.data());
  };
#ifdef SHARDLOCK_HAVE_CLUSTER
  if (!cluster_url.empty()) {
    const auto endpoints = shardlock::cluster::etcd_endpoints_of_url(cluster_url);
    if (!endpoints) {
      return usage_error("--cluster: '" + cluster_url + "' is not etcd://HOST:PORT[,HOST:PORT...]");
    }
    cluster.endpoints = *endpoints;
    if (cluster.node_id.empty()) return usage_error("--cluster needs --node-id");
    if (!shardlock::cluster::valid_node_id(cluster.node_id)) {
      return usage_error("--node-id '" + cluster.node_id + "': 1..128 of [A-Za-z0-9._-]");
    }
    if (!shardlock::cluster::valid_node_id(cluster.cluster_name)) {
      return usage_error("--cluster-name '" + cluster.cluster_name + "': 1..128 of [A-Za-z0-9._-]");
    }
    if (options.data_dir.empty()) return usage_error("--cluster needs --data-dir");
    // A restarted node acknowledges hand-offs once its server's lock-delay
    // is over: shorter than the longest lease of its previous run, the
    // acknowledgement would speak for leases still live.
    if (options.lock_delay && *options.lock_delay < options.max_ttl) {
      return usage_error("--lock-delay " + *lock_delay + " is below --max-ttl " + max_ttl +
                         ", which cluster mode refuses: a restarted node's hand-offs would "
                         "release buckets while its previous run's leases may be live. Leave "
                         "--lock-delay out (it defaults to --max-ttl) or raise it");
    }
    const auto ttl_flag = shardlock::tools::parse_duration_flag("--etcd-lease-ttl", etcd_lease_ttl,
                                                                ZeroDuration::kRejected);
    if (!ttl_flag.error.empty()) return usage_error(ttl_flag.error);
    if (ttl_flag.value < std::chrono::seconds(2) || ttl_flag.value > std::chrono::minutes(10)) {
      return usage_error("--etcd-lease-ttl must be 2s..10m");
    }
    cluster.lease_ttl = std::chrono::duration_cast<std::chrono::seconds>(ttl_flag.value);
    cluster.max_ttl = options.max_ttl;
    cluster.data_dir = options.data_dir;
    cluster.log = options.log;
    options.start_closed = true;  // nothing granted before the cluster says what
  }
#endif

  // Block the stop signals before any thread exists, so every server thread
  // inherits the mask and sigwait() below is the only receiver.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  LeaseServer server(options);
  if (const std::error_code ec = server.start()) {
    std::cerr << "shardlockd: cannot start: " << server.error_detail() << " (" << ec.message()
              << ")\n";
    return kExitStartFailed;
  }
  // On the server's clock, read after start(): never before the end the
  // server keeps itself.
  const auto server_delay_ends = server.now() + server.lock_delay();
  auto lock_delay_ends = server_delay_ends;
#ifdef SHARDLOCK_HAVE_CLUSTER
  std::unique_ptr<shardlock::cluster::ClusterNode> node;
  if (!cluster_url.empty()) {
    if (cluster.advertise.empty()) cluster.advertise = server.listen_address();
    if (const int status = join_cluster(cluster, server, node)) {
      server.stop();
      return status;
    }
    // The first map opens the node's gate a lock-delay after it is adopted
    // (about now); buckets whose previous owners are alive wait longer, for
    // their hand-offs.
    lock_delay_ends = std::max(lock_delay_ends, server.now() + node->lock_delay());
  }
#endif
  // The exporter's civetweb threads start here, after the mask above, so the
  // stop signals still reach only sigwait().
  std::unique_ptr<shardlock::lease::PrometheusExporter> exporter;
  if (!metrics_address.empty()) {
    std::string detail;
    if (const std::error_code ec = shardlock::lease::PrometheusExporter::start(
            server, metrics_address, exporter, detail)) {
      std::cerr << "shardlockd: cannot start: " << detail << "\n";
      server.stop();
      return kExitStartFailed;
    }
  }
  std::string metrics_json = "null";
  if (exporter) {
    const std::size_t colon = metrics_address.rfind(':');
    metrics_json =
        json_string(metrics_address.substr(0, colon + 1) + std::to_string(exporter->port()));
  }
  const auto effective_delay = server.lock_delay();
  std::string cluster_json = "null";
#ifdef SHARDLOCK_HAVE_CLUSTER
  if (node) {
    const auto stats = node->stats();
    cluster_json =
        "{\"node_id\":" + json_string(cluster.node_id) +
        ",\"advertise\":" + json_string(cluster.advertise) +
        ",\"epoch\":" + std::to_string(stats.membership.highest_epoch) + ",\"lock_delay_ms\":" +
        std::to_string(
            std::chrono::duration_cast<std::chrono::milliseconds>(node->lock_delay()).count()) +
        "}";
  }
#endif
  const auto delay_left = std::max(lock_delay_ends - server.now(), std::chrono::nanoseconds{0});
  const std::string delay_ends_text =
      utc_iso8601(std::chrono::system_clock::now() +
                  std::chrono::duration_cast<std::chrono::system_clock::duration>(delay_left));
  options.log("lock-delay ends at " + delay_ends_text + " (in " + seconds_text(delay_left) + " s)" +
              (cluster_json == "null" ? "" : ", the earliest this node's buckets activate") +
              ": ACQUIRE is answered RECOVERING until then");
  std::printf(
      "{\"event\":\"ready\",\"listen\":%s,\"port\":%u,\"shards\":%u,\"io\":\"%s\","
      "\"io_threads\":%u,\"data_dir\":%s,\"max_ttl_ms\":%lld,\"lock_delay_ms\":%lld,"
      "\"lock_delay_ends\":\"%s\",\"lock_delay_remaining_s\":%s,\"auth\":%s,\"metrics\":%s,"
      "\"allocator\":\"%s\",\"cluster\":%s,\"pid\":%d}\n",
      json_string(server.listen_address()).c_str(), server.port(), options.shards,
      std::string(to_string(server.backend())).c_str(), options.io_threads,
      options.data_dir.empty() ? "null" : json_string(options.data_dir).c_str(),
      static_cast<long long>(options.max_ttl.count()),
      static_cast<long long>(effective_delay.count()), delay_ends_text.c_str(),
      seconds_text(delay_left).c_str(), options.auth_key ? "true" : "false", metrics_json.c_str(),
      shardlock::tools::kAllocatorName, cluster_json.c_str(), static_cast<int>(::getpid()));
  std::fflush(stdout);

  auto granting = [&]() -> std::optional<std::string> {
    if (server.now() < server_delay_ends) return std::nullopt;
#ifdef SHARDLOCK_HAVE_CLUSTER
    if (node) {
      const auto stats = node->stats();
      if (stats.buckets_active == 0) return std::nullopt;
      return "granting: epoch " + std::to_string(stats.epoch) + ", " +
             std::to_string(stats.buckets_active) + " of " + std::to_string(stats.buckets_owned) +
             " buckets here active";
    }
#endif
    return std::string("granting: the lock-delay is over");
  };
  const int signal_number = wait_for_stop(stop_signals, granting, options.log);
  options.log(std::string("received ") + (signal_number == SIGTERM ? "SIGTERM" : "SIGINT") +
              ", stopping");
  exporter.reset();
#ifdef SHARDLOCK_HAVE_CLUSTER
  if (node) node->stop(shardlock::cluster::StopMode::kRevokeLease);  // a clean leave
#endif
  server.stop();
  options.log("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return shardlock::tools::run_main(kTool, kExitStartFailed, run, argc, argv);
}
