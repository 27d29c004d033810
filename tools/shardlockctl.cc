// shardlockctl: the command-line client of the lease service.
//
//   shardlockctl [GLOBAL FLAGS] SUBCOMMAND [FLAGS] [GLOBAL FLAGS]
//     global: --server HOST:PORT[,HOST:PORT...] --timeout DUR --auth-key FILE
//             --discover, and the output switch -w json | --json
//     run     KEY... [-w DUR | -n] [-s | --permits P] [--value V] [-E N] [-q] [--ttl DUR]
//             [--on-lost term|kill|ignore] [--kill-after DUR] -- COMMAND ARGS...
//     elect   NAME [-w DUR | -n] [--value V] [-E N] [-q] [--ttl DUR] [--on-lost ...]
//             [--kill-after DUR] -- COMMAND ARGS...
//     acquire KEY... --ttl DUR [-w DUR] [-s | --permits P] [--value V] [--owner HEX] [-q]
//     renew   KEY --token T --owner HEX --ttl DUR
//     release KEY --token T --owner HEX
//     query   KEY          (each holder, and the waiters)
//     stats        (gauges: version, uptime, leases, keys, waiters; counters)
//     ping         (round trip, version, uptime, recovering or not)
//     top | hot    [--interval DUR] [--count N | --once] [--limit N]
//                  (a live view of the busiest keys, as redis-cli --hotkeys)
//     keygen
//     members --cluster etcd://HOST:PORT[,...] [--cluster-name NAME]
//     drain   ID --cluster ... [--cancel] [--force] [--wait DUR]
//
// The global flags go before or after the subcommand, and every
// subcommand's --help lists them. Durations: 500ms, 1.5s, 30 (seconds), 2m.
//
// run works like flock(1): it waits for the lease (as flock, etcdctl lock
// and consul lock do) unless -n, or up to -w DUR; a wait longer than the
// server's --max-wait is queued again until it is spent. A key it cannot
// take prints nothing on stdout (the command's stream): the reason goes to
// stderr and the exit status is -E's (69 by default, EX_UNAVAILABLE, so it
// is not the command's own 1), for a server in its lock-delay too, so that
// `run -n -E 0 -q` skips a turn quietly. A wait that lasts over a second
// says once on stderr what it waits for and how long at most (flock -v
// style) unless -q. A lease lost while the command runs (the message says
// why) gets it SIGTERM, then SIGKILL after --kill-after (5s), as timeout -k
// and consul lock do, so it cannot go on past another holder's grant.
//
// Several keys (up to 16, all owned by one node) are taken all or nothing
// with one ACQUIRE_MANY, exclusive or shared; --permits takes one key.
// --discover talks to a cluster (docs/cluster.md): the --server addresses
// are seeds that give the cluster's map, and each key goes to its owner.
//
// Output is for people by default, one line per result; -w json (--json,
// --write-out json) prints one JSON object per result instead, made with
// nlohmann-json, for scripts. A key that is not UTF-8 is shown with each
// byte outside valid UTF-8 (and each backslash) as \xNN; JSON adds its exact
// bytes as "key_hex". Errors go to stderr as "shardlockctl: KEY: reason";
// with JSON they are one object on stdout ({"key":..,"error":..}), except
// run's, which go to stderr. Exit codes, as with flock -n:
//   0  granted / renewed / released / answered
//   1  busy or timed out (acquire); not owner or expired (renew, release);
//      drain: an id that is not a member (without --force), or --wait ran out
//   2  usage error (also: several keys owned by different nodes; a bad
//      --cluster URL or --cluster-name)
//   3  server unreachable: no answer in --timeout, or a host name that does
//      not resolve (the message says which, and whether anything listens
//      there); members, drain: etcd unreachable
//   4  server recovering (lock-delay after a restart)
//   5  the server answered ERROR (a TTL above its limit names the limit),
//      incomplete stats, or a local failure (stdout could not be written)
//   6  replies failed authentication (the server's --auth-key is not ours)
//   run: the command's own exit status (128+N if killed by signal N;
//        126 not executable, 127 not found), except 5 when it cannot be
//        learned, -E's status (69) when the lease was not acquired (busy,
//        recovering, or -w ran out), and
//   75 the lease was lost while the command ran (EX_TEMPFAIL)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>  // POSIX sigtimedwait, sigset_t: not in <csignal>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/command_line.h"
#include "common/json.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/client/election.h"
#include "shardlock/lease/wire/duration.h"
#if defined(SHARDLOCK_HAVE_CLUSTER)
#include <map>

#include "membership.h"  // src/cluster/etcd: the etcd client and the cluster's keys
#include "shardlock/cluster/cluster_map.h"
#endif

extern char** environ;

namespace {

using namespace shardlock::lease;
using shardlock::tools::escaped_key;
using shardlock::tools::hex_bytes;
using shardlock::tools::kExitUsage;
using shardlock::tools::valid_utf8;
using shardlock::tools::ZeroDuration;
using std::chrono::milliseconds;
// Fields in the order they are set: the output reads as it did.
using Json = nlohmann::ordered_json;

constexpr const char* kTool = "shardlockctl";
constexpr int kExitOk = 0;
constexpr int kExitRefused = 1;
constexpr int kExitUnreachable = 3;
constexpr int kExitRecovering = 4;
constexpr int kExitError = 5;
constexpr int kExitAuthFailed = 6;
constexpr int kExitLeaseLost = 75;
// run's status when the lease was not acquired (busy, or -w ran out) unless
// -E says otherwise: EX_UNAVAILABLE, apart from the command's own 1.
constexpr int kExitConflictDefault = 69;
// run's wait without -w or -n: until the lease is granted.
constexpr milliseconds kForever = milliseconds::max();
// How long an unanswered node is probed for a refusal (error messages).
constexpr milliseconds kProbeWait{300};

// The flags every subcommand takes, before or after its name.
struct Globals {
  std::string servers;  // --server, else $SHARDLOCK_SERVER
  std::string timeout = "2s";
  bool discover = false;
  std::string auth_key_file;  // --auth-key, else $SHARDLOCK_AUTH_KEY_FILE
  shardlock::tools::OutputFlags output;
};

// How results and errors are printed.
struct Output {
  bool json = false;
  bool errors_to_stderr = false;  // run: stdout is the command's
  // -q: no line while waiting, and a conflict (is_conflict()) is told by
  // the exit status alone, as flock -n tells it (acquire's JSON result on
  // stdout still says it).
  bool quiet = false;
};

// The key is not to be had now: another owner holds it (busy, or the wait
// ran out) or the server is in its lock-delay. run and elect exit -E's
// status for these; -q says nothing about them.
bool is_conflict(const std::error_code& ec) {
  return ec == LeaseErrc::kBusy || ec == LeaseErrc::kTimeout || ec == LeaseErrc::kRecovering;
}

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

// `key` under `name` in `j`; a key that is not UTF-8 escaped (\xNN), with
// its exact bytes as hex under name + "_hex".
void put_key(Json& j, const std::string& name, std::string_view key) {
  if (valid_utf8(key)) {
    j[name] = key;
  } else {
    j[name] = escaped_key(key, /*controls=*/false);
    j[name + "_hex"] = hex_bytes(key);
  }
}

Json key_list(const std::vector<std::string>& keys) {
  Json list = Json::array();
  for (const std::string& key : keys) {
    list.push_back(valid_utf8(key) ? key : escaped_key(key, /*controls=*/false));
  }
  return list;
}

// `keys` as JSON: "key" for one, "keys" (and "keys_hex" when one of them is
// not UTF-8) for several.
void put_keys(Json& j, const std::vector<std::string>& keys) {
  if (keys.size() == 1) {
    put_key(j, "key", keys[0]);
    return;
  }
  j["keys"] = key_list(keys);
  if (!std::all_of(keys.begin(), keys.end(), [](const std::string& k) { return valid_utf8(k); })) {
    Json hex = Json::array();
    for (const std::string& key : keys) hex.push_back(hex_bytes(key));
    j["keys_hex"] = hex;
  }
}

// A key for a terminal: control characters and bytes outside UTF-8 as \xNN.
std::string shown(std::string_view key) { return escaped_key(key, /*controls=*/true); }

std::string shown_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& key : keys) out += (out.empty() ? "" : " ") + shown(key);
  return out;
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

// 12.5s, 30s, 0.25s: a duration for people.
std::string seconds_text(std::uint64_t ms) {
  std::string text = std::to_string(ms / 1000);
  if (const std::uint64_t part = ms % 1000; part != 0) {
    char digits[8];
    std::snprintf(digits, sizeof digits, ".%03u", static_cast<unsigned>(part));
    std::string fraction = digits;
    while (fraction.back() == '0') fraction.pop_back();
    text += fraction;
  }
  return text + "s";
}

// query's JSON: QUERY's summary fields as before (mode null when nobody
// holds the key), "listed" (false: the server predates QUERY_HOLDERS), and
// "holder_list", each holder oldest grant first (null when not listed).
Json holders_json(const std::string& key, const HoldersReply& r) {
  Json j;
  put_key(j, "key", key);
  j["held"] = r.held;
  j["mode"] = r.held ? Json(std::string(to_string(r.mode))) : Json(nullptr);
  j["holders"] = r.holder_count;
  j["permits"] = r.permits;
  j["token"] = r.token;
  j["ttl_left_ms"] = r.ttl_left.count();
  j["waiters"] = r.waiters;
  j["listed"] = r.listed;
  if (!r.listed) {
    j["holder_list"] = nullptr;
    return j;
  }
  j["holder_list"] = Json::array();
  for (const HolderInfo& h : r.holders) {
    Json item;
    item["owner"] = to_hex(h.owner);
    item["token"] = h.token;
    item["mode"] = std::string(to_string(r.mode));
    item["ttl_left_ms"] = h.ttl_left.count();
    item["pending"] = h.pending;
    put_key(item, "value", h.value);
    j["holder_list"].push_back(std::move(item));
  }
  return j;
}

// query for people: the summary line ("not held" when nobody holds the
// key), then one indented line per holder, oldest grant first.
std::string holders_text(const std::string& key, const HoldersReply& r) {
  std::string text = shown(key);
  if (!r.held) return text + " not held waiters=" + std::to_string(r.waiters) + "\n";
  const std::string mode(to_string(r.mode));
  text += " held mode=" + mode + " holders=" + std::to_string(r.holder_count) +
          (r.mode == LeaseMode::kPermit ? " permits=" + std::to_string(r.permits) : "") +
          " ttl_left=" + seconds_text(static_cast<std::uint64_t>(r.ttl_left.count())) +
          " token=" + std::to_string(r.token) + " waiters=" + std::to_string(r.waiters) + "\n";
  for (const HolderInfo& h : r.holders) {
    text += "  owner=" + to_hex(h.owner) + " token=" + std::to_string(h.token) + " mode=" + mode +
            " ttl_left=" + seconds_text(static_cast<std::uint64_t>(h.ttl_left.count())) +
            (h.pending ? " pending" : "") + (h.value.empty() ? "" : " value=" + shown(h.value)) +
            "\n";
  }
  return text;
}

void print_json(const Json& j, std::FILE* to = stdout) {
  // Keys are escaped above, so nothing invalid reaches dump(); `replace`
  // keeps even a missed one from throwing.
  std::fprintf(to, "%s\n", j.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
}

// Why a call failed, with what the answer or the diagnosis said.
struct Failure {
  std::error_code error;
  WireError wire_error = WireError::kInternal;
  std::string busy_key;  // several keys: the one that is held
  std::uint32_t ttl_left_ms = 0;
  std::uint32_t retry_after_ms = 0;
  std::optional<std::uint32_t> max_ttl_ms;  // kTtlOutOfRange: the server's limit, when learned
  std::string detail;                       // unreachable: what the diagnosis found
  bool auth_failed = false;
};

// What the failure is called in JSON, and its exit status.
std::string failure_name(const Failure& f) {
  return f.auth_failed ? "auth_failed" : error_name(f.error);
}
int failure_status(const Failure& f) {
  return f.auth_failed ? kExitAuthFailed : exit_code_for(f.error);
}

// The failure for people, after "shardlockctl: KEY: ".
std::string failure_text(const Failure& f, milliseconds ttl, milliseconds wait) {
  const auto& e = f.error;
  if (f.auth_failed || e == LeaseErrc::kUnreachable) return f.detail;
  if (e == LeaseErrc::kBusy) {
    return (f.busy_key.empty() ? std::string("busy") : "busy: " + shown(f.busy_key) + " is held") +
           " (another owner holds it, " + seconds_text(f.ttl_left_ms) + " left on its lease)";
  }
  if (e == LeaseErrc::kTimeout) {
    return "not acquired: still held when the wait (" + seconds_text(wait.count()) + ") ran out";
  }
  if (e == LeaseErrc::kRecovering) {
    return "the server is recovering (its lock-delay after a start): it grants in " +
           seconds_text(f.retry_after_ms);
  }
  if (e == LeaseErrc::kNotOwner) return "not owner: the lease is held by another owner or token";
  if (e == LeaseErrc::kExpired) return "expired: the server no longer holds this lease";
  if (e == LeaseErrc::kGrantExpired) {
    return "granted, but the grant's ttl had run out by the time it arrived (wait >= ttl?)";
  }
  if (e == LeaseErrc::kCrossNode) {
    return "the keys are owned by different nodes; one acquire takes keys of one node";
  }
  if (e == LeaseErrc::kServerError) {
    if (f.wire_error == WireError::kTtlOutOfRange) {
      return "--ttl " + to_string(ttl) + " is above the server's maximum TTL" +
             (f.max_ttl_ms ? ", " + to_string(milliseconds(*f.max_ttl_ms)) : std::string()) +
             " (shardlockd --max-ttl)";
    }
    return "the server refused the request: " + std::string(to_string(f.wire_error));
  }
  return e.message();
}

// Prints `f` for `keys` (for people on stderr; with JSON also one object on
// stdout, or for run only that object, on stderr) and returns its exit
// status.
int report(const Output& out, const std::vector<std::string>& keys, const Failure& f,
           milliseconds ttl = {}, milliseconds wait = {}) {
  const bool silent = out.quiet && !f.auth_failed && is_conflict(f.error);
  // For people: on stderr always (with JSON too, unless the JSON goes there).
  if (!silent && (!out.json || !out.errors_to_stderr)) {
    std::fprintf(stderr, "shardlockctl: %s%s%s\n", shown_keys(keys).c_str(),
                 keys.empty() ? "" : ": ", failure_text(f, ttl, wait).c_str());
  }
  if (!out.json || (silent && out.errors_to_stderr)) return failure_status(f);
  Json j;
  if (!keys.empty()) put_keys(j, keys);
  j["error"] = failure_name(f);
  if (f.error == LeaseErrc::kServerError) j["wire_error"] = std::string(to_string(f.wire_error));
  if (f.error == LeaseErrc::kBusy) {
    if (!f.busy_key.empty()) put_key(j, "busy_key", f.busy_key);
    j["ttl_left_ms"] = f.ttl_left_ms;
  }
  if (f.error == LeaseErrc::kRecovering) j["retry_after_ms"] = f.retry_after_ms;
  if (f.max_ttl_ms) j["max_ttl_ms"] = *f.max_ttl_ms;
  if (f.error != LeaseErrc::kBusy) j["message"] = failure_text(f, ttl, wait);
  print_json(j, out.errors_to_stderr ? stderr : stdout);
  return failure_status(f);
}

bool is_loopback(const Endpoint& e) {
  if (e.address.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&e.address);
    return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
  }
  if (e.address.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&e.address);
    return IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
  }
  return false;
}

// What to say about a call that got no answer from `node`: replies that
// failed authentication, nothing listening there, or silence (and then
// what silence usually means).
void diagnose_silence(LeaseClient& client, const std::string& node, milliseconds timeout,
                      bool have_key, Failure& f) {
  const TransportCounters seen = client.transport_counters();
  if (seen.auth_mismatches > 0) {
    f.auth_failed = true;
    f.detail = std::to_string(seen.auth_mismatches) + " repl" +
               (seen.auth_mismatches == 1 ? "y" : "ies") + " from " + node +
               " failed authentication: " +
               (have_key ? "the server sends them unsealed (it has no --auth-key)"
                         : "the server seals them (it has an --auth-key; give this client the "
                           "same with --auth-key FILE)");
    return;
  }
  Endpoint endpoint;
  const PortProbe probe =
      parse_endpoint(node, endpoint) ? PortProbe::kUnknown : probe_port(endpoint, kProbeWait);
  const std::string waited = "no answer from " + node + " within " + seconds_text(timeout.count());
  switch (probe) {
    case PortProbe::kRefused:
      f.detail = waited +
                 ": nothing listens there (the host refused the port); is shardlockd "
                 "running, on that address?";
      return;
    case PortProbe::kSilent:
      // On this host nothing is in between: something holds the port.
      f.detail = waited +
                 (is_loopback(endpoint) ? ", yet something holds the port: "
                                        : ", and no refusal either: the host is down or a "
                                          "firewall drops UDP, or ") +
                 "a shardlockd there drops every request not sealed with its key, without "
                 "an answer: " +
                 (have_key ? "check that --auth-key names the server's key"
                           : "this client sends none (--auth-key FILE, or "
                             "SHARDLOCK_AUTH_KEY_FILE)");
      return;
    case PortProbe::kAnswered:
    case PortProbe::kUnknown:
      break;
  }
  f.detail = waited;
}

// The server's maximum TTL, learned by bisection with RENEWs of `key` under
// token 0 (which no lease has): a TTL above the limit is refused before the
// token is looked at, one within it is answered not-owner or expired. After
// an ACQUIRE was refused kTtlOutOfRange for `refused`; nullopt when the
// server stops answering like that.
std::optional<std::uint32_t> learn_max_ttl(LeaseClient& client, std::string_view key,
                                           milliseconds refused) {
  std::uint64_t low = 0;  // the highest TTL known to be accepted (0: none yet)
  auto high = static_cast<std::uint64_t>(refused.count());  // refused
  while (high - low > 1) {
    const std::uint64_t mid = low + (high - low) / 2;
    const CallResult r = client.renew(key, 0, milliseconds(mid));
    if (r.error == LeaseErrc::kServerError && r.wire_error == WireError::kTtlOutOfRange) {
      high = mid;
    } else if (r.error == LeaseErrc::kNotOwner || r.error == LeaseErrc::kExpired) {
      low = mid;
    } else {
      return std::nullopt;
    }
  }
  if (low == 0) return std::nullopt;
  return static_cast<std::uint32_t>(low);
}

// The failure of a call for `keys` that ended with `error`, diagnosed: an
// unanswered call's node probed, a TTL's limit learned.
Failure diagnosed(LeaseClient& client, const Globals& g, milliseconds timeout,
                  const std::vector<std::string>& keys, std::error_code error, WireError wire,
                  milliseconds ttl) {
  Failure f;
  f.error = error;
  f.wire_error = wire;
  if (error == LeaseErrc::kUnreachable) {
    const std::string node = keys.empty() ? std::string() : client.address_for(keys.front());
    diagnose_silence(client, node.empty() ? g.servers : node, timeout, !g.auth_key_file.empty(), f);
  }
  if (error == LeaseErrc::kServerError && wire == WireError::kTtlOutOfRange && !keys.empty() &&
      ttl.count() > 0) {
    f.max_ttl_ms = learn_max_ttl(client, keys.front(), ttl);
  }
  return f;
}

// How acquire and run take their keys.
struct KindArg {
  bool shared = false;
  std::uint32_t permits = 0;  // 0: not a semaphore
  std::string value;          // --value: the holder value (one key)
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
Acquired acquire_keys(LeaseClient& client, const std::vector<std::string>& keys,
                      const KindArg& kind, milliseconds ttl, milliseconds wait,
                      LeaseOptions options) {
  Acquired out;
  options.value = kind.value;
  if (keys.size() == 1) {
    AcquireResult r = kind.permits > 0 ? client.acquire_permit(keys[0], kind.permits, ttl, wait,
                                                               std::move(options))
                      : kind.shared ? client.acquire_shared(keys[0], ttl, wait, std::move(options))
                                    : client.acquire(keys[0], ttl, wait, std::move(options));
    out.error = r.error;
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

// Why `keys` were not acquired, diagnosed.
Failure acquire_failure(LeaseClient& client, const Globals& g, milliseconds timeout,
                        const std::vector<std::string>& keys, const Acquired& a, milliseconds ttl) {
  Failure f = diagnosed(client, g, timeout, keys, a.error, a.wire_error, ttl);
  f.busy_key = a.busy_key;
  f.ttl_left_ms = a.ttl_left_ms;
  f.retry_after_ms = a.retry_after_ms;
  return f;
}

// ------------------------------------------------------------------ waiting

// How long a wait goes on before it says, once, what it waits for (as
// flock -v does): a wait that ends sooner prints nothing.
constexpr milliseconds kNoticeAfter{1000};

// A duration in a line people read while they wait: to a tenth of a second.
std::string tenths_text(std::uint64_t ms) { return seconds_text((ms + 50) / 100 * 100); }

// What run, elect and acquire --wait wait for.
struct WaitTarget {
  std::vector<std::string> keys;
  milliseconds wait{0};   // kForever: until granted
  bool election = false;  // elect: the one key is the election's name
};

// The line a wait prints once it has lasted kNoticeAfter: what holds the
// acquire up (a holder and its time left, or the server's lock-delay and
// when it ends) and how long the wait goes on at most. It learns that from
// one WATCH per key that asks for the key's state at once: a WATCH takes
// nothing and moves no waiter, so the queued ACQUIRE keeps its place; and
// unlike QUERY it is answered RECOVERING during a lock-delay, with the time
// left. The WATCHes are asynchronous, so the caller's loop keeps taking
// signals while they are out.
class WaitNotice {
 public:
  WaitNotice(LeaseClient& client, WaitTarget target)
      : client_(client), target_(std::move(target)) {}

  // Called on every turn of the caller's waiting loop with how long it has
  // waited: sends the WATCHes at kNoticeAfter, prints once they are all
  // answered (each is, by the client's request timeout).
  void poll(milliseconds waited) {
    if (said_ || waited < kNoticeAfter) return;
    if (!answers_) {
      answers_ = std::make_shared<Answers>();
      answers_->events.resize(target_.keys.size());
      for (std::size_t i = 0; i < target_.keys.size(); ++i) {
        // The completion may run after this object is gone (the acquire
        // was granted first): it holds the answers, not `this`.
        client_.watch_async(target_.keys[i], KeyVersion{}, milliseconds{0},
                            [answers = answers_, i](const CallResult& r) {
                              std::lock_guard lock(answers->mutex);
                              answers->events[i] = watch_event(r);
                            });
      }
      return;
    }
    std::vector<WatchEvent> events;
    {
      std::lock_guard lock(answers_->mutex);
      for (const std::optional<WatchEvent>& e : answers_->events) {
        if (!e) return;
        events.push_back(*e);
      }
    }
    said_ = true;
    std::fprintf(stderr, "shardlockctl: %s\n", line(events).c_str());
    std::fflush(stderr);
  }

 private:
  struct Answers {
    std::mutex mutex;
    std::vector<std::optional<WatchEvent>> events;  // by key; empty until answered
  };

  // "up to 1m30s" or "until granted".
  [[nodiscard]] std::string how_long() const {
    if (target_.wait == kForever) return target_.election ? "until elected" : "until granted";
    return "up to " + seconds_text(static_cast<std::uint64_t>(target_.wait.count()));
  }
  [[nodiscard]] const char* verb() const { return target_.election ? "campaigning" : "waiting"; }

  // Who holds a key and how long its lease has left.
  [[nodiscard]] std::string holder_text(const WatchEvent& e) const {
    std::uint64_t longest = 0;
    std::uint64_t soonest = UINT64_MAX;
    for (const HolderInfo& h : e.holders) {
      const auto left = static_cast<std::uint64_t>(h.ttl_left.count());
      longest = std::max(longest, left);
      soonest = std::min(soonest, left);
    }
    if (e.holders.empty()) soonest = 0;
    if (e.mode == LeaseMode::kShared) {
      return "held shared by " + std::to_string(e.holder_count) + " owner" +
             (e.holder_count == 1 ? "" : "s") + ", " + tenths_text(longest) +
             " left on the longest lease";
    }
    if (e.mode == LeaseMode::kPermit) {
      return std::to_string(e.holder_count) + " of " + std::to_string(e.permits) +
             " permits held, the first to end has " + tenths_text(soonest) + " left";
    }
    // An exclusive holder is always listed, the newest last.
    if (e.holders.empty()) return "held by another owner";
    const HolderInfo& holder = e.holders.back();
    if (target_.election) {
      return "led by " +
             (holder.value.empty() ? std::string("another owner") : shown(holder.value)) +
             ", term " + std::to_string(holder.token) + ", " + tenths_text(longest) +
             " left on its lease";
    }
    return "held by another owner, " + tenths_text(longest) + " left on its lease";
  }

  [[nodiscard]] std::string line(const std::vector<WatchEvent>& events) const {
    const std::vector<std::string>& keys = target_.keys;
    const std::string what =
        target_.election ? "leadership of " + shown(keys.front()) : shown_keys(keys);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (events[i].error == LeaseErrc::kRecovering) {
        return "server " + client_.address_for(keys[i]) +
               " is recovering after a restart (its lock-delay): grants in " +
               tenths_text(events[i].retry_after_ms) + "; " + verb() + " for " + what + " " +
               how_long();
      }
    }
    // Several keys: the first that is held names the holder.
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const WatchEvent& e = events[i];
      if (e.error || !e.held()) continue;
      return std::string(verb()) + " for " + what + " (" +
             (keys.size() > 1 ? shown(keys[i]) + " is " : "") + holder_text(e) + "; " + verb() +
             " " + how_long() + ")";
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (!events[i].error) continue;
      return std::string(verb()) + " for " + what + " (the server " + client_.address_for(keys[i]) +
             " did not say what holds it up: " + error_name(events[i].error) + "; " + verb() + " " +
             how_long() + ")";
    }
    // Free, yet not granted: queued behind earlier waiters, or being granted now.
    std::uint32_t waiters = 0;
    for (const WatchEvent& e : events) waiters = std::max(waiters, e.waiters);
    return std::string(verb()) + " for " + what + " (not held, " + std::to_string(waiters) +
           " waiting; " + verb() + " " + how_long() + ")";
  }

  LeaseClient& client_;
  const WaitTarget target_;
  std::shared_ptr<Answers> answers_;  // null until the WATCHes are sent
  bool said_ = false;
};

// acquire_keys() on a thread of its own, waited for here: `pause` blocks
// for one turn of the loop (run takes its signals there). A wait that
// lasts kNoticeAfter prints what it waits for, once, unless `quiet`.
Acquired acquire_telling(LeaseClient& client, const std::vector<std::string>& keys,
                         const KindArg& kind, milliseconds ttl, milliseconds wait,
                         LeaseOptions options, bool quiet, bool election,
                         const std::function<void()>& pause) {
  Acquired acquired;
  std::atomic<bool> done{false};
  std::thread acquirer([&] {
    acquired = acquire_keys(client, keys, kind, ttl, wait, std::move(options));
    // Release pairs with the acquire loads below: `acquired` is written first.
    done.store(true, std::memory_order_release);
  });
  std::optional<WaitNotice> notice;
  if (!quiet && wait > kNoticeAfter) {
    notice.emplace(client, WaitTarget{keys, wait, election});
  }
  const auto start = std::chrono::steady_clock::now();
  while (!done.load(std::memory_order_acquire)) {
    pause();
    if (notice) {
      notice->poll(
          std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start));
    }
  }
  acquirer.join();
  return acquired;
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

// What run was asked to do.
struct RunArgs {
  std::vector<std::string> keys;
  KindArg kind;
  milliseconds ttl;
  milliseconds wait;  // kForever: until granted
  int conflict_status = kExitConflictDefault;
  std::string on_lost = "term";
  // --on-lost term: SIGKILL this long after the SIGTERM if the command is
  // still running (as timeout -k, consul lock); 0: never.
  milliseconds kill_after{0};
  std::vector<std::string> command;
  bool election = false;  // elect: the lease is leadership, its token the term
};

// Why a lease was lost, for "lease on 'KEY' lost: ...". `unconfirmed`: how
// long before the loss the last confirmed grant or renewal was sent.
std::string loss_text(const LeaseLost& lost, milliseconds unconfirmed, const std::string& node) {
  const std::error_code& reason = lost.reason;
  if (reason == LeaseErrc::kExpired && !lost.refused_by_server) {
    return "expired: no renewal confirmed for " +
           tenths_text(static_cast<std::uint64_t>(std::max<std::int64_t>(unconfirmed.count(), 0))) +
           " (its ttl): the server " + node + " did not answer in time";
  }
  if (reason == LeaseErrc::kNotOwner) {
    return "the server " + node +
           " refused its renewal: not owner (the lease was released or taken over; another owner "
           "may hold it now)";
  }
  if (reason == LeaseErrc::kExpired) {
    return "the server " + node +
           " refused its renewal: expired (it no longer holds this lease: it ran out there, or "
           "the key moved to another node)";
  }
  if (reason == LeaseErrc::kServerError) {
    return "the server " + node + " answered its renewal with ERROR";
  }
  return reason.message();
}

int run_command(LeaseClient& client, const Globals& g, milliseconds timeout, const Output& out,
                const RunArgs& args) {
  const std::vector<std::string>& keys = args.keys;
  const std::string& on_lost = args.on_lost;
  const std::vector<std::string>& command = args.command;
  const std::string& auth_key_file = g.auth_key_file;
  // Signals ctl handles itself: they are blocked in every thread (the client
  // threads inherit the mask, so they must be blocked before the client
  // starts; main() does that) and taken synchronously with sigtimedwait.
  sigset_t handled;
  sigemptyset(&handled);
  for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&handled, s);

  // The first loss, and when it was seen; written on the watchdog thread,
  // read below.
  struct Loss {
    std::mutex mutex;
    std::optional<LeaseLost> event;
    LeaseClock::time_point at;
  } loss;
  std::atomic<bool> lost{false};
  LeaseOptions options;
  options.watchdog = true;
  options.on_lost = [&lost, &loss](const LeaseLost& event) {
    {
      std::lock_guard lock(loss.mutex);
      if (!loss.event) {
        loss.event = event;
        loss.at = LeaseClock::now();
      }
    }
    // Relaxed is enough: the loss rides under loss.mutex, not on the flag.
    lost.store(true, std::memory_order_relaxed);
  };
  // The wait may be long (by default, until granted): it runs on its own
  // thread so that a signal can end it here. The queued ACQUIRE cannot be
  // taken back: should the server grant it after we left, the lease stands
  // until its TTL runs out, as a crashed holder's would.
  const auto take_signals = [&] {
    const timespec tick{0, 20'000'000};
    siginfo_t info{};
    const int sig = ::sigtimedwait(&handled, &info, &tick);
    if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) {
      std::fprintf(stderr, "shardlockctl: %s while waiting for %s; not acquired\n", strsignal(sig),
                   shown_keys(keys).c_str());
      std::fflush(stderr);
      std::_Exit(128 + sig);  // the acquirer is blocked in the client: no unwinding
    }
  };
  Acquired acquired = acquire_telling(client, keys, args.kind, args.ttl, args.wait,
                                      std::move(options), out.quiet, args.election, take_signals);
  if (acquired.error) {
    const Failure f = acquire_failure(client, g, timeout, keys, acquired, args.ttl);
    const int status = report(out, keys, f, args.ttl, args.wait);
    return is_conflict(f.error) ? args.conflict_status : status;
  }
  std::vector<Lease>& leases = acquired.leases;
  std::vector<std::string> tokens;
  tokens.reserve(leases.size());
  for (const Lease& lease : leases) tokens.push_back(std::to_string(lease.token()));

  // The child's environment: ours plus the lease.
  // Several keys: comma separated, in the order given.
  std::vector<std::string> extra = {
      "SHARDLOCK_KEY=" + joined(keys, ','),
      "SHARDLOCK_TOKEN=" + joined(tokens, ','),
      "SHARDLOCK_MODE=" + std::string(to_string(args.kind.mode())),
      "SHARDLOCK_OWNER=" + to_hex(leases.front().owner()),
      "SHARDLOCK_SERVER=" + g.servers,
  };
  // elect: the term, by the name etcd's and Consul's recipes use for it.
  if (args.election) extra.push_back("SHARDLOCK_TERM=" + tokens.front());
  // So the command's own shardlockctl calls reach an --auth-key server too.
  if (!auth_key_file.empty()) extra.push_back("SHARDLOCK_AUTH_KEY_FILE=" + auth_key_file);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "SHARDLOCK_KEY=", 14) == 0 ||
        std::strncmp(*e, "SHARDLOCK_TOKEN=", 16) == 0 ||
        std::strncmp(*e, "SHARDLOCK_MODE=", 15) == 0 ||
        std::strncmp(*e, "SHARDLOCK_OWNER=", 16) == 0 ||
        std::strncmp(*e, "SHARDLOCK_SERVER=", 17) == 0 ||
        std::strncmp(*e, "SHARDLOCK_TERM=", 15) == 0 ||
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
  // --kill-after: when the command, sent SIGTERM for a lost lease, gets
  // SIGKILL if it is still running; time_point::max(): none (a sentinel,
  // not an optional, which GCC 12 at -O1 calls maybe-uninitialized).
  constexpr auto kNoKill = std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point kill_at = kNoKill;
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
      LeaseLost event;
      LeaseClock::time_point lost_at;
      {
        std::lock_guard lock(loss.mutex);
        event = *loss.event;
        lost_at = loss.at;
      }
      milliseconds unconfirmed{0};
      for (const Lease& lease : leases) {
        if (lease.key() == event.key && lease.token() == event.token) {
          unconfirmed =
              std::chrono::duration_cast<milliseconds>(lost_at - lease.expiry()) + lease.ttl();
        }
      }
      const std::string action =
          on_lost == "ignore" ? std::string("not signalling the command (--on-lost ignore)")
          : on_lost == "kill" ? std::string("sending SIGKILL to the command")
          : args.kill_after.count() > 0
              ? "sending SIGTERM to the command, SIGKILL if it is still running in " +
                    seconds_text(static_cast<std::uint64_t>(args.kill_after.count())) +
                    " (--kill-after)"
              : std::string("sending SIGTERM to the command");
      std::fprintf(stderr, "shardlockctl: lease on '%s' lost: %s; %s\n", shown(event.key).c_str(),
                   loss_text(event, unconfirmed, client.address_for(event.key)).c_str(),
                   action.c_str());
      std::fflush(stderr);
      if (on_lost == "term") {
        ::kill(child, SIGTERM);
        if (args.kill_after.count() > 0) {
          kill_at = std::chrono::steady_clock::now() + args.kill_after;
        }
      }
      if (on_lost == "kill") ::kill(child, SIGKILL);
    }
    if (kill_at != kNoKill && std::chrono::steady_clock::now() >= kill_at) {
      kill_at = kNoKill;
      std::fprintf(stderr,
                   "shardlockctl: the command is still running %s after SIGTERM: sending "
                   "SIGKILL\n",
                   seconds_text(static_cast<std::uint64_t>(args.kill_after.count())).c_str());
      std::fflush(stderr);
      ::kill(child, SIGKILL);
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
      std::fprintf(stderr, "shardlockctl: release of '%s' failed: %s\n", shown(lease.key()).c_str(),
                   released.message().c_str());
    }
  }
  if (was_lost) return kExitLeaseLost;
  if (!status_known) return kExitError;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kExitError;
}

// ------------------------------------------------------------------ leader, observe

// A name's leader (or none) as a line for people and as JSON.
std::string leader_text(const std::string& name, const std::optional<LeaderInfo>& leader) {
  if (!leader) return shown(name) + " no leader\n";
  return shown(name) + " leader term=" + std::to_string(leader->term) +
         " owner=" + to_hex(leader->owner) + " ttl=" + seconds_text(leader->ttl_left.count()) +
         " value=" + shown(leader->value) + "\n";
}

Json leader_json(const std::string& name, const std::optional<LeaderInfo>& leader) {
  Json j;
  put_key(j, "name", name);
  if (!leader) {
    j["leader"] = nullptr;
    return j;
  }
  Json l;
  l["term"] = leader->term;
  l["owner"] = to_hex(leader->owner);
  l["ttl_ms"] = leader->ttl_left.count();
  put_key(l, "value", leader->value);
  j["leader"] = std::move(l);
  return j;
}

void print_leader(const Output& out, const std::string& name,
                  const std::optional<LeaderInfo>& leader) {
  if (out.json) {
    print_json(leader_json(name, leader));
  } else {
    std::printf("%s", leader_text(name, leader).c_str());
  }
  std::fflush(stdout);
}

// observe: one line per change of leader, the first for the leader now,
// until --count changes were shown (0: until interrupted).
int run_observe(LeaseClient& client, const Globals& g, milliseconds timeout, const Output& out,
                const std::string& name, std::uint64_t count) {
  LeaderObserver observer(client, name);
  std::uint64_t shown_changes = 0;
  std::error_code last_error;
  while (count == 0 || shown_changes < count) {
    std::error_code error;
    std::optional<LeaderChange> change = observer.next(std::chrono::seconds(1), &error);
    if (error) {
      // Said once per outage, on stderr; the watch keeps trying.
      if (error != last_error) {
        const std::vector<std::string> keys = {name};
        (void)report(Output{.json = false, .errors_to_stderr = true}, keys,
                     diagnosed(client, g, timeout, keys, error, WireError::kInternal, {}), {});
      }
      last_error = error;
      continue;
    }
    last_error.clear();
    if (!change) continue;
    print_leader(out, name, change->leader);
    ++shown_changes;
  }
  return kExitOk;
}

// ------------------------------------------------------------------ stats, ping

// The gauges of a STATS reply beside its counters, under their JSON names;
// from a server that predates them, version null and no others.
void put_gauges(Json& j, const ServerStatsReply& s) {
  const std::string version = s.version();
  j["version"] = version.empty() ? Json(nullptr) : Json(version);
  if (!s.has_gauges()) return;
  for (std::size_t i = kStatCounterCountWithoutGauges; i < kStatCounterCount; ++i) {
    const auto gauge = static_cast<StatCounter>(i);
    if (gauge != StatCounter::kVersion) j[std::string(to_string(gauge))] = s.counter(gauge);
  }
  j["recovering"] = s.counter(StatCounter::kLockDelayLeftMs) > 0;
}

// ping for people: "ADDR answered in 0.21ms: shardlockd 1.2.0, up 12.5s,
// granting" (or "recovering: grants in 41s").
std::string ping_text(const std::string& node, const ServerStatsReply& s) {
  char round_trip[32];
  std::snprintf(round_trip, sizeof round_trip, "%.2fms",
                static_cast<double>(s.round_trip.count()) / 1000.0);
  std::string text = node + " answered in " + round_trip;
  if (!s.has_gauges()) return text + " (a server too old to say its version or state)\n";
  const std::uint64_t delay = s.counter(StatCounter::kLockDelayLeftMs);
  return text + ": shardlockd " + s.version() + ", up " +
         seconds_text(s.counter(StatCounter::kUptimeMs)) + ", " +
         (delay > 0 ? "recovering: grants in " + seconds_text(delay) + " (its lock-delay)"
                    : std::string("granting")) +
         "\n";
}

// The column the values of stats' text start after: "  %-20s ".
constexpr std::size_t kNameWidth = 20;

// stats for people: the node and its shard count, then one "  name value"
// line per gauge and counter, then the shard tokens.
std::string stats_text(const std::string& node, const ServerStatsReply& s) {
  std::string text = node + " shards=" + std::to_string(s.shard_count) + "\n";
  // No fixed line buffer: shard_tokens is as long as the shards are many.
  const auto add = [&](std::string_view name, const std::string& value) {
    text += "  ";
    text += name;
    text.append(name.size() < kNameWidth ? kNameWidth - name.size() : 0, ' ');
    text += ' ';
    text += value;
    text += '\n';
  };
  if (s.has_gauges()) {
    add("version", s.version());
    add("uptime", seconds_text(s.counter(StatCounter::kUptimeMs)));
    add("lock_delay_left", seconds_text(s.counter(StatCounter::kLockDelayLeftMs)));
    for (const StatCounter gauge :
         {StatCounter::kLeases, StatCounter::kKeys, StatCounter::kWaiters}) {
      add(to_string(gauge), std::to_string(s.counter(gauge)));
    }
  }
  for (std::size_t i = 0; i < kStatCounterCountWithoutGauges; ++i) {
    add(to_string(static_cast<StatCounter>(i)), std::to_string(s.counters[i]));
  }
  std::string tokens;
  for (const std::uint64_t t : s.shard_tokens) {
    tokens += (tokens.empty() ? "" : " ") + std::to_string(t);
  }
  add("shard_tokens", tokens);
  return text;
}

// Why a call to `node` failed, diagnosed: on stderr for people, in `j` for
// JSON. Returns its exit status.
int node_failure(LeaseClient& client, const std::string& node, milliseconds timeout, bool have_key,
                 std::error_code error, const Output& out, Json& j) {
  Failure f;
  f.error = error;
  if (error == LeaseErrc::kUnreachable) diagnose_silence(client, node, timeout, have_key, f);
  j["error"] = failure_name(f);
  if (!f.detail.empty()) j["message"] = f.detail;
  if (!out.json) {
    std::fprintf(stderr, "shardlockctl: %s: %s\n", node.c_str(), failure_text(f, {}, {}).c_str());
  }
  return failure_status(f);
}

// stats or ping (`ping`) of every node in turn: one result each (JSON: one
// object, {"nodes": [...]}); the exit status is the worst node's.
int print_nodes(LeaseClient& client, const std::vector<std::string>& nodes, milliseconds timeout,
                bool have_key, const Output& out, bool ping) {
  Json results = Json::array();
  int worst = kExitOk;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    const std::string& node = nodes[n];
    const ServerStatsReply s = ping ? client.ping(n) : client.stats(n);
    Json j;
    j["server"] = node;
    if (s.error) {
      worst = std::max(worst, node_failure(client, node, timeout, have_key, s.error, out, j));
      results.push_back(std::move(j));
      continue;
    }
    if (ping) {
      j["round_trip_us"] = s.round_trip.count();
      put_gauges(j, s);
      if (!out.json) std::printf("%s", ping_text(node, s).c_str());
      results.push_back(std::move(j));
      continue;
    }
    j["shards"] = s.shard_count;
    if (s.shard_tokens.size() < s.shard_count) {
      // The server stopped paging early: what follows is a part, not the
      // whole, and must not read as the server's state.
      std::fprintf(stderr, "shardlockctl: %s: stats incomplete: %zu of %u shard tokens received\n",
                   node.c_str(), s.shard_tokens.size(), s.shard_count);
      j["error"] = "incomplete";
      worst = std::max(worst, kExitError);
    }
    put_gauges(j, s);
    Json counters;
    for (std::size_t i = 0; i < kStatCounterCountWithoutGauges; ++i) {
      counters[std::string(to_string(static_cast<StatCounter>(i)))] = s.counters[i];
    }
    j["counters"] = counters;
    j["shard_tokens"] = s.shard_tokens;
    if (!out.json) std::printf("%s", stats_text(node, s).c_str());
    results.push_back(std::move(j));
  }
  if (out.json) print_json(Json{{"nodes", results}});
  return worst;
}

// ------------------------------------------------------------------ top

// What top was asked to do.
struct TopArgs {
  DurationArg interval{"1s"};
  std::uint64_t count = 0;  // frames; 0: until interrupted
  bool once = false;        // --once: one frame
  std::size_t limit = 20;   // keys shown per node
};

// One node's last STATS, for its request rate over the interval.
struct RateSample {
  std::uint64_t requests = 0;
  std::uint64_t uptime_ms = 0;
};

// Requests per second from `since` to `now` (since the start when `since`
// is all zeros).
double request_rate(const RateSample& since, const RateSample& now) {
  if (now.uptime_ms <= since.uptime_ms || now.requests < since.requests) return 0.0;
  return static_cast<double>(now.requests - since.requests) * 1000.0 /
         static_cast<double>(now.uptime_ms - since.uptime_ms);
}

// A rate for people: 1234.5, 12.0, 0.
std::string rate_text(double rate) {
  char text[32];
  std::snprintf(text, sizeof text, rate == 0 ? "%.0f" : "%.1f", rate);
  return text;
}

// One frame of one node: its header line, then the busiest keys as a table.
std::string top_text(const std::string& node, const ServerStatsReply& s, double rate,
                     const HotKeysReply& hot, std::size_t limit) {
  std::string text = node + " shardlockd " + s.version() + " up " +
                     seconds_text(s.counter(StatCounter::kUptimeMs)) + ": " + rate_text(rate) +
                     " req/s, " + std::to_string(s.counter(StatCounter::kLeases)) + " leases, " +
                     std::to_string(s.counter(StatCounter::kKeys)) + " keys, " +
                     std::to_string(s.counter(StatCounter::kWaiters)) + " waiters" +
                     (s.counter(StatCounter::kLockDelayLeftMs) > 0 ? ", recovering" : "") + "\n";
  const std::size_t rows = std::min(limit, hot.keys.size());
  std::size_t width = 3;
  for (std::size_t i = 0; i < rows; ++i) {
    width = std::max(width, std::min<std::size_t>(shown(hot.keys[i].key).size(), 48));
  }
  char line[512];
  std::snprintf(line, sizeof line, "%-*s %10s %10s %8s %8s %8s %8s\n", static_cast<int>(width),
                "KEY", "REQ/S", "REQUESTS", "ERROR", "BUSY", "HOLDERS", "WAITERS");
  text += line;
  for (std::size_t i = 0; i < rows; ++i) {
    const HotKeyInfo& k = hot.keys[i];
    std::snprintf(line, sizeof line, "%-*s %10s %10u %8u %8u %8u %8u\n", static_cast<int>(width),
                  shown(k.key).c_str(), rate_text(hot.rate(k)).c_str(), k.requests, k.error, k.busy,
                  k.holders, k.waiters);
    text += line;
  }
  if (hot.keys.empty()) text += "(no key requested lately)\n";
  return text;
}

// top's JSON for one node: the gauges, the request rate and the keys.
void put_top(Json& j, const ServerStatsReply& s, double rate, bool since_start,
             const HotKeysReply& hot, std::size_t limit) {
  j["request_rate"] = rate;
  j["rate_since"] = since_start ? "start" : "last";
  put_gauges(j, s);
  j["window_ms"] = hot.window.count();
  j["hot_keys"] = Json::array();
  for (std::size_t i = 0; i < std::min(limit, hot.keys.size()); ++i) {
    const HotKeyInfo& k = hot.keys[i];
    Json item;
    put_key(item, "key", k.key);
    item["requests_per_second"] = hot.rate(k);
    item["requests"] = k.requests;
    item["error"] = k.error;
    item["busy"] = k.busy;
    item["holders"] = k.holders;
    item["waiters"] = k.waiters;
    j["hot_keys"].push_back(std::move(item));
  }
}

// The busiest keys of every node, refreshed every --interval, like top(1)
// (a terminal is cleared between frames) and redis-cli --hotkeys. Each
// node's request rate is over the interval (the first frame: since it
// started), from STATS' requests counter and uptime.
int run_top(LeaseClient& client, const std::vector<std::string>& nodes, milliseconds timeout,
            bool have_key, const Output& out, const TopArgs& args) {
  const std::uint64_t frames = args.once ? 1 : args.count;
  const bool clear = !out.json && ::isatty(STDOUT_FILENO) == 1;
  std::vector<std::optional<RateSample>> last(nodes.size());
  int worst = kExitOk;
  auto next = std::chrono::steady_clock::now();
  for (std::uint64_t frame = 0; frames == 0 || frame < frames; ++frame) {
    if (frame > 0) std::this_thread::sleep_until(next);
    next = std::chrono::steady_clock::now() + args.interval.value;
    std::string text = clear ? "\x1b[H\x1b[2J" : (frame > 0 ? "\n" : "");
    Json results = Json::array();
    for (std::size_t n = 0; n < nodes.size(); ++n) {
      Json j;
      j["server"] = nodes[n];
      const ServerStatsReply s = client.ping(n);
      const HotKeysReply hot = s.error ? HotKeysReply{} : client.hot_keys(n);
      if (const std::error_code error = s.error ? s.error : hot.error) {
        worst = std::max(worst, node_failure(client, nodes[n], timeout, have_key, error, out, j));
        results.push_back(std::move(j));
        last[n].reset();
        continue;
      }
      const RateSample now{s.counter(StatCounter::kRequests), s.counter(StatCounter::kUptimeMs)};
      const double rate = request_rate(last[n].value_or(RateSample{}), now);
      put_top(j, s, rate, !last[n].has_value(), hot, args.limit);
      last[n] = now;
      text += top_text(nodes[n], s, rate, hot, args.limit);
      results.push_back(std::move(j));
    }
    if (out.json) {
      print_json(Json{{"nodes", results}});
    } else {
      std::fputs(text.c_str(), stdout);
    }
    std::fflush(stdout);
  }
  return worst;
}

// ------------------------------------------------------------------ cluster

// The flags of members and drain.
struct ClusterArgs {
  std::string url;  // --cluster etcd://HOST:PORT[,HOST:PORT...]
  std::string name = "default";
  bool json = false;    // the output switch (-w json)
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
    Json out;
    out["cluster"] = name;
    out["epoch"] = table.epoch;
    out["members"] = table.live_members;
    out["map_members"] = table.map_members;
    out["bucket_count"] = table.bucket_count;
    out["nodes"] = Json::array();
    for (const MemberRow& r : table.rows) {
      Json node;
      node["id"] = r.id;
      node["address"] = r.address;
      node["weight"] = r.weight;
      node["state"] = r.state;
      node["buckets"] = r.buckets;
      node["handoff"] = r.handoff ? Json(*r.handoff) : Json(nullptr);
      node["drain"] = r.drain_requested;
      out["nodes"].push_back(std::move(node));
    }
    print_json(out);
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

// One line of drain's progress: `text` for people, or {"id":..} + `fields`.
void say(const ClusterArgs& args, const Json& fields, const std::string& text) {
  if (!args.json) {
    std::printf("%s %s\n", args.node_id.c_str(), text.c_str());
    return;
  }
  Json out;
  out["id"] = args.node_id;
  out.update(fields);
  print_json(out);
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
  say(args, {{"drain", args.cancel ? "cancelled" : "requested"}},
      args.cancel ? "drain cancelled" : "drain requested");
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
          say(args, {{"buckets", buckets}, {"epoch", epoch}},
              "owns " + std::to_string(buckets) + " buckets in epoch " + std::to_string(epoch));
          return kExitOk;
        }
        waiting_for = "owns 0 buckets";
      } else if (buckets > 0) {
        waiting_for = "still owns " + std::to_string(buckets) + " buckets";
      } else if (!is_member(view, args.node_id)) {
        say(args, {{"buckets", 0}, {"epoch", epoch}, {"gone", true}},
            "owns 0 buckets in epoch " + std::to_string(epoch) +
                "; it is gone (no member key), so it handed nothing off: its buckets' new "
                "owners grant once the lock-delay since it left has passed");
        return kExitOk;
      } else if (const std::uint64_t acked = handoff_epoch(view, args.node_id); acked >= epoch) {
        say(args, {{"buckets", 0}, {"epoch", epoch}, {"handoff", acked}},
            "owns 0 buckets in epoch " + std::to_string(epoch) +
                " and has handed them off (handoff " + std::to_string(acked) + ")");
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

// ------------------------------------------------------------------ main

constexpr const char* kGlobalGroup = "Global flags (before or after the subcommand)";

// Gives `app` (the top level or a subcommand) the global flags, bound to
// `g`: the last one given wins, wherever it stands. -w is the output
// switch, except where the subcommand takes -w itself (`short_w` false).
void add_global_flags(CLI::App& app, Globals& g, bool short_w) {
  app.add_option("--server", g.servers,
                 "HOST:PORT of the server(s), comma separated (env SHARDLOCK_SERVER; required "
                 "except for keygen, members and drain)")
      ->group(kGlobalGroup);
  app.add_option("--timeout", g.timeout,
                 "How long a request retransmits before 'unreachable' (members, drain: each etcd "
                 "call's deadline)")
      ->capture_default_str()
      ->group(kGlobalGroup);
  app.add_flag("--discover", g.discover,
               "The servers are seeds of a cluster (docs/cluster.md): ask them for the cluster's "
               "map and send each key to the node that owns it, following redirects. stats "
               "still asks the --server nodes")
      ->group(kGlobalGroup);
  app.add_option("--auth-key", g.auth_key_file,
                 "File with the key shared with the servers (see keygen; env "
                 "SHARDLOCK_AUTH_KEY_FILE); seals every request and accepts only sealed replies")
      ->group(kGlobalGroup);
  shardlock::tools::add_output_flags(app, g.output, short_w, kGlobalGroup);
}

// The value of a flag given on the command line, else of `env`.
void default_from_env(std::string& value, const char* env) {
  if (!value.empty()) return;
  if (const char* text = std::getenv(env); text != nullptr) value = text;
}

// Parses the command line. Like parse_command_line(), and: an unknown
// subcommand is named, and no arguments at all print the usage.
std::optional<int> parse(CLI::App& app, std::vector<char*>& args) {
  if (args.size() == 1) {
    std::cout << app.help();
    return kExitUsage;
  }
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    const std::vector<std::string> extra = app.remaining();
    if (app.get_subcommands().empty() && !extra.empty() && !extra.front().empty() &&
        extra.front().front() != '-') {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands({})) {
        names += (names.empty() ? "" : ", ") + sub->get_name();
      }
      return shardlock::tools::usage_error(
          kTool, "unknown command '" + extra.front() + "' (commands: " + names + ")");
    }
    return shardlock::tools::usage_error(kTool, e.what());
  }
  return std::nullopt;
}

int run(int argc, char** argv) {
  CLI::App app{
      "shardlockctl: take, renew, release and inspect shardlock leases; run a command under a "
      "lease, like flock(1).\nDurations: 500ms, 1.5s, 30 (seconds), 2m, 1m30s.",
      kTool};
  app.require_subcommand(1);
  shardlock::tools::add_version_flag(app, kTool);
  Globals g;
  add_global_flags(app, g, /*short_w=*/true);
  app.footer(
      "Output: for people by default; -w json (or --json) prints JSON for scripts, on every "
      "subcommand.\nExit codes: 0 ok; 1 busy/timeout/not owner/expired (drain: not a member, or "
      "--wait ran out); 2 usage (or keys of different nodes); 3 unreachable (no answer, or a name "
      "that does not resolve; members, drain: etcd); 4 recovering; 5 server error, incomplete "
      "stats or a local failure (e.g. stdout could not be written); 6 replies failed "
      "authentication. run: the command's status (5 if it cannot be learned), -E's (69) when "
      "the lease was not acquired, or 75 when a lease was lost.");

  std::string key;
  std::vector<std::string> keys;  // acquire and run
  KindArg kind;
  DurationArg ttl;
  DurationArg wait;
  // -w in acquire and run: a duration (--wait, as flock's -w), or json/text
  // (the output switch everywhere else).
  std::string short_w;
  bool nonblock = false;
  int conflict_status = kExitConflictDefault;
  bool quiet = false;            // -q: acquire, run, elect
  DurationArg kill_after{"5s"};  // run, elect
  std::string owner_hex;
  std::uint64_t token = 0;
  // acquire and run take their keys the same way.
  const auto add_kind_flags = [&](CLI::App* sub) {
    sub->add_option("-w", short_w,
                    "DUR: same as --wait (as flock's -w); json or text: same as --write-out");
    sub->add_flag("-s,--shared", kind.shared,
                  "Shared (read) lease: held alongside other shared leases, never with an "
                  "exclusive one");
    sub->add_option("--permits", kind.permits,
                    "One of at most P leases on the key (a semaphore); the first holder's P holds "
                    "while the key is in use. One key only; not with --shared")
        ->check(CLI::Range(1u, static_cast<unsigned>(kMaxPermits)));
    sub->add_option("--value", kind.value,
                    "V: a value the lease carries, shown by query with its holder (the "
                    "holder's address, a host name and pid); at most 256 bytes, one key only");
  };

  auto* acquire = app.add_subcommand(
      "acquire",
      "Take a lease and leave it held; prints KEY token=T ttl=.. owner=.. mode=.. per key (JSON: "
      "{key, token, ttl_ms, owner, mode}, or for several keys {leases: [{key, token}...], "
      "ttl_ms, owner, mode}). Several keys (up to 16, of one node) are taken all or nothing");
  acquire->add_option("key", keys, "The key(s)")->required();
  acquire->add_option("--ttl", ttl.text, "Lease duration, e.g. 30s")->required();
  acquire->add_option("--wait", wait.text,
                      "Wait up to this long for the holder(s) to let go (default 0: answer busy "
                      "at once)");
  add_kind_flags(acquire);
  acquire->add_option(
      "--owner", owner_hex,
      "Act as this owner (32 hex digits): the lease is held by exactly this "
      "owner, as renew and release --owner name it; default: a fresh owner of its own");
  acquire->add_flag("-q,--quiet", quiet,
                    "No line on stderr while waiting (after 1s a --wait prints what holds the key "
                    "and how long it waits at most), nor when busy, recovering or the wait ran "
                    "out: the exit status says it (JSON still prints its result)");
  add_global_flags(*acquire, g, /*short_w=*/false);

  auto* renew = app.add_subcommand("renew", "Extend a lease you hold");
  renew->add_option("key", key, "The key")->required();
  renew->add_option("--token", token, "The lease's token")->required();
  renew->add_option("--owner", owner_hex, "The owner printed by acquire")->required();
  renew->add_option("--ttl", ttl.text, "New duration, e.g. 30s")->required();
  add_global_flags(*renew, g, /*short_w=*/true);

  auto* release = app.add_subcommand("release", "Give a lease back");
  release->add_option("key", key, "The key")->required();
  release->add_option("--token", token, "The lease's token")->required();
  release->add_option("--owner", owner_hex, "The owner printed by acquire")->required();
  add_global_flags(*release, g, /*short_w=*/true);

  auto* query = app.add_subcommand(
      "query",
      "Who holds the key: each holder (owner id, token, mode, time left), oldest grant first, "
      "and how many wait; with the summary (held, mode: exclusive, shared or permit, holders, "
      "the permit limit, the newest token, the longest ttl left)");
  query->add_option("key", key, "The key")->required();
  add_global_flags(*query, g, /*short_w=*/true);

  auto* keygen = app.add_subcommand(
      "keygen", "Print a new random auth key (64 hex digits) for shardlockd --auth-key");
  add_global_flags(*keygen, g, /*short_w=*/true);
  auto* stats = app.add_subcommand(
      "stats",
      "Each server's version, uptime, lock-delay left, leases held, keys in use and waiters, its "
      "counters, and every shard's token");
  add_global_flags(*stats, g, /*short_w=*/true);
  TopArgs top_args;
  auto* top = app.add_subcommand(
      "top",
      "A live view of each server's busiest keys by requests (its bounded sketch of them), with "
      "their requests per second, BUSY answers, holders and waiters, under a line with the "
      "server's request rate, leases, keys and waiters; refreshed every --interval, like top(1) "
      "and redis-cli --hotkeys. Ctrl-C ends it. Alias: hot");
  top->alias("hot");
  top->add_option("--interval", top_args.interval.text, "Time between refreshes")
      ->capture_default_str();
  top->add_option("--count", top_args.count, "Stop after this many refreshes (0: never)")
      ->capture_default_str();
  top->add_flag("--once", top_args.once, "One refresh, then exit (as --count 1)");
  top->add_option("--limit", top_args.limit, "Keys shown per server")
      ->check(CLI::Range(1, 255))
      ->capture_default_str();
  add_global_flags(*top, g, /*short_w=*/true);
  auto* ping = app.add_subcommand(
      "ping",
      "Ask each server how it is: the round trip, its version and uptime, and whether it is "
      "recovering (in its lock-delay after a start, ACQUIRE answered RECOVERING) and for how "
      "long yet");
  add_global_flags(*ping, g, /*short_w=*/true);

  RunArgs run_args;
  auto* run = app.add_subcommand(
      "run",
      "Hold a lease (or several keys' leases, all or nothing) while COMMAND runs, like flock: "
      "waits for it unless -n or -w; the command sees SHARDLOCK_KEY, SHARDLOCK_TOKEN (comma "
      "separated for several keys, in the order given), SHARDLOCK_MODE, SHARDLOCK_OWNER and "
      "SHARDLOCK_SERVER. Not acquired: nothing on stdout, the reason on stderr (unless -q), "
      "exit -E's status");
  run->add_option("key", keys, "The key(s), then -- COMMAND ARGS...")->required();
  run->add_option("--ttl", ttl.text, "Lease duration; renewed every ttl/3 while the command runs")
      ->default_str("30s");
  run->add_option("--wait", wait.text,
                  "Wait at most this long for the holder(s) to let go (default: until granted; a "
                  "wait beyond the server's --max-wait queues again until it is spent)");
  run->add_flag("-n,--nonblock", nonblock,
                "Do not wait: fail at once if a key is held or the server is in its lock-delay");
  run->add_option("-E,--conflict-exit-code", conflict_status,
                  "Exit status when the lease is not acquired: busy, the server recovering (its "
                  "lock-delay after a restart), or the wait ran out. -n -E 0 -q: skip quietly")
      ->check(CLI::Range(0, 255))
      ->capture_default_str();
  run->add_flag("-q,--quiet", quiet,
                "Say nothing on stderr about waiting (after 1s of waiting a line says what holds "
                "the lease up and how long it waits at most) or about not acquiring it (busy, "
                "recovering, the wait ran out): the exit status says it, as with flock -n");
  add_kind_flags(run);
  run->add_option("--on-lost", run_args.on_lost,
                  "What to do to the command if a lease is lost: term (SIGTERM, then SIGKILL "
                  "after --kill-after), kill (SIGKILL) or ignore")
      ->check(CLI::IsMember({"term", "kill", "ignore"}))
      ->capture_default_str();
  run->add_option("--kill-after", kill_after.text,
                  "With --on-lost term: SIGKILL the command if it is still running this long "
                  "after the SIGTERM, so it cannot work on past another holder's grant (as "
                  "timeout -k); 0: never")
      ->capture_default_str();
  add_global_flags(*run, g, /*short_w=*/false);
  run->footer(
      "The command follows --: shardlockctl run KEY... [-w 10s | -n] -- COMMAND ARGS...\n"
      "A wait of over 1s prints one line on stderr saying what it waits for (a holder and its "
      "time left, or the server's lock-delay) and how long at most, unless -q.\n"
      "A lease lost while the command runs (it expired unrenewed, or the server refused its "
      "renewal; the message says which): SIGTERM to the command, SIGKILL after --kill-after "
      "(--on-lost), and exit 75.");

  auto* elect = app.add_subcommand(
      "elect",
      "Run COMMAND while leader of NAME (leader election, as etcdctl elect and consul lock): "
      "waits, FIFO behind earlier campaigners, until elected (unless -n or -w), then holds the "
      "leadership lease with --value while the command runs; the command sees SHARDLOCK_TERM "
      "(the leadership's term, a fencing token) besides run's variables. Lost leadership: "
      "--on-lost's signal to the command, and exit 75. Not elected: exit -E's status");
  elect->add_option("name", keys, "The election's name, then -- COMMAND ARGS...")
      ->required()
      ->expected(1);
  elect->add_option("--value", kind.value,
                    "V: what others see as the leader (leader, observe): an address, a host name "
                    "and pid; at most 256 bytes");
  elect
      ->add_option("--ttl", ttl.text,
                   "Leadership lease; renewed every ttl/3. A leader that dies silently keeps "
                   "the others waiting this long")
      ->default_str("10s");
  elect->add_option("-w", short_w, "DUR: same as --wait; json or text: same as --write-out");
  elect->add_option("--wait", wait.text, "Campaign at most this long (default: until elected)");
  elect->add_flag("-n,--nonblock", nonblock,
                  "Do not wait: fail at once if another leads or the server is in its lock-delay");
  elect
      ->add_option("-E,--conflict-exit-code", conflict_status,
                   "Exit status when not elected: another leads, the server is recovering (its "
                   "lock-delay after a restart), or the wait ran out")
      ->check(CLI::Range(0, 255))
      ->capture_default_str();
  elect->add_flag("-q,--quiet", quiet,
                  "Say nothing on stderr about campaigning (after 1s a line says who leads and "
                  "how long it waits at most) or about not being elected: the exit status says it");
  elect
      ->add_option("--on-lost", run_args.on_lost,
                   "What to do to the command if leadership is lost: term (SIGTERM, then SIGKILL "
                   "after --kill-after), kill (SIGKILL) or ignore")
      ->check(CLI::IsMember({"term", "kill", "ignore"}))
      ->capture_default_str();
  elect
      ->add_option("--kill-after", kill_after.text,
                   "With --on-lost term: SIGKILL the command if it is still running this long "
                   "after the SIGTERM, so it cannot act on past the next leader's election; 0: "
                   "never")
      ->capture_default_str();
  add_global_flags(*elect, g, /*short_w=*/false);
  elect->footer(
      "shardlockctl elect NAME --value HOST:PORT -- COMMAND ARGS...\n"
      "Lost leadership (the message says why): SIGTERM to the command, SIGKILL after "
      "--kill-after (--on-lost), and exit 75.");

  auto* leader = app.add_subcommand(
      "leader",
      "The leader of election NAME: its term, owner, time left and value; or 'no leader' "
      "(JSON: {name, leader: {term, owner, ttl_ms, value} or null})");
  leader->add_option("name", key, "The election's name")->required();
  add_global_flags(*leader, g, /*short_w=*/true);

  std::uint64_t observe_count = 0;
  auto* observe = app.add_subcommand(
      "observe",
      "Follow election NAME: one line per change of leader (as leader prints it), the first for "
      "the leader now, in term order, without polling (a watch). Ctrl-C ends it");
  observe->add_option("name", key, "The election's name")->required();
  observe->add_option("--count", observe_count, "Stop after this many lines (0: never)")
      ->capture_default_str();
  add_global_flags(*observe, g, /*short_w=*/true);

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
  add_global_flags(*members, g, /*short_w=*/true);
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
  add_global_flags(*drain, g, /*short_w=*/true);

  // run's keys and its command are both positional, so CLI11 would hand
  // the command's words to the keys: everything after run's first "--" is
  // the command, and CLI11 sees only what comes before.
  std::vector<char*> args(argv, argv + argc);
  std::vector<std::string>& command = run_args.command;
  bool run_named = false;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    if (arg == "run" || arg == "elect") run_named = true;
    if (run_named && arg == "--") {
      for (std::size_t j = i + 1; j < args.size(); ++j) command.emplace_back(args[j]);
      args.resize(i);
      break;
    }
  }

  if (const auto status = parse(app, args)) return *status;
  if (!short_w.empty()) {
    if (short_w == "json" || short_w == "text") {
      g.output.write_out = short_w;
    } else if (!wait.text.empty()) {
      return shardlock::tools::usage_error(kTool, "give the wait once: -w or --wait");
    } else {
      wait.text = short_w;
    }
  }
  default_from_env(g.servers, "SHARDLOCK_SERVER");
  default_from_env(g.auth_key_file, "SHARDLOCK_AUTH_KEY_FILE");
  Output out;
  out.json = g.output.json();
  out.errors_to_stderr = run->parsed() || elect->parsed();
  out.quiet = quiet;
  DurationArg timeout{g.timeout};
  if (members->parsed() || drain->parsed()) {
    if (!parse_arg(timeout, "--timeout", ZeroDuration::kRejected) ||
        !parse_arg(cluster_args.wait, "--wait", ZeroDuration::kAllowed)) {
      return kExitUsage;
    }
    cluster_args.json = out.json;
    return run_cluster(cluster_args, members->parsed(), timeout.value);
  }
  if (keygen->parsed()) {
    const std::string generated =
        shardlock::lease::format_auth_key(shardlock::lease::generate_auth_key());
    if (out.json) {
      print_json(Json{{"auth_key", generated}});
    } else {
      std::printf("%s\n", generated.c_str());
    }
    return kExitOk;
  }
  if (g.servers.empty()) {
    return shardlock::tools::usage_error(kTool, "--server (or SHARDLOCK_SERVER) is required");
  }
  if (run->parsed() && ttl.text.empty()) ttl.text = "30s";
  if (elect->parsed() && ttl.text.empty()) ttl.text = "10s";
  if (!parse_arg(timeout, "--timeout", ZeroDuration::kRejected) ||
      !parse_arg(ttl, "--ttl", ZeroDuration::kRejected) ||
      !parse_arg(wait, "--wait", ZeroDuration::kAllowed) ||
      !parse_arg(kill_after, "--kill-after", ZeroDuration::kAllowed)) {
    return kExitUsage;
  }
  if (nonblock && !wait.text.empty()) {
    return shardlock::tools::usage_error(kTool,
                                         "-n (do not wait) and -w/--wait exclude each other");
  }
  // run waits until granted unless told otherwise; acquire answers at once.
  if ((run->parsed() || elect->parsed()) && !nonblock && wait.text.empty()) wait.value = kForever;

  LeaseClientOptions options;
  options.nodes = split_node_list(g.servers);
  options.discover_cluster = g.discover;
  options.request_timeout = timeout.value;
  // acquire --owner: the lease's owner (each acquire is otherwise a fresh
  // owner of its own); renew, release --owner: the raw calls' owner.
  LeaseOptions acquire_options;
  if (!owner_hex.empty()) {
    const auto id = parse_client_id(owner_hex);
    if (!id) {
      return shardlock::tools::usage_error(kTool,
                                           "--owner wants 32 hex digits, got '" + owner_hex + "'");
    }
    options.client_id = *id;
    acquire_options.owner = *id;
  }
  const auto auth = shardlock::tools::load_auth_key_flag(g.auth_key_file);
  if (!auth.error.empty()) return shardlock::tools::usage_error(kTool, auth.error);
  options.auth_key = auth.key;
  if (acquire->parsed() || run->parsed() || elect->parsed()) {
    if (kind.shared && kind.permits > 0) {
      return shardlock::tools::usage_error(
          kTool, "--shared and --permits exclude each other: a key is a lock or a semaphore");
    }
    if (kind.permits > 0 && keys.size() > 1) {
      return shardlock::tools::usage_error(kTool, "--permits takes one key");
    }
    if (!kind.value.empty() && keys.size() > 1) {
      return shardlock::tools::usage_error(kTool, "--value takes one key");
    }
    if (kind.value.size() > kMaxHolderValueLength) {
      return shardlock::tools::usage_error(
          kTool, "--value is at most " + std::to_string(kMaxHolderValueLength) + " bytes");
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
    if (elect->parsed() && command.empty()) {
      return shardlock::tools::usage_error(kTool, "elect: give the command after --");
    }
  } else if (!command.empty()) {
    return shardlock::tools::usage_error(kTool, "only run and elect take -- COMMAND");
  }
  std::vector<std::string> checked_keys = keys;
  if (!stats->parsed() && !ping->parsed() && !top->parsed() && keys.empty()) {
    checked_keys.push_back(key);
  }
  for (const std::string& k : checked_keys) {
    if (k.size() < kMinKeyLength || k.size() > kMaxKeyLength) {
      return shardlock::tools::usage_error(
          kTool, "keys are 1.." + std::to_string(kMaxKeyLength) + " bytes");
    }
  }
  if (run->parsed() || elect->parsed()) {
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
    if (ec == LeaseErrc::kBadAddress) {
      // A host name that does not resolve is no usage error: DNS may be down.
      for (const std::string& node : options.nodes) {
        Endpoint endpoint;
        if (parse_endpoint(node, endpoint) == LeaseErrc::kUnreachable) return kExitUnreachable;
      }
      return kExitUsage;
    }
    // --discover: no seed answered with the cluster's map.
    return ec == LeaseErrc::kUnreachable ? kExitUnreachable : kExitError;
  }

  if (acquire->parsed()) {
    Acquired a =
        !quiet && wait.value > kNoticeAfter
            ? acquire_telling(client, keys, kind, ttl.value, wait.value, std::move(acquire_options),
                              quiet, /*election=*/false,
                              [] { std::this_thread::sleep_for(milliseconds(20)); })
            : acquire_keys(client, keys, kind, ttl.value, wait.value, std::move(acquire_options));
    if (a.error) {
      return report(out, keys, acquire_failure(client, g, timeout.value, keys, a, ttl.value),
                    ttl.value, wait.value);
    }
    const Lease& first = a.leases.front();
    if (!out.json) {
      std::string common = " ttl=" + seconds_text(first.ttl().count()) +
                           " owner=" + to_hex(first.owner()) +
                           " mode=" + std::string(to_string(first.mode()));
      if (first.mode() == LeaseMode::kPermit)
        common += " permits=" + std::to_string(first.permits());
      for (const Lease& lease : a.leases) {
        std::printf("%s token=%" PRIu64 "%s\n", shown(lease.key()).c_str(), lease.token(),
                    common.c_str());
      }
    } else {
      Json j;
      if (keys.size() == 1) {
        put_key(j, "key", keys[0]);
        j["token"] = first.token();
      } else {
        j["leases"] = Json::array();
        for (const Lease& lease : a.leases) {
          Json item;
          put_key(item, "key", lease.key());
          item["token"] = lease.token();
          j["leases"].push_back(std::move(item));
        }
      }
      j["ttl_ms"] = first.ttl().count();
      j["owner"] = to_hex(first.owner());
      j["mode"] = std::string(to_string(first.mode()));
      if (first.mode() == LeaseMode::kPermit) j["permits"] = first.permits();
      print_json(j);
    }
    // The leases outlive this process: let go of the handles, not the leases.
    for (Lease& lease : a.leases) lease.detach();
    return kExitOk;
  }
  const std::vector<std::string> one_key = {key};
  if (query->parsed()) {
    const HoldersReply r = client.holders(key);
    if (r.error) {
      return report(out, one_key,
                    diagnosed(client, g, timeout.value, one_key, r.error, r.wire_error, ttl.value),
                    ttl.value);
    }
    if (!r.listed) {
      std::fprintf(stderr,
                   "shardlockctl: %s: the server does not list holders (it predates "
                   "QUERY_HOLDERS): its summary only\n",
                   shown(key).c_str());
    }
    if (out.json) {
      print_json(holders_json(key, r));
    } else {
      std::printf("%s", holders_text(key, r).c_str());
    }
    return kExitOk;
  }
  if (renew->parsed() || release->parsed()) {
    const CallResult r =
        renew->parsed() ? client.renew(key, token, ttl.value) : client.release(key, token);
    if (r.error) {
      return report(out, one_key,
                    diagnosed(client, g, timeout.value, one_key, r.error, r.wire_error, ttl.value),
                    ttl.value);
    }
    Json j;
    put_key(j, "key", key);
    std::string text = shown(key);
    if (renew->parsed()) {
      j["token"] = token;
      j["ttl_ms"] = r.ttl_ms;
      j["renewed"] = true;
      text += " token=" + std::to_string(token) + " renewed ttl=" + seconds_text(r.ttl_ms);
    } else {
      j["token"] = token;
      j["released"] = true;
      text += " token=" + std::to_string(token) + " released";
    }
    if (out.json) {
      print_json(j);
    } else {
      std::printf("%s\n", text.c_str());
    }
    return kExitOk;
  }
  if (top->parsed()) {
    if (!parse_arg(top_args.interval, "--interval", ZeroDuration::kRejected)) return kExitUsage;
    return run_top(client, options.nodes, timeout.value, options.auth_key.has_value(), out,
                   top_args);
  }
  if (stats->parsed() || ping->parsed()) {
    return print_nodes(client, options.nodes, timeout.value, options.auth_key.has_value(), out,
                       ping->parsed());
  }
  if (leader->parsed()) {
    const HoldersReply r = client.holders(key);
    if (r.error) {
      return report(out, one_key,
                    diagnosed(client, g, timeout.value, one_key, r.error, r.wire_error, ttl.value),
                    ttl.value);
    }
    print_leader(out, key, leader_of(r.mode, r.holders));
    return kExitOk;
  }
  if (observe->parsed()) {
    return run_observe(client, g, timeout.value, out, key, observe_count);
  }
  if (run->parsed() || elect->parsed()) {
    run_args.election = elect->parsed();
    run_args.keys = keys;
    run_args.kind = kind;
    run_args.ttl = ttl.value;
    run_args.wait = wait.value;
    run_args.conflict_status = conflict_status;
    run_args.kill_after = kill_after.value;
    return run_command(client, g, timeout.value, out, run_args);
  }
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  return shardlock::tools::run_main(kTool, kExitError, run, argc, argv);
}
