// shardlockd: the lease server daemon, a thin main() around LeaseServer.
//
// Prints one JSON line to stdout once the socket is bound:
//   {"event":"ready","listen":"127.0.0.1:7420","port":7420,...,
//    "lock_delay_ends":"2026-11-25T12:01:00.250Z","lock_delay_remaining_s":59.998,...,
//    "fresh_data_dir":false,"version":"0.1.0","pid":1234}
// (fresh_data_dir: the data dir had never issued a token, so there was no
// lock-delay to wait out; docs/lease-server.md, "A fresh data dir")
// logs to stderr, one line per event with a level (common/daemon_log.h:
// a timestamp on a terminal, a "<N>" priority for journald), including
// "granting: ..." once ACQUIRE can be granted and, at most once per
// --log-summary-interval, what the server refused or dropped; stops cleanly
// on SIGTERM or SIGINT; SIGHUP reloads --tenants (else it is logged and ignored).
// Under systemd (Type=notify) it sends READY=1 once bound with its data dir
// loaded, and STATUS= says whether it is in its lock-delay; --auth-key may
// name a credential (LoadCredential=).
// lock_delay_ends is when the lock-delay after this start ends, on the wall
// clock (UTC); in cluster mode the later of the server's and the cluster's
// (counted from about now, when the node adopts its first map), the earliest
// its buckets can become active.
// Exit codes: 0 clean stop or --help, 1 start-up failure (or the ready line
// could not be written to stdout), 2 bad flags.
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>

#include "common/allocator.h"
#include "common/command_line.h"
#include "common/daemon_log.h"
#include "common/systemd.h"
#include "common/serve_loop.h"
#include "common/traffic_summary.h"
#include "prometheus_exporter.h"
#include "shardlock/lease/server/server.h"
#include "shardlock_version.h"
#ifdef SHARDLOCK_HAVE_CLUSTER
#include <thread>

#include "cluster_node.h"
#include "common/etcd_flags.h"
#endif

namespace {

using shardlock::lease::IoBackend;
using shardlock::lease::LeaseServer;
using shardlock::lease::LeaseServerOptions;
using shardlock::tools::DaemonLog;
using shardlock::tools::LogLevel;
using shardlock::tools::serve_until_stopped;
using shardlock::tools::utc_iso8601;
using shardlock::tools::ZeroDuration;
// The ready line's fields in the order they are set.
using Json = nlohmann::ordered_json;

constexpr const char* kTool = "shardlockd";
constexpr int kExitStartFailed = 1;

// A usage error under systemd is logged at priority err, like the rest of
// the log (daemon_log.h), not at the journal's default.
int usage_error(std::string_view message) {
  if (shardlock::tools::is_journal_stream(STDERR_FILENO)) std::fputs("<3>", stderr);
  return shardlock::tools::usage_error(kTool, message);
}

// Seconds with millisecond precision, "59.998".
std::string seconds_text(std::chrono::nanoseconds d) {
  std::array<char, 32> text{};
  std::snprintf(text.data(), text.size(), "%.3f",
                std::chrono::duration<double>(std::max(d, std::chrono::nanoseconds{0})).count());
  return text.data();
}

// The same seconds as a JSON number, 59.998 (rounded to the millisecond).
double seconds_value(std::chrono::nanoseconds d) {
  const auto ms =
      std::chrono::round<std::chrono::milliseconds>(std::max(d, std::chrono::nanoseconds{0}));
  return static_cast<double>(ms.count()) / 1000.0;
}

// Tells systemd `state` (Type=notify); a failure is only logged.
void notify(const DaemonLog& log, const std::string& state) {
  if (!shardlock::tools::service_manager_listens()) return;
  if (const std::error_code ec = shardlock::tools::notify_service_manager(state)) {
    log.write(LogLevel::kWarning,
              "cannot notify the service manager ($NOTIFY_SOCKET): " + ec.message());
    return;
  }
  log.write(LogLevel::kDebug, "told the service manager: " + state);
}


#ifdef SHARDLOCK_HAVE_CLUSTER
// Joins the cluster; 0 or an exit code. A member key still held by this
// node's previous run (killed before its etcd lease ran out) is waited out.
int join_cluster(const shardlock::cluster::ClusterNodeOptions& options,
                 const shardlock::tools::EtcdFlags& etcd_flags, shardlock::lease::LeaseServer& server,
                 std::unique_ptr<shardlock::cluster::ClusterNode>& node, const DaemonLog& log) {
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
      log.write(LogLevel::kError, "cannot join the cluster: " + detail + " (" + ec.message() + ")" +
                                      shardlock::tools::etcd_flag_hint(ec, detail, etcd_flags));
      return kExitStartFailed;
    }
    if (!told) {
      log.write(LogLevel::kWarning, detail + "; waiting for it to expire");
      told = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}
#endif

// The file a key or password flag (--auth-key, --cluster-key, --etcd-key,
// --etcd-password-file) names: the path itself, or, when that is no
// readable file, the systemd credential of that name
// (LoadCredential=NAME:PATH puts it in $CREDENTIALS_DIRECTORY, readable by a
// DynamicUser service).
std::string resolve_credential_path(std::string_view flag, const std::string& value,
                                    const DaemonLog& log) {
  if (value.empty() || ::access(value.c_str(), R_OK) == 0) return value;
  if (const auto credential = shardlock::tools::credential_path(value)) {
    log.write(LogLevel::kInfo,
              std::string(flag) + " " + value + ": the systemd credential " + *credential);
    return *credential;
  }
  return value;
}

#ifdef SHARDLOCK_HAVE_CLUSTER
// Whether "HOST:PORT" names a loopback host (127.0.0.0/8, [::1], localhost):
// the one place --replicas may go without --cluster-key (tests, one host).
bool is_loopback_address(std::string_view address) {
  const std::size_t colon = address.rfind(':');
  const std::string_view host = address.substr(0, colon == std::string_view::npos ? 0 : colon);
  return host.starts_with("127.") || host == "[::1]" || host == "localhost";
}
#endif

// For an --auth-key that cannot be read: where a plain name was looked for.
std::string auth_key_hint(const std::string& flag) {
  if (flag.find('/') != std::string::npos) return "";
  return std::getenv("CREDENTIALS_DIRECTORY") == nullptr
             ? " (nor is it a systemd credential: $CREDENTIALS_DIRECTORY is not set; see "
               "LoadCredential= in docs/lease-server.md)"
             : " (nor is it a credential in $CREDENTIALS_DIRECTORY)";
}

// A key others can read lets them forge grants and releases: warn, as
// OpenSSH does about a private key with group or other permissions.
void warn_if_others_can_read(std::string_view flag, const std::string& path,
                             const DaemonLog& log) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & 0077) == 0) return;
  std::array<char, 8> mode{};
  std::snprintf(mode.data(), mode.size(), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  log.write(LogLevel::kWarning,
            std::string(flag) + " " + path + " is accessible by other users (mode " + mode.data() +
                "): whoever reads it can forge any client's datagrams. chmod 600 it, or pass it "
                "to the service with LoadCredential=");
}

// The flags as given: bound by add_server_flags() and add_cluster_flags(),
// then parsed and checked against each other by apply_server_flags() and
// apply_cluster_flags().
struct DaemonFlags {
  LeaseServerOptions options;  // the flags bound to it directly, then the parsed ones
  std::string max_ttl = "60s";
  std::string max_wait = "5m";
  std::optional<std::string> lock_delay;
  std::string hot_key_half_life = "10s";
  std::string io = "auto";
  std::string metrics_address;
  unsigned busy_poll_us = static_cast<unsigned>(LeaseServerOptions{}.busy_poll.count());
  std::string auth_key_file;
  std::string tenants_file;      // --tenants, reloaded on SIGHUP
  std::string cluster_key_file;  // --cluster-key, with the cluster flags
  std::string log_level = "info";
  std::string log_summary_interval = "10s";
  std::chrono::milliseconds summary_interval{0};  // log_summary_interval, parsed
#ifdef SHARDLOCK_HAVE_CLUSTER
  shardlock::cluster::ClusterNodeOptions cluster;
  std::string cluster_url;
  shardlock::tools::EtcdFlags etcd;  // --etcd-cacert, --etcd-user, ...
  std::string etcd_lease_ttl = "5s";
  std::string replica_timeout = "300ms";
  std::string replies_from = "backup";
  CLI::Option* replies_from_flag = nullptr;
#endif
};

// The server's flags: where it listens, its limits, its keys and its log.
void add_server_flags(CLI::App& app, DaemonFlags& f) {
  f.options.bind_address = "127.0.0.1:7420";
  f.options.bind_address = "127.0.0.1:7420";
  app.add_option("--listen", f.options.bind_address,
                 "HOST:PORT to bind (IPv4, or [IPv6]:PORT); port 0 picks a free port")
      ->capture_default_str();
  app.add_option("--shards", f.options.shards, "number of shards (1..65536)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 65536u));
  app.add_option("--metrics", f.metrics_address,
                 "serve Prometheus metrics at http://HOST:PORT/metrics (off by default; "
                 "give 127.0.0.1:PORT unless other hosts must scrape it; port 0 picks one)");
  app.add_option("--data-dir", f.options.data_dir,
                 "directory for the durable token high-water marks; without it tokens restart "
                 "from 1 after a restart");
  app.add_option("--max-ttl", f.max_ttl, "largest TTL a client may ask for")->capture_default_str();
  app.add_option("--max-wait", f.max_wait, "largest wait a client may ask for")
      ->capture_default_str();
  app.add_option("--lock-delay", f.lock_delay,
                 "refuse ACQUIRE (RECOVERING) this long after start-up; default: --max-ttl. "
                 "0 is for tests only");
  app.add_option("--io", f.io, "I/O back end: uring, socket or auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "uring", "socket"}));
  app.add_option("--io-threads", f.options.io_threads, "I/O threads, each with its own socket")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  app.add_option("--busy-poll-us", f.busy_poll_us,
                 "microseconds an I/O thread keeps polling after a datagram before it sleeps: "
                 "lower latency for some CPU while traffic flows; 0 = off")
      ->capture_default_str()
      ->check(CLI::Range(0u, 10'000u));
  app.add_option("--auth-key", f.auth_key_file,
                 "file with the shared key (64 hex digits, from `shardlockctl keygen`): every "
                 "datagram must then carry a valid tag, and replies are sealed. Under systemd, "
                 "a plain NAME that is no readable file is the credential "
                 "$CREDENTIALS_DIRECTORY/NAME (LoadCredential=NAME:PATH)");
  app.add_option("--tenants", f.tenants_file,
                 "tenant file (docs/security.md): each tenant's key id, keys, key prefixes and "
                 "rights; every datagram is then verified under its tenant's key, and SIGHUP "
                 "reloads the file without dropping a lease. Instead of --auth-key")
      ->excludes("--auth-key");
  app.add_option("--log-level", f.log_level,
                 "least severe lines logged: error, warning, info or debug (debug adds the "
                 "grant log: one line per grant, hand-off, release, expiry and takeover, at most "
                 "1000 a second)")
      ->capture_default_str()
      ->check(CLI::IsMember({"error", "warning", "warn", "info", "debug"}));
  app.add_option("--log-summary-interval", f.log_summary_interval,
                 "log refused and malformed traffic (authentication failures, ERROR answers, "
                 "dropped replies) at most once per this long, with the counts since the last "
                 "summary; 0 = never")
      ->capture_default_str();
  app.add_option("--token-block", f.options.token_block,
                 "tokens reserved per durable write (advanced)")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  // Memory bounds: past one, a request is answered ERROR(limit exceeded).
  constexpr std::size_t kMaxBound = std::size_t{1} << 40;
  for (const auto& [flag, field, what] :
       {std::tuple<const char*, std::size_t*, const char*>{
            "--max-keys", &f.options.max_keys,
            "leases held, all shards (each shared or permit holder counts)"},
        {"--max-waiters", &f.options.max_waiters, "queued ACQUIREs, all keys"},
        {"--max-waiters-per-key", &f.options.max_waiters_per_key, "queued ACQUIREs on one key"},
        {"--max-leases-per-client", &f.options.max_leases_per_client,
         "leases one client id may hold (enforced per shard as ceil(n / shards))"},
        {"--max-waiters-per-client", &f.options.max_waiters_per_client,
         "ACQUIREs one client id may have queued (per shard as ceil(n / shards))"},
        {"--max-watches", &f.options.max_watches, "parked WATCHes (blocking queries), all keys"},
        {"--max-watches-per-key", &f.options.max_watches_per_key, "parked WATCHes on one key"},
        {"--max-watches-per-client", &f.options.max_watches_per_client,
         "WATCHes one client id may have parked (per shard as ceil(n / shards))"}}) {
    app.add_option(flag, *field, what)
        ->capture_default_str()
        ->check(CLI::Range(std::size_t{1}, kMaxBound));
  }

  app.add_option("--hot-keys", f.options.hot_keys_per_shard,
                 "slots per shard of the busiest-keys sketch that shardlockctl top reads (fixed "
                 "memory, ~300 bytes a slot); 0 = none")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{0}, LeaseServerOptions::kMaxHotKeysPerShard));
  app.add_option("--hot-key-half-life", f.hot_key_half_life,
                 "the sketch's counts halve this often, so top follows current traffic; 0 = "
                 "never (counts since the start)")
      ->capture_default_str();
}

#ifdef SHARDLOCK_HAVE_CLUSTER
// The cluster flags: --cluster and those that only go with it.
void add_cluster_flags(CLI::App& app, DaemonFlags& f) {
  auto* cluster_flag = app.add_option(
      "--cluster", f.cluster_url,
      "etcd://HOST:PORT[,HOST:PORT...] (or http://), or over TLS etcds://HOST:PORT[,...] (or "
      "https://): join the cluster kept in this etcd (docs/cluster.md); needs --node-id and "
      "--data-dir. Without it the node serves every key itself");
  shardlock::tools::add_etcd_flags(app, f.etcd, cluster_flag);
  app.add_option("--node-id", f.cluster.node_id, "this node's id in the cluster ([A-Za-z0-9._-])")
      ->needs(cluster_flag);
  app.add_option("--advertise", f.cluster.advertise,
                 "HOST:PORT clients reach this node at (default: the bound address)")
      ->needs(cluster_flag);
  app.add_option("--weight", f.cluster.weight, "this node's share of the buckets, relative")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000u))
      ->needs(cluster_flag);
  app.add_option("--cluster-name", f.cluster.cluster_name,
                 "the cluster's name: its keys in etcd live under /shardlock/NAME/")
      ->capture_default_str()
      ->needs(cluster_flag);
  app.add_option("--etcd-lease-ttl", f.etcd_lease_ttl,
                 "TTL of this node's etcd lease: how soon a dead node's keys move")
      ->capture_default_str()
      ->needs(cluster_flag);
  app.add_option("--replicas", f.cluster.replicas,
                 "owners per bucket: 1, none; 2 or 3, each grant also on the next nodes, so a "
                 "node's death loses no holder (docs/cluster.md, Replication; every node of a "
                 "cluster must use the same value)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{3}))
      ->needs(cluster_flag);
  app.add_option("--cluster-key", f.cluster_key_file,
                 "with --replicas: file with the key (64 hex digits, `shardlockctl keygen`) that "
                 "seals node-to-node replication datagrams; every node has it, clients never do "
                 "(not the --auth-key). Required unless every node listens on loopback")
      ->needs(cluster_flag);
  app.add_option("--replica-timeout", f.replica_timeout,
                 "with --replicas: a replica not heard from for this long is evicted from the "
                 "cluster (its etcd lease revoked), so its buckets fail over at once")
      ->capture_default_str()
      ->needs(cluster_flag);
  f.replies_from_flag =
      app.add_option("--replies-from", f.replies_from,
                     "with --replicas: who sends the answer to a grant or release that waits on "
                     "one backup. backup: that backup, as soon as it holds the entry (one network "
                     "hop sooner). primary: the node the client asked; choose it when clients hear "
                     "only the address they sent to (behind a NAT), where an answer from the "
                     "backup is lost and arrives only when the client retransmits")
          ->capture_default_str()
          ->check(CLI::IsMember({"backup", "primary"}))
          ->needs(cluster_flag);
}
#else
// Without the cluster layer: says so in --help, and refuses a cluster flag
// with that reason (exit status) rather than CLI11's "not expected".
std::optional<int> refuse_cluster_flags(CLI::App& app, int argc, char** argv) {
  app.footer(app.get_footer() +
             "\nThis shardlockd was built without cluster support: --cluster and its flags are "
             "refused (build it with gRPC installed: tools/install-deps.sh --release).");
  // CLI11 would call the cluster flags "not expected", naming their values
  // first; say what is missing instead.
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    for (const std::string_view flag :
         {"--cluster", "--node-id", "--advertise", "--weight", "--cluster-name", "--etcd-lease-ttl",
          "--replicas", "--replica-timeout", "--replies-from", "--cluster-key", "--etcd-cacert",
          "--etcd-cert", "--etcd-key", "--etcd-user", "--etcd-password-file"}) {
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
  return std::nullopt;
}
#endif

// Parses the server's flags into f.options and f.summary_interval (the
// log-summary interval); the usage error's exit status, or nullopt. The
// log callbacks write to `log`, which must outlive the server.
std::optional<int> apply_server_flags(DaemonFlags& f, const DaemonLog& log) {
  const auto summary_interval_flag = shardlock::tools::parse_duration_flag(
      "--log-summary-interval", f.log_summary_interval, ZeroDuration::kAllowed);
  if (!summary_interval_flag.error.empty()) return usage_error(summary_interval_flag.error);
  f.summary_interval = summary_interval_flag.value;

  // The wire carries TTLs and waits as u32 milliseconds (the flags' upper
  // bound); a lock-delay beyond the longest lease is meaningless and would
  // overflow the clock.
  const auto max_ttl_flag =
      shardlock::tools::parse_duration_flag("--max-ttl", f.max_ttl, ZeroDuration::kRejected);
  if (!max_ttl_flag.error.empty()) return usage_error(max_ttl_flag.error);
  f.options.max_ttl = max_ttl_flag.value;
  const auto max_wait_flag =
      shardlock::tools::parse_duration_flag("--max-wait", f.max_wait, ZeroDuration::kAllowed);
  if (!max_wait_flag.error.empty()) return usage_error(max_wait_flag.error);
  f.options.max_wait = max_wait_flag.value;
  const auto half_life_flag = shardlock::tools::parse_duration_flag(
      "--hot-key-half-life", f.hot_key_half_life, ZeroDuration::kAllowed);
  if (!half_life_flag.error.empty()) return usage_error(half_life_flag.error);
  f.options.hot_key_half_life = half_life_flag.value;
  if (f.lock_delay) {
    const auto lock_delay_flag = shardlock::tools::parse_duration_flag(
        "--lock-delay", *f.lock_delay, ZeroDuration::kAllowed);
    if (!lock_delay_flag.error.empty()) return usage_error(lock_delay_flag.error);
    f.options.lock_delay = lock_delay_flag.value;
  }
  f.options.io = *shardlock::lease::parse_io_backend(f.io);
  const auto auth_key_path = resolve_credential_path("--auth-key", f.auth_key_file, log);
  const auto auth = shardlock::tools::load_auth_key_flag(auth_key_path);
  if (!auth.error.empty()) return usage_error(auth.error + auth_key_hint(f.auth_key_file));
  if (auth.key) warn_if_others_can_read("--auth-key", auth_key_path, log);
  f.options.auth_key = auth.key;
  if (!f.tenants_file.empty()) {
    auto loaded = shardlock::lease::load_tenant_file(f.tenants_file);
    if (!loaded.ok()) return usage_error("--tenants: " + loaded.message());
    warn_if_others_can_read("--tenants", f.tenants_file, log);
    f.options.tenants = std::move(*loaded.table);
  }
  f.options.log = [&log](std::string_view line) { log.write_library_line(line); };
  if (log.enabled(LogLevel::kDebug)) {
    // The grant log: one line per grant, hand-off, release, expiry and
    // takeover (rate-limited), so "who held X at 10:02" has an answer.
    f.options.grant_log = [&log](std::string_view line) { log.write(LogLevel::kDebug, line); };
  }
  return std::nullopt;
}

#ifdef SHARDLOCK_HAVE_CLUSTER
// With --cluster: checks the cluster flags against each other and the
// server's, and fills f.cluster and the server's cluster options; the usage
// error's exit status, or nullopt.
std::optional<int> apply_cluster_flags(DaemonFlags& f, const DaemonLog& log) {
  if (f.cluster_url.empty()) return std::nullopt;
  auto etcd = shardlock::tools::resolve_etcd_flags(
      f.cluster_url, f.etcd, [&log](std::string_view flag, const std::string& path) {
        return resolve_credential_path(flag, path, log);
      });
  if (!etcd.error.empty()) return usage_error(etcd.error);
  for (const std::string& warning : etcd.warnings) log.write(LogLevel::kWarning, warning);
  f.cluster.endpoints = std::move(etcd.endpoints);
  f.cluster.etcd_tls = std::move(etcd.tls);
  f.cluster.etcd_credentials = std::move(etcd.credentials);
  if (f.cluster.node_id.empty()) return usage_error("--cluster needs --node-id");
  if (!shardlock::cluster::valid_node_id(f.cluster.node_id)) {
    return usage_error("--node-id '" + f.cluster.node_id + "': 1..128 of [A-Za-z0-9._-]");
  }
  if (!shardlock::cluster::valid_node_id(f.cluster.cluster_name)) {
    return usage_error("--cluster-name '" + f.cluster.cluster_name + "': 1..128 of [A-Za-z0-9._-]");
  }
  if (f.options.data_dir.empty()) return usage_error("--cluster needs --data-dir");
  // A restarted node acknowledges hand-offs once its server's lock-delay
  // is over: shorter than the longest lease of its previous run, the
  // acknowledgement would speak for leases still live.
  if (f.options.lock_delay && *f.options.lock_delay < f.options.max_ttl) {
    return usage_error("--lock-delay " + *f.lock_delay + " is below --max-ttl " + f.max_ttl +
                       ", which cluster mode refuses: a restarted node's hand-offs would "
                       "release buckets while its previous run's leases may be live. Leave "
                       "--lock-delay out (it defaults to --max-ttl) or raise it");
  }
  const auto ttl_flag = shardlock::tools::parse_duration_flag("--etcd-lease-ttl", f.etcd_lease_ttl,
                                                              ZeroDuration::kRejected);
  if (!ttl_flag.error.empty()) return usage_error(ttl_flag.error);
  if (ttl_flag.value < std::chrono::seconds(2) || ttl_flag.value > std::chrono::minutes(10)) {
    return usage_error("--etcd-lease-ttl must be 2s..10m");
  }
  f.cluster.lease_ttl = std::chrono::duration_cast<std::chrono::seconds>(ttl_flag.value);
  f.cluster.max_ttl = f.options.max_ttl;
  f.cluster.data_dir = f.options.data_dir;
  f.cluster.log = f.options.log;
  f.options.start_closed = true;  // nothing granted before the cluster says what
  f.options.replication = f.cluster.replicas > 1;
  if (f.replies_from_flag->count() > 0 && !f.options.replication) {
    return usage_error("--replies-from needs --replicas 2 or 3");
  }
  f.options.relay_replies = f.replies_from == "backup";
  const auto timeout_flag = shardlock::tools::parse_duration_flag(
      "--replica-timeout", f.replica_timeout, ZeroDuration::kRejected);
  if (!timeout_flag.error.empty()) return usage_error(timeout_flag.error);
  if (timeout_flag.value < std::chrono::milliseconds(100) ||
      timeout_flag.value > std::chrono::minutes(1)) {
    return usage_error("--replica-timeout must be 100ms..1m");
  }
  f.cluster.evict_after = std::chrono::duration_cast<std::chrono::milliseconds>(timeout_flag.value);
  if (!f.cluster_key_file.empty()) {
    if (!f.options.replication) return usage_error("--cluster-key needs --replicas 2 or 3");
    const auto cluster_key_path = resolve_credential_path("--cluster-key", f.cluster_key_file, log);
    const auto key = shardlock::tools::load_auth_key_flag(cluster_key_path);
    if (!key.error.empty()) {
      return usage_error("--cluster-key: " + key.error + auth_key_hint(f.cluster_key_file));
    }
    if (f.options.tenants && key.key) {
      for (const auto& tenant : f.options.tenants->tenants()) {
        if (tenant.key == *key.key || tenant.next_key == key.key) {
          return usage_error("--cluster-key is tenant " + tenant.name +
                             "'s key: its clients could forge the replication stream; make a "
                             "key of its own (shardlockctl keygen)");
        }
      }
    }
    if (f.options.auth_key && key.key && *key.key == *f.options.auth_key) {
      return usage_error(
          "--cluster-key is the --auth-key: the clients hold that one, so any of them could "
          "forge the replication stream; make a key of its own (shardlockctl keygen)");
    }
    warn_if_others_can_read("--cluster-key", cluster_key_path, log);
    f.options.cluster_key = key.key;
  } else if (f.options.replication && f.options.tenants) {
    return usage_error("--tenants with --replicas " + std::to_string(f.cluster.replicas) +
                       " needs --cluster-key FILE: no tenant's key may seal the replication "
                       "stream");
  } else if (f.options.replication &&
             !(is_loopback_address(f.options.bind_address) &&
               (f.cluster.advertise.empty() || is_loopback_address(f.cluster.advertise)))) {
    return usage_error(
        "--replicas " + std::to_string(f.cluster.replicas) +
        " needs --cluster-key FILE outside loopback: the replication stream moves holders "
        "between nodes, and without a key of its own anyone who can reach the port (or holds "
        "the clients' --auth-key) can forge it (docs/cluster.md, \"Replication\")");
  }
  return std::nullopt;
}
#endif

// Blocks the stop signals (and SIGHUP, which would kill) in this thread and
// returns them. Called before any thread exists, so every server thread
// inherits the mask and the loop in serve_until_stopped() is the only
// receiver.
sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Starts the Prometheus exporter on `address` (none when it is empty); 0 or
// an exit code.
int start_exporter(const shardlock::lease::LeaseServer& server, const std::string& address,
                   std::unique_ptr<shardlock::lease::PrometheusExporter>& exporter,
                   const DaemonLog& log) {
  if (address.empty()) return 0;
  std::string detail;
  if (const std::error_code ec =
          shardlock::lease::PrometheusExporter::start(server, address, exporter, detail)) {
    log.write(LogLevel::kError, "cannot start: " + detail);
    return kExitStartFailed;
  }
  return 0;
}

#ifdef SHARDLOCK_HAVE_CLUSTER
// The ready line's "cluster" object.
Json cluster_json(const shardlock::cluster::ClusterNodeOptions& cluster,
                  const shardlock::cluster::ClusterNode& node) {
  const auto stats = node.stats();
  Json cluster_info = Json::object();
  cluster_info["node_id"] = cluster.node_id;
  cluster_info["advertise"] = cluster.advertise;
  cluster_info["epoch"] = stats.membership.highest_epoch;
  cluster_info["lock_delay_ms"] =
      std::chrono::duration_cast<std::chrono::milliseconds>(node.lock_delay()).count();
  return cluster_info;
}
#endif

// Says the daemon is ready, once bound with its data dir loaded: logs when
// its lock-delay ends (`lock_delay_ends`, on the server's clock), prints the
// ready line and tells systemd. `metrics` is the exporter's address (null:
// none) and `cluster_info` the ready line's cluster object (null: not in a
// cluster). Returns "; listening on HOST:PORT", for the later STATUS= lines.
std::string announce_ready(const DaemonLog& log, const LeaseServerOptions& options,
                           const LeaseServer& server, std::chrono::nanoseconds lock_delay_ends,
                           Json metrics, Json cluster_info) {
  const auto effective_delay = server.lock_delay();
  const auto delay_left = std::max(lock_delay_ends - server.now(), std::chrono::nanoseconds{0});
  const std::string delay_ends_text =
      utc_iso8601(std::chrono::system_clock::now() +
                  std::chrono::duration_cast<std::chrono::system_clock::duration>(delay_left));
  if (delay_left.count() == 0 && server.fresh_data_dir()) {
    log.write(LogLevel::kInfo,
              "no lock-delay (fresh data dir: no lease was ever granted from it): ACQUIRE is "
              "granted at once");
  } else {
    const std::string until =
        cluster_info.is_null()
            ? ": ACQUIRE is answered RECOVERING until then"
            : (options.replication
                   ? ", the earliest this node's buckets activate, except those it takes over "
                     "complete from a replica (they grant at once): the rest answer ACQUIRE "
                     "RECOVERING until then"
                   : ", the earliest this node's buckets activate: ACQUIRE is answered "
                     "RECOVERING until then");
    log.write(LogLevel::kInfo, "lock-delay ends at " + delay_ends_text + " (in " +
                                   seconds_text(delay_left) + " s)" + until);
  }
  Json ready;
  ready["event"] = "ready";
  ready["listen"] = server.listen_address();
  ready["port"] = server.port();
  ready["shards"] = options.shards;
  ready["io"] = std::string(to_string(server.backend()));
  ready["io_threads"] = options.io_threads;
  ready["data_dir"] = options.data_dir.empty() ? Json(nullptr) : Json(options.data_dir);
  ready["max_ttl_ms"] = options.max_ttl.count();
  ready["lock_delay_ms"] = effective_delay.count();
  ready["lock_delay_ends"] = delay_ends_text;
  ready["lock_delay_remaining_s"] = seconds_value(delay_left);
  ready["auth"] = options.auth_key.has_value() || options.tenants.has_value();
  ready["tenants"] = options.tenants ? Json(options.tenants->size()) : Json(nullptr);
  ready["metrics"] = std::move(metrics);
  ready["fresh_data_dir"] = server.fresh_data_dir();
  ready["allocator"] = shardlock::tools::kAllocatorName;
  ready["cluster"] = std::move(cluster_info);
  ready["version"] = std::string(shardlock::kVersion);
  ready["pid"] = static_cast<int>(::getpid());
  // A data dir that is not UTF-8 (any bytes name a path) would make invalid
  // JSON: its bad bytes are written U+FFFD instead.
  std::printf("%s\n", ready.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
  std::fflush(stdout);
  // Bound, data dir loaded, ready line out: systemd may start what follows it.
  std::string listening = "; listening on " + server.listen_address();
  notify(log, delay_left.count() == 0 && server.fresh_data_dir()
                  ? "READY=1\nSTATUS=granting (fresh data dir)" + listening
                  : "READY=1\nSTATUS=in its lock-delay until " + delay_ends_text +
                        ": ACQUIRE is answered RECOVERING" + listening);
  return listening;
}

int run(int argc, char** argv) {
  CLI::App app{
      "shardlockd: UDP lease server with fencing tokens that survive kill -9.\n"
      "Durations are written like 500ms, 1.5s, 30 (seconds), 2m, 1m30s."};
  shardlock::tools::add_version_flag(app, kTool);
  app.footer(
      "Exit codes: 0 clean stop (SIGTERM, SIGINT); 1 start-up failure, or the ready line could "
      "not be written to stdout; 2 bad flags.");
  DaemonFlags f;
  add_server_flags(app, f);
#ifdef SHARDLOCK_HAVE_CLUSTER
  add_cluster_flags(app, f);
#else
  if (const auto status = refuse_cluster_flags(app, argc, argv)) return *status;
#endif
  if (const auto status = shardlock::tools::parse_command_line(app, argc, argv, kTool)) {
    return *status;
  }
  f.options.busy_poll = std::chrono::microseconds(f.busy_poll_us);
  const DaemonLog log(kTool, *shardlock::tools::parse_log_level(f.log_level), STDERR_FILENO,
                      shardlock::tools::is_journal_stream(STDERR_FILENO));
  if (const auto status = apply_server_flags(f, log)) return *status;
#ifdef SHARDLOCK_HAVE_CLUSTER
  if (const auto status = apply_cluster_flags(f, log)) return *status;
#endif

  const sigset_t signals = block_stop_signals();
  LeaseServer server(f.options);
  if (const std::error_code ec = server.start()) {
    log.write(LogLevel::kError,
              "cannot start: " + server.error_detail() + " (" + ec.message() + ")");
    return kExitStartFailed;
  }
  // On the server's clock, read after start(): never before the end the
  // server keeps itself.
  const auto server_delay_ends = server.now() + server.lock_delay();
  auto lock_delay_ends = server_delay_ends;
  Json cluster_info = nullptr;
#ifdef SHARDLOCK_HAVE_CLUSTER
  std::unique_ptr<shardlock::cluster::ClusterNode> node;
  if (!f.cluster_url.empty()) {
    if (f.cluster.advertise.empty()) f.cluster.advertise = server.listen_address();
    if (const int status = join_cluster(f.cluster, f.etcd, server, node, log)) {
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
  if (const int status = start_exporter(server, f.metrics_address, exporter, log)) {
    server.stop();
    return status;
  }
  Json metrics = nullptr;
  if (exporter) {
    const std::size_t colon = f.metrics_address.rfind(':');
    metrics = f.metrics_address.substr(0, colon + 1) + std::to_string(exporter->port());
  }
#ifdef SHARDLOCK_HAVE_CLUSTER
  if (node) cluster_info = cluster_json(f.cluster, *node);
#endif
  const std::string listening = announce_ready(log, f.options, server, lock_delay_ends,
                                               std::move(metrics), std::move(cluster_info));

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
    return std::string(server.lock_delay().count() == 0 && server.fresh_data_dir()
                           ? "granting: no lock-delay (fresh data dir)"
                           : "granting: the lock-delay is over");
  };
  // SIGHUP: the tenant file again, whole or not at all.
  auto reload = [&] {
    if (f.tenants_file.empty()) {
      log.write(LogLevel::kInfo,
                "received SIGHUP: ignored (no --tenants to reload; the log is stderr, nothing "
                "to reopen)");
      return;
    }
    auto loaded = shardlock::lease::load_tenant_file(f.tenants_file);
    if (!loaded.ok()) {
      log.write(LogLevel::kError, "received SIGHUP: kept the tenants in force, the file is bad: " +
                                      loaded.message());
      return;
    }
    const std::size_t tenants = loaded.table->size();
    (void)server.reload_tenants(std::move(*loaded.table));
    log.write(LogLevel::kInfo, "received SIGHUP: reloaded " + std::to_string(tenants) +
                                   " tenant(s) from " + f.tenants_file);
  };
  const int signal_number = serve_until_stopped(
      signals, log, server, f.summary_interval, granting,
      [&](const std::string& line) { notify(log, "STATUS=" + line + listening); }, reload);
  log.write(LogLevel::kInfo, std::string("received ") +
                                 (signal_number == SIGTERM ? "SIGTERM" : "SIGINT") + ", stopping");
  notify(log, "STOPPING=1\nSTATUS=stopping");
  exporter.reset();
#ifdef SHARDLOCK_HAVE_CLUSTER
  if (node) node->stop(shardlock::cluster::StopMode::kRevokeLease);  // a clean leave
#endif
  server.stop();
  log.write(LogLevel::kInfo, "stopped");
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  return shardlock::tools::run_main(kTool, kExitStartFailed, run, argc, argv);
}
