// shardlockctl top (alias hot) [--interval DUR] [--count N | --once]
// [--limit N]: a live view of the busiest keys, as redis-cli --hotkeys.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

#include "ctl/commands.h"
#include "ctl/nodes.h"

namespace shardlock::ctl {

using namespace lease;

namespace {

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
  // The key column is padded to `width` but never cut: a key shown wider (up
  // to 4 x kMaxKeyLength, every byte \xNN) pushes its counts right instead
  // of losing them. Only the counts go through a fixed buffer.
  const auto key_column = [&](std::string_view shown_key) {
    text += shown_key;
    if (shown_key.size() < width) text.append(width - shown_key.size(), ' ');
  };
  char counts[160];
  key_column("KEY");
  std::snprintf(counts, sizeof counts, " %10s %10s %8s %8s %8s %8s\n", "REQ/S", "REQUESTS", "ERROR",
                "BUSY", "HOLDERS", "WAITERS");
  text += counts;
  for (std::size_t i = 0; i < rows; ++i) {
    const HotKeyInfo& k = hot.keys[i];
    key_column(shown(k.key));
    std::snprintf(counts, sizeof counts, " %10s %10u %8u %8u %8u %8u\n",
                  rate_text(hot.rate(k)).c_str(), k.requests, k.error, k.busy, k.holders,
                  k.waiters);
    text += counts;
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

int top(Session& session, TopArgs& args) {
  if (const auto status = check_servers_and_timeout(session)) return *status;
  StartedClient started = start_client(session, ClientRequest{});
  if (!started.client) return started.status;
  if (!parse_arg(args.interval, "--interval", ZeroDuration::kRejected)) return kExitUsage;
  return run_top(*started.client, started.nodes, session.timeout.value, started.have_key,
                 session.out, args);
}

}  // namespace

void add_top_command(CLI::App& app, Session& session) {
  auto args = std::make_shared<TopArgs>();
  CLI::App* sub = app.add_subcommand(
      "top",
      "A live view of each server's busiest keys by requests (its bounded sketch of them), with "
      "their requests per second, BUSY answers, holders and waiters, under a line with the "
      "server's request rate, leases, keys and waiters; refreshed every --interval, like top(1) "
      "and redis-cli --hotkeys. Ctrl-C ends it. Alias: hot");
  sub->alias("hot");
  sub->add_option("--interval", args->interval.text, "Time between refreshes")
      ->capture_default_str();
  sub->add_option("--count", args->count, "Stop after this many refreshes (0: never)")
      ->capture_default_str();
  sub->add_flag("--once", args->once, "One refresh, then exit (as --count 1)");
  sub->add_option("--limit", args->limit, "Keys shown per server")
      ->check(CLI::Range(1, 255))
      ->capture_default_str();
  on_parsed(*sub, session, /*short_w=*/true, [&session, args] { return top(session, *args); });
}

}  // namespace shardlock::ctl
