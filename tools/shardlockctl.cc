// shardlockctl: the command-line client of the lease service.
//
//   shardlockctl --server HOST:PORT[,HOST:PORT...] [--discover] SUBCOMMAND
//     acquire KEY... --ttl DUR [--wait DUR] [--shared | --permits P] [--owner HEX]
//     renew   KEY --token T --owner HEX --ttl DUR
//     release KEY --token T --owner HEX
//     query   KEY
//     stats
//     run     KEY... --ttl DUR [--wait DUR] [--shared | --permits P]
//             [--on-lost term|kill|ignore] -- COMMAND ARGS...
//
//   shardlockctl [--timeout DUR] SUBCOMMAND --cluster etcd://HOST:PORT[,...]
//                [--cluster-name NAME]
//     members [--json]
//     drain   ID [--cancel] [--force] [--wait DUR]
//
// Several keys (up to 16, all owned by one node) are taken all or nothing
// with one ACQUIRE_MANY, exclusive or --shared; --permits takes one key.
// --discover talks to a cluster (docs/cluster.md): the --server addresses
// are seeds that give the cluster's map, and each key goes to its owner.
//
// Every lease subcommand prints one JSON object on stdout (run prints nothing
// of its own on success). The cluster subcommands (members, drain) read and
// write the cluster's keys in etcd (docs/cluster.md) and print for people:
// members one line per member, or one JSON object with --json. Exit codes,
// as with flock -n:
//   0  granted / renewed / released / answered
//   1  busy or timed out (acquire, run); not owner or expired (renew, release);
//      drain: an id that is not a member (without --force), or --wait ran out
//   2  usage error (also: several keys owned by different nodes; a bad
//      --cluster URL or --cluster-name)
//   3  server unreachable (members, drain: etcd unreachable)
//   4  server recovering (lock-delay after a restart)
//   5  the server answered ERROR, incomplete stats, or a local failure
//      (stdout could not be written: keygen > /full/disk)
//   run: the command's own exit status (128+N if killed by signal N;
//        126 not executable, 127 not found), except 5 when it cannot be
//        learned, and
//   75 the lease was lost while the command ran (EX_TEMPFAIL)
#include <signal.h>  // POSIX sigtimedwait, sigset_t: not in <csignal>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/command_line.h"
#include "common/json.h"
#include "shardlock/lease/client/client.h"
#if defined(SHARDLOCK_HAVE_CLUSTER)
#include <algorithm>
#include <map>
#include <optional>
#include <thread>

#include "membership.h"  // src/cluster/etcd: the etcd client and the cluster's keys
#include "shardlock/cluster/cluster_map.h"
#endif

extern char** environ;

namespace {

using namespace shardlock::lease;
using shardlock::tools::json_string;
using shardlock::tools::kExitUsage;
using shardlock::tools::ZeroDuration;
using std::chrono::milliseconds;

constexpr const char* kTool = "shardlockctl";
constexpr int kExitOk = 0;
constexpr int kExitRefused = 1;
constexpr int kExitUnreachable = 3;
constexpr int kExitRecovering = 4;
constexpr int kExitError = 5;
constexpr int kExitLeaseLost = 75;

int exit_code_for(const std::error_code& ec) {
  if (!ec) return kExitOk;
  if (ec == LeaseErrc::kBusy || ec == LeaseErrc::kTimeout || ec == LeaseErrc::kNotOwner ||
      ec == LeaseErrc::kExpired || ec == LeaseErrc::kGrantExpired) {
    return kExitRefused;
  }
  if (ec == LeaseErrc::kUnreachable) return kExitUnreachable;
  if (ec == LeaseErrc::kRecovering) return kExitRecovering;
  if (ec == LeaseErrc::kBadArgument || ec == LeaseErrc::kCrossNode) return kExitUsage;
  return kExitError;
}

// The JSON spelling of an error: "busy", "not_owner", ...
std::string error_name(const std::error_code& ec) {
  std::string name(ec.category() == lease_category()
                       ? std::string(to_string(static_cast<LeaseErrc>(ec.value())))
                       : ec.message());
  for (char& ch : name) {
    if (ch == ' ') ch = '_';
  }
  return name;
}

// Prints {"key":..,"error":..[,extra]} and returns the exit code for `ec`.
int print_error(std::string_view key, const std::error_code& ec, const std::string& extra = {}) {
  std::printf("{\"key\":%s,\"error\":%s%s}\n", json_string(key).c_str(),
              json_string(error_name(ec)).c_str(), extra.c_str());
  return exit_code_for(ec);
}

std::string wire_error_field(const std::error_code& ec, WireError wire) {
  if (ec != LeaseErrc::kServerError) return {};
  return ",\"wire_error\":" + json_string(to_string(wire));
}

// `keys` as a JSON array of strings.
std::string json_keys(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i > 0) out += ',';
    out += json_string(keys[i]);
  }
  return out + "]";
}

// `items` joined by `separator`.
std::string joined(const std::vector<std::string>& items, char separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  return out;
}

// How acquire and run take their keys.
struct KindArg {
  bool shared = false;
  std::uint32_t permits = 0;  // 0: not a semaphore
  [[nodiscard]] LeaseMode mode() const noexcept {
    return permits > 0 ? LeaseMode::kPermit : shared ? LeaseMode::kShared : LeaseMode::kExclusive;
  }
};

// The leases of one acquire or run: every key's, or none and why.
struct Acquired {
  std::error_code error;
  std::vector<Lease> leases;
  std::string busy_key;
  std::uint32_t ttl_left_ms = 0;
  std::uint32_t retry_after_ms = 0;
  WireError wire_error = WireError::kInternal;
};

// One key: ACQUIRE, ACQUIRE_SHARED or ACQUIRE_PERMIT. Several: one
// ACQUIRE_MANY, all or nothing.
Acquired acquire_keys(LeaseClient& client, const std::vector<std::string>& keys, KindArg kind,
                      milliseconds ttl, milliseconds wait, LeaseOptions options) {
  Acquired out;
  if (keys.size() == 1) {
    AcquireResult r = kind.permits > 0 ? client.acquire_permit(keys[0], kind.permits, ttl, wait,
                                                               std::move(options))
                      : kind.shared ? client.acquire_shared(keys[0], ttl, wait, std::move(options))
                                    : client.acquire(keys[0], ttl, wait, std::move(options));
    out.error = r.error;
    if (r.error == LeaseErrc::kBusy) out.busy_key = keys[0];
    out.ttl_left_ms = r.holder_ttl_left_ms;
    out.retry_after_ms = r.retry_after_ms;
    out.wire_error = r.wire_error;
    if (!r.error) out.leases.push_back(std::move(r.lease));
    return out;
  }
  const std::vector<std::string_view> views(keys.begin(), keys.end());
  MultiAcquireResult r = client.acquire_many(views, ttl, wait, kind.mode(), std::move(options));
  out.error = r.error;
  out.busy_key = std::move(r.busy_key);
  out.ttl_left_ms = r.holder_ttl_left_ms;
  out.retry_after_ms = r.retry_after_ms;
  out.wire_error = r.wire_error;
  out.leases = std::move(r.leases);
  return out;
}

// Prints why `keys` were not acquired ({"key":..} for one key, {"keys":[..]}
// for several) and returns the exit code.
int print_acquire_error(const std::vector<std::string>& keys, const Acquired& a) {
  std::string extra = wire_error_field(a.error, a.wire_error);
  if (a.error == LeaseErrc::kBusy) {
    if (keys.size() > 1) extra += ",\"busy_key\":" + json_string(a.busy_key);
    extra += ",\"ttl_left_ms\":" + std::to_string(a.ttl_left_ms);
  }
  if (a.error == LeaseErrc::kRecovering)
    extra += ",\"retry_after_ms\":" + std::to_string(a.retry_after_ms);
  if (a.error == LeaseErrc::kCrossNode) {
    std::fprintf(stderr,
                 "shardlockctl: the keys are owned by different nodes; one acquire takes keys of "
                 "one node\n");
  }
  if (keys.size() == 1) return print_error(keys[0], a.error, extra);
  std::printf("{\"keys\":%s,\"error\":%s%s}\n", json_keys(keys).c_str(),
              json_string(error_name(a.error)).c_str(), extra.c_str());
  return exit_code_for(a.error);
}

struct DurationArg {
  std::string text;
  milliseconds value{0};
};

// Parses `d.text` (an unset subcommand flag stays empty and 0) into
// `d.value`; prints the usage error and returns false when it is not valid.
bool parse_arg(DurationArg& d, const char* flag, ZeroDuration zero) {
  if (d.text.empty()) return true;
  const auto parsed = shardlock::tools::parse_duration_flag(flag, d.text, zero);
  if (!parsed.error.empty()) {
    shardlock::tools::usage_error(kTool, parsed.error);
    return false;
  }
  d.value = parsed.value;
  return true;
}

// ------------------------------------------------------------------ run

const char* signal_for(const std::string& on_lost) {
  return on_lost == "kill" ? "SIGKILL" : on_lost == "term" ? "SIGTERM" : "none";
}

int run_command(LeaseClient& client, const std::vector<std::string>& keys, KindArg kind,
                milliseconds ttl, milliseconds wait, const std::string& on_lost,
                const std::vector<std::string>& command, const std::string& servers,
                const std::string& auth_key_file) {
  // Signals ctl handles itself: they are blocked in every thread (the client
  // threads inherit the mask, so they must be blocked before the client
  // starts; main() does that) and taken synchronously with sigtimedwait.
  sigset_t handled;
  sigemptyset(&handled);
  for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&handled, s);

  // Which key was lost first; written on the watchdog thread, read below.
  struct Loss {
    std::mutex mutex;
    std::string key;
  } loss;
  std::atomic<bool> lost{false};
  LeaseOptions options;
  options.watchdog = true;
  options.on_lost = [&lost, &loss](const LeaseLost& event) {
    {
      std::lock_guard lock(loss.mutex);
      if (loss.key.empty()) loss.key = event.key;
    }
    // Relaxed is enough: the key rides under loss.mutex, not on the flag.
    lost.store(true, std::memory_order_relaxed);
  };
  Acquired acquired = acquire_keys(client, keys, kind, ttl, wait, std::move(options));
  if (acquired.error) return print_acquire_error(keys, acquired);
  std::vector<Lease>& leases = acquired.leases;
  std::vector<std::string> tokens;
  tokens.reserve(leases.size());
  for (const Lease& lease : leases) tokens.push_back(std::to_string(lease.token()));

  // The child's environment: ours plus the lease.
  // Several keys: comma separated, in the order given.
  std::vector<std::string> extra = {
      "SHARDLOCK_KEY=" + joined(keys, ','),
      "SHARDLOCK_TOKEN=" + joined(tokens, ','),
      "SHARDLOCK_MODE=" + std::string(to_string(kind.mode())),
      "SHARDLOCK_OWNER=" + to_hex(leases.front().owner()),
      "SHARDLOCK_SERVER=" + servers,
  };
  // So the command's own shardlockctl calls reach an --auth-key server too.
  if (!auth_key_file.empty()) extra.push_back("SHARDLOCK_AUTH_KEY_FILE=" + auth_key_file);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "SHARDLOCK_KEY=", 14) == 0 ||
        std::strncmp(*e, "SHARDLOCK_TOKEN=", 16) == 0 ||
        std::strncmp(*e, "SHARDLOCK_MODE=", 15) == 0 ||
        std::strncmp(*e, "SHARDLOCK_OWNER=", 16) == 0 ||
        std::strncmp(*e, "SHARDLOCK_SERVER=", 17) == 0 ||
        (!auth_key_file.empty() && std::strncmp(*e, "SHARDLOCK_AUTH_KEY_FILE=", 24) == 0)) {
      continue;
    }
    envp.push_back(*e);
  }
  for (std::string& e : extra) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<char*> argv;
  argv.reserve(command.size() + 1);
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  // The child starts with an empty signal mask and default dispositions.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &handled);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t child = -1;
  const int spawn_error = ::posix_spawnp(&child, argv[0], nullptr, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  if (spawn_error != 0) {
    std::fprintf(stderr, "shardlockctl: cannot run '%s': %s\n", argv[0],
                 std::strerror(spawn_error));
    for (Lease& lease : leases) (void)lease.release();
    return spawn_error == ENOENT ? 127 : 126;
  }

  bool signalled_for_loss = false;
  int status = 0;
  bool status_known = true;
  for (;;) {
    const pid_t done = ::waitpid(child, &status, WNOHANG);
    if (done == child) break;
    if (done < 0 && errno != EINTR) {
      // Not a 0 by default: the command's fate is unknown.
      std::fprintf(stderr, "shardlockctl: cannot learn how the command ended: waitpid: %s\n",
                   std::strerror(errno));
      status_known = false;
      break;
    }
    if (lost.load(std::memory_order_relaxed) && !signalled_for_loss) {
      signalled_for_loss = true;
      std::string lost_key;
      {
        std::lock_guard lock(loss.mutex);
        lost_key = loss.key;
      }
      std::fprintf(stderr, "shardlockctl: lease on '%s' lost; %s the command\n", lost_key.c_str(),
                   on_lost == "ignore" ? "not signalling" : signal_for(on_lost));
      if (on_lost == "term") ::kill(child, SIGTERM);
      if (on_lost == "kill") ::kill(child, SIGKILL);
    }
    // Wake for a child exit or a signal to forward; the 20 ms bound is
    // how late a lost lease may be noticed.
    const timespec tick{0, 20'000'000};
    siginfo_t info{};
    const int sig = ::sigtimedwait(&handled, &info, &tick);
    if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) ::kill(child, sig);
  }

  const bool was_lost = lost.load(std::memory_order_relaxed);
  if (was_lost) {
    // The other keys' leases (each is lost on its own) get one RELEASE each,
    // not waited for: their server may be the one that stopped answering.
    leases.clear();
  }
  for (Lease& lease : leases) {
    const std::error_code released = lease.release();
    if (released) {
      std::fprintf(stderr, "shardlockctl: release of '%s' failed: %s\n", lease.key().c_str(),
                   released.message().c_str());
    }
  }
  if (was_lost) return kExitLeaseLost;
  if (!status_known) return kExitError;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kExitError;
}

// ------------------------------------------------------------------ cluster

// The flags of members and drain.
struct ClusterArgs {
  std::string url;  // --cluster etcd://HOST:PORT[,HOST:PORT...]
  std::string name = "default";
  bool json = false;    // members
  std::string node_id;  // drain
  bool cancel = false;  // drain
  bool force = false;   // drain
  DurationArg wait;     // drain: empty when not given
};

#if defined(SHARDLOCK_HAVE_CLUSTER)

namespace cluster = shardlock::cluster;

// One line of `members`: a live member, a member of the map whose key is
// gone, or an id with only a drain key.
struct MemberRow {
  std::string id;
  std::string address = "-";
  std::uint32_t weight = 0;
  std::string state = "gone";  // active, draining, or gone (no member key)
  std::size_t buckets = 0;     // in the current map
  std::optional<std::uint64_t> handoff;
  bool drain_requested = false;
};

struct ClusterTable {
  std::uint64_t epoch = 0;  // 0: no map
  std::size_t live_members = 0;
  std::size_t map_members = 0;
  std::size_t bucket_count = 0;
  std::vector<MemberRow> rows;  // by id
};

// The rows of `view`: every id with a member key, in the map, or with a
// drain key.
ClusterTable table_of(const cluster::ClusterView& view) {
  ClusterTable table;
  std::map<std::string, MemberRow> rows;
  const auto row = [&rows](const std::string& id) -> MemberRow& {
    MemberRow& r = rows[id];
    r.id = id;
    return r;
  };
  if (view.map) {
    table.epoch = view.map->epoch;
    table.map_members = view.map->members.size();
    std::unique_ptr<cluster::ClusterRouting> routing;
    // A map that decoded always routes (cluster_map.h).
    if (cluster::ClusterRouting::build(*view.map, routing) == shardlock::RouterStatus::kOk) {
      table.bucket_count = routing->bucket_count();
      const std::vector<std::size_t> counts = routing->buckets_per_member();
      for (std::size_t i = 0; i < routing->map().members.size(); ++i) {
        const cluster::ClusterMember& member = routing->map().members[i];
        MemberRow& r = row(member.id);
        r.address = member.address;
        r.weight = member.weight;
        r.buckets = counts[i];
      }
    }
  }
  for (const cluster::ClusterView::Member& member : view.members) {
    MemberRow& r = row(member.id);
    r.address = member.record.address;
    r.weight = member.record.weight;
    r.state = std::string(cluster::to_string(member.record.state));
  }
  table.live_members = view.members.size();
  for (const cluster::ClusterView::Handoff& handoff : view.handoffs) {
    row(handoff.id).handoff = handoff.epoch;
  }
  for (const std::string& id : view.drains) row(id).drain_requested = true;
  for (auto& [id, r] : rows) table.rows.push_back(std::move(r));
  return table;
}

void print_table(const ClusterTable& table, const std::string& name, bool json) {
  if (json) {
    std::string out = "{\"cluster\":" + json_string(name) +
                      ",\"epoch\":" + std::to_string(table.epoch) +
                      ",\"members\":" + std::to_string(table.live_members) +
                      ",\"map_members\":" + std::to_string(table.map_members) +
                      ",\"bucket_count\":" + std::to_string(table.bucket_count) + ",\"nodes\":[";
    for (std::size_t i = 0; i < table.rows.size(); ++i) {
      const MemberRow& r = table.rows[i];
      if (i > 0) out += ',';
      out += "{\"id\":" + json_string(r.id) + ",\"address\":" + json_string(r.address) +
             ",\"weight\":" + std::to_string(r.weight) + ",\"state\":" + json_string(r.state) +
             ",\"buckets\":" + std::to_string(r.buckets) +
             ",\"handoff\":" + (r.handoff ? std::to_string(*r.handoff) : std::string("null")) +
             ",\"drain\":" + (r.drain_requested ? "true" : "false") + "}";
    }
    out += "]}";
    std::printf("%s\n", out.c_str());
    return;
  }
  std::printf("cluster=%s epoch=%" PRIu64 " members=%zu map_members=%zu buckets=%zu\n",
              name.c_str(), table.epoch, table.live_members, table.map_members, table.bucket_count);
  for (const MemberRow& r : table.rows) {
    const std::string handoff = r.handoff ? std::to_string(*r.handoff) : "-";
    std::printf("%s address=%s weight=%u state=%s buckets=%zu handoff=%s drain=%s\n", r.id.c_str(),
                r.address.c_str(), r.weight, r.state.c_str(), r.buckets, handoff.c_str(),
                r.drain_requested ? "yes" : "no");
  }
}

int exit_code_for_etcd(const std::error_code& ec) {
  if (ec == cluster::EtcdErrc::kUnavailable || ec == cluster::EtcdErrc::kDeadlineExceeded) {
    return kExitUnreachable;
  }
  if (ec == cluster::EtcdErrc::kBadEndpoint) return kExitUsage;
  return kExitError;
}

// Prints "shardlockctl: <what>: <detail>" and returns the exit code.
int etcd_failure(const std::string& what, const std::error_code& ec, const std::string& detail) {
  std::fprintf(stderr, "shardlockctl: %s: %s (%s)\n", what.c_str(), ec.message().c_str(),
               detail.c_str());
  return exit_code_for_etcd(ec);
}

// The buckets `id` owns in `view`'s map (0 without a map).
std::size_t buckets_of(const cluster::ClusterView& view, const std::string& id) {
  for (const MemberRow& r : table_of(view).rows) {
    if (r.id == id) return r.buckets;
  }
  return 0;
}

// Whether `id` has a member key in `view` (alive, or its etcd lease not yet
// expired).
bool is_member(const cluster::ClusterView& view, const std::string& id) {
  return std::any_of(view.members.begin(), view.members.end(),
                     [&](const cluster::ClusterView::Member& m) { return m.id == id; });
}

// The map epoch `id`'s handoff/<id> key acknowledges (0 without one).
std::uint64_t handoff_epoch(const cluster::ClusterView& view, const std::string& id) {
  for (const cluster::ClusterView::Handoff& h : view.handoffs) {
    if (h.id == id) return h.epoch;
  }
  return 0;
}

int run_cluster(ClusterArgs& args, bool members, milliseconds timeout) {
  const std::optional<std::string> endpoints = cluster::etcd_endpoints_of_url(args.url);
  if (!endpoints) {
    return shardlock::tools::usage_error(
        kTool, "--cluster: '" + args.url + "' is not etcd://HOST:PORT[,HOST:PORT...]");
  }
  const std::string prefix = cluster::cluster_prefix(args.name);
  if (prefix.empty()) {
    return shardlock::tools::usage_error(
        kTool, "--cluster-name: '" + args.name + "' is not 1..128 bytes of [A-Za-z0-9._-]");
  }
  if (!members && !cluster::valid_node_id(args.node_id)) {
    return shardlock::tools::usage_error(
        kTool, "drain: node id '" + args.node_id + "' is not 1..128 bytes of [A-Za-z0-9._-]");
  }
  cluster::EtcdClientOptions options;
  options.endpoints = *endpoints;
  options.call_timeout = timeout;
  auto connected = cluster::EtcdClient::connect(options);
  if (!connected.ok()) {
    return etcd_failure("etcd " + *endpoints, connected.error, connected.detail);
  }
  cluster::EtcdClient& client = *connected.value;
  std::uint64_t bad_values = 0;
  const auto read = cluster::Membership::read_view(client, prefix, &bad_values);
  if (!read.ok())
    return etcd_failure("cannot read " + prefix + " at " + *endpoints, read.error, read.detail);
  if (bad_values != 0) {
    std::fprintf(stderr, "shardlockctl: %" PRIu64 " value(s) under %s did not decode (ignored)\n",
                 bad_values, prefix.c_str());
  }
  if (members) {
    print_table(table_of(read.value), args.name, args.json);
    return kExitOk;
  }

  // drain: refuse an id the cluster does not know, unless forced (a node
  // that is down and should come back drained) or cancelling.
  const ClusterTable table = table_of(read.value);
  const bool known = std::any_of(table.rows.begin(), table.rows.end(), [&](const MemberRow& r) {
    return r.id == args.node_id && r.state != "gone";
  });
  if (!known && !args.cancel && !args.force) {
    std::string ids;
    for (const cluster::ClusterView::Member& member : read.value.members) {
      ids += ids.empty() ? "" : ", ";
      ids += member.id;
    }
    std::fprintf(stderr,
                 "shardlockctl: drain: '%s' is not a member of cluster %s (members: %s); "
                 "--force drains it when it registers\n",
                 args.node_id.c_str(), args.name.c_str(), ids.empty() ? "none" : ids.c_str());
    return kExitRefused;
  }
  const cluster::EtcdStatus written =
      args.cancel ? cluster::Membership::cancel_drain(client, prefix, args.node_id)
                  : cluster::Membership::request_drain(client, prefix, args.node_id);
  if (!written.ok()) {
    return etcd_failure(std::string(args.cancel ? "cannot delete " : "cannot put ") + prefix +
                            "drain/" + args.node_id,
                        written.error, written.detail);
  }
  std::printf("%s %s\n", args.node_id.c_str(), args.cancel ? "drain cancelled" : "drain requested");
  if (args.wait.text.empty()) return kExitOk;

  // Cancel: until the map gives the node buckets again. Drain: until the map
  // gives it none AND it has handed them off (handoff/ID acknowledges that
  // map's epoch), since its heirs grant its keys only then; returning at the
  // map alone sent operators to stop a node mid hand-off, which costs a
  // whole lock-delay. A node whose member key is gone hands nothing off: its
  // heirs grant once the lock-delay since it vanished has passed.
  const auto deadline = std::chrono::steady_clock::now() + args.wait.value;
  std::string waiting_for;
  for (;;) {
    const auto polled = cluster::Membership::read_view(client, prefix);
    if (polled.ok()) {
      const cluster::ClusterView& view = polled.value;
      const std::size_t buckets = buckets_of(view, args.node_id);
      const std::uint64_t epoch = view.map ? view.map->epoch : 0;
      if (args.cancel) {
        if (buckets > 0) {
          std::printf("%s owns %zu buckets in epoch %" PRIu64 "\n", args.node_id.c_str(), buckets,
                      epoch);
          return kExitOk;
        }
        waiting_for = "owns 0 buckets";
      } else if (buckets > 0) {
        waiting_for = "still owns " + std::to_string(buckets) + " buckets";
      } else if (!is_member(view, args.node_id)) {
        std::printf("%s owns 0 buckets in epoch %" PRIu64
                    "; it is gone (no member key), so it handed nothing off: its buckets' new "
                    "owners grant once the lock-delay since it left has passed\n",
                    args.node_id.c_str(), epoch);
        return kExitOk;
      } else if (const std::uint64_t acked = handoff_epoch(view, args.node_id); acked >= epoch) {
        std::printf("%s owns 0 buckets in epoch %" PRIu64
                    " and has handed them off (handoff %" PRIu64 ")\n",
                    args.node_id.c_str(), epoch, acked);
        return kExitOk;
      } else {
        waiting_for = "owns 0 buckets in epoch " + std::to_string(epoch) +
                      " but has not handed them off (handoff " + std::to_string(acked) + ")";
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::fprintf(stderr, "shardlockctl: drain: %s %s after %s%s%s\n", args.node_id.c_str(),
                   polled.ok() ? waiting_for.c_str() : "(unknown)", args.wait.text.c_str(),
                   polled.ok() ? "" : "; etcd: ", polled.ok() ? "" : polled.detail.c_str());
      return kExitRefused;
    }
    std::this_thread::sleep_for(milliseconds(200));
  }
}

#else

int run_cluster(ClusterArgs&, bool, milliseconds) {
  std::fprintf(stderr,
               "shardlockctl: this build has no cluster support (configure with "
               "-DSHARDLOCK_BUILD_CLUSTER=ON)\n");
  return kExitError;
}

#endif

int run(int argc, char** argv) {
  CLI::App app{
      "shardlockctl: take, renew, release and inspect shardlock leases; run a command under a "
      "lease"};
  app.require_subcommand(1);
  std::string servers;
  DurationArg timeout{"2s"};
  app.add_option("--server", servers,
                 "HOST:PORT of the server(s), comma separated (required except for keygen, "
                 "members and drain)")
      ->envname("SHARDLOCK_SERVER");
  app.add_option("--timeout", timeout.text,
                 "How long a request retransmits before 'unreachable' (members, drain: each etcd "
                 "call's deadline)")
      ->capture_default_str();
  bool discover = false;
  app.add_flag("--discover", discover,
               "The servers are seeds of a cluster (docs/cluster.md): ask them for the cluster's "
               "map and send each key to the node that owns it, following redirects. stats "
               "still asks the --server nodes");
  std::string auth_key_file;
  app.add_option("--auth-key", auth_key_file,
                 "File with the key shared with the servers (see keygen); seals every request "
                 "and accepts only sealed replies")
      ->envname("SHARDLOCK_AUTH_KEY_FILE");
  app.footer(
      "Exit codes: 0 ok; 1 busy/timeout/not owner/expired (drain: not a member, or --wait ran "
      "out); 2 usage (or keys of different nodes); 3 unreachable (server, or etcd); 4 recovering; "
      "5 server error, incomplete stats or a local failure "
      "(e.g. stdout could not be written). run: the command's status (5 if it cannot be "
      "learned), or 75 when a lease was lost.");

  std::string key;
  std::vector<std::string> keys;  // acquire and run
  KindArg kind;
  DurationArg ttl;
  DurationArg wait{"0"};
  std::string owner_hex;
  std::uint64_t token = 0;
  // acquire and run take their keys the same way.
  const auto add_kind_flags = [&kind](CLI::App* sub) {
    sub->add_flag("--shared", kind.shared,
                  "Shared (read) lease: held alongside other shared leases, never with an "
                  "exclusive one");
    sub->add_option("--permits", kind.permits,
                    "One of at most P leases on the key (a semaphore); the first holder's P holds "
                    "while the key is in use. One key only; not with --shared")
        ->check(CLI::Range(1u, static_cast<unsigned>(kMaxPermits)));
  };

  auto* acquire = app.add_subcommand(
      "acquire",
      "Take a lease; prints {key, token, ttl_ms, owner, mode}. Several keys (up to 16, of one "
      "node) are taken all or nothing; prints {leases: [{key, token}...], ttl_ms, owner, mode}, or "
      "when one is held {keys, error: busy, busy_key}");
  acquire->add_option("key", keys, "The key(s)")->required();
  acquire->add_option("--ttl", ttl.text, "Lease duration, e.g. 30s")->required();
  acquire->add_option("--wait", wait.text, "Wait up to this long for the holder(s) to let go")
      ->capture_default_str();
  add_kind_flags(acquire);
  acquire->add_option("--owner", owner_hex,
                      "Act as this owner (32 hex digits); default: a new random owner");

  auto* renew = app.add_subcommand("renew", "Extend a lease you hold");
  renew->add_option("key", key, "The key")->required();
  renew->add_option("--token", token, "The lease's token")->required();
  renew->add_option("--owner", owner_hex, "The owner printed by acquire")->required();
  renew->add_option("--ttl", ttl.text, "New duration, e.g. 30s")->required();

  auto* release = app.add_subcommand("release", "Give a lease back");
  release->add_option("key", key, "The key")->required();
  release->add_option("--token", token, "The lease's token")->required();
  release->add_option("--owner", owner_hex, "The owner printed by acquire")->required();

  auto* query = app.add_subcommand(
      "query",
      "Is the key held, how (mode: exclusive, shared or permit), by how many holders (and the "
      "permit limit), the newest token, the longest ttl left, and how many wait");
  query->add_option("key", key, "The key")->required();

  auto* keygen = app.add_subcommand(
      "keygen", "Print a new random auth key (64 hex digits) for shardlockd --auth-key");
  auto* stats = app.add_subcommand("stats", "Server counters and every shard's token");

  std::string on_lost = "term";
  std::vector<std::string> command;
  auto* run = app.add_subcommand(
      "run",
      "Hold a lease (or several keys' leases, all or nothing) while COMMAND runs, like flock; the "
      "command sees SHARDLOCK_KEY, SHARDLOCK_TOKEN (comma separated for several keys, in the "
      "order given), SHARDLOCK_MODE, SHARDLOCK_OWNER and SHARDLOCK_SERVER");
  run->add_option("key", keys, "The key(s), then -- COMMAND ARGS...")->required();
  run->add_option("--ttl", ttl.text, "Lease duration; renewed every ttl/3 while the command runs")
      ->required();
  run->add_option("--wait", wait.text, "Wait up to this long for the holder(s) to let go")
      ->capture_default_str();
  add_kind_flags(run);
  run->add_option("--on-lost", on_lost, "What to do to the command if a lease is lost")
      ->check(CLI::IsMember({"term", "kill", "ignore"}))
      ->capture_default_str();
  run->footer("The command follows --: shardlockctl run KEY... --ttl 30s -- COMMAND ARGS...");

  ClusterArgs cluster_args;
  const auto add_cluster_flags = [&cluster_args](CLI::App* sub) {
    sub->add_option("--cluster", cluster_args.url, "etcd://HOST:PORT[,HOST:PORT...] of the cluster")
        ->envname("SHARDLOCK_CLUSTER")
        ->required();
    sub->add_option("--cluster-name", cluster_args.name,
                    "The cluster's name: its keys are under /shardlock/NAME/ in etcd")
        ->capture_default_str();
  };
  auto* members = app.add_subcommand(
      "members",
      "List the cluster's members from etcd: a header line (map epoch, member count), then one "
      "line per member: id, address, weight, state (active, draining, or gone from etcd but still "
      "in the map), buckets owned in the current map, hand-off epoch, drain requested");
  add_cluster_flags(members);
  members->add_flag("--json", cluster_args.json, "One JSON object instead of lines");
  auto* drain = app.add_subcommand(
      "drain",
      "Ask node ID to drain (it leaves the next map, hands its buckets off, and stays up), or "
      "with --cancel to come back; puts or deletes drain/ID in etcd");
  drain->add_option("id", cluster_args.node_id, "The node id")->required();
  add_cluster_flags(drain);
  drain->add_flag("--cancel", cluster_args.cancel, "Cancel a drain the key asked for");
  drain->add_flag("--force", cluster_args.force,
                  "Drain an id that is not a member now (it drains when it registers)");
  drain->add_option("--wait", cluster_args.wait.text,
                    "Wait up to this long until the map gives ID no buckets and ID has handed "
                    "them off (handoff/ID at the map's epoch), or ID is gone (with --cancel: until "
                    "it owns some again); exit 1 if it does not");

  // run's keys and its command are both positional, so CLI11 would hand
  // the command's words to the keys: everything after run's first "--" is
  // the command, and CLI11 sees only what comes before.
  std::vector<char*> args(argv, argv + argc);
  bool run_named = false;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    if (arg == "run") run_named = true;
    if (run_named && arg == "--") {
      for (std::size_t j = i + 1; j < args.size(); ++j) command.emplace_back(args[j]);
      args.resize(i);
      break;
    }
  }

  if (const auto status = shardlock::tools::parse_command_line(app, static_cast<int>(args.size()),
                                                               args.data(), kTool)) {
    return *status;
  }
  if (members->parsed() || drain->parsed()) {
    if (!parse_arg(timeout, "--timeout", ZeroDuration::kRejected) ||
        !parse_arg(cluster_args.wait, "--wait", ZeroDuration::kAllowed)) {
      return kExitUsage;
    }
    return run_cluster(cluster_args, members->parsed(), timeout.value);
  }
  if (keygen->parsed()) {
    std::printf("%s\n",
                shardlock::lease::format_auth_key(shardlock::lease::generate_auth_key()).c_str());
    return kExitOk;
  }
  if (servers.empty()) {
    return shardlock::tools::usage_error(kTool, "--server (or SHARDLOCK_SERVER) is required");
  }
  if (!parse_arg(timeout, "--timeout", ZeroDuration::kRejected) ||
      !parse_arg(ttl, "--ttl", ZeroDuration::kRejected) ||
      !parse_arg(wait, "--wait", ZeroDuration::kAllowed)) {
    return kExitUsage;
  }

  LeaseClientOptions options;
  options.nodes = split_node_list(servers);
  options.discover_cluster = discover;
  options.request_timeout = timeout.value;
  if (!owner_hex.empty()) {
    const auto id = parse_client_id(owner_hex);
    if (!id) {
      std::fprintf(stderr, "shardlockctl: --owner wants 32 hex digits, got '%s'\n",
                   owner_hex.c_str());
      return kExitUsage;
    }
    options.client_id = *id;
  }
  const auto auth = shardlock::tools::load_auth_key_flag(auth_key_file);
  if (!auth.error.empty()) return shardlock::tools::usage_error(kTool, auth.error);
  options.auth_key = auth.key;
  if (acquire->parsed() || run->parsed()) {
    if (kind.shared && kind.permits > 0) {
      return shardlock::tools::usage_error(
          kTool, "--shared and --permits exclude each other: a key is a lock or a semaphore");
    }
    if (kind.permits > 0 && keys.size() > 1) {
      return shardlock::tools::usage_error(kTool, "--permits takes one key");
    }
    if (keys.size() > kMaxKeysPerRequest) {
      return shardlock::tools::usage_error(kTool, "at most " + std::to_string(kMaxKeysPerRequest) +
                                                      " keys at once, got " +
                                                      std::to_string(keys.size()));
    }
    const std::set<std::string> distinct(keys.begin(), keys.end());
    if (distinct.size() != keys.size()) {
      return shardlock::tools::usage_error(kTool, "each key may be given only once");
    }
    if (run->parsed() && command.empty()) {
      return shardlock::tools::usage_error(kTool, "run: give the command after --");
    }
  } else if (!command.empty()) {
    return shardlock::tools::usage_error(kTool, "only run takes -- COMMAND");
  }
  std::vector<std::string> checked_keys = keys;
  if (!stats->parsed() && keys.empty()) checked_keys.push_back(key);
  for (const std::string& k : checked_keys) {
    if (k.size() < kMinKeyLength || k.size() > kMaxKeyLength) {
      std::fprintf(stderr, "shardlockctl: keys are 1..%zu bytes\n", kMaxKeyLength);
      return kExitUsage;
    }
  }
  if (run->parsed()) {
    // Before any client thread exists, so every thread inherits the mask.
    sigset_t handled;
    sigemptyset(&handled);
    for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&handled, s);
    pthread_sigmask(SIG_BLOCK, &handled, nullptr);
    // SIGCHLD ignored (inherited across exec from a parent that ignores it)
    // would have the kernel reap the command, so its exit status could
    // never be read, and run reported 0 whatever the command did.
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    sigaction(SIGCHLD, &default_action, nullptr);
  }

  LeaseClient client(options);
  if (std::error_code ec = client.start()) {
    std::fprintf(stderr, "shardlockctl: %s\n", client.error_detail().c_str());
    if (ec == LeaseErrc::kBadAddress) return kExitUsage;
    // --discover: no seed answered with the cluster's map.
    return ec == LeaseErrc::kUnreachable ? kExitUnreachable : kExitError;
  }

  if (acquire->parsed()) {
    Acquired a = acquire_keys(client, keys, kind, ttl.value, wait.value, {});
    if (a.error) return print_acquire_error(keys, a);
    const Lease& first = a.leases.front();
    std::string kind_fields = ",\"mode\":" + json_string(to_string(first.mode()));
    if (first.mode() == LeaseMode::kPermit)
      kind_fields += ",\"permits\":" + std::to_string(first.permits());
    const std::string common = ",\"ttl_ms\":" + std::to_string(first.ttl().count()) +
                               ",\"owner\":" + json_string(to_hex(first.owner())) + kind_fields;
    if (keys.size() == 1) {
      std::printf("{\"key\":%s,\"token\":%" PRIu64 "%s}\n", json_string(keys[0]).c_str(),
                  first.token(), common.c_str());
    } else {
      std::string leases = "[";
      for (std::size_t i = 0; i < a.leases.size(); ++i) {
        if (i > 0) leases += ',';
        leases += "{\"key\":" + json_string(a.leases[i].key()) +
                  ",\"token\":" + std::to_string(a.leases[i].token()) + "}";
      }
      std::printf("{\"leases\":%s]%s}\n", leases.c_str(), common.c_str());
    }
    // The leases outlive this process: let go of the handles, not the leases.
    for (Lease& lease : a.leases) lease.detach();
    return kExitOk;
  }
  if (renew->parsed()) {
    const CallResult r = client.renew(key, token, ttl.value);
    if (r.error) return print_error(key, r.error, wire_error_field(r.error, r.wire_error));
    std::printf("{\"key\":%s,\"token\":%" PRIu64 ",\"ttl_ms\":%u,\"renewed\":true}\n",
                json_string(key).c_str(), token, r.ttl_ms);
    return kExitOk;
  }
  if (release->parsed()) {
    const CallResult r = client.release(key, token);
    if (r.error) return print_error(key, r.error, wire_error_field(r.error, r.wire_error));
    std::printf("{\"key\":%s,\"token\":%" PRIu64 ",\"released\":true}\n", json_string(key).c_str(),
                token);
    return kExitOk;
  }
  if (query->parsed()) {
    const CallResult r = client.query(key);
    if (r.error) return print_error(key, r.error, wire_error_field(r.error, r.wire_error));
    std::printf(
        "{\"key\":%s,\"held\":%s,\"mode\":%s,\"holders\":%u,\"permits\":%u,"
        "\"token\":%" PRIu64 ",\"ttl_left_ms\":%u,\"waiters\":%u}\n",
        json_string(key).c_str(), r.held ? "true" : "false", json_string(to_string(r.mode)).c_str(),
        r.holders, r.permits, r.token, r.ttl_ms, r.waiters);
    return kExitOk;
  }
  if (stats->parsed()) {
    std::string out = "{\"nodes\":[";
    int worst = kExitOk;
    for (std::size_t n = 0; n < options.nodes.size(); ++n) {
      const ServerStatsReply s = client.stats(n);
      if (n > 0) out += ',';
      out += "{\"server\":" + json_string(options.nodes[n]);
      if (s.error) {
        out += ",\"error\":" + json_string(error_name(s.error)) + "}";
        worst = std::max(worst, exit_code_for(s.error));
        continue;
      }
      out += ",\"shards\":" + std::to_string(s.shard_count);
      if (s.shard_tokens.size() < s.shard_count) {
        // The server stopped paging early: what follows is a part, not the
        // whole, and must not read as the server's state.
        std::fprintf(stderr,
                     "shardlockctl: %s: stats incomplete: %zu of %u shard tokens received\n",
                     options.nodes[n].c_str(), s.shard_tokens.size(), s.shard_count);
        out += R"(,"error":"incomplete")";
        worst = std::max(worst, kExitError);
      }
      out += ",\"counters\":{";
      for (std::size_t i = 0; i < kStatCounterCount; ++i) {
        if (i > 0) out += ',';
        out += std::string("\"") + std::string(to_string(static_cast<StatCounter>(i))) +
               "\":" + std::to_string(s.counters[i]);
      }
      out += "},\"shard_tokens\":[";
      for (std::size_t i = 0; i < s.shard_tokens.size(); ++i) {
        if (i > 0) out += ',';
        out += std::to_string(s.shard_tokens[i]);
      }
      out += "]}";
    }
    out += "]}";
    std::printf("%s\n", out.c_str());
    return worst;
  }
  if (run->parsed()) {
    return run_command(client, keys, kind, ttl.value, wait.value, on_lost, command, servers,
                       auth_key_file);
  }
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  return shardlock::tools::run_main(kTool, kExitError, run, argc, argv);
}
