// shardlock-bench as a process: a short run against its embedded server, an
// external server and the in-process LockTable each exit 0 with one
// well-formed JSON result; bad flags are usage errors.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "client_tool_support.h"
#include "shardlock/lease/server.h"

namespace shardlock::lease {
namespace {

using namespace std::chrono_literals;
using testing::Json;
using testing::json_line;
using testing::run_tool;

const std::string kBench = SHARDLOCK_TOOL_SHARDLOCK_BENCH;

// The fields every result carries, with the invariants between them.
void expect_well_formed(const Json& j, const std::string& mode) {
  ASSERT_EQ(j.kind, Json::Kind::kObject);
  for (const char* field : {"mode", "target", "duration_s", "clients", "keys", "theta", "ttl_ms",
                            "batch", "ops", "ops_per_s", "pairs", "pairs_per_s", "grants", "busy",
                            "errors", "allocator", "latency_us", "pair_latency_us"}) {
    EXPECT_TRUE(j.has(field)) << field;
  }
  EXPECT_EQ(j["mode"].text, mode);
  EXPECT_GT(j["duration_s"].number, 0.5);
  EXPECT_GT(j["ops"].number, 0);
  EXPECT_GT(j["grants"].number, 0);
  EXPECT_LE(j["pairs"].number, j["grants"].number);
  for (const char* histogram : {"latency_us", "pair_latency_us"}) {
    const Json& h = j[histogram];
    ASSERT_EQ(h.kind, Json::Kind::kObject) << histogram;
    EXPECT_GT(h["count"].number, 0) << histogram;
    EXPECT_LE(h["p50"].number, h["p90"].number);
    EXPECT_LE(h["p90"].number, h["p99"].number);
    EXPECT_LE(h["p99"].number, h["p999"].number);
    EXPECT_LE(h["p999"].number, h["max"].number);
  }
}

TEST(ShardlockBenchTest, ShortEmbeddedRunPrintsOneJsonResult) {
  const auto r =
      run_tool(kBench, {"--duration", "1s", "--json", "--clients", "4", "--keys", "1000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = json_line(r);
  ASSERT_TRUE(j) << "not one JSON line: " << r.out;
  expect_well_formed(*j, "lease");
  EXPECT_EQ((*j)["clients"].number, 4);
  EXPECT_EQ((*j)["keys"].number, 1000);
  EXPECT_NE((*j)["target"].text.find("embedded 127.0.0.1:"), std::string::npos);
}

TEST(ShardlockBenchTest, BatchedRunAgainstAnExternalServer) {
  LeaseServerOptions options;
  options.lock_delay = 0ms;
  options.log = [](std::string_view) {};
  LeaseServer server(options);
  ASSERT_FALSE(server.start()) << server.error_detail();
  const auto r = run_tool(kBench, {"--server", server.listen_address(), "--duration", "1s",
                                   "--json", "--clients", "2", "--batch", "8", "--theta", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = json_line(r);
  ASSERT_TRUE(j) << r.out;
  expect_well_formed(*j, "lease");
  EXPECT_EQ((*j)["batch"].number, 8);
  EXPECT_EQ((*j)["target"].text, server.listen_address());
  // The server saw the grants the bench counted (plus any still in flight
  // when the run ended).
  EXPECT_GE(static_cast<double>(server.stats().counter(StatCounter::kGrants)),
            (*j)["grants"].number);
}

// Owners' requests share datagrams by default; --pack 1 sends one request
// per datagram. Either way every owner keeps one request in flight.
TEST(ShardlockBenchTest, PackSetsRequestsPerDatagram) {
  for (const char* pack : {"1", "64"}) {
    const auto r =
        run_tool(kBench, {"--duration", "1s", "--json", "--clients", "8", "--pack", pack});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = json_line(r);
    ASSERT_TRUE(j) << r.out;
    expect_well_formed(*j, "lease");
    EXPECT_EQ((*j)["pack"].number, std::stod(pack));
    const double per_datagram =
        ((*j)["ops"].number + (*j)["retransmissions"].number) / (*j)["datagrams_sent"].number;
    if (std::string(pack) == "1") {
      EXPECT_LE(per_datagram, 1.0 + 1e-9);
    }
  }
  EXPECT_EQ(run_tool(kBench, {"--pack", "0"}).exit_code, 2);
  EXPECT_EQ(run_tool(kBench, {"--pack", "65"}).exit_code, 2);
}

TEST(ShardlockBenchTest, AuthenticatedEmbeddedRun) {
  const auto r = run_tool(kBench, {"--duration", "1s", "--json", "--clients", "2", "--auth"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = json_line(r);
  ASSERT_TRUE(j) << r.out;
  expect_well_formed(*j, "lease");
  EXPECT_TRUE((*j)["auth"].boolean);
  EXPECT_EQ((*j)["errors"].number, 0);
  // --auth makes a key for the embedded server only.
  EXPECT_EQ(run_tool(kBench, {"--server", "127.0.0.1:9", "--auth"}).exit_code, 2);
  EXPECT_EQ(run_tool(kBench, {"--auth-key", "/nonexistent/key"}).exit_code, 2);
}

TEST(ShardlockBenchTest, TableModeRunsTheInProcessLockTable) {
  const auto r =
      run_tool(kBench, {"--mode", "table", "--duration", "1s", "--json", "--clients", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = json_line(r);
  ASSERT_TRUE(j) << r.out;
  expect_well_formed(*j, "table");
}

TEST(ShardlockBenchTest, TableOutputWithoutJson) {
  const auto r = run_tool(kBench, {"--duration", "1s", "--clients", "2", "--keys", "100"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* text : {"ops/s", "grants", "busy answers", "p50", "p90", "p99", "p999"}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << text << " missing from:\n" << r.out;
  }
  EXPECT_NE(r.err.find("lock-delay 0"), std::string::npos) << r.err;
}

TEST(ShardlockBenchTest, BadFlagsAreUsageErrors) {
  EXPECT_EQ(run_tool(kBench, {"--duration", "ten"}).exit_code, 2);
  EXPECT_EQ(run_tool(kBench, {"--mode", "bogus"}).exit_code, 2);
  EXPECT_EQ(run_tool(kBench, {"--batch", "0"}).exit_code, 2);
  EXPECT_EQ(run_tool(kBench, {"--no-such-flag"}).exit_code, 2);
  const auto help = run_tool(kBench, {"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--server"), std::string::npos);
}

TEST(ShardlockBenchTest, UnreachableServerFailsFast) {
  // Port 9 (discard) on loopback: nothing answers.
  const auto r =
      run_tool(kBench, {"--server", "127.0.0.1:9", "--duration", "1s", "--json", "--clients", "1"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
}

}  // namespace
}  // namespace shardlock::lease
