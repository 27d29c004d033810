// shardlockctl over a real shardlockd: JSON output (--json) and exit codes of
// every subcommand, the output for people, the CLI's conventions (global
// flags anywhere, --version, unknown commands named, errors that name their
// cause), and `run` - it waits like flock, the command sees its lease, the
// lease is released when it exits, and a lost lease signals it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "poll_until.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/wire/envelope.h"
#include "shardlock/lease/wire/protocol.h"
#include "support/daemon.h"
#include "tools/client_tool_support.h"

namespace shardlock::lease {
namespace {

using namespace std::chrono_literals;
using testing::ChildProcess;
using testing::Json;
using testing::json_line;
using testing::run_tool;
using testing::ToolResult;

const std::string kCtl = SHARDLOCK_TOOL_SHARDLOCKCTL;
const std::string kDaemon = SHARDLOCK_TOOL_SHARDLOCKD;

// A shardlockd on 127.0.0.1:0; address() is empty if it did not come up.
// An empty `lock_delay` leaves it to the server (none for a fresh data dir,
// --max-ttl after a restart).
class Daemon {
 public:
  explicit Daemon(const std::string& lock_delay = "0", const std::vector<std::string>& extra = {},
                  const std::string& shards = "8") {
    const std::vector<std::string> argv = with_extra(
        lock_delay.empty()
            ? std::vector<std::string>{kDaemon, "--listen", "127.0.0.1:0", "--shards", shards}
            : std::vector<std::string>{kDaemon, "--listen", "127.0.0.1:0", "--shards", shards,
                                       "--lock-delay", lock_delay},
        extra);
    ::shardlock::test_support::ChildOptions wiring;
    wiring.capture_stderr = true;
    std::string why;
    address_ = ::shardlock::test_support::start_daemon(process_, argv, wiring, 20s, why);
    EXPECT_FALSE(address_.empty()) << why;
  }
  const std::string& address() const { return address_; }
  void kill9() { process_.signal(SIGKILL); }

  static std::vector<std::string> with_extra(std::vector<std::string> args,
                                             const std::vector<std::string>& extra) {
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

 private:
  ChildProcess process_;
  std::string address_;
};

// shardlockctl --server <d> --json ARGS: the output for scripts.
ToolResult ctl(const Daemon& d, std::vector<std::string> args,
               std::chrono::milliseconds timeout = 30s) {
  args.insert(args.begin(), {"--server", d.address(), "--json"});
  return run_tool(kCtl, args, timeout);
}

// shardlockctl --server <d> ARGS: the output for people.
ToolResult ctl_text(const Daemon& d, std::vector<std::string> args,
                    std::chrono::milliseconds timeout = 30s) {
  args.insert(args.begin(), {"--server", d.address()});
  return run_tool(kCtl, args, timeout);
}

// A UDP socket bound to 127.0.0.1:0 and its address; -1 on failure.
int loopback_udp_socket(sockaddr_in& address) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

Json parsed(const ToolResult& r) {
  const auto j = json_line(r);
  EXPECT_TRUE(j) << "not one JSON line: '" << r.out << "' stderr: " << r.err;
  return j ? *j : Json{};
}

TEST(ShardlockctlTest, AcquireRenewReleaseQueryStatsPrintJsonWithExitCodes) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());

  const ToolResult acquired = ctl(d, {"acquire", "deploy/prod", "--ttl", "30s"});
  ASSERT_EQ(acquired.exit_code, 0) << acquired.err;
  const Json grant = parsed(acquired);
  EXPECT_EQ(grant["key"].text, "deploy/prod");
  EXPECT_GT(grant["token"].number, 0);
  EXPECT_EQ(grant["ttl_ms"].number, 30000);
  const std::string owner = grant["owner"].text;
  EXPECT_TRUE(std::regex_match(owner, std::regex("[0-9a-f]{32}"))) << owner;
  const std::string token = std::to_string(static_cast<std::uint64_t>(grant["token"].number));

  // Another owner is refused, like flock -n.
  const ToolResult busy = ctl(d, {"acquire", "deploy/prod", "--ttl", "30s"});
  EXPECT_EQ(busy.exit_code, 1);
  EXPECT_EQ(parsed(busy)["error"].text, "busy");
  EXPECT_GT(parsed(busy)["ttl_left_ms"].number, 0);
  // A bounded wait that runs out is a timeout, also 1.
  const ToolResult waited = ctl(d, {"acquire", "deploy/prod", "--ttl", "30s", "--wait", "200ms"});
  EXPECT_EQ(waited.exit_code, 1);
  EXPECT_EQ(parsed(waited)["error"].text, "timeout");
  // The same owner acquiring again (--owner: exactly that owner, a new
  // request) is a contender like any other, never a new grant that would
  // replace the first: busy, and the first grant stands
  // (docs/lease-server.md, "One owner, one grant").
  const ToolResult again = ctl(d, {"acquire", "deploy/prod", "--ttl", "30s", "--owner", owner});
  EXPECT_EQ(again.exit_code, 1) << again.out;
  EXPECT_EQ(parsed(again)["error"].text, "busy");
  const std::string& token_text = token;
  // --owner is the lease's owner as given, not one derived from it.
  const std::string chosen(32, 'c');
  const ToolResult as_chosen =
      ctl(d, {"acquire", "deploy/chosen", "--ttl", "30s", "--owner", chosen});
  EXPECT_EQ(as_chosen.exit_code, 0) << as_chosen.err;
  EXPECT_EQ(parsed(as_chosen)["owner"].text, chosen);
  const std::string chosen_token =
      std::to_string(static_cast<std::uint64_t>(parsed(as_chosen)["token"].number));
  EXPECT_EQ(
      ctl(d, {"release", "deploy/chosen", "--token", chosen_token, "--owner", chosen}).exit_code,
      0);

  const ToolResult query = ctl(d, {"query", "deploy/prod"});
  EXPECT_EQ(query.exit_code, 0);
  const Json q = parsed(query);
  EXPECT_TRUE(q["held"].boolean);
  EXPECT_EQ(q["token"].number, grant["token"].number);
  EXPECT_GT(q["ttl_left_ms"].number, 0);
  EXPECT_TRUE(q.has("waiters"));

  const ToolResult renewed =
      ctl(d, {"renew", "deploy/prod", "--token", token_text, "--owner", owner, "--ttl", "10s"});
  EXPECT_EQ(renewed.exit_code, 0) << renewed.out;
  EXPECT_TRUE(parsed(renewed)["renewed"].boolean);
  EXPECT_EQ(parsed(renewed)["ttl_ms"].number, 10000);

  const std::string stranger(32, 'a');
  const ToolResult not_owner =
      ctl(d, {"renew", "deploy/prod", "--token", token_text, "--owner", stranger, "--ttl", "10s"});
  EXPECT_EQ(not_owner.exit_code, 1);
  EXPECT_EQ(parsed(not_owner)["error"].text, "not_owner");

  const ToolResult released =
      ctl(d, {"release", "deploy/prod", "--token", token_text, "--owner", owner});
  EXPECT_EQ(released.exit_code, 0) << released.out;
  EXPECT_TRUE(parsed(released)["released"].boolean);
  const ToolResult twice =
      ctl(d, {"release", "deploy/prod", "--token", token_text, "--owner", owner});
  EXPECT_EQ(twice.exit_code, 1);
  EXPECT_EQ(parsed(twice)["error"].text, "expired");
  EXPECT_FALSE(parsed(ctl(d, {"query", "deploy/prod"}))["held"].boolean);

  const ToolResult stats = ctl(d, {"stats"});
  EXPECT_EQ(stats.exit_code, 0);
  const Json s = parsed(stats);
  ASSERT_EQ(s["nodes"].items.size(), 1u);
  const Json& node = s["nodes"].items[0];
  EXPECT_EQ(node["server"].text, d.address());
  EXPECT_EQ(node["shards"].number, 8);
  EXPECT_EQ(node["shard_tokens"].items.size(), 8u);
  EXPECT_GE(node["counters"]["grants"].number, 1);
  EXPECT_GE(node["counters"]["busy"].number, 1);
  EXPECT_GE(node["counters"]["released"].number, 1);
  // The gauges beside the counters: both leases were released, so nothing
  // is held now.
  EXPECT_TRUE(std::regex_match(node["version"].text, std::regex(R"(\d+\.\d+\.\d+)")))
      << node["version"].text;
  EXPECT_EQ(node["leases"].number, 0);
  EXPECT_EQ(node["keys"].number, 0);
  EXPECT_EQ(node["waiters"].number, 0);
  EXPECT_GT(node["uptime_ms"].number, 0);
  EXPECT_EQ(node["lock_delay_left_ms"].number, 0);
  EXPECT_FALSE(node["recovering"].boolean);
  EXPECT_FALSE(node["counters"].has("leases"));  // a gauge is no counter
}

// ping: the round trip, version, uptime and whether the server recovers;
// stats: leases, keys and waiters held now.
TEST(ShardlockctlTest, PingSaysHowTheServerIs) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  const ToolResult pinged = ctl(d, {"ping"});
  ASSERT_EQ(pinged.exit_code, 0) << pinged.err;
  const Json node = parsed(pinged)["nodes"].items.at(0);
  EXPECT_EQ(node["server"].text, d.address());
  EXPECT_GT(node["round_trip_us"].number, 0);
  EXPECT_TRUE(std::regex_match(node["version"].text, std::regex(R"(\d+\.\d+\.\d+)")));
  EXPECT_FALSE(node["recovering"].boolean);
  EXPECT_EQ(node["lock_delay_left_ms"].number, 0);
  const ToolResult text = ctl_text(d, {"ping"});
  EXPECT_EQ(text.exit_code, 0);
  EXPECT_TRUE(std::regex_match(
      text.out, std::regex(d.address() + R"( answered in [0-9.]+ms: shardlockd \d+\.\d+\.\d+, )"
                                         R"(up [0-9.]+s, granting\n)")))
      << text.out;

  ASSERT_EQ(ctl(d, {"acquire", "p/a", "p/b", "--ttl", "30s"}).exit_code, 0);
  ASSERT_EQ(ctl(d, {"acquire", "p/s", "--ttl", "30s", "-s"}).exit_code, 0);
  ASSERT_EQ(ctl(d, {"acquire", "p/s", "--ttl", "30s", "-s"}).exit_code, 0);
  const Json stats = parsed(ctl(d, {"stats"}))["nodes"].items.at(0);
  EXPECT_EQ(stats["leases"].number, 4);
  EXPECT_EQ(stats["keys"].number, 3);
  EXPECT_EQ(stats["waiters"].number, 0);
  const ToolResult stats_text = ctl_text(d, {"stats"});
  EXPECT_NE(stats_text.out.find("\n  leases               4\n"), std::string::npos)
      << stats_text.out;
  EXPECT_NE(stats_text.out.find("\n  version              "), std::string::npos);
  EXPECT_NE(stats_text.out.find("\n  uptime               "), std::string::npos);

  // Every one of 64 shard tokens is printed, and the next node's header
  // begins its own line (a fixed line buffer once cut both off).
  Daemon wide("0", {}, "64");
  ASSERT_FALSE(wide.address().empty());
  const ToolResult both = run_tool(kCtl, {"--server", wide.address() + "," + d.address(), "stats"});
  ASSERT_EQ(both.exit_code, 0) << both.err;
  std::smatch tokens;
  ASSERT_TRUE(std::regex_search(both.out, tokens, std::regex("\n  shard_tokens +([0-9 ]*)\n")))
      << both.out;
  std::istringstream words(tokens[1].str());
  std::size_t count = 0;
  for (std::string word; words >> word;) ++count;
  EXPECT_EQ(count, 64u) << both.out;
  EXPECT_NE(both.out.find("\n" + d.address() + " shards=8\n"), std::string::npos) << both.out;

  // In its lock-delay: answered, recovering, and how long yet.
  Daemon recovering("1m");
  ASSERT_FALSE(recovering.address().empty());
  const ToolResult r = ctl(recovering, {"ping"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const Json rn = parsed(r)["nodes"].items.at(0);
  EXPECT_TRUE(rn["recovering"].boolean);
  EXPECT_GT(rn["lock_delay_left_ms"].number, 50000);
  EXPECT_NE(ctl_text(recovering, {"ping"}).out.find("recovering: grants in "), std::string::npos);

  const ToolResult unreachable =
      run_tool(kCtl, {"--server", "127.0.0.1:9", "--timeout", "300ms", "ping", "--json"});
  EXPECT_EQ(unreachable.exit_code, 3);
  EXPECT_EQ(parsed(unreachable)["nodes"].items.at(0)["error"].text, "unreachable");
}

TEST(ShardlockctlTest, UsageUnreachableAndRecoveringExitCodes) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  EXPECT_EQ(ctl(d, {}).exit_code, 2);                                 // no subcommand
  EXPECT_EQ(ctl(d, {"acquire", "k"}).exit_code, 2);                   // --ttl missing
  EXPECT_EQ(ctl(d, {"acquire", "k", "--ttl", "soon"}).exit_code, 2);  // bad duration
  EXPECT_EQ(ctl(d, {"acquire", "k", "--ttl", "1s", "--owner", "xyz"}).exit_code, 2);
  EXPECT_EQ(ctl(d, {"acquire", std::string(300, 'k'), "--ttl", "1s"}).exit_code, 2);
  EXPECT_EQ(ctl(d, {"run", "k", "--ttl", "1s", "--on-lost", "shrug", "--", "true"}).exit_code, 2);
  EXPECT_EQ(run_tool(kCtl, {"acquire", "k", "--ttl", "1s"}).exit_code, 2);  // no --server
  for (const char* sub : {"acquire", "renew", "release", "query", "stats", "ping", "top", "run"}) {
    const ToolResult help = run_tool(kCtl, {sub, "--help"});
    EXPECT_EQ(help.exit_code, 0) << sub;
    EXPECT_NE(help.out.find("--help"), std::string::npos) << sub;
  }

  const ToolResult unreachable = run_tool(kCtl, {"--server", "127.0.0.1:9", "--timeout", "300ms",
                                                 "acquire", "k", "--ttl", "1s", "--json"});
  EXPECT_EQ(unreachable.exit_code, 3);
  EXPECT_EQ(parsed(unreachable)["error"].text, "unreachable");

  Daemon recovering("1m");
  ASSERT_FALSE(recovering.address().empty());
  const ToolResult r = ctl(recovering, {"acquire", "k", "--ttl", "1s"});
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_EQ(parsed(r)["error"].text, "recovering");
  EXPECT_GT(parsed(r)["retry_after_ms"].number, 0);
}

// --discover: the --server addresses are cluster seeds. A single shardlockd
// is no cluster node and gives no map: exit 3, as for a server that does
// not answer, with the seed named on stderr.
TEST(ShardlockctlTest, DiscoverNeedsAClusterNodeAmongTheSeeds) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  const ToolResult r = ctl(d, {"--discover", "--timeout", "300ms", "query", "k"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find(d.address()), std::string::npos) << r.err;
  EXPECT_EQ(
      run_tool(kCtl, {"--server", "127.0.0.1:9", "--discover", "--timeout", "300ms", "query", "k"})
          .exit_code,
      3);
  EXPECT_NE(run_tool(kCtl, {"--help"}).out.find("--discover"), std::string::npos);
}

TEST(ShardlockctlTest, KeygenAndAuthenticatedDaemon) {
  const ToolResult keygen = run_tool(kCtl, {"keygen"});
  ASSERT_EQ(keygen.exit_code, 0) << keygen.err;
  static const std::regex kKey("^[0-9a-f]{64}\n$");
  EXPECT_TRUE(std::regex_match(keygen.out, kKey)) << keygen.out;
  EXPECT_NE(run_tool(kCtl, {"keygen"}).out, keygen.out);

  const std::string key_file =
      ::testing::TempDir() + "shardlockctl_test_" + std::to_string(::getpid()) + ".key";
  std::ofstream(key_file) << keygen.out;
  const std::string bad_file = key_file + ".bad";
  std::ofstream(bad_file) << "xyz\n";

  // A bad key file is a usage error that names the file.
  const ToolResult bad_daemon =
      run_tool(kDaemon, {"--listen", "127.0.0.1:0", "--auth-key", bad_file});
  EXPECT_EQ(bad_daemon.exit_code, 2);
  EXPECT_NE(bad_daemon.err.find(bad_file), std::string::npos) << bad_daemon.err;

  Daemon d("0", {"--auth-key", key_file});
  ASSERT_FALSE(d.address().empty());
  const ToolResult with_key = ctl(d, {"--auth-key", key_file, "acquire", "k", "--ttl", "10s"});
  EXPECT_EQ(with_key.exit_code, 0) << with_key.err;
  EXPECT_GT(parsed(with_key)["token"].number, 0);

  const ToolResult without_key = ctl(d, {"--timeout", "300ms", "acquire", "k2", "--ttl", "1s"});
  EXPECT_EQ(without_key.exit_code, 3);
  EXPECT_EQ(ctl(d, {"--auth-key", bad_file, "query", "k"}).exit_code, 2);

  // run hands the key file to the command, whose own shardlockctl call then
  // reaches the server.
  const ToolResult run =
      ctl(d, {"--auth-key", key_file, "run", "job", "--ttl", "10s", "--", "/bin/sh", "-c",
              "test \"$SHARDLOCK_AUTH_KEY_FILE\" = '" + key_file + "' && \"$0\" --json query job",
              kCtl});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("\"held\":true"), std::string::npos) << run.out;

  const ToolResult stats = ctl(d, {"--auth-key", key_file, "stats"});
  ASSERT_EQ(stats.exit_code, 0) << stats.err;
  const Json counters = parsed(stats)["nodes"].items.at(0)["counters"];
  EXPECT_GE(counters["auth_failures"].number, 1);
  EXPECT_EQ(counters["grants"].number, 2);
  std::remove(key_file.c_str());
  std::remove(bad_file.c_str());
}

// --tenant and --encrypt (or SHARDLOCK_TENANT, SHARDLOCK_ENCRYPT) against a
// daemon with --tenants: the tenant's requests within its prefix are served,
// outside it refused with the cause named; bad values are usage errors.
TEST(ShardlockctlTest, TenantFlagsReachADaemonWithTenants) {
  const std::string base =
      ::testing::TempDir() + "shardlockctl_tenant_" + std::to_string(::getpid());
  const ToolResult keygen = run_tool(kCtl, {"keygen"});
  ASSERT_EQ(keygen.exit_code, 0) << keygen.err;
  const std::string key_file = base + ".key";
  std::ofstream(key_file) << keygen.out;
  const std::string tenants = base + ".tenants";
  std::ofstream(tenants) << "tenant jobs id=7 key-file=" << key_file
                         << " encrypt=yes\nallow jobs \"jobs/\" acquire,query\n";
  Daemon d("0", {"--tenants", tenants});
  ASSERT_FALSE(d.address().empty());
  const ToolResult granted = ctl(d, {"--auth-key", key_file, "--tenant", "7", "--encrypt",
                                     "acquire", "jobs/a", "--ttl", "10s"});
  EXPECT_EQ(granted.exit_code, 0) << granted.err;
  const ToolResult outside = ctl(d, {"--auth-key", key_file, "--tenant", "7", "--encrypt",
                                     "acquire", "other/a", "--ttl", "10s"});
  EXPECT_NE(outside.exit_code, 0);
  EXPECT_NE(outside.err.find("permission denied"), std::string::npos) << outside.err;
  // Unencrypted, a tenant with encrypt=yes is not answered.
  EXPECT_EQ(ctl(d, {"--timeout", "300ms", "--auth-key", key_file, "--tenant", "7", "acquire",
                    "jobs/b", "--ttl", "1s"})
                .exit_code,
            3);
  EXPECT_EQ(ctl(d, {"--auth-key", key_file, "--tenant", "seven", "query", "jobs/a"}).exit_code, 2);
  EXPECT_EQ(ctl(d, {"--auth-key", key_file, "--encrypt", "query", "jobs/a"}).exit_code, 2);
  EXPECT_EQ(ctl(d, {"--tenant", "7", "query", "jobs/a"}).exit_code, 2);
  // Each cipher suite this host has reaches the tenant, by flag or by
  // SHARDLOCK_CIPHER; a bad suite, or AES-GCM without a tenant, is a usage
  // error.
  std::vector<std::string> ciphers = {"portable", "auto"};
  if (lease::aes_gcm_available()) ciphers.emplace_back("aes");
  for (const std::string& cipher : ciphers) {
    SCOPED_TRACE(cipher);
    const ToolResult queried = ctl(d, {"--auth-key", key_file, "--tenant", "7", "--encrypt",
                                       "--cipher", cipher, "query", "jobs/a"});
    EXPECT_EQ(queried.exit_code, 0) << queried.err;
    const ToolResult by_env = run_tool(kCtl,
                                       {"--server", d.address(), "--auth-key", key_file, "--tenant",
                                        "7", "--encrypt", "query", "jobs/a"},
                                       30s, {"SHARDLOCK_CIPHER=" + cipher});
    EXPECT_EQ(by_env.exit_code, 0) << by_env.err;
  }
  EXPECT_EQ(ctl(d, {"--auth-key", key_file, "--tenant", "7", "--cipher", "gcm", "query", "jobs/a"})
                .exit_code,
            2);
  EXPECT_EQ(ctl(d, {"--auth-key", key_file, "--cipher", "aes", "query", "jobs/a"}).exit_code, 2);
  std::remove(key_file.c_str());
  std::remove(tenants.c_str());
}

TEST(ShardlockctlTest, RunGivesTheCommandItsLeaseAndReleasesOnExit) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  // The child checks, from inside, that the lease it was given is held.
  const std::string script =
      "echo \"$SHARDLOCK_KEY $SHARDLOCK_TOKEN\"; \"" + kCtl +
      "\" --server \"$SHARDLOCK_SERVER\" query --json \"$SHARDLOCK_KEY\"; exit 7";
  const ToolResult r = ctl(d, {"run", "cron/backup", "--ttl", "5s", "--", "/bin/sh", "-c", script});
  EXPECT_EQ(r.exit_code, 7) << r.err;  // the command's own status
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(cron/backup (\d+)\n(\{.*\}))"))) << r.out;
  const auto inside = testing::JsonParser::parse(m[2].str());
  ASSERT_TRUE(inside);
  EXPECT_TRUE((*inside)["held"].boolean);
  EXPECT_EQ(std::to_string(static_cast<std::uint64_t>((*inside)["token"].number)), m[1].str());
  // Released when the command exited: free at once, not after the TTL.
  EXPECT_FALSE(parsed(ctl(d, {"query", "cron/backup"}))["held"].boolean);

  // A held key with -n: run does not start the command and exits -E's
  // status (69 by default), with nothing on stdout.
  ASSERT_EQ(ctl(d, {"acquire", "cron/busy", "--ttl", "30s"}).exit_code, 0);
  const ToolResult busy =
      ctl_text(d, {"run", "cron/busy", "-n", "--ttl", "5s", "--", "/bin/sh", "-c", "echo ran"});
  EXPECT_EQ(busy.exit_code, 69);
  EXPECT_EQ(busy.out, "");
  EXPECT_NE(busy.err.find("cron/busy: busy"), std::string::npos) << busy.err;

  EXPECT_EQ(ctl(d, {"run", "cron/missing", "--ttl", "5s", "--", "/no/such/command"}).exit_code,
            127);
  EXPECT_FALSE(parsed(ctl(d, {"query", "cron/missing"}))["held"].boolean);
  EXPECT_EQ(ctl(d, {"run", "cron/signalled", "--ttl", "5s", "--", "/bin/sh", "-c", "kill -9 $$"})
                .exit_code,
            137);
}

// SIGTERM to shardlockctl reaches the command; the lease is released once
// the command has exited, and its status comes back.
TEST(ShardlockctlTest, RunForwardsTerminationToTheCommandAndReleases) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  const std::string script =
      "trap 'echo got-term; exit 9' TERM; echo started; i=0; while [ $i -lt 200 ]; do sleep 0.05; "
      "i=$((i+1)); done";
  ChildProcess run(kCtl, {"--server", d.address(), "run", "forward/key", "--ttl", "30s", "--",
                          "/bin/sh", "-c", script});
  ASSERT_EQ(run.read_line(20s), "started");
  EXPECT_TRUE(parsed(ctl(d, {"query", "forward/key"}))["held"].boolean);
  run.signal(SIGTERM);
  const ToolResult r = run.finish(30s);
  EXPECT_EQ(r.exit_code, 9) << r.err;
  EXPECT_NE(r.out.find("got-term"), std::string::npos) << r.out;
  EXPECT_FALSE(parsed(ctl(d, {"query", "forward/key"}))["held"].boolean);
}

// The lease is lost (the server dies, so renewals go unanswered until the
// client-side expiry); run signals the command as --on-lost says and exits 75.
TEST(ShardlockctlTest, RunSignalsTheCommandWhenTheLeaseIsLost) {
  struct Case {
    const char* on_lost;
    int expected_output_found;  // the TERM trap's output
  };
  for (const Case c : {Case{"term", 1}, Case{"kill", 0}, Case{"ignore", 0}}) {
    SCOPED_TRACE(c.on_lost);
    Daemon d;
    ASSERT_FALSE(d.address().empty());
    // Loops for at most ~3 s on its own; prints when SIGTERM arrives.
    const std::string script =
        "trap 'echo got-term; exit 0' TERM; echo started; i=0; while [ $i -lt 60 ]; do sleep 0.05; "
        "i=$((i+1)); done; "
        "echo finished";
    ChildProcess run(kCtl, {"--server", d.address(), "run", "lost/key", "--ttl", "600ms",
                            "--on-lost", c.on_lost, "--", "/bin/sh", "-c", script});
    ASSERT_EQ(run.read_line(20s), "started");
    d.kill9();
    const ToolResult r = run.finish(30s);
    EXPECT_EQ(r.exit_code, 75) << r.err;
    EXPECT_EQ(r.out.find("got-term") != std::string::npos, c.expected_output_found == 1) << r.out;
    EXPECT_NE(r.err.find("lost"), std::string::npos) << r.err;
    // Why: the renewals went unanswered until the client-side expiry.
    EXPECT_NE(r.err.find("expired: no renewal confirmed for"), std::string::npos) << r.err;
    if (std::string(c.on_lost) == "ignore") {
      EXPECT_NE(r.out.find("finished"), std::string::npos) << r.out;
    }
  }
}

// Shared and permit leases, and several keys in one acquire (all or
// nothing), with the kind and holders visible in query.
TEST(ShardlockctlTest, AcquireSharedPermitsAndSeveralKeys) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());

  const ToolResult reader = ctl(d, {"acquire", "doc", "--ttl", "30s", "--shared"});
  ASSERT_EQ(reader.exit_code, 0) << reader.out << reader.err;
  const Json first = parsed(reader);
  EXPECT_EQ(first["mode"].text, "shared");
  EXPECT_GT(first["token"].number, 0);
  const ToolResult second_reader = ctl(d, {"acquire", "doc", "--ttl", "30s", "--shared"});
  ASSERT_EQ(second_reader.exit_code, 0) << second_reader.out;
  EXPECT_NE(parsed(second_reader)["token"].number, first["token"].number);
  const ToolResult writer = ctl(d, {"acquire", "doc", "--ttl", "30s"});
  EXPECT_EQ(writer.exit_code, 1);
  EXPECT_EQ(parsed(writer)["error"].text, "busy");
  const Json shared_query = parsed(ctl(d, {"query", "doc"}));
  EXPECT_TRUE(shared_query["held"].boolean);
  EXPECT_EQ(shared_query["mode"].text, "shared");
  EXPECT_EQ(shared_query["holders"].number, 2);
  EXPECT_EQ(shared_query["permits"].number, 0);
  EXPECT_EQ(shared_query["waiters"].number, 0);

  for (int i = 0; i < 2; ++i) {
    const ToolResult permit = ctl(d, {"acquire", "pool", "--ttl", "30s", "--permits", "2"});
    ASSERT_EQ(permit.exit_code, 0) << permit.out;
    EXPECT_EQ(parsed(permit)["mode"].text, "permit");
    EXPECT_EQ(parsed(permit)["permits"].number, 2);
  }
  EXPECT_EQ(ctl(d, {"acquire", "pool", "--ttl", "30s", "--permits", "2"}).exit_code, 1);
  const ToolResult other_limit = ctl(d, {"acquire", "pool", "--ttl", "30s", "--permits", "3"});
  EXPECT_EQ(other_limit.exit_code, 5);
  EXPECT_EQ(parsed(other_limit)["error"].text, "server_error");
  EXPECT_TRUE(parsed(other_limit).has("wire_error"));
  const Json pool = parsed(ctl(d, {"query", "pool"}));
  EXPECT_EQ(pool["mode"].text, "permit");
  EXPECT_EQ(pool["holders"].number, 2);
  EXPECT_EQ(pool["permits"].number, 2);

  // Several keys: one token each, in the order given.
  const ToolResult many = ctl(d, {"acquire", "m/c", "m/a", "m/b", "--ttl", "30s"});
  ASSERT_EQ(many.exit_code, 0) << many.out << many.err;
  const Json granted = parsed(many);
  EXPECT_EQ(granted["mode"].text, "exclusive");
  EXPECT_EQ(granted["ttl_ms"].number, 30000);
  ASSERT_EQ(granted["leases"].items.size(), 3u);
  const std::vector<std::string> order = {"m/c", "m/a", "m/b"};
  for (std::size_t i = 0; i < order.size(); ++i) {
    const Json& lease = granted["leases"].items[i];
    EXPECT_EQ(lease["key"].text, order[i]);
    EXPECT_GT(lease["token"].number, 0);
    // Each key's own token (tokens count per shard, so keys may share one).
    const Json q = parsed(ctl(d, {"query", order[i]}));
    EXPECT_TRUE(q["held"].boolean) << order[i];
    EXPECT_EQ(q["token"].number, lease["token"].number) << order[i];
  }

  // All or nothing: one held key refuses the lot, and names it.
  const ToolResult refused = ctl(d, {"acquire", "m/d", "m/a", "--ttl", "30s"});
  EXPECT_EQ(refused.exit_code, 1);
  const Json busy = parsed(refused);
  EXPECT_EQ(busy["error"].text, "busy");
  EXPECT_EQ(busy["busy_key"].text, "m/a");
  ASSERT_EQ(busy["keys"].items.size(), 2u);
  EXPECT_GT(busy["ttl_left_ms"].number, 0);
  EXPECT_FALSE(parsed(ctl(d, {"query", "m/d"}))["held"].boolean);

  // Several keys shared, by two owners at once.
  EXPECT_EQ(ctl(d, {"acquire", "r/1", "r/2", "--ttl", "30s", "--shared"}).exit_code, 0);
  const ToolResult readers = ctl(d, {"acquire", "r/1", "r/2", "--ttl", "30s", "--shared"});
  EXPECT_EQ(readers.exit_code, 0) << readers.out;
  EXPECT_EQ(parsed(readers)["mode"].text, "shared");
  EXPECT_EQ(parsed(ctl(d, {"query", "r/2"}))["holders"].number, 2);
}

TEST(ShardlockctlTest, LeaseKindFlagsAreCheckedBeforeAnythingIsSent) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  const auto usage = [&](std::vector<std::string> args) {
    const ToolResult r = ctl(d, std::move(args));
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_FALSE(r.err.empty());
    return r.err;
  };
  EXPECT_NE(usage({"acquire", "k", "--ttl", "1s", "--shared", "--permits", "2"}).find("--permits"),
            std::string::npos);
  EXPECT_NE(usage({"acquire", "a", "b", "--ttl", "1s", "--permits", "2"}).find("one key"),
            std::string::npos);
  EXPECT_NE(usage({"acquire", "a", "b", "a", "--ttl", "1s"}).find("once"), std::string::npos);
  std::vector<std::string> seventeen = {"acquire", "--ttl", "1s"};
  for (int i = 0; i < 17; ++i) seventeen.push_back("k" + std::to_string(i));
  EXPECT_NE(usage(seventeen).find("16"), std::string::npos);
  usage({"acquire", "k", "--ttl", "1s", "--permits", "0"});
  usage({"acquire", "k", "--ttl", "1s", "--permits", "65536"});
  usage({"acquire", "k", "--ttl", "1s", "--permits", "many"});
  usage({"run", "k", "--ttl", "1s", "--shared", "--permits", "2", "--", "true"});
  EXPECT_NE(usage({"run", "a", "b", "--ttl", "1s"}).find("--"), std::string::npos);
  usage({"run", "a", "", "--ttl", "1s", "--", "true"});
  // Nothing reached the server.
  const Json counters = parsed(ctl(d, {"stats"}))["nodes"].items.at(0)["counters"];
  EXPECT_EQ(counters["grants"].number, 0);
  EXPECT_EQ(counters["requests"].number, 0);

  for (const char* sub : {"acquire", "run"}) {
    const ToolResult help = run_tool(kCtl, {sub, "--help"});
    EXPECT_EQ(help.exit_code, 0) << sub;
    EXPECT_NE(help.out.find("--shared"), std::string::npos) << sub;
    EXPECT_NE(help.out.find("--permits"), std::string::npos) << sub;
  }
  EXPECT_NE(run_tool(kCtl, {"query", "--help"}).out.find("holders"), std::string::npos);
}

TEST(ShardlockctlTest, SeveralKeysOfDifferentNodesAreAUsageError) {
  Daemon one;
  Daemon two;
  ASSERT_FALSE(one.address().empty());
  ASSERT_FALSE(two.address().empty());
  LeaseClientOptions options;
  options.nodes = {one.address(), two.address()};
  LeaseClient router(options);
  ASSERT_FALSE(router.start());
  std::array<std::string, 2> on_node;
  for (int i = 0; on_node[0].empty() || on_node[1].empty(); ++i) {
    ASSERT_LT(i, 1000);
    const std::string key = "split/" + std::to_string(i);
    std::string& slot = on_node[router.node_for(key)];
    if (slot.empty()) slot = key;
  }
  const ToolResult r = run_tool(kCtl, {"--server", one.address() + "," + two.address(), "acquire",
                                       on_node[0], on_node[1], "--ttl", "10s", "--json"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(parsed(r)["error"].text, "keys_owned_by_different_nodes");
  EXPECT_NE(r.err.find("different nodes"), std::string::npos) << r.err;
}

TEST(ShardlockctlTest, RunHoldsSeveralKeysOrASharedLeaseWhileTheCommandRuns) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  // The child sees every key and token, and checks the second from inside.
  const std::string script = "echo \"$SHARDLOCK_KEY $SHARDLOCK_TOKEN $SHARDLOCK_MODE\"; \"" + kCtl +
                             "\" --server \"$SHARDLOCK_SERVER\" query jobs/b --json; exit 3";
  const ToolResult r =
      ctl(d, {"run", "jobs/a", "jobs/b", "--ttl", "5s", "--", "/bin/sh", "-c", script});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(r.out, m, std::regex(R"(jobs/a,jobs/b (\d+),(\d+) exclusive\n(\{.*\}))")))
      << r.out;
  const auto inside = testing::JsonParser::parse(m[3].str());
  ASSERT_TRUE(inside);
  EXPECT_TRUE((*inside)["held"].boolean);
  EXPECT_EQ(std::to_string(static_cast<std::uint64_t>((*inside)["token"].number)), m[2].str());
  // Both released when the command exited.
  EXPECT_FALSE(parsed(ctl(d, {"query", "jobs/a"}))["held"].boolean);
  EXPECT_FALSE(parsed(ctl(d, {"query", "jobs/b"}))["held"].boolean);

  // One key held elsewhere: run starts nothing and holds nothing.
  ASSERT_EQ(ctl(d, {"acquire", "jobs/b", "--ttl", "30s"}).exit_code, 0);
  const ToolResult busy =
      ctl(d, {"run", "jobs/a", "jobs/b", "-n", "--ttl", "5s", "--", "/bin/sh", "-c", "echo ran"});
  EXPECT_EQ(busy.exit_code, 69);
  EXPECT_EQ(busy.out, "");  // run's stdout is the command's: its JSON goes to stderr
  const auto why = testing::JsonParser::parse(busy.err);
  ASSERT_TRUE(why) << busy.err;
  EXPECT_EQ((*why)["error"].text, "busy");
  EXPECT_EQ((*why)["busy_key"].text, "jobs/b");
  EXPECT_FALSE(parsed(ctl(d, {"query", "jobs/a"}))["held"].boolean);

  // run --shared next to another reader; an exclusive run is refused.
  ASSERT_EQ(ctl(d, {"acquire", "report", "--ttl", "30s", "--shared"}).exit_code, 0);
  const ToolResult shared =
      ctl(d, {"run", "report", "--ttl", "5s", "--shared", "--", "/bin/sh", "-c",
              "\"$0\" --server \"$SHARDLOCK_SERVER\" query report -w json", kCtl});
  EXPECT_EQ(shared.exit_code, 0) << shared.err;
  const Json during = parsed(shared);
  EXPECT_EQ(during["mode"].text, "shared");
  EXPECT_EQ(during["holders"].number, 2);
  EXPECT_EQ(parsed(ctl(d, {"query", "report"}))["holders"].number, 1) << "released on exit";
  EXPECT_EQ(ctl(d, {"run", "report", "-n", "-E", "42", "--ttl", "5s", "--", "true"}).exit_code, 42);
}

// ---------------------------------------------------------- loud failures

// A key that could not be written is no key: keygen (like every subcommand)
// fails when stdout cannot take its output.
TEST(ShardlockctlTest, OutputThatCannotBeWrittenIsAFailure) {
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no /dev/full";
  const ToolResult r = run_tool("/bin/sh", {"-c", "exec \"$0\" keygen > /dev/full", kCtl});
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_NE(r.err.find("cannot write the output"), std::string::npos) << r.err;
}

// A parent that ignores SIGCHLD passes that on across exec; the kernel then
// reaps the command itself, and run reported 0 whatever the command did.
TEST(ShardlockctlTest, RunReportsTheCommandsStatusWhenSigchldWasIgnored) {
  if (::access("/usr/bin/perl", X_OK) != 0) GTEST_SKIP() << "no perl to ignore SIGCHLD with";
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  const ToolResult r =
      run_tool("/usr/bin/perl",
               {"-e", "$SIG{CHLD} = 'IGNORE'; exec @ARGV or exit 99", kCtl, "--server", d.address(),
                "run", "job", "--ttl", "10s", "--", "/bin/sh", "-c", "exit 7"});
  EXPECT_EQ(r.exit_code, 7) << r.err;
}

// A server that answers STATS with fewer shard tokens than its shard count
// and then an empty page: ctl must not print the part as the whole.
TEST(ShardlockctlTest, StatsThatStopPagingEarlyAreAnError) {
  sockaddr_in address{};
  const int fd = loopback_udp_socket(address);
  ASSERT_GE(fd, 0);
  std::atomic<bool> stop{false};
  std::thread server([&] {
    std::array<std::uint8_t, kMaxDatagramSize> in{};
    std::array<std::uint8_t, kMaxDatagramSize> out{};
    while (!stop.load(std::memory_order_relaxed)) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      sockaddr_in from{};
      socklen_t from_length = sizeof from;
      const ssize_t n =
          ::recvfrom(fd, in.data(), in.size(), 0, reinterpret_cast<sockaddr*>(&from), &from_length);
      Datagram request;
      if (n <= 0 || decode({in.data(), static_cast<std::size_t>(n)}, request) != ProtocolError::kOk)
        continue;
      Datagram reply;
      reply.request_id = request.request_id;
      reply.client_id = request.client_id;
      Message m;
      m.type = MessageType::kStatsReply;
      m.request_id = request.messages[0].request_id;
      m.first_shard = request.messages[0].first_shard;
      m.shard_count = 4;  // and never a token
      static const std::array<std::uint8_t, 8 * kStatCounterCount> counters{};
      m.counters_le = counters;
      (void)reply.push(m);
      std::size_t written = 0;
      if (encode(reply, out, written) != ProtocolError::kOk) continue;
      (void)::sendto(fd, out.data(), written, 0, reinterpret_cast<sockaddr*>(&from), from_length);
    }
  });
  const ToolResult r =
      run_tool(kCtl, {"--server", "127.0.0.1:" + std::to_string(ntohs(address.sin_port)),
                      "--timeout", "1s", "stats", "--json"});
  stop.store(true, std::memory_order_relaxed);
  server.join();
  ::close(fd);
  EXPECT_EQ(r.exit_code, 5) << r.out << r.err;
  EXPECT_EQ(parsed(r)["nodes"].items.at(0)["error"].text, "incomplete");
  EXPECT_NE(r.err.find("0 of 4 shard tokens"), std::string::npos) << r.err;
}

// top (and its alias hot): the busiest keys with their BUSY answers,
// holders and waiters, under the server's request rate; --once, --count
// and --interval bound it.
TEST(ShardlockctlTest, TopShowsTheBusiestKeys) {
  // Counts that never halve, so none does between the requests and top.
  Daemon d("0", {"--hot-key-half-life", "0"});
  ASSERT_FALSE(d.address().empty());
  ASSERT_EQ(ctl(d, {"acquire", "top/hot", "--ttl", "60s"}).exit_code, 0);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(ctl(d, {"acquire", "top/hot", "--ttl", "60s"}).exit_code, 1);
  EXPECT_EQ(ctl(d, {"query", "top/warm"}).exit_code, 0);

  const ToolResult once = ctl(d, {"top", "--once"});
  ASSERT_EQ(once.exit_code, 0) << once.err;
  const Json node = parsed(once)["nodes"].items.at(0);
  EXPECT_EQ(node["server"].text, d.address());
  EXPECT_EQ(node["rate_since"].text, "start");
  EXPECT_GT(node["request_rate"].number, 0);
  EXPECT_EQ(node["leases"].number, 1);
  EXPECT_GT(node["window_ms"].number, 0);
  const auto& keys = node["hot_keys"].items;
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0]["key"].text, "top/hot");
  EXPECT_EQ(keys[0]["requests"].number, 5);
  EXPECT_EQ(keys[0]["error"].number, 0);
  EXPECT_EQ(keys[0]["busy"].number, 4);
  EXPECT_EQ(keys[0]["holders"].number, 1);
  EXPECT_EQ(keys[0]["waiters"].number, 0);
  EXPECT_GT(keys[0]["requests_per_second"].number, 0);
  EXPECT_EQ(keys[1]["key"].text, "top/warm");
  EXPECT_EQ(keys[1]["holders"].number, 0);

  // Two frames, the second's rate over the interval; --limit cuts the list.
  const ToolResult frames = ctl(d, {"hot", "--count", "2", "--interval", "200ms", "--limit", "1"});
  ASSERT_EQ(frames.exit_code, 0) << frames.err;
  std::vector<Json> lines;
  std::size_t from = 0;
  for (std::size_t at; (at = frames.out.find('\n', from)) != std::string::npos; from = at + 1) {
    const auto j = testing::JsonParser::parse(std::string_view(frames.out).substr(from, at - from));
    ASSERT_TRUE(j) << frames.out;
    lines.push_back(*j);
  }
  ASSERT_EQ(lines.size(), 2u) << frames.out;
  EXPECT_EQ(lines[1]["nodes"].items.at(0)["rate_since"].text, "last");
  EXPECT_EQ(lines[1]["nodes"].items.at(0)["hot_keys"].items.size(), 1u);

  // For people: the server's line, then a table.
  const ToolResult text = ctl_text(d, {"top", "--once"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_TRUE(std::regex_search(
      text.out, std::regex(d.address() + R"( shardlockd \d+\.\d+\.\d+ up [0-9.]+s: [0-9.]+ req/s, )"
                                         R"(1 leases, 1 keys, 0 waiters\n)")))
      << text.out;
  EXPECT_TRUE(std::regex_search(
      text.out, std::regex(R"(KEY +REQ/S +REQUESTS +ERROR +BUSY +HOLDERS +WAITERS\n)"
                           R"(top/hot +[0-9.]+ +\d+ +0 +4 +1 +0\n)")))
      << text.out;
  EXPECT_EQ(text.out.find("\x1b["), std::string::npos);  // not a terminal: no clearing

  EXPECT_EQ(ctl(d, {"top", "--interval", "0"}).exit_code, 2);

  // A key shown wider than a line buffer (all 256 bytes \xNN) is shown
  // whole, with its counts after it on the same line.
  const std::string wide(shardlock::lease::kMaxKeyLength, '\xff');
  ASSERT_EQ(ctl(d, {"acquire", wide, "--ttl", "60s"}).exit_code, 0);
  const ToolResult wide_text = ctl_text(d, {"top", "--once"});
  ASSERT_EQ(wide_text.exit_code, 0) << wide_text.err;
  std::string wide_shown;
  for (std::size_t i = 0; i < wide.size(); ++i) wide_shown += "\\xff";
  const std::size_t row = wide_text.out.find(wide_shown + " ");
  ASSERT_NE(row, std::string::npos) << wide_text.out;
  const std::size_t row_end = wide_text.out.find('\n', row);
  ASSERT_NE(row_end, std::string::npos);
  const std::string counts =
      wide_text.out.substr(row + wide_shown.size(), row_end - row - wide_shown.size());
  EXPECT_TRUE(std::regex_match(counts, std::regex(R"( +[0-9.]+ +1 +0 +0 +1 +0)"))) << counts;

  // shardlockd --hot-keys 0 keeps no sketch: top lists no key.
  Daemon none("0", {"--hot-keys", "0"});
  ASSERT_FALSE(none.address().empty());
  ASSERT_EQ(ctl(none, {"acquire", "top/hot", "--ttl", "60s"}).exit_code, 0);
  const ToolResult empty = ctl(none, {"top", "--once"});
  ASSERT_EQ(empty.exit_code, 0) << empty.err;
  EXPECT_TRUE(parsed(empty)["nodes"].items.at(0)["hot_keys"].items.empty()) << empty.out;
  EXPECT_NE(ctl_text(none, {"top", "--once"}).out.find("(no key requested lately)"),
            std::string::npos);
  EXPECT_EQ(
      run_tool(kCtl, {"--server", "127.0.0.1:9", "--timeout", "300ms", "top", "--once"}).exit_code,
      3);
}

// ---------------------------------------------------------- conventions

// The global flags work before or after the subcommand, and every
// subcommand's --help lists them; the output switch is the same everywhere.
TEST(ShardlockctlTest, GlobalFlagsGoAnywhereAndEverySubcommandListsThem) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  const ToolResult after =
      run_tool(kCtl, {"acquire", "g/after", "--ttl", "30", "--server", d.address(), "--json"});
  ASSERT_EQ(after.exit_code, 0) << after.err;
  EXPECT_EQ(parsed(after)["ttl_ms"].number, 30000);  // a bare number is seconds
  const ToolResult mixed =
      run_tool(kCtl, {"--json", "query", "g/after", "--timeout", "1.5s", "--server", d.address()});
  ASSERT_EQ(mixed.exit_code, 0) << mixed.err;
  EXPECT_TRUE(parsed(mixed)["held"].boolean);
  const ToolResult write_out =
      run_tool(kCtl, {"query", "g/after", "-w", "json", "--server", d.address()});
  EXPECT_TRUE(parsed(write_out)["held"].boolean);
  // From the environment, and the flag over the environment.
  const ToolResult from_env =
      run_tool(kCtl, {"query", "g/after", "--json"}, 30s, {"SHARDLOCK_SERVER=" + d.address()});
  EXPECT_EQ(from_env.exit_code, 0) << from_env.err;
  const ToolResult flag_wins =
      run_tool(kCtl, {"query", "g/after", "--json", "--server", d.address()}, 30s,
               {"SHARDLOCK_SERVER=no-port"});
  EXPECT_EQ(flag_wins.exit_code, 0) << flag_wins.err;

  for (const char* sub : {"acquire", "renew", "release", "query", "stats", "ping", "run", "keygen",
                          "members", "drain"}) {
    const ToolResult help = run_tool(kCtl, {sub, "--help"});
    EXPECT_EQ(help.exit_code, 0) << sub;
    for (const char* flag :
         {"--server", "--timeout", "--auth-key", "--discover", "--json", "--write-out"}) {
      EXPECT_NE(help.out.find(flag), std::string::npos) << sub << " --help lacks " << flag;
    }
  }
}

TEST(ShardlockctlTest, UnknownCommandsNoArgumentsAndVersion) {
  const ToolResult unknown = run_tool(kCtl, {"frobnicate"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("unknown command 'frobnicate'"), std::string::npos) << unknown.err;
  const ToolResult after_flags = run_tool(kCtl, {"--server", "127.0.0.1:9", "frobnicate"});
  EXPECT_NE(after_flags.err.find("unknown command 'frobnicate'"), std::string::npos)
      << after_flags.err;

  const ToolResult bare = run_tool(kCtl, {});
  EXPECT_EQ(bare.exit_code, 2);
  EXPECT_NE(bare.out.find("Usage: shardlockctl"), std::string::npos) << bare.out;
  EXPECT_NE(bare.out.find("acquire"), std::string::npos) << bare.out;

  const ToolResult version = run_tool(kCtl, {"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_TRUE(std::regex_match(version.out, std::regex(R"(shardlockctl \d+\.\d+\.\d+\n)")))
      << version.out;
}

// Without --json every subcommand prints for people, one line per result.
TEST(ShardlockctlTest, OutputIsForPeopleByDefault) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  const ToolResult acquired = ctl_text(d, {"acquire", "h/a", "h/b", "--ttl", "50"});
  ASSERT_EQ(acquired.exit_code, 0) << acquired.err;
  EXPECT_TRUE(std::regex_match(
      acquired.out, std::regex("h/a token=\\d+ ttl=50s owner=[0-9a-f]{32} mode=exclusive\n"
                               "h/b token=\\d+ ttl=50s owner=[0-9a-f]{32} mode=exclusive\n")))
      << acquired.out;
  const ToolResult query = ctl_text(d, {"query", "h/a"});
  EXPECT_TRUE(std::regex_match(
      query.out, std::regex("h/a held mode=exclusive holders=1 ttl_left=[0-9.]+s token=(\\d+) "
                            "waiters=0\n"
                            "  owner=[0-9a-f]{32} token=\\d+ mode=exclusive ttl_left=[0-9.]+s\n")))
      << query.out;
  EXPECT_EQ(ctl_text(d, {"query", "h/free"}).out, "h/free not held waiters=0\n");
  const ToolResult busy = ctl_text(d, {"acquire", "h/a", "--ttl", "5s"});
  EXPECT_EQ(busy.exit_code, 1);
  EXPECT_EQ(busy.out, "");
  EXPECT_NE(busy.err.find("shardlockctl: h/a: busy"), std::string::npos) << busy.err;
  const ToolResult stats = ctl_text(d, {"stats"});
  EXPECT_EQ(stats.exit_code, 0);
  EXPECT_EQ(stats.out.rfind(d.address() + " shards=8\n", 0), 0u) << stats.out;
  EXPECT_NE(stats.out.find("  grants "), std::string::npos) << stats.out;
}

// query shows each holder: owner, token, mode and time left, oldest grant
// first, with the waiters; nobody holding it is "not held", mode null.
TEST(ShardlockctlTest, QueryShowsEachHolder) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  std::vector<Json> grants;
  for (int i = 0; i < 3; ++i) {
    const ToolResult r = ctl(d, {"acquire", "who/doc", "-s", "--ttl", "30s"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    grants.push_back(parsed(r));
  }
  // A writer waiting behind the readers, from a client of our own.
  LeaseClientOptions options;
  options.nodes = {d.address()};
  LeaseClient writer(options);
  ASSERT_FALSE(writer.start());
  std::atomic<bool> answered{false};
  writer.acquire_async("who/doc", 30s, 20s, [&](const CallResult&) { answered.store(true); });
  for (int i = 0; i < 200 && writer.query("who/doc").waiters == 0; ++i) {
    std::this_thread::sleep_for(10ms);
  }

  const ToolResult json = ctl(d, {"query", "who/doc"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json q = nlohmann::json::parse(json.out);
  EXPECT_EQ(q["held"], true);
  EXPECT_EQ(q["mode"], "shared");
  EXPECT_EQ(q["holders"], 3);
  EXPECT_EQ(q["waiters"], 1);
  EXPECT_EQ(q["listed"], true);
  ASSERT_EQ(q["holder_list"].size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    const nlohmann::json& h = q["holder_list"][i];
    EXPECT_EQ(h["owner"], grants[i]["owner"].text) << i;
    EXPECT_EQ(h["token"].get<double>(), grants[i]["token"].number) << i;
    EXPECT_EQ(h["mode"], "shared");
    EXPECT_GT(h["ttl_left_ms"].get<std::int64_t>(), 0);
    EXPECT_LE(h["ttl_left_ms"].get<std::int64_t>(), 30000);
    EXPECT_EQ(h["pending"], false);
    EXPECT_EQ(h["value"], "");
  }

  const ToolResult text = ctl_text(d, {"query", "who/doc"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_TRUE(std::regex_match(
      text.out, std::regex("who/doc held mode=shared holders=3 ttl_left=[0-9.]+s token=\\d+ "
                           "waiters=1\n"
                           "(  owner=[0-9a-f]{32} token=\\d+ mode=shared ttl_left=[0-9.]+s\n){3}")))
      << text.out;
  EXPECT_NE(text.out.find("owner=" + grants[1]["owner"].text), std::string::npos);

  const nlohmann::json free = nlohmann::json::parse(ctl(d, {"query", "who/nobody"}).out);
  EXPECT_EQ(free["held"], false);
  EXPECT_TRUE(free["mode"].is_null());
  EXPECT_EQ(free["holders"], 0);
  EXPECT_TRUE(free["holder_list"].empty());
  EXPECT_EQ(ctl_text(d, {"query", "who/nobody"}).out, "who/nobody not held waiters=0\n");
}

// `acquire --value` attaches a value that query shows with the
// holder; run takes it too, and it is one key's, at most 256 bytes.
TEST(ShardlockctlTest, AcquireValueIsShownByQuery) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  const ToolResult granted =
      ctl(d, {"acquire", "leader/db", "--ttl", "30s", "--value", "10.0.0.7:5432"});
  ASSERT_EQ(granted.exit_code, 0) << granted.err;
  const nlohmann::json q = nlohmann::json::parse(ctl(d, {"query", "leader/db"}).out);
  ASSERT_EQ(q["holder_list"].size(), 1u);
  EXPECT_EQ(q["holder_list"][0]["value"], "10.0.0.7:5432");
  EXPECT_NE(ctl_text(d, {"query", "leader/db"}).out.find(" value=10.0.0.7:5432\n"),
            std::string::npos);

  const std::string script =
      "\"$0\" --server \"$SHARDLOCK_SERVER\" query --json \"$SHARDLOCK_KEY\"";
  const ToolResult run =
      ctl_text(d, {"run", "job/x", "--value", "host-b pid 7", "--", "/bin/sh", "-c", script, kCtl});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("\"value\":\"host-b pid 7\""), std::string::npos) << run.out;

  EXPECT_EQ(ctl(d, {"acquire", "a", "b", "--ttl", "5s", "--value", "v"}).exit_code, 2);
  EXPECT_EQ(ctl(d, {"acquire", "a", "--ttl", "5s", "--value", std::string(257, 'v')}).exit_code, 2);
}

// A key is bytes: one that is not UTF-8 still gives valid JSON (escaped,
// with its exact bytes in key_hex) and a readable line.
TEST(ShardlockctlTest, KeysThatAreNotUtf8StayValidJson) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  const std::string key = "caf\xe9\x01\\";
  for (const char* sub : {"acquire", "query"}) {
    std::vector<std::string> args = {sub, key};
    if (std::string(sub) == "acquire") args.insert(args.end(), {"--ttl", "30s"});
    const ToolResult r = ctl(d, args);
    ASSERT_EQ(r.exit_code, 0) << sub << r.err;
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << sub << ": " << r.out;
    EXPECT_EQ(j["key"], "caf\\xe9\x01\\x5c") << sub;
    EXPECT_EQ(j["key_hex"], "636166e9015c") << sub;
  }
  // Refused, the error names the key the same way.
  const ToolResult busy = ctl(d, {"acquire", key, "--ttl", "30s"});
  EXPECT_EQ(busy.exit_code, 1);
  EXPECT_TRUE(nlohmann::json::accept(busy.out)) << busy.out;
  EXPECT_NE(ctl_text(d, {"query", key}).out.find("caf\\xe9\\x01\\x5c held"), std::string::npos);
  EXPECT_NE(busy.err.find("caf\\xe9\\x01\\x5c: busy"), std::string::npos) << busy.err;
}

// run waits like flock: by default until the lease is granted, -w bounds
// the wait, -n does not wait, and a wait beyond the server's --max-wait
// queues again rather than failing.
TEST(ShardlockctlTest, RunWaitsLikeFlock) {
  Daemon d("0", {"--max-wait", "200ms"});
  ASSERT_FALSE(d.address().empty());
  // Held by another owner for 1 s, well past the server's longest wait.
  ASSERT_EQ(ctl(d, {"acquire", "w/key", "--ttl", "1s"}).exit_code, 0);
  const ToolResult waited = ctl_text(d, {"run", "w/key", "--", "/bin/sh", "-c", "echo ran"});
  EXPECT_EQ(waited.exit_code, 0) << waited.err;
  EXPECT_EQ(waited.out, "ran\n");

  ASSERT_EQ(ctl(d, {"acquire", "w/key", "--ttl", "1s"}).exit_code, 0);
  const ToolResult bounded =
      ctl_text(d, {"run", "w/key", "-w", "20s", "--", "/bin/sh", "-c", "echo ran"});
  EXPECT_EQ(bounded.exit_code, 0) << bounded.err;
  EXPECT_EQ(bounded.out, "ran\n");
  // acquire takes the same long wait.
  ASSERT_EQ(ctl(d, {"acquire", "w/other", "--ttl", "1s"}).exit_code, 0);
  EXPECT_EQ(ctl(d, {"acquire", "w/other", "--ttl", "5s", "-w", "20s"}).exit_code, 0);

  ASSERT_EQ(ctl(d, {"acquire", "w/held", "--ttl", "1m"}).exit_code, 0);
  const ToolResult ran_out =
      ctl_text(d, {"run", "w/held", "-w", "300ms", "--", "/bin/sh", "-c", "echo ran"});
  EXPECT_EQ(ran_out.exit_code, 69);
  EXPECT_EQ(ran_out.out, "");
  EXPECT_NE(ran_out.err.find("w/held: not acquired"), std::string::npos) << ran_out.err;
  const ToolResult conflict =
      ctl_text(d, {"run", "w/held", "--nonblock", "--conflict-exit-code", "0", "--", "false"});
  EXPECT_EQ(conflict.exit_code, 0);
  EXPECT_EQ(ctl_text(d, {"run", "w/held", "-n", "-w", "1s", "--", "true"}).exit_code, 2);

  // -s: shared beside another reader.
  ASSERT_EQ(ctl(d, {"acquire", "w/doc", "--ttl", "1m", "-s"}).exit_code, 0);
  EXPECT_EQ(ctl_text(d, {"run", "w/doc", "-s", "-n", "--", "true"}).exit_code, 0);
}

// A signal while run waits ends the wait: the command never starts.
TEST(ShardlockctlTest, RunCanBeInterruptedWhileItWaits) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  ASSERT_EQ(ctl(d, {"acquire", "i/key", "--ttl", "1m"}).exit_code, 0);
  ChildProcess run(kCtl,
                   {"--server", d.address(), "run", "i/key", "--", "/bin/sh", "-c", "echo ran"});
  // Queued once the server counts a waiter.
  for (int i = 0; i < 2000 && parsed(ctl(d, {"query", "i/key"}))["waiters"].number < 1; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(parsed(ctl(d, {"query", "i/key"}))["waiters"].number, 1);
  run.signal(SIGTERM);
  const ToolResult r = run.finish(30s);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("not acquired"), std::string::npos) << r.err;
}

// How often `word` occurs in `text`.
std::size_t occurrences(const std::string& text, const std::string& word) {
  std::size_t count = 0;
  for (std::size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    ++count;
  }
  return count;
}

// A wait that outlasts a second says once, on stderr, what it waits for
// and how long at most (flock -v style): run, acquire --wait and elect
// alike; -q silences it. The holders stay until the lines have been read,
// then are released by key, token and owner, so nothing hangs on timing.
TEST(ShardlockctlTest, AWaitBehindAHolderSaysOnceWhatItWaitsFor) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  struct Holder {
    std::string key;
    std::string token;
    std::string owner;
  };
  std::vector<Holder> holders;
  const auto hold = [&d, &holders](const std::string& key, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"acquire", key, "--ttl", "1m"};
    args.insert(args.end(), extra.begin(), extra.end());
    const ToolResult r = ctl(d, args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const Json j = parsed(r);
    holders.push_back(
        {key, std::to_string(static_cast<std::uint64_t>(j["token"].number)), j["owner"].text});
  };
  for (const char* key : {"wait/quiet", "wait/run", "wait/acquire"}) hold(key, {});
  hold("wait/elect", {"--value", "host-a:1"});
  const auto ctl_child = [&d](std::vector<std::string> args) {
    args.insert(args.begin(), {"--server", d.address()});
    return std::make_unique<ChildProcess>(kCtl, args);
  };
  const auto with_echo = [](std::vector<std::string> args) {
    args.insert(args.end(), {"--", "/bin/sh", "-c", "echo ran"});
    return args;
  };
  // The quiet one first: once the others have spoken, it has waited longer.
  auto quiet = ctl_child(with_echo({"run", "-q", "wait/quiet", "--ttl", "5s"}));
  ASSERT_TRUE(test_support::poll_until(
      [&d] {
        return parsed(ctl(d, {"query", "wait/quiet"}))["waiters"].number >= 1;
      },
      test_support::kPollTimeout, 10ms));
  auto run = ctl_child(with_echo({"run", "wait/run", "--ttl", "5s"}));
  auto acquire = ctl_child({"acquire", "wait/acquire", "--ttl", "5s", "-w", "50s"});
  auto elect = ctl_child(with_echo({"elect", "wait/elect", "--ttl", "5s"}));

  const std::string run_line = run->read_stderr_line(20s);
  EXPECT_EQ(run_line.rfind("shardlockctl: waiting for wait/run (held by another owner, ", 0), 0u)
      << run_line;
  EXPECT_TRUE(run_line.ends_with(" left on its lease; waiting until granted)")) << run_line;
  const std::string acquire_line = acquire->read_stderr_line(20s);
  EXPECT_EQ(
      acquire_line.rfind("shardlockctl: waiting for wait/acquire (held by another owner, ", 0), 0u)
      << acquire_line;
  EXPECT_TRUE(acquire_line.ends_with(" left on its lease; waiting up to 50s)")) << acquire_line;
  const std::string elect_line = elect->read_stderr_line(20s);
  EXPECT_EQ(
      elect_line.rfind(
          "shardlockctl: campaigning for leadership of wait/elect (led by host-a:1, term ", 0),
      0u)
      << elect_line;
  EXPECT_TRUE(elect_line.ends_with(" left on its lease; campaigning until elected)")) << elect_line;

  for (const Holder& h : holders) {
    EXPECT_EQ(ctl(d, {"release", h.key, "--token", h.token, "--owner", h.owner}).exit_code, 0)
        << h.key;
  }
  // Once: nothing more on stderr after the line.
  for (auto* waiter : {run.get(), elect.get(), quiet.get()}) {
    const ToolResult r = waiter->finish(30s);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "ran\n");
    EXPECT_EQ(r.err, "");
  }
  const ToolResult acquired = acquire->finish(30s);
  EXPECT_EQ(acquired.exit_code, 0) << acquired.err;
  EXPECT_EQ(acquired.err, "");

  // A wait that ends at once says nothing.
  const ToolResult free_key = ctl_text(d, with_echo({"run", "wait/free"}));
  EXPECT_EQ(free_key.exit_code, 0) << free_key.err;
  EXPECT_EQ(free_key.err, "");
  // -n -q on a held key: the status alone says it, as flock -n.
  ASSERT_EQ(ctl(d, {"acquire", "wait/held", "--ttl", "30s"}).exit_code, 0);
  const ToolResult busy = ctl_text(d, with_echo({"run", "-n", "-q", "wait/held"}));
  EXPECT_EQ(busy.exit_code, 69);
  EXPECT_EQ(busy.out, "");
  EXPECT_EQ(busy.err, "");
}

// After a restart the server answers RECOVERING for its lock-delay (here
// its earlier run's max TTL, a minute: longer than the test). run -n counts
// that as a conflict (-E's status), so a cron job's `run -n -E 0 -q` skips
// its turn quietly; without -q it says why. A waiting run says once that
// the server is recovering and when it grants; -q silences that too.
TEST(ShardlockctlTest, ALockDelayIsAConflictAndAWaitThroughItSaysSo) {
  char dir_template[] = "/tmp/shardlockctl-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::unique_ptr<const std::string, void (*)(const std::string*)> remove_dir(
      &dir, [](const std::string* path) { std::filesystem::remove_all(*path); });
  const std::vector<std::string> flags = {"--data-dir", dir, "--max-ttl", "1m"};
  {
    Daemon first("", flags);  // a fresh data dir: no lock-delay
    ASSERT_FALSE(first.address().empty());
    ASSERT_EQ(ctl(first, {"acquire", "cron/backup", "--ttl", "2s"}).exit_code, 0);
    first.kill9();
  }
  Daemon restarted("", flags);
  ASSERT_FALSE(restarted.address().empty());
  const auto run_args = [&restarted](std::vector<std::string> run_flags) {
    run_flags.insert(run_flags.begin(), {"--server", restarted.address(), "run"});
    run_flags.insert(run_flags.end(),
                     {"cron/backup", "--ttl", "2s", "--", "/bin/sh", "-c", "echo ran"});
    return run_flags;
  };
  ChildProcess waiting(kCtl, run_args({"-w", "3s"}));
  ChildProcess waiting_quietly(kCtl, run_args({"-w", "3s", "-q"}));

  const ToolResult quiet = run_tool(kCtl, run_args({"-n", "-E", "0", "-q"}));
  EXPECT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.out, "");
  EXPECT_EQ(quiet.err, "");
  const ToolResult told = run_tool(kCtl, run_args({"-n", "-E", "0"}));
  EXPECT_EQ(told.exit_code, 0) << told.err;
  EXPECT_EQ(told.out, "");
  EXPECT_NE(told.err.find("cron/backup: the server is recovering"), std::string::npos) << told.err;
  EXPECT_EQ(run_tool(kCtl, run_args({"-n"})).exit_code, 69);

  const ToolResult r = waiting.finish(30s);
  EXPECT_EQ(r.exit_code, 69) << r.err;  // still recovering when -w ran out: a conflict
  EXPECT_EQ(r.out, "");
  const std::string said = "shardlockctl: server " + restarted.address() +
                           " is recovering after a restart (its lock-delay): grants in ";
  EXPECT_EQ(r.err.rfind(said, 0), 0u) << r.err;
  EXPECT_EQ(occurrences(r.err, said), 1u) << r.err;
  EXPECT_NE(r.err.find("; waiting for cron/backup up to 3s\n"), std::string::npos) << r.err;
  const ToolResult q = waiting_quietly.finish(30s);
  EXPECT_EQ(q.exit_code, 69) << q.err;
  EXPECT_EQ(q.out, "");
  EXPECT_EQ(q.err, "");
}

// A lost lease ends the command even when it ignores SIGTERM: SIGKILL
// follows --kill-after later, so it cannot work on past another holder's
// grant (as timeout -k). The lease is taken away as an operator would: it
// is released by key, token and owner from another process, so the next
// renewal is refused, and the message says so. Without the SIGKILL, run
// would wait for the command for ever and finish() would give up (-1).
TEST(ShardlockctlTest, ALostLeaseKillsACommandThatIgnoresSigterm) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  const std::string script =
      "trap '' TERM; echo \"$SHARDLOCK_TOKEN $SHARDLOCK_OWNER $$\"; while :; do sleep 0.1; done";
  for (const char* sub : {"run", "elect"}) {
    SCOPED_TRACE(sub);
    const std::string key = std::string("kill-after/") + sub;
    ChildProcess holder(kCtl, {"--server", d.address(), sub, key, "--ttl", "1500ms", "--kill-after",
                               "1s", "--", "/bin/sh", "-c", script});
    const std::string line = holder.read_line(20s);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, std::regex(R"((\d+) ([0-9a-f]{32}) (\d+))"))) << line;
    const pid_t command = static_cast<pid_t>(std::stol(m[3].str()));
    const ToolResult released =
        ctl(d, {"release", key, "--token", m[1].str(), "--owner", m[2].str()});
    EXPECT_EQ(released.exit_code, 0) << released.err;
    const ToolResult r = holder.finish(10s);
    EXPECT_EQ(r.exit_code, 75) << r.err;
    EXPECT_NE(r.err.find("lease on '" + key + "' lost: the server " + d.address() +
                         " refused its renewal"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("sending SIGTERM to the command, SIGKILL if it is still running in 1s"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("still running 1s after SIGTERM: sending SIGKILL"), std::string::npos)
        << r.err;
    // Gone: killed and reaped by run (not left to run on as an orphan).
    EXPECT_TRUE(test_support::poll_until(
        [command] { return ::kill(command, 0) != 0 && errno == ESRCH; }, 5s, 10ms));
    if (::kill(command, 0) == 0) ::kill(command, SIGKILL);
  }
}

// ------------------------------------------------------------ elections

// elect runs the command while leader (SHARDLOCK_TERM set), leader shows
// who leads, observe prints each change of leader once, in term order.
TEST(ShardlockctlTest, ElectLeaderAndObserve) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  const ToolResult none = ctl_text(d, {"leader", "e/sched"});
  EXPECT_EQ(none.exit_code, 0) << none.err;
  EXPECT_EQ(none.out, "e/sched no leader\n");
  const Json j = parsed(ctl(d, {"leader", "e/sched"}));
  EXPECT_TRUE(j.has("leader"));
  EXPECT_EQ(j["leader"].kind, Json::Kind::kNull);

  ChildProcess observer(kCtl, {"--server", d.address(), "observe", "e/sched", "--count", "3"});
  EXPECT_EQ(observer.read_line(20s), "e/sched no leader");
  const ToolResult a = ctl_text(d, {"elect", "e/sched", "--value", "host-a:1", "--", "/bin/sh",
                                    "-c", "echo term=$SHARDLOCK_TERM key=$SHARDLOCK_KEY"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_match(a.out, m, std::regex("term=(\\d+) key=e/sched\n"))) << a.out;
  const std::string term = m[1].str();
  const std::string line = observer.read_line(20s);
  EXPECT_EQ(line.rfind("e/sched leader term=" + term + " owner=", 0), 0u) << line;
  EXPECT_NE(line.find(" value=host-a:1"), std::string::npos) << line;
  const ToolResult r = observer.finish(20s);  // the third: no leader once A's command ended
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "e/sched no leader\n");

  EXPECT_EQ(ctl_text(d,
                     {
                         "elect",
                         "e/sched",
                         "--",
                     })
                .exit_code,
            2);  // no command
  EXPECT_EQ(
      ctl_text(d, {"elect", "e/sched", "--value", std::string(257, 'v'), "--", "true"}).exit_code,
      2);
}

// A leader killed with SIGKILL never resigns: the next campaigner is
// elected once its leadership lease runs out (the TTL), with a later term,
// and `leader` shows it.
TEST(ShardlockctlTest, AKilledLeadersSuccessorIsElectedWhenItsTtlRunsOut) {
  Daemon d;
  ASSERT_FALSE(d.address().empty());
  ChildProcess first(
      kCtl, {"--server", d.address(), "elect", "e/job", "--value", "first", "--ttl", "1s", "--",
             "/bin/sh", "-c", "echo term=$SHARDLOCK_TERM; exec sleep 60"});
  const std::string first_line = first.read_line(20s);
  ASSERT_EQ(first_line.rfind("term=", 0), 0u) << first_line;
  const std::uint64_t first_term = std::stoull(first_line.substr(5));
  ChildProcess second(kCtl, {"--server", d.address(), "elect", "e/job", "--value", "second",
                             "--ttl", "1s", "--", "/bin/sh", "-c", "echo term=$SHARDLOCK_TERM"});
  for (int i = 0; i < 2000 && parsed(ctl(d, {"query", "e/job"}))["waiters"].number < 1; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(parsed(ctl(d, {"query", "e/job"}))["waiters"].number, 1) << "second is campaigning";
  first.signal(SIGKILL);  // its shell and sleep live on; its lease is no longer renewed
  const ToolResult r = second.finish(30s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(r.out.rfind("term=", 0), 0u) << r.out;
  EXPECT_GT(std::stoull(r.out.substr(5)), first_term);
  (void)first.finish(1s);
}

// ------------------------------------------------------------ real causes

TEST(ShardlockctlTest, ANameThatDoesNotResolveIsNotAUsageError) {
  const ToolResult r = run_tool(kCtl, {"--server", "no-such-host.invalid:7420", "query", "k"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("cannot resolve \"no-such-host.invalid:7420\""), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("want HOST:PORT"), std::string::npos) << r.err;
  // A malformed address still is one.
  const ToolResult malformed = run_tool(kCtl, {"--server", "no-port", "query", "k"});
  EXPECT_EQ(malformed.exit_code, 2);
  EXPECT_NE(malformed.err.find("want HOST:PORT"), std::string::npos) << malformed.err;
}

// No answer is explained: nothing listening, or a server that drops what
// is not sealed with its key (a missing or wrong --auth-key).
TEST(ShardlockctlTest, UnansweredRequestsNameTheLikelyCause) {
  const ToolResult keygen = run_tool(kCtl, {"keygen"});
  ASSERT_EQ(keygen.exit_code, 0);
  const std::string key_file = ::testing::TempDir() + "ctl_cause_" + std::to_string(::getpid());
  std::ofstream(key_file + ".a") << keygen.out;
  std::ofstream(key_file + ".b") << run_tool(kCtl, {"keygen"}).out;
  Daemon d("0", {"--auth-key", key_file + ".a"});
  ASSERT_FALSE(d.address().empty());

  const ToolResult missing = ctl_text(d, {"--timeout", "300ms", "query", "k"});
  EXPECT_EQ(missing.exit_code, 3);
  EXPECT_NE(missing.err.find("something holds the port"), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("this client sends none (--auth-key FILE"), std::string::npos)
      << missing.err;
  // The other silent server: a replicated node holding its answer.
  EXPECT_NE(missing.err.find("holds its answer until its backups"), std::string::npos)
      << missing.err;
  const ToolResult wrong =
      ctl(d, {"--timeout", "300ms", "--auth-key", key_file + ".b", "query", "k"});
  EXPECT_EQ(wrong.exit_code, 3);
  EXPECT_NE(parsed(wrong)["message"].text.find("check that --auth-key names the server's key"),
            std::string::npos)
      << wrong.out;
  EXPECT_EQ(ctl(d, {"--auth-key", key_file + ".a", "query", "k"}).exit_code, 0);

  // A port nothing listens on (any more): the host refuses it.
  sockaddr_in address{};
  const int fd = loopback_udp_socket(address);
  ASSERT_GE(fd, 0);
  ::close(fd);
  const std::string closed = "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  const ToolResult refused =
      run_tool(kCtl, {"--server", closed, "--timeout", "300ms", "query", "k"});
  EXPECT_EQ(refused.exit_code, 3);
  EXPECT_NE(refused.err.find("nothing listens there"), std::string::npos) << refused.err;
  std::remove((key_file + ".a").c_str());
  std::remove((key_file + ".b").c_str());
}

TEST(ShardlockctlTest, ATtlAboveTheServersLimitNamesTheLimit) {
  Daemon d("0", {"--max-ttl", "10s"});
  ASSERT_FALSE(d.address().empty());
  const ToolResult r = ctl(d, {"acquire", "t/key", "--ttl", "1m"});
  EXPECT_EQ(r.exit_code, 5);
  EXPECT_EQ(parsed(r)["wire_error"].text, "ttl out of range");
  EXPECT_EQ(parsed(r)["max_ttl_ms"].number, 10000);
  EXPECT_NE(r.err.find("--ttl 1m is above the server's maximum TTL, 10s"), std::string::npos)
      << r.err;
  // The probe took nothing.
  EXPECT_FALSE(parsed(ctl(d, {"query", "t/key"}))["held"].boolean);
}

}  // namespace
}  // namespace shardlock::lease
