// shardlock-bench as a process: a short run against its embedded server, an
// external server and the in-process LockTable, keyless, sealed, as a
// tenant and encrypted, each exit 0 with one well-formed JSON result; bad flags are usage errors; a
// run the server refuses fails loudly (exit 4, the cause on stderr).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardlock/lease/server/server.h"
#include "shardlock/lease/tenants.h"
#include "shardlock/lease/wire/auth.h"
#include "shardlock/lease/wire/envelope.h"
#include "support/loopback_server.h"
#include "tools/client_tool_support.h"

namespace shardlock::lease {
namespace {

using namespace std::chrono_literals;
using shardlock::test_support::loopback_options;
using shardlock::test_support::start_loopback_server;
using testing::Json;
using testing::json_line;
using testing::run_tool;

const std::string kBench = SHARDLOCK_TOOL_SHARDLOCK_BENCH;

// The fields every result carries, with the invariants between them.
void expect_well_formed(const Json& j, const std::string& mode) {
  ASSERT_EQ(j.kind, Json::Kind::kObject);
  for (const char* field :
       {"mode",           "target",      "duration_s", "clients",   "keys",
        "theta",          "ttl_ms",      "batch",      "ops",       "ops_per_s",
        "pairs",          "pairs_per_s", "grants",     "busy",      "errors",
        "errors_by_kind", "first_error", "ok",         "allocator", "latency_us",
        "pair_latency_us"}) {
    EXPECT_TRUE(j.has(field)) << field;
  }
  EXPECT_EQ(j["mode"].text, mode);
  EXPECT_TRUE(j["ok"].boolean);
  ASSERT_EQ(j["errors_by_kind"].kind, Json::Kind::kObject);
  double by_kind = 0;
  for (const auto& [kind, count] : j["errors_by_kind"].fields) by_kind += count.number;
  EXPECT_EQ(by_kind, j["errors"].number) << "the breakdown sums to the errors";
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

// Runs the bench with `args`, expects a usage error (exit 2), and returns
// its stderr.
std::string usage(const std::vector<std::string>& args) {
  const auto r = run_tool(kBench, args);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  return r.err;
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
  EXPECT_EQ((*j)["errors"].number, 0);
  EXPECT_TRUE((*j)["errors_by_kind"].fields.empty());
  EXPECT_EQ((*j)["first_error"].kind, Json::Kind::kNull);
  // A strict parser (nlohmann's refuses invalid UTF-8 and stray commas)
  // reads the same object, its numbers at the precision they always had.
  nlohmann::json strict;
  ASSERT_NO_THROW(strict = nlohmann::json::parse(r.out)) << r.out;
  EXPECT_EQ(strict["clients"], 4);
  EXPECT_TRUE(strict["ops_per_s"].is_number());
  const double duration = strict["duration_s"].get<double>();
  EXPECT_DOUBLE_EQ(duration, std::round(duration * 1000) / 1000);
}

// The reported case: every ACQUIRE is refused (ERROR ttl out of range), so
// the run measured refusals. It must not pass for a result: exit 4, the
// server's error on stderr, ok:false and the breakdown in the JSON.
TEST(ShardlockBenchTest, TtlAboveTheServersMaximumFailsLoudly) {
  LeaseServerOptions options = loopback_options();
  options.max_ttl = 1s;
  const auto server = start_loopback_server(options);
  ASSERT_NE(server, nullptr);
  const auto r = run_tool(kBench, {"--server", server->listen_address(), "--duration", "1s",
                                   "--json", "--clients", "2", "--ttl", "5s"});
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("ttl out of range"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--max-ttl"), std::string::npos) << r.err;
  const auto j = json_line(r);
  ASSERT_TRUE(j) << r.out;
  EXPECT_FALSE((*j)["ok"].boolean);
  EXPECT_EQ((*j)["grants"].number, 0);
  EXPECT_GT((*j)["errors"].number, 0);
  EXPECT_EQ((*j)["errors_by_kind"]["ttl_out_of_range"].number, (*j)["errors"].number);
  EXPECT_NE((*j)["first_error"].text.find("ttl out of range"), std::string::npos);

  // The table says it too, and still exits 4.
  const auto table = run_tool(kBench, {"--server", server->listen_address(), "--duration", "1s",
                                       "--clients", "2", "--ttl", "5s"});
  EXPECT_EQ(table.exit_code, 4) << table.err;
  EXPECT_NE(table.out.find("ttl_out_of_range"), std::string::npos) << table.out;
  EXPECT_NE(table.err.find("ttl out of range"), std::string::npos) << table.err;
  EXPECT_NE(run_tool(kBench, {"--help"}).out.find("4 errors dominated"), std::string::npos);
}

// A server in its lock-delay answers every ACQUIRE RECOVERING: nothing is
// granted, and the message says why.
TEST(ShardlockBenchTest, AServerInItsLockDelayFailsTheRun) {
  LeaseServerOptions options = loopback_options();
  options.lock_delay = 60s;
  const auto server = start_loopback_server(options);
  ASSERT_NE(server, nullptr);
  const auto r = run_tool(kBench, {"--server", server->listen_address(), "--duration", "1s",
                                   "--json", "--clients", "2"});
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("recovering: the server is in its lock-delay"), std::string::npos) << r.err;
  const auto j = json_line(r);
  ASSERT_TRUE(j) << r.out;
  EXPECT_FALSE((*j)["ok"].boolean);
  EXPECT_GT((*j)["errors_by_kind"]["recovering"].number, 0);
}

TEST(ShardlockBenchTest, BatchedRunAgainstAnExternalServer) {
  const auto server = start_loopback_server();
  ASSERT_NE(server, nullptr);
  const auto r = run_tool(kBench, {"--server", server->listen_address(), "--duration", "1s",
                                   "--json", "--clients", "2", "--batch", "8", "--theta", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = json_line(r);
  ASSERT_TRUE(j) << r.out;
  expect_well_formed(*j, "lease");
  EXPECT_EQ((*j)["batch"].number, 8);
  EXPECT_EQ((*j)["target"].text, server->listen_address());
  // The server saw the grants the bench counted (plus any still in flight
  // when the run ended).
  EXPECT_GE(static_cast<double>(server->stats().counter(StatCounter::kGrants)),
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

// A --tenant run (with --encrypt when `encrypt`) that must complete: exit 0,
// one well-formed result named for its security, not one error.
std::optional<Json> expect_tenant_run(std::vector<std::string> args, bool encrypt) {
  if (encrypt) args.emplace_back("--encrypt");
  const auto r = run_tool(kBench, args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto j = json_line(r);
  if (!j) {
    ADD_FAILURE() << "not one JSON line: " << r.out;
    return std::nullopt;
  }
  expect_well_formed(*j, "lease");
  EXPECT_EQ((*j)["security"].text, encrypt ? "encrypt" : "tenant");
  EXPECT_EQ((*j)["errors"].number, 0);
  return j;
}

// --tenant and --encrypt against the embedded server: it serves that one
// tenant, and every datagram is sealed (and encrypted) as it.
TEST(ShardlockBenchTest, TenantAndEncryptedEmbeddedRuns) {
  for (const bool encrypt : {false, true}) {
    SCOPED_TRACE(encrypt ? "encrypt" : "tenant");
    const auto j = expect_tenant_run(
        {"--duration", "1s", "--json", "--clients", "4", "--pack", "1", "--tenant", "9"}, encrypt);
    ASSERT_TRUE(j);
    EXPECT_EQ((*j)["tenant"].number, 9);
    EXPECT_TRUE((*j)["auth"].boolean);
  }
  const auto keyless = run_tool(kBench, {"--duration", "0.5s", "--json", "--clients", "2"});
  ASSERT_EQ(keyless.exit_code, 0) << keyless.err;
  const auto j = json_line(keyless);
  ASSERT_TRUE(j) << keyless.out;
  EXPECT_EQ((*j)["security"].text, "keyless");
  EXPECT_EQ((*j)["tenant"].kind, Json::Kind::kNull);

  EXPECT_NE(usage({"--encrypt"}).find("--encrypt needs --tenant"), std::string::npos);
  EXPECT_NE(usage({"--server", "127.0.0.1:9", "--tenant", "1"}).find("--auth-key"),
            std::string::npos);
  usage({"--tenant", "1", "--auth"});
  usage({"--tenant", "-1"});
  usage({"--tenant", "4294967296"});
  usage({"--mode", "table", "--tenant", "1"});
  const auto help = run_tool(kBench, {"--help"});
  EXPECT_NE(help.out.find("--tenant"), std::string::npos);
  EXPECT_NE(help.out.find("--encrypt"), std::string::npos);
  EXPECT_NE(help.out.find("--cipher"), std::string::npos);
}

// --cipher picks the suite of a --tenant run, and the report names the one
// it used ("cipher"); auto is AES-GCM exactly where this CPU has it.
TEST(ShardlockBenchTest, CipherPicksTheTenantsSuite) {
  const bool aes = lease::aes_gcm_available();
  std::vector<std::pair<std::string, std::string>> runs = {{"portable", "portable"},
                                                           {"auto", aes ? "aes" : "portable"}};
  if (aes) runs.emplace_back("aes", "aes");
  for (const auto& [cipher, used] : runs) {
    SCOPED_TRACE(cipher);
    const auto j = expect_tenant_run({"--duration", "1s", "--json", "--clients", "2", "--pack", "1",
                                      "--tenant", "4", "--cipher", cipher},
                                     true);
    ASSERT_TRUE(j);
    EXPECT_EQ((*j)["cipher"].text, used);
  }
  const auto keyless = run_tool(kBench, {"--duration", "0.3s", "--json", "--clients", "1"});
  const auto j = json_line(keyless);
  ASSERT_TRUE(j) << keyless.out;
  EXPECT_EQ((*j)["cipher"].kind, Json::Kind::kNull);
  EXPECT_NE(usage({"--cipher", "aes"}).find("--cipher needs --tenant"), std::string::npos);
  usage({"--tenant", "1", "--cipher", "gcm"});
}

// Against an external server with a tenant table: --tenant ID --auth-key
// FILE [--encrypt], the server's tenant encrypted or not to match.
TEST(ShardlockBenchTest, TenantRunsAgainstAnExternalServer) {
  const AuthKey key = generate_auth_key();
  const std::string key_file =
      ::testing::TempDir() + "shardlock_bench_tenant_" + std::to_string(::getpid()) + ".key";
  {
    std::ofstream out(key_file);
    for (const std::uint8_t byte : key) {
      constexpr char kHex[] = "0123456789abcdef";
      out << kHex[byte >> 4] << kHex[byte & 0xF];
    }
    out << "\n";
  }
  ::chmod(key_file.c_str(), 0600);
  for (const bool encrypt : {false, true}) {
    SCOPED_TRACE(encrypt ? "encrypt" : "tenant");
    Tenant tenant;
    tenant.name = "bench";
    tenant.key_id = 3;
    tenant.key = key;
    tenant.encrypt = encrypt;
    tenant.rules.push_back(PrefixRule{"k:", Rights::kAcquire | Rights::kQueryWatch});
    std::vector<Tenant> tenants;
    tenants.push_back(std::move(tenant));
    TenantTableResult built = TenantTable::build(std::move(tenants));
    ASSERT_TRUE(built.ok()) << built.message();
    LeaseServerOptions options = loopback_options();
    options.tenants = std::move(built.table);
    const auto server = start_loopback_server(options);
    ASSERT_NE(server, nullptr);
    const auto j = expect_tenant_run(
        {"--server", server->listen_address(), "--duration", "1s", "--json", "--clients", "2",
         "--pack", "1", "--tenant", "3", "--auth-key", key_file},
        encrypt);
    ASSERT_TRUE(j);
    EXPECT_GE(static_cast<double>(server->stats().counter(StatCounter::kGrants)),
              (*j)["grants"].number);
  }
  std::remove(key_file.c_str());
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

TEST(ShardlockBenchTest, VersionAndTheOutputSwitch) {
  const auto version = run_tool(kBench, {"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.out.rfind("shardlock-bench ", 0), 0u) << version.out;
  // -w json is --json, as in shardlockctl; durations as people type them.
  const auto r = run_tool(kBench, {"--duration", "0.5", "-w", "json", "--clients", "2", "--keys",
                                   "100", "--ttl", "30"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(json_line(r)) << r.out;
}

TEST(ShardlockBenchTest, BadFlagsAreUsageErrors) {
  EXPECT_EQ(run_tool(kBench, {"--duration", "ten"}).exit_code, 2);
  EXPECT_EQ(run_tool(kBench, {"--mode", "bogus"}).exit_code, 2);
  EXPECT_EQ(run_tool(kBench, {"--batch", "0"}).exit_code, 2);
  EXPECT_EQ(run_tool(kBench, {"--no-such-flag"}).exit_code, 2);
  EXPECT_EQ(run_tool(kBench, {"--discover"}).exit_code, 2);  // seeds come from --server
  const auto help = run_tool(kBench, {"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--server"), std::string::npos);
  EXPECT_NE(help.out.find("--discover"), std::string::npos);
}

// --discover: the --server addresses are cluster seeds. A single server
// (no cluster node) gives no map, so the run cannot start: exit 3, as for a
// server that does not answer, naming the seed.
TEST(ShardlockBenchTest, DiscoverWithoutAClusterNodeDoesNotStart) {
  const auto server = start_loopback_server();
  ASSERT_NE(server, nullptr);
  const auto r = run_tool(kBench, {"--server", server->listen_address(), "--discover", "--duration",
                                   "1s", "--json", "--clients", "1"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find(server->listen_address()), std::string::npos) << r.err;
}

// --read-fraction: that share of the acquires is shared. All shared never
// meets a busy key; none shared sends no ACQUIRE_SHARED.
TEST(ShardlockBenchTest, ReadFractionMakesThatShareOfAcquiresShared) {
  for (const char* fraction : {"0", "0.5", "1"}) {
    SCOPED_TRACE(fraction);
    const auto r = run_tool(kBench, {"--duration", "1s", "--json", "--clients", "8", "--keys", "50",
                                     "--read-fraction", fraction});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = json_line(r);
    ASSERT_TRUE(j) << r.out;
    expect_well_formed(*j, "lease");
    EXPECT_EQ((*j)["read_fraction"].number, std::stod(fraction));
    EXPECT_EQ((*j)["keys_per_op"].number, 1);
    const double acquires = (*j)["acquires"].number;
    const double shared = (*j)["shared_acquires"].number;
    // The counters are read while the owners finish their last round, one
    // answer each at most: they may disagree by up to one per owner.
    constexpr double kInFlight = 8;
    EXPECT_NEAR(acquires, (*j)["grants"].number + (*j)["busy"].number + (*j)["errors"].number,
                kInFlight);
    EXPECT_EQ((*j)["errors"].number, 0);
    if (std::string(fraction) == "0") {
      EXPECT_EQ(shared, 0);
    } else if (std::string(fraction) == "1") {
      EXPECT_NEAR(shared, acquires, kInFlight);
      EXPECT_EQ((*j)["busy"].number, 0) << "shared holders never exclude each other";
    } else {
      EXPECT_GT(shared, 0);
      EXPECT_LT(shared, acquires);
    }
  }
}

// --keys-per-op: each acquire is one ACQUIRE_MANY; a pair is that acquire and
// its K releases, so the server granted K keys per counted grant.
TEST(ShardlockBenchTest, KeysPerOpAcquiresSeveralKeysAtOnce) {
  const auto server = start_loopback_server();
  ASSERT_NE(server, nullptr);
  const auto r = run_tool(
      kBench, {"--server", server->listen_address(), "--duration", "1s", "--json", "--clients", "4",
               "--keys", "200", "--keys-per-op", "4", "--read-fraction", "0.25"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = json_line(r);
  ASSERT_TRUE(j) << r.out;
  expect_well_formed(*j, "lease");
  EXPECT_EQ((*j)["keys_per_op"].number, 4);
  EXPECT_EQ((*j)["read_fraction"].number, 0.25);
  EXPECT_EQ((*j)["errors"].number, 0);
  // Every grant the bench counted was four keys on the server (plus any
  // still in flight when the run ended), and each op released key by key.
  EXPECT_GE(static_cast<double>(server->stats().counter(StatCounter::kGrants)),
            4 * (*j)["grants"].number);
  EXPECT_GE(static_cast<double>(server->stats().counter(StatCounter::kReleased)),
            4 * (*j)["pairs"].number);

  const auto table = run_tool(kBench, {"--duration", "1s", "--clients", "2", "--keys", "100",
                                       "--keys-per-op", "3", "--read-fraction", "0.5"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  for (const char* text : {"read fraction 0.50", "3 keys per acquire", "shared acquires"}) {
    EXPECT_NE(table.out.find(text), std::string::npos) << text << " missing from:\n" << table.out;
  }
}

TEST(ShardlockBenchTest, LeaseKindFlagsAreRangeChecked) {
  EXPECT_NE(usage({"--read-fraction", "1.5"}).find("--read-fraction"), std::string::npos);
  usage({"--read-fraction", "-0.1"});
  usage({"--read-fraction", "half"});
  EXPECT_NE(usage({"--keys-per-op", "0"}).find("--keys-per-op"), std::string::npos);
  usage({"--keys-per-op", "17"});
  EXPECT_NE(usage({"--keys-per-op", "2", "--batch", "4"}).find("--batch"), std::string::npos);
  usage({"--keys-per-op", "8", "--keys", "4"});
  usage({"--mode", "table", "--read-fraction", "0.5"});
  usage({"--mode", "table", "--keys-per-op", "2"});
  const auto help = run_tool(kBench, {"--help"});
  EXPECT_NE(help.out.find("--read-fraction"), std::string::npos);
  EXPECT_NE(help.out.find("--keys-per-op"), std::string::npos);
}

TEST(ShardlockBenchTest, UnreachableServerFailsFast) {
  // Port 9 (discard) on loopback: nothing answers.
  const auto r =
      run_tool(kBench, {"--server", "127.0.0.1:9", "--duration", "1s", "--json", "--clients", "1"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
}

}  // namespace
}  // namespace shardlock::lease
