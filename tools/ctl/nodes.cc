// shardlockctl stats and ping: each server's counters and state, one
// after another; nodes.h shares their pieces with top.
#include "ctl/nodes.h"

#include "ctl/commands.h"
#include "ctl/diagnosis.h"

namespace shardlock::ctl {

using namespace lease;

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

namespace {

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

int stats_or_ping(Session& session, bool ping) {
  if (const auto status = check_servers_and_timeout(session)) return *status;
  StartedClient started = start_client(session, ClientRequest{});
  if (!started.client) return started.status;
  return print_nodes(*started.client, started.nodes, session.timeout.value, started.have_key,
                     session.out, ping);
}

}  // namespace

void add_stats_command(CLI::App& app, Session& session) {
  CLI::App* sub = app.add_subcommand(
      "stats",
      "Each server's version, uptime, lock-delay left, leases held, keys in use and waiters, its "
      "counters, and every shard's token");
  on_parsed(*sub, session, /*short_w=*/true,
            [&session] { return stats_or_ping(session, /*ping=*/false); });
}

void add_ping_command(CLI::App& app, Session& session) {
  CLI::App* sub = app.add_subcommand(
      "ping",
      "Ask each server how it is: the round trip, its version and uptime, and whether it is "
      "recovering (in its lock-delay after a start, ACQUIRE answered RECOVERING) and for how "
      "long yet");
  on_parsed(*sub, session, /*short_w=*/true,
            [&session] { return stats_or_ping(session, /*ping=*/true); });
}

}  // namespace shardlock::ctl
