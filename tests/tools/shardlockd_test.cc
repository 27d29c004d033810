// shardlockd as a process: flags, the ready line, clean stop, and the crash
// test - kill -9 a daemon with a data dir, restart it, and every new token
// exceeds every token issued before, with RECOVERING during lock-delay.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tools/client_tool_support.h"
#include "lease/udp_test_peer.h"

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
  explicit Daemon(std::vector<std::string> args) : ChildProcess(kDaemon, std::move(args)) {}
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
      R"re("lock_delay_remaining_s":(\d+\.\d{3}),)re");
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

}  // namespace
}  // namespace shardlock::lease
