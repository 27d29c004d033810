// shardlockd as a process: flags, the ready line, clean stop, and the crash
// test - kill -9 a daemon with a data dir, restart it, and every new token
// exceeds every token issued before, with RECOVERING during lock-delay. Also
// what it does as a service: its log lines and levels (journald's form
// too), the summary of refused traffic, sd_notify through a socket the test
// binds, SIGHUP, the auth key as a systemd credential and the warning about
// a key others can read.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "lease/udp_test_peer.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/wire/auth.h"
#include "tools/client_tool_support.h"

extern char** environ;

namespace shardlock::lease {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using test_support::UdpTestPeer;

const std::string kDaemon = SHARDLOCK_TOOL_SHARDLOCKD;

// shardlockd as a child process with stdout and stderr captured.
class Daemon : public testing::ChildProcess {
 public:
  explicit Daemon(std::vector<std::string> args, const std::vector<std::string>& env = {})
      : ChildProcess(kDaemon, std::move(args), env) {}
  std::string read_line(milliseconds timeout = milliseconds{20'000}) {
    return ChildProcess::read_line(timeout);
  }
};

std::uint16_t ready_port(const std::string& line) {
  std::smatch m;
  static const std::regex kReady(
      R"re(^\{"event":"ready","listen":"127\.0\.0\.1:(\d+)","port":(\d+),.*\}$)re");
  if (!std::regex_match(line, m, kReady)) return 0;
  EXPECT_EQ(m[1].str(), m[2].str());
  return static_cast<std::uint16_t>(std::stoi(m[1].str()));
}

class ShardlockdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kDaemon)) FAIL() << kDaemon << " is missing: build the shardlockd target";
    char tmpl[] = "/tmp/shardlockd-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

TEST_F(ShardlockdTest, HelpAndBadFlags) {
  {
    Daemon d({"--help"});
    EXPECT_EQ(d.wait(), 0);
  }
  {
    Daemon d({"--no-such-flag"});
    EXPECT_EQ(d.wait(), 2);
    EXPECT_NE(d.read_stderr().find("no-such-flag"), std::string::npos);
  }
  {
    Daemon d({"--max-ttl", "ten seconds"});
    EXPECT_EQ(d.wait(), 2);
    EXPECT_NE(d.read_stderr().find("--max-ttl: invalid duration"), std::string::npos);
  }
  {
    Daemon d({"--shards", "0"});
    EXPECT_EQ(d.wait(), 2);
  }
  {
    Daemon d({"--io", "carrier-pigeon"});
    EXPECT_EQ(d.wait(), 2);
  }
}

// --version and the ready line carry one version: the project's.
TEST_F(ShardlockdTest, VersionFlagAndReadyLineAgree) {
  std::string version;
  {
    Daemon d({"--version"});
    const std::string line = d.read_line();
    EXPECT_EQ(d.wait(), 0);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, std::regex(R"(shardlockd (\d+\.\d+\.\d+))"))) << line;
    version = m[1].str();
  }
  Daemon d({"--listen", "127.0.0.1:0", "--lock-delay", "0"});
  const std::string line = d.read_line();
  EXPECT_NE(line.find("\"version\":\"" + version + "\""), std::string::npos) << line;
  // Durations as people type them.
  Daemon bare({"--listen", "127.0.0.1:0", "--lock-delay", "0", "--max-ttl", "90"});
  EXPECT_NE(bare.read_line().find("\"max_ttl_ms\":90000"), std::string::npos);
  Daemon fraction({"--listen", "127.0.0.1:0", "--lock-delay", "0", "--max-ttl", "1.5m"});
  EXPECT_NE(fraction.read_line().find("\"max_ttl_ms\":90000"), std::string::npos);
}

// Numeric flags at and beyond their limits: refused as usage errors (exit
// 2) naming the flag, never wrapped or truncated into another value.
TEST_F(ShardlockdTest, NumericFlagsBeyondTheirRangeAreUsageErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--lock-delay", "9223372036854775807ms"},  // used to wrap to no lock-delay
      {"--lock-delay", "1200h"},                  // above the u32 ms of any lease
      {"--max-ttl", "1200h"},
      {"--max-wait", "1200h"},
      {"--max-ttl", "99999999999999999999ms"},
      {"--shards", "4294967297"},
      {"--io-threads", "4294967297"},
      {"--busy-poll-us", "10001"},
      {"--busy-poll-us", "-1"},
      {"--token-block", "18446744073709551617"},
      {"--token-block", "18446744073709551615"},
  };
  for (const auto& [flag, value] : cases) {
    const auto result =
        Daemon({"--listen", "127.0.0.1:0", flag, value}).finish(milliseconds{20'000});
    EXPECT_EQ(result.exit_code, 2) << flag << " " << value << ": " << result.err;
    EXPECT_NE(result.err.find(flag), std::string::npos)
        << flag << " " << value << ": " << result.err;
  }
}

TEST_F(ShardlockdTest, ReadyLineThenCleanStopOnSigterm) {
  for (const char* io : {"socket", "auto"}) {
    Daemon d({"--listen", "127.0.0.1:0", "--lock-delay", "0", "--io", io});
    const std::string line = d.read_line();
    const std::uint16_t port = ready_port(line);
    ASSERT_NE(port, 0) << line;
    UdpTestPeer peer(port);
    EXPECT_EQ(peer.acquire("daemon", 1000).type, MessageType::kGranted);
    d.signal(SIGTERM);
    EXPECT_EQ(d.wait(), 0);
    const std::string log = d.read_stderr();
    EXPECT_NE(log.find("lock-delay is 0"), std::string::npos) << log;
    EXPECT_NE(log.find("granting: the lock-delay is over"), std::string::npos) << log;
    EXPECT_NE(log.find("stopped"), std::string::npos) << log;
  }
}

// --metrics: the ready line names the bound address; an address that cannot
// be served is a start-up failure that says why, and no server keeps running.
TEST_F(ShardlockdTest, MetricsAddressInTheReadyLineAndBadOnesRefused) {
  {
    Daemon d({"--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"});
    const std::string line = d.read_line();
    ASSERT_NE(ready_port(line), 0) << line;
    EXPECT_TRUE(std::regex_search(line, std::regex(R"re("metrics":"127\.0\.0\.1:[1-9]\d*")re")))
        << line;
    d.signal(SIGTERM);
    EXPECT_EQ(d.wait(), 0);
  }
  {
    Daemon d({"--listen", "127.0.0.1:0"});
    EXPECT_NE(d.read_line().find("\"metrics\":null"), std::string::npos);
    d.signal(SIGTERM);
    EXPECT_EQ(d.wait(), 0);
  }
  const auto bad =
      Daemon({"--listen", "127.0.0.1:0", "--metrics", "9464"}).finish(milliseconds{20'000});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("HOST:PORT"), std::string::npos) << bad.err;
}

TEST_F(ShardlockdTest, CorruptDataDirIsAStartUpError) {
  const std::string dir = root_ + "/data";
  {
    Daemon d({"--listen", "127.0.0.1:0", "--data-dir", dir, "--lock-delay", "0", "--shards", "4"});
    ASSERT_NE(ready_port(d.read_line()), 0);
    d.signal(SIGINT);
    EXPECT_EQ(d.wait(), 0);
  }
  std::ofstream(dir + "/shard-00002.hwm", std::ios::trunc) << "not a token file";
  Daemon d({"--listen", "127.0.0.1:0", "--data-dir", dir, "--shards", "4"});
  EXPECT_EQ(d.wait(), 1);
  const std::string log = d.read_stderr();
  EXPECT_NE(log.find("shard-00002.hwm"), std::string::npos) << log;
  EXPECT_NE(log.find("refusing to start"), std::string::npos) << log;
}

TEST_F(ShardlockdTest, TokensSurviveKillDashNine) {
  const std::string dir = root_ + "/data";
  // A small token block makes the first run cross several durable blocks.
  const std::vector<std::string> common = {"--listen", "127.0.0.1:0", "--data-dir",    dir,
                                           "--shards", "8",           "--token-block", "16",
                                           "--io",     "socket"};
  std::map<std::string, std::uint64_t> before;  // key -> highest token seen
  std::uint64_t highest_before = 0;
  {
    auto args = common;
    args.insert(args.end(), {"--lock-delay", "0"});
    Daemon d(args);
    const std::uint16_t port = ready_port(d.read_line());
    ASSERT_NE(port, 0);
    UdpTestPeer peer(port);
    for (int round = 0; round < 5; ++round) {
      for (int k = 0; k < 40; ++k) {
        const std::string key = "crash/" + std::to_string(k);
        const Message g = peer.acquire(key, 60'000);
        ASSERT_EQ(g.type, MessageType::kGranted);
        before[key] = std::max(before[key], g.token);
        highest_before = std::max(highest_before, g.token);
        if (round < 4) {
          ASSERT_EQ(peer.release(key, g.token).type, MessageType::kReleased);
        }
      }
    }
    d.signal(SIGKILL);  // no chance to write anything more
    EXPECT_EQ(d.wait(), 128 + SIGKILL);
  }

  auto args = common;
  args.insert(args.end(), {"--lock-delay", "2s"});
  Daemon d(args);
  const std::uint16_t port = ready_port(d.read_line());
  ASSERT_NE(port, 0);
  UdpTestPeer peer(port);
  // The old leases (still held when the first run died) are unknown to the
  // new run, so it must refuse to grant anything during the lock-delay.
  const Message recovering = peer.acquire("crash/0", 60'000);
  ASSERT_EQ(recovering.type, MessageType::kRecovering);
  EXPECT_GT(recovering.retry_after_ms, 0u);
  EXPECT_LE(recovering.retry_after_ms, 2000u);
  std::this_thread::sleep_for(milliseconds{recovering.retry_after_ms + 20});

  for (const auto& [key, old_token] : before) {
    const Message g = peer.acquire(key, 60'000);
    ASSERT_EQ(g.type, MessageType::kGranted) << key;
    EXPECT_GT(g.token, old_token) << key;
    EXPECT_GT(g.token, highest_before) << key;  // stronger: above every shard's old tokens
  }
  d.signal(SIGTERM);
  EXPECT_EQ(d.wait(), 0);
}

// Any bytes name a path: a data dir that is not UTF-8 still gives a ready
// line that is valid JSON (nlohmann's parser refuses invalid UTF-8), with
// the path's bad bytes written U+FFFD.
TEST_F(ShardlockdTest, TheReadyLineIsValidJsonForADataDirThatIsNotUtf8) {
  const std::string dir = root_ + "/data-\xff\xfe-\"quoted\"";
  Daemon d({"--listen", "127.0.0.1:0", "--data-dir", dir, "--shards", "2", "--io", "socket"});
  const std::string ready = d.read_line();
  ASSERT_NE(ready_port(ready), 0) << ready;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(ready)) << ready;
  EXPECT_EQ(j["data_dir"].get<std::string>(), root_ + "/data-\xef\xbf\xbd\xef\xbf\xbd-\"quoted\"");
  EXPECT_EQ(j["event"], "ready");
  EXPECT_TRUE(fs::is_directory(dir)) << "the daemon uses the path as given";
}

// A brand-new data dir has no earlier lease to protect, so the
// daemon grants at once with the default lock-delay and says so; after a
// kill -9 the same dir waits its lock-delay out (RECOVERING).
TEST_F(ShardlockdTest, AFreshDataDirGrantsAtOnceAndARestartAfterKillDashNineWaits) {
  const std::string dir = root_ + "/fresh";
  const std::vector<std::string> common = {"--listen", "127.0.0.1:0", "--data-dir", dir,
                                           "--shards", "4",           "--max-ttl",  "3s",
                                           "--io",     "socket"};
  std::uint64_t token = 0;
  {
    Daemon d(common);
    const std::string ready = d.read_line();
    EXPECT_NE(ready.find("\"fresh_data_dir\":true"), std::string::npos) << ready;
    EXPECT_NE(ready.find("\"lock_delay_ms\":0"), std::string::npos) << ready;
    const std::uint16_t port = ready_port(ready);
    ASSERT_NE(port, 0);
    UdpTestPeer peer(port);
    const Message g = peer.acquire("cron/backup", 3000);
    ASSERT_EQ(g.type, MessageType::kGranted) << "the first acquire waits for nothing";
    token = g.token;
    d.signal(SIGKILL);
    EXPECT_EQ(d.wait(), 128 + SIGKILL);
    const std::string log = d.read_stderr();
    EXPECT_NE(log.find("fresh data dir"), std::string::npos) << log;
  }
  Daemon d(common);
  const std::string ready = d.read_line();
  EXPECT_NE(ready.find("\"fresh_data_dir\":false"), std::string::npos) << ready;
  const std::uint16_t port = ready_port(ready);
  ASSERT_NE(port, 0);
  UdpTestPeer peer(port);
  const Message r = peer.acquire("cron/backup", 3000);
  ASSERT_EQ(r.type, MessageType::kRecovering) << "the lease of the killed run may be live";
  EXPECT_GT(r.retry_after_ms, 0u);
  EXPECT_LE(r.retry_after_ms, 3000u);
  std::this_thread::sleep_for(milliseconds{r.retry_after_ms + 20});
  const Message g = peer.acquire("cron/backup", 3000);
  ASSERT_EQ(g.type, MessageType::kGranted);
  EXPECT_GT(g.token, token);
  d.signal(SIGTERM);
  EXPECT_EQ(d.wait(), 0);
}

std::int64_t ready_lock_delay_ms(const std::string& line) {
  std::smatch m;
  static const std::regex kDelay(R"re("lock_delay_ms":(\d+))re");
  if (!std::regex_search(line, m, kDelay)) return -1;
  return std::stoll(m[1].str());
}

// Lowering --max-ttl across a crash must not shorten the wait for the old,
// longer leases: the default lock-delay covers the previous run's max TTL
// until the new run has waited it out.
TEST_F(ShardlockdTest, LockDelayCoversThePreviousRunsLongerMaxTtl) {
  const std::string dir = root_ + "/data";
  {
    Daemon d(
        {"--listen", "127.0.0.1:0", "--data-dir", dir, "--max-ttl", "3s", "--lock-delay", "0"});
    const std::uint16_t port = ready_port(d.read_line());
    ASSERT_NE(port, 0);
    UdpTestPeer peer(port);
    ASSERT_EQ(peer.acquire("long", 3000).type, MessageType::kGranted);
    d.signal(SIGKILL);
    d.wait();
  }
  {
    Daemon d({"--listen", "127.0.0.1:0", "--data-dir", dir, "--max-ttl", "200ms"});
    const std::string line = d.read_line();
    const std::uint16_t port = ready_port(line);
    ASSERT_NE(port, 0);
    EXPECT_EQ(ready_lock_delay_ms(line), 3000) << line;
    UdpTestPeer peer(port);
    const Message r = peer.acquire("long", 200);
    ASSERT_EQ(r.type, MessageType::kRecovering);
    EXPECT_GT(r.retry_after_ms, 200u);
    // Once the delay has passed, the smaller bound is what the next run needs.
    std::this_thread::sleep_for(milliseconds{r.retry_after_ms + 50});
    ASSERT_EQ(peer.acquire("long", 200).type, MessageType::kGranted);
    d.signal(SIGKILL);
    d.wait();
  }
  Daemon d({"--listen", "127.0.0.1:0", "--data-dir", dir, "--max-ttl", "200ms"});
  const std::string line = d.read_line();
  EXPECT_EQ(ready_lock_delay_ms(line), 200) << line;
}

struct LockDelayEnd {
  std::chrono::system_clock::time_point at;
  std::string text;  // as written, "2026-11-25T12:01:00.250Z"
  double remaining_s = -1;
};

// The ready line's lock_delay_ends and lock_delay_remaining_s.
std::optional<LockDelayEnd> ready_lock_delay_end(const std::string& line) {
  std::smatch m;
  static const std::regex kEnd(
      R"re("lock_delay_ends":"((\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{3})Z)",)re"
      R"re("lock_delay_remaining_s":(\d+(?:\.\d{1,3})?),)re");
  if (!std::regex_search(line, m, kEnd)) return std::nullopt;
  std::tm utc{};
  utc.tm_year = std::stoi(m[2].str()) - 1900;
  utc.tm_mon = std::stoi(m[3].str()) - 1;
  utc.tm_mday = std::stoi(m[4].str());
  utc.tm_hour = std::stoi(m[5].str());
  utc.tm_min = std::stoi(m[6].str());
  utc.tm_sec = std::stoi(m[7].str());
  return LockDelayEnd{.at = std::chrono::system_clock::from_time_t(::timegm(&utc)) +
                            milliseconds(std::stoi(m[8].str())),
                      .text = m[1].str(),
                      .remaining_s = std::stod(m[9].str())};
}

// The ready line and the log say when the lock-delay ends (wall clock, UTC),
// and the log says when granting starts: after that, never before.
TEST_F(ShardlockdTest, ReadyLineAndLogSayWhenTheLockDelayEndsAndWhenGrantingStarts) {
  using std::chrono::system_clock;
  {
    const auto launched = system_clock::now();
    Daemon d({"--listen", "127.0.0.1:0", "--lock-delay", "1500ms", "--io", "socket"});
    const std::string line = d.read_line();
    const auto read = system_clock::now();
    const std::uint16_t port = ready_port(line);
    ASSERT_NE(port, 0) << line;
    const auto end = ready_lock_delay_end(line);
    ASSERT_TRUE(end) << line;
    // Counted from just after the server started (whole milliseconds).
    EXPECT_GE(end->at, launched + milliseconds{1500 - 1}) << line;
    EXPECT_LE(end->at, read + milliseconds{1500 + 1}) << line;
    EXPECT_GT(end->remaining_s, 0.0) << line;
    EXPECT_LE(end->remaining_s, 1.5) << line;

    UdpTestPeer peer(port);
    const Message recovering = peer.acquire("k", 1000);
    ASSERT_EQ(recovering.type, MessageType::kRecovering);
    // The daemon looks every 50 ms.
    std::this_thread::sleep_for(milliseconds{recovering.retry_after_ms + 300});
    EXPECT_EQ(peer.acquire("k", 1000).type, MessageType::kGranted);
    // The shards may grant a little before the end the daemon announced
    // (that end is read after the server started: never early), and the
    // daemon logs "granting" once its own clock is past it; a SIGTERM sent
    // before then came before the line (seen under TSan on loaded cores).
    std::this_thread::sleep_until(end->at + milliseconds{100});
    d.signal(SIGTERM);
    EXPECT_EQ(d.wait(), 0);
    const std::string log = d.read_stderr();
    const auto told = log.find("lock-delay ends at " + end->text);
    const auto granting = log.find("granting: the lock-delay is over");
    const auto stopping = log.find("received SIGTERM");
    ASSERT_NE(told, std::string::npos) << log;
    ASSERT_NE(granting, std::string::npos) << log;
    ASSERT_NE(stopping, std::string::npos) << log;
    EXPECT_LT(told, granting) << log;
    EXPECT_LT(granting, stopping) << log;
  }
  {
    // Stopped during its lock-delay: it never said it was granting.
    Daemon d({"--listen", "127.0.0.1:0", "--lock-delay", "1m", "--io", "socket"});
    const std::string line = d.read_line();
    const std::uint16_t port = ready_port(line);
    ASSERT_NE(port, 0) << line;
    const auto end = ready_lock_delay_end(line);
    ASSERT_TRUE(end) << line;
    EXPECT_GT(end->remaining_s, 59.0) << line;
    UdpTestPeer peer(port);
    ASSERT_EQ(peer.acquire("k", 1000).type, MessageType::kRecovering);
    d.signal(SIGTERM);
    EXPECT_EQ(d.wait(), 0);
    const std::string log = d.read_stderr();
    EXPECT_NE(log.find("lock-delay ends at " + end->text), std::string::npos) << log;
    EXPECT_EQ(log.find("granting"), std::string::npos) << log;
  }
}

// Whether this shardlockd has the cluster layer (--cluster and its flags).
bool daemon_has_cluster() {
  const testing::ToolResult help = Daemon({"--help"}).finish(milliseconds{20'000});
  return help.out.find("--node-id") != std::string::npos;
}

// Cluster mode refuses a lock-delay below the max TTL (a restarted node's
// hand-off acknowledgements wait for that lock-delay), before reaching etcd.
TEST_F(ShardlockdTest, ClusterModeRefusesALockDelayBelowTheMaxTtl) {
  if (!daemon_has_cluster()) GTEST_SKIP() << "shardlockd was built without the cluster layer";
  auto cluster_daemon = [&](const std::string& lock_delay) {
    return Daemon({"--listen", "127.0.0.1:0", "--cluster", "etcd://127.0.0.1:1", "--node-id", "n1",
                   "--data-dir", root_ + "/data", "--max-ttl", "10s", "--lock-delay", lock_delay,
                   "--io", "socket"})
        .finish(milliseconds{20'000});
  };
  for (const char* below : {"0", "9999ms"}) {
    const testing::ToolResult r = cluster_daemon(below);
    EXPECT_EQ(r.exit_code, 2) << below << ": " << r.err;
    EXPECT_NE(r.err.find(std::string("--lock-delay ") + below + " is below --max-ttl 10s"),
              std::string::npos)
        << r.err;
  }
  // At the max TTL the flags pass; nothing answers at port 1.
  const testing::ToolResult r = cluster_daemon("10s");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("cannot join the cluster"), std::string::npos) << r.err;
}

// A shardlockd built without the cluster layer says so when given a cluster
// flag, as a usage error.
TEST_F(ShardlockdTest, ClusterFlagsWithoutTheClusterLayerSaySo) {
  if (daemon_has_cluster()) GTEST_SKIP() << "shardlockd has the cluster layer";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--cluster", "etcd://127.0.0.1:2379", "--node-id", "n1"},
        std::vector<std::string>{"--cluster=etcd://127.0.0.1:2379"},
        std::vector<std::string>{"--node-id", "n1"}}) {
    const testing::ToolResult r = Daemon(args).finish(milliseconds{20'000});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("this shardlockd was built without cluster support"), std::string::npos)
        << r.err;
  }
}

TEST_F(ShardlockdTest, SecondDaemonOnTheSameDataDirIsRefused) {
  const std::string dir = root_ + "/data";
  Daemon first({"--listen", "127.0.0.1:0", "--data-dir", dir, "--lock-delay", "0"});
  ASSERT_NE(ready_port(first.read_line()), 0);
  Daemon second({"--listen", "127.0.0.1:0", "--data-dir", dir, "--lock-delay", "0"});
  EXPECT_EQ(second.wait(), 1);
  EXPECT_NE(second.read_stderr().find("in use by another server"), std::string::npos);
}

// A stray second daemon on a served port (here with SO_REUSEPORT, another
// data dir) would split the lease table: it must exit 1 naming the address.
TEST_F(ShardlockdTest, SecondDaemonOnAServedPortIsRefused) {
  Daemon first({"--listen", "127.0.0.1:0", "--data-dir", root_ + "/a", "--lock-delay", "0",
                "--io-threads", "2"});
  const std::uint16_t port = ready_port(first.read_line());
  ASSERT_NE(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  for (const char* threads : {"2", "1"}) {
    Daemon second({"--listen", address, "--data-dir", root_ + "/b", "--lock-delay", "0",
                   "--io-threads", threads});
    const auto result = second.finish(milliseconds{20'000});  // a second server would not exit
    EXPECT_EQ(result.exit_code, 1);
    const std::string& log = result.err;
    EXPECT_NE(log.find("cannot start"), std::string::npos) << log;
    EXPECT_NE(log.find(address), std::string::npos) << log;
  }
  UdpTestPeer peer(port);
  EXPECT_EQ(peer.acquire("first-still-serves", 1000).type, MessageType::kGranted);
  first.signal(SIGTERM);
  EXPECT_EQ(first.wait(), 0);
}

// A daemon stopped with SIGTERM hands its port back before it exits, so a
// restart on the same port (systemd Restart=, an operator) binds at once.
// io_uring kept the socket open past exit while a receive was still armed.
TEST_F(ShardlockdTest, ARestartOnTheSamePortBindsAtOnce) {
  std::uint16_t port = 0;
  for (int restart = 0; restart < 4; ++restart) {
    const std::string listen = "127.0.0.1:" + std::to_string(port);
    Daemon daemon({"--listen", listen, "--data-dir", root_ + "/restart", "--lock-delay", "0"});
    const std::uint16_t bound = ready_port(daemon.read_line());
    ASSERT_NE(bound, 0) << "restart " << restart << " on " << listen;
    port = bound;
    UdpTestPeer peer(port);
    EXPECT_EQ(peer.acquire("k" + std::to_string(restart), 1000).type, MessageType::kGranted);
    daemon.signal(SIGTERM);
    EXPECT_EQ(daemon.wait(), 0);
  }
}

// ---- shardlockd as a service --------------------------------------------

const std::string kKeyText = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";

void write_key(const std::string& path, mode_t mode) {
  std::ofstream(path, std::ios::trunc) << kKeyText;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

// The lines of `log` that are not empty.
std::vector<std::string> lines_of(const std::string& log) {
  std::vector<std::string> lines;
  std::size_t at = 0;
  while (at < log.size()) {
    const std::size_t end = std::min(log.find('\n', at), log.size());
    if (end > at) lines.push_back(log.substr(at, end - at));
    at = end + 1;
  }
  return lines;
}

// Every line "TIMESTAMP LEVEL shardlockd: MESSAGE", at the given levels only.
TEST_F(ShardlockdTest, LogLinesCarryATimestampAndALevel) {
  static const std::regex kLine(
      R"re(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (error|warning|info|debug) shardlockd: .+$)re");
  {
    Daemon d({"--listen", "127.0.0.1:0", "--lock-delay", "0", "--io", "socket"});
    ASSERT_NE(ready_port(d.read_line()), 0);
    d.signal(SIGTERM);
    EXPECT_EQ(d.wait(), 0);
    const std::string log = d.read_stderr();
    for (const std::string& line : lines_of(log)) {
      EXPECT_TRUE(std::regex_match(line, kLine)) << line;
    }
    // The server's own "warning: " becomes the level.
    EXPECT_NE(log.find(" warning shardlockd: lock-delay is 0"), std::string::npos) << log;
    EXPECT_NE(log.find(" info shardlockd: listening on 127.0.0.1:"), std::string::npos) << log;
    EXPECT_NE(log.find(" info shardlockd: granting: the lock-delay is over"), std::string::npos)
        << log;
  }
  {
    Daemon d({"--listen", "127.0.0.1:0", "--lock-delay", "0", "--io", "socket", "--log-level",
              "warning"});
    ASSERT_NE(ready_port(d.read_line()), 0);
    d.signal(SIGTERM);
    EXPECT_EQ(d.wait(), 0);
    const std::string log = d.read_stderr();
    const auto lines = lines_of(log);
    ASSERT_FALSE(lines.empty()) << log;
    for (const std::string& line : lines) {
      EXPECT_NE(line.find(" warning shardlockd: "), std::string::npos) << line;
    }
  }
  {
    // debug adds what it tells the service manager.
    const std::string notify_path = root_ + "/notify";
    const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof address.sun_path, "%s", notify_path.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
    Daemon d({"--listen", "127.0.0.1:0", "--lock-delay", "0", "--log-level", "debug"},
             {"NOTIFY_SOCKET=" + notify_path});
    ASSERT_NE(ready_port(d.read_line()), 0);
    d.signal(SIGTERM);
    EXPECT_EQ(d.wait(), 0);
    const std::string log = d.read_stderr();
    EXPECT_NE(log.find(" debug shardlockd: told the service manager: READY=1"), std::string::npos)
        << log;
    ::close(fd);
  }
  for (const char* bad : {"verbose", "INFO", ""}) {
    const auto r = Daemon({"--log-level", bad}).finish(milliseconds{20'000});
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
    EXPECT_NE(r.err.find("--log-level"), std::string::npos) << r.err;
  }
}

// /bin/sh arguments that run shardlockd with `args` and $JOURNAL_STREAM
// naming its stderr (the pipe the test reads), as systemd names its stream.
std::vector<std::string> under_journald(std::vector<std::string> args) {
  args.insert(args.begin(),
              {"-c",
               R"(JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2) && export JOURNAL_STREAM && )"
               R"(exec "$0" "$@")",
               kDaemon});
  return args;
}

// With stderr connected to journald, lines carry a syslog priority instead
// of a timestamp and level word.
TEST_F(ShardlockdTest, UnderJournaldLinesCarryASyslogPriority) {
  testing::ChildProcess d("/bin/sh", under_journald({"--listen", "127.0.0.1:0", "--lock-delay", "0",
                                                     "--io", "socket"}));
  ASSERT_NE(ready_port(d.read_line(milliseconds{20'000})), 0);
  d.signal(SIGTERM);
  EXPECT_EQ(d.wait(), 0);
  const std::string log = d.read_stderr();
  const auto lines = lines_of(log);
  ASSERT_FALSE(lines.empty());
  for (const std::string& line : lines) {
    EXPECT_TRUE(std::regex_match(line, std::regex(R"re(^<[3-7]>[^<].*$)re"))) << line;
  }
  EXPECT_NE(log.find("<4>lock-delay is 0"), std::string::npos) << log;
  EXPECT_NE(log.find("<6>listening on 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("<6>stopped"), std::string::npos) << log;

  // A usage error after the flags parse (here an unreadable key) is an error
  // too, not a line at the journal's default priority.
  testing::ChildProcess bad(
      "/bin/sh", under_journald({"--listen", "127.0.0.1:0", "--auth-key", root_ + "/missing.key"}));
  const testing::ToolResult r = bad.finish(milliseconds{20'000});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("<3>shardlockd: --auth-key: cannot read key file", 0), 0u) << r.err;
}

// Datagrams the server refuses are logged as counts, at most once per
// --log-summary-interval (the first news at once, what is left at the stop),
// each summary counting from the one before.
TEST_F(ShardlockdTest, RefusedAndMalformedTrafficIsSummarised) {
  Daemon d({"--listen", "127.0.0.1:0", "--lock-delay", "0", "--io", "socket",
            "--log-summary-interval", "1h"});
  const std::uint16_t port = ready_port(d.read_line());
  ASSERT_NE(port, 0);
  UdpTestPeer peer(port);
  // A server without a key drops a sealed datagram as an authentication
  // failure; four bytes are no datagram at all.
  const auto sealed = [&] {
    Message m;
    m.type = MessageType::kAcquire;
    m.key = "sealed";
    m.ttl_ms = 1000;
    m.request_id = peer.next_id();
    Datagram datagram;
    (void)datagram.push(m);
    datagram.request_id = m.request_id;
    datagram.client_id = peer.id();
    std::vector<std::uint8_t> bytes(kMaxDatagramSize);
    std::size_t n = 0;
    EXPECT_EQ(encode(datagram, bytes, n), ProtocolError::kOk);
    n = seal_datagram(bytes, n, *parse_auth_key(kKeyText));
    EXPECT_NE(n, 0u);
    bytes.resize(n);
    return bytes;
  };
  const std::vector<std::uint8_t> garbage = {0xde, 0xad, 0xbe, 0xef};
  peer.send_raw(sealed());
  peer.send_raw(garbage);
  // One socket, one I/O thread: once this is answered, the two above were
  // counted.
  ASSERT_EQ(peer.acquire("sync/1", 1000).type, MessageType::kGranted);
  std::string first;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (first.find("refused or dropped traffic") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    first += d.read_stderr();
  }
  EXPECT_NE(first.find(" warning shardlockd: refused or dropped traffic in the last "),
            std::string::npos)
      << first;
  EXPECT_NE(first.find("1 auth_failures ("), std::string::npos) << first;
  // The daemon's loop may take its first look between the two datagrams
  // (seen under TSan: "1 auth_failures" alone, 0.0 s after the start): the
  // garbage is then news for the summary at the stop.
  const bool malformed_told = first.find("1 malformed (") != std::string::npos;

  // Within the hour: nothing until the stop, which reports only the news.
  peer.send_raw(garbage);
  peer.send_raw(garbage);
  ASSERT_EQ(peer.acquire("sync/2", 1000).type, MessageType::kGranted);
  d.signal(SIGTERM);
  EXPECT_EQ(d.wait(), 0);
  const std::string rest = d.read_stderr();
  const auto summary = rest.find("refused or dropped traffic");
  ASSERT_NE(summary, std::string::npos) << rest;
  EXPECT_EQ(rest.find("refused or dropped traffic", summary + 1), std::string::npos) << rest;
  EXPECT_NE(rest.find(malformed_told ? "2 malformed (" : "3 malformed ("), std::string::npos)
      << rest;
  EXPECT_EQ(rest.find("auth_failures"), std::string::npos) << rest;
  EXPECT_LT(summary, rest.find("stopped")) << rest;
}

// A UNIX datagram socket standing in for systemd's $NOTIFY_SOCKET.
class NotifySocket {
 public:
  // `name`: a path, or "@name" in the abstract namespace.
  explicit NotifySocket(std::string name) : name_(std::move(name)) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, name_.data(), name_.size());
    if (name_[0] == '@') address.sun_path[0] = '\0';
    const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name_.size());
    EXPECT_EQ(::bind(fd_, reinterpret_cast<const sockaddr*>(&address), length), 0) << name_;
  }
  ~NotifySocket() { ::close(fd_); }
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;
  std::string env() const { return "NOTIFY_SOCKET=" + name_; }
  // The next notification, or "" after `timeout`.
  std::string next(milliseconds timeout = milliseconds{20'000}) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return {};
    char buffer[4096];
    const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
    return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : std::string{};
  }

 private:
  std::string name_;
  int fd_ = -1;
};

// Type=notify: READY=1 once the socket is bound and the data dir loaded,
// STATUS= in the lock-delay and again when granting starts, STOPPING=1 at
// SIGTERM; through a path and through an abstract socket.
TEST_F(ShardlockdTest, NotifiesTheServiceManager) {
  for (const std::string& name :
       {root_ + "/notify", "@shardlockd-test-" + std::to_string(::getpid())}) {
    NotifySocket manager(name);
    Daemon d({"--listen", "127.0.0.1:0", "--lock-delay", "1500ms", "--io", "socket", "--data-dir",
              root_ + "/data"},
             {manager.env()});
    const std::string line = d.read_line();
    const std::uint16_t port = ready_port(line);
    ASSERT_NE(port, 0) << line;
    const auto end = ready_lock_delay_end(line);
    ASSERT_TRUE(end) << line;
    const std::string ready = manager.next();
    EXPECT_EQ(ready, "READY=1\nSTATUS=in its lock-delay until " + end->text +
                         ": ACQUIRE is answered RECOVERING; listening on 127.0.0.1:" +
                         std::to_string(port))
        << name;
    const std::string granting = manager.next();
    EXPECT_EQ(granting, "STATUS=granting: the lock-delay is over; listening on 127.0.0.1:" +
                            std::to_string(port))
        << name;
    UdpTestPeer peer(port);
    EXPECT_EQ(peer.acquire("after-ready", 1000).type, MessageType::kGranted);
    d.signal(SIGTERM);
    EXPECT_EQ(manager.next(), "STOPPING=1\nSTATUS=stopping") << name;
    EXPECT_EQ(d.wait(), 0);
  }
}

// SIGHUP (a closed terminal, `systemctl kill -s HUP`) is logged and ignored.
TEST_F(ShardlockdTest, SighupDoesNotStopIt) {
  Daemon d({"--listen", "127.0.0.1:0", "--lock-delay", "0", "--io", "socket"});
  const std::uint16_t port = ready_port(d.read_line());
  ASSERT_NE(port, 0);
  UdpTestPeer peer(port);
  ASSERT_EQ(peer.acquire("before-hup", 1000).type, MessageType::kGranted);
  d.signal(SIGHUP);
  d.signal(SIGHUP);
  std::string log;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (log.find("received SIGHUP") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    log += d.read_stderr();
  }
  EXPECT_NE(log.find("received SIGHUP: ignored"), std::string::npos) << log;
  EXPECT_EQ(peer.acquire("after-hup", 1000).type, MessageType::kGranted);
  d.signal(SIGTERM);
  EXPECT_EQ(d.wait(), 0);
}

// LoadCredential=auth.key:/etc/shardlockd/auth.key hands a DynamicUser
// service the key in $CREDENTIALS_DIRECTORY; --auth-key auth.key finds it.
TEST_F(ShardlockdTest, TheAuthKeyMayBeASystemdCredential) {
  const std::string credentials = root_ + "/credentials";
  fs::create_directories(credentials);
  write_key(credentials + "/auth.key", 0400);
  {
    Daemon d({"--listen", "127.0.0.1:0", "--lock-delay", "0", "--auth-key", "auth.key"},
             {"CREDENTIALS_DIRECTORY=" + credentials});
    const std::string line = d.read_line();
    ASSERT_NE(ready_port(line), 0) << line;
    EXPECT_NE(line.find("\"auth\":true"), std::string::npos) << line;
    d.signal(SIGTERM);
    EXPECT_EQ(d.wait(), 0);
    const std::string log = d.read_stderr();
    EXPECT_NE(log.find("--auth-key auth.key: the systemd credential " + credentials + "/auth.key"),
              std::string::npos)
        << log;
    EXPECT_EQ(log.find("accessible by other users"), std::string::npos) << log;
  }
  {
    // Without the directory the name is only a (missing) file, and the
    // error says where else it looked.
    const auto r =
        Daemon({"--listen", "127.0.0.1:0", "--auth-key", "auth.key"}).finish(milliseconds{20'000});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("$CREDENTIALS_DIRECTORY is not set"), std::string::npos) << r.err;
  }
  {
    const auto r = Daemon({"--listen", "127.0.0.1:0", "--auth-key", "other.key"},
                          {"CREDENTIALS_DIRECTORY=" + credentials})
                       .finish(milliseconds{20'000});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("nor is it a credential in $CREDENTIALS_DIRECTORY"), std::string::npos)
        << r.err;
  }
}

// A key file other users can read is served, with a warning (OpenSSH's rule:
// any group or other permission); 0600 is quiet.
TEST_F(ShardlockdTest, WarnsAboutAKeyFileOthersCanRead) {
  for (const mode_t mode : {0644, 0640, 0600}) {
    const std::string key = root_ + "/auth.key";
    write_key(key, mode);
    Daemon d({"--listen", "127.0.0.1:0", "--lock-delay", "0", "--auth-key", key});
    const std::string line = d.read_line();
    ASSERT_NE(ready_port(line), 0) << line;
    d.signal(SIGTERM);
    EXPECT_EQ(d.wait(), 0);
    const std::string log = d.read_stderr();
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mode));
    const bool warned =
        log.find(" warning shardlockd: --auth-key " + key + " is accessible by other users (mode " +
                 octal + ")") != std::string::npos;
    EXPECT_EQ(warned, mode != 0600) << octal << ": " << log;
  }
}

// The replication stream is sealed with a cluster key that
// clients never hold. --replicas outside loopback without one, or with the
// clients' --auth-key as the cluster key, is a usage error; on loopback it
// is optional (tests, one host).
TEST_F(ShardlockdTest, ReplicasOutsideLoopbackNeedAClusterKeyOfTheirOwn) {
  if (!daemon_has_cluster()) GTEST_SKIP() << "shardlockd was built without the cluster layer";
  const std::string key = root_ + "/cluster.key";
  std::ofstream(key, std::ios::trunc) << kKeyText;
  ASSERT_EQ(::chmod(key.c_str(), 0600), 0);
  const std::string other = root_ + "/client.key";
  std::ofstream(other, std::ios::trunc)
      << "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100\n";
  ASSERT_EQ(::chmod(other.c_str(), 0600), 0);
  auto node = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "--cluster",     "etcd://127.0.0.1:1", "--node-id", "n1",   "--data-dir",
        root_ + "/data", "--replicas",         "2",         "--io", "socket"};
    args.insert(args.end(), extra.begin(), extra.end());
    return Daemon(args).finish(milliseconds{20'000});
  };
  testing::ToolResult r = node({"--listen", "0.0.0.0:0"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("needs --cluster-key FILE outside loopback"), std::string::npos) << r.err;
  r = node({"--listen", "127.0.0.1:0", "--advertise", "10.1.2.3:7420"});
  EXPECT_EQ(r.exit_code, 2) << "advertised beyond loopback: " << r.err;
  r = node({"--listen", "0.0.0.0:0", "--cluster-key", key, "--auth-key", key});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--cluster-key is the --auth-key"), std::string::npos) << r.err;
  // Its own key, or loopback: the flags pass (nothing answers at etcd's port 1).
  r = node({"--listen", "0.0.0.0:0", "--cluster-key", key, "--auth-key", other});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("cannot join the cluster"), std::string::npos) << r.err;
  r = node({"--listen", "127.0.0.1:0"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
}

// --tenants FILE: a bad file is a usage error naming its line and column; a
// good one is served, and SIGHUP reloads it (a tenant added is served, a
// lease held is kept) or, when the new file is bad, keeps the one in force.
TEST_F(ShardlockdTest, TheTenantFileIsCheckedAtStartAndReloadedOnSighup) {
  const std::string file = root_ + "/tenants";
  const lease::AuthKey a = lease::generate_auth_key();
  const lease::AuthKey b = lease::generate_auth_key();
  const std::string tenant_a = "tenant a id=1 key=" + lease::format_auth_key(a) +
                               "\nallow a \"a/\" acquire\n";
  const auto write = [&](const std::string& text) {
    std::ofstream(file, std::ios::trunc) << text;
    ::chmod(file.c_str(), 0600);
  };
  write(tenant_a + "tenant b id=1 key=" + lease::format_auth_key(b) + "\n");
  {
    const auto r = Daemon({"--listen", "127.0.0.1:0", "--tenants", file}).finish(milliseconds{20'000});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(file + ":3:"), std::string::npos) << r.err;  // the duplicate id
  }
  write(tenant_a);
  Daemon d({"--listen", "127.0.0.1:0", "--lock-delay", "0", "--tenants", file});
  const std::string line = d.read_line();
  const std::uint16_t port = ready_port(line);
  ASSERT_NE(port, 0) << line;
  EXPECT_NE(line.find("\"tenants\":1"), std::string::npos) << line;
  const auto client = [&](std::uint32_t tenant, const lease::AuthKey& key) {
    lease::LeaseClientOptions o;
    o.nodes = {"127.0.0.1:" + std::to_string(port)};
    o.auth_key = key;
    o.tenant = tenant;
    o.request_timeout = milliseconds{800};
    auto c = std::make_unique<lease::LeaseClient>(o);
    EXPECT_FALSE(c->start()) << c->error_detail();
    return c;
  };
  auto ca = client(1, a);
  auto held = ca->acquire("a/held", milliseconds{30'000}, milliseconds{0});
  ASSERT_TRUE(held) << held.error.message();
  auto cb = client(2, b);
  EXPECT_EQ(cb->acquire("b/x", milliseconds{5000}, milliseconds{0}).error,
            lease::LeaseErrc::kUnreachable);

  const auto log_until = [&](const std::string& text) {
    std::string log;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (log.find(text) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      log += d.read_stderr();
    }
    return log;
  };
  write(tenant_a + "tenant b id=2 key=" + lease::format_auth_key(b) + "\nallow b \"b/\" acquire\n");
  d.signal(SIGHUP);
  std::string log = log_until("reloaded 2 tenant(s)");
  EXPECT_NE(log.find("reloaded 2 tenant(s) from " + file), std::string::npos) << log;
  auto granted = cb->acquire("b/x", milliseconds{5000}, milliseconds{0});
  EXPECT_TRUE(granted) << granted.error.message();
  EXPECT_FALSE(held.lease.renew(milliseconds{30'000})) << "a lease held across the reload";

  write("tenant broken\n");
  d.signal(SIGHUP);
  log = log_until("kept the tenants in force");
  EXPECT_NE(log.find("kept the tenants in force"), std::string::npos) << log;
  EXPECT_TRUE(cb->acquire("b/y", milliseconds{5000}, milliseconds{0}));
  EXPECT_FALSE(held.lease.release());
  d.signal(SIGTERM);
  EXPECT_EQ(d.wait(), 0);
}

}  // namespace
}  // namespace shardlock::lease
