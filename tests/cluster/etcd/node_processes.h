// node_processes.h: a fixture for end-to-end cluster tests that run real
// shardlockd nodes as processes against the suite's etcd (support/etcd_fixture.h),
// and cluster clients that reach them. Shared by client_failover_test and
// replication_e2e_test; a test that includes it must be registered with
// shardlockd among its tools (tests/CMakeLists.txt), which defines
// SHARDLOCK_TOOL_SHARDLOCKD.
//
//   class MyTest : public test_support::NodeProcessTest {};
//   TEST_F(MyTest, X) {
//     start_node("n1", {"--replicas", "2"});
//     auto client = client_with_members({"n1"});
//     ... nodes_.at("n1")->kill(); ...
//   }
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "shardlock/lease/client/client.h"
#include "support/daemon.h"
#include "support/etcd_fixture.h"
#include "support/process.h"

namespace shardlock::test_support {

// Starts shardlockd with `extra` flags on a loopback port, stderr to `log`,
// and returns the address from its ready line, or empty, with `why`, when
// none came.
inline std::string try_start_daemon(ChildProcess& process, const std::string& log,
                                    const std::vector<std::string>& extra, std::string& why) {
  using namespace std::chrono_literals;
  std::vector<std::string> argv = {SHARDLOCK_TOOL_SHARDLOCKD, "--listen", "127.0.0.1:0", "--io",
                                   "socket"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  ChildOptions wiring;
  wiring.stderr_path = log;
  return start_daemon(process, argv, wiring, 30s, why);
}

// try_start_daemon(), failing the test when the daemon does not start.
inline std::string start_daemon(ChildProcess& process, const std::string& log,
                                const std::vector<std::string>& extra) {
  std::string why;
  std::string address = try_start_daemon(process, log, extra, why);
  EXPECT_FALSE(address.empty()) << why;
  return address;
}

// ACQUIREs `key` through `c` until granted (RECOVERING, unreachable and
// REDIRECT answers are retried) or `give_up` passes, and releases it; the
// token, or nothing (the test failed).
inline std::optional<std::uint64_t> acquire_until_granted(
    lease::LeaseClient& c, const std::string& key,
    std::chrono::seconds give_up = std::chrono::seconds(30)) {
  using namespace std::chrono_literals;
  const auto deadline = std::chrono::steady_clock::now() + give_up;
  while (std::chrono::steady_clock::now() < deadline) {
    auto result = c.try_acquire(key, 2000ms);
    if (result) {
      const std::uint64_t token = result.lease.token();
      EXPECT_FALSE(result.lease.release());
      return token;
    }
    const auto e = static_cast<lease::LeaseErrc>(result.error.value());
    if (e != lease::LeaseErrc::kRecovering && e != lease::LeaseErrc::kUnreachable &&
        e != lease::LeaseErrc::kRedirected) {
      ADD_FAILURE() << key << ": " << result.error.message();
      return std::nullopt;
    }
    std::this_thread::sleep_for(50ms);
  }
  ADD_FAILURE() << key << " was not granted in " << give_up.count() << " s";
  return std::nullopt;
}

// One etcd per suite (EtcdSuiteTest), and per test a temporary directory
// for the nodes' data dirs and logs, removed after the test with every node
// still running killed (kept, and named, when the test failed).
class NodeProcessTest : public EtcdSuiteTest {
 protected:
  void SetUp() override {
    EtcdSuiteTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    char pattern[] = "/tmp/shardlock-nodes-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override {
    // A node the test did not kill that is gone died by itself: a crash, or
    // a sanitizer's report (TSan exits 66), which its log holds.
    for (const auto& [id, process] : nodes_) {
      if (process->running() && process->wait_for(std::chrono::milliseconds(0))) {
        ADD_FAILURE() << id << " exited by itself (wait status " << process->exit_status()
                      << "): see " << log_of(id);
      }
    }
    nodes_.clear();  // kills what is left
    if (root_.empty()) return;
    // SHARDLOCK_KEEP_NODE_LOGS=1 keeps them after a pass too (to compare).
    if (HasFailure() || std::getenv("SHARDLOCK_KEEP_NODE_LOGS") != nullptr) {
      std::cout << "kept the nodes' data dirs and logs for a look: " << root_ << "\n";
      return;
    }
    std::filesystem::remove_all(root_);
  }

  // Starts node `id` of the test's cluster and records its listen address.
  // `max_ttl` is also the node's --lock-delay.
  void start_node(const std::string& id, const std::vector<std::string>& extra = {},
                  const std::string& max_ttl = "2s", const std::string& etcd_lease_ttl = "2s") {
    auto& process = nodes_[id];
    std::vector<std::string> flags = {"--data-dir",   root_ + "/" + id, "--cluster-name",
                                      test_name(),    "--node-id",      id,
                                      "--max-ttl",    max_ttl,          "--etcd-lease-ttl",
                                      etcd_lease_ttl, "--lock-delay",   max_ttl};
    const std::vector<std::string> etcd = cluster_flags();  // the suite's etcd, over TLS or not
    flags.insert(flags.end(), etcd.begin(), etcd.end());
    flags.insert(flags.end(), extra.begin(), extra.end());
    // A daemon that cannot reach etcd in time (its etcd calls have
    // deadlines, which a loaded machine can miss) exits before its ready
    // line; it is started again, up to three times in all, appending to
    // the same log. Any other failure fails the test at once.
    std::string why;
    for (int attempt = 0; attempt < 3; ++attempt) {
      process = std::make_unique<ChildProcess>();
      addresses_[id] = try_start_daemon(*process, log_of(id), flags, why);
      if (!addresses_[id].empty()) return;
      process->kill();
      std::ifstream log(log_of(id));
      const std::string text((std::istreambuf_iterator<char>(log)),
                             std::istreambuf_iterator<char>());
      if (text.find("cannot join the cluster") == std::string::npos) break;
    }
    ADD_FAILURE() << id << " did not start: " << why << " (log: " << log_of(id) << ")";
  }
  [[nodiscard]] std::string log_of(const std::string& id) const {
    return root_ + "/" + id + ".log";
  }

  // A cluster client, seeded with every node started so far, whose map has
  // exactly `ids`, waiting up to 60 s for the cluster to publish it (room for
  // a start-up eviction and the lock-delay it costs).
  std::unique_ptr<lease::LeaseClient> client_with_members(const std::set<std::string>& ids) {
    using namespace std::chrono_literals;
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (;;) {
      lease::LeaseClientOptions options;
      for (const auto& [id, address] : addresses_) options.nodes.push_back(address);
      options.discover_cluster = true;
      auto c = std::make_unique<lease::LeaseClient>(options);
      const std::error_code ec = c->start();
      std::set<std::string> seen;
      if (!ec) {
        for (const auto& member : c->map_members()) seen.insert(member.id);
      }
      if (seen == ids || std::chrono::steady_clock::now() > deadline) {
        EXPECT_EQ(seen, ids) << ec.message();
        return c;
      }
      std::this_thread::sleep_for(100ms);
    }
  }

  // Keys the map of `c` gives to member `id`.
  static std::vector<std::string> keys_of(const lease::LeaseClient& c, const std::string& id,
                                          std::size_t count) {
    std::vector<std::string> keys;
    const auto members = c.map_members();
    if (members.empty()) {
      ADD_FAILURE() << "the client has no map";
      return keys;
    }
    for (int i = 0; keys.size() < count && i < 100000; ++i) {
      const std::string key = "key-" + std::to_string(i);
      if (members[c.node_for(key)].id == id) keys.push_back(key);
    }
    EXPECT_EQ(keys.size(), count);
    return keys;
  }

  std::string root_;
  std::map<std::string, std::unique_ptr<ChildProcess>> nodes_;
  std::map<std::string, std::string> addresses_;  // listen addresses, by id
};

}  // namespace shardlock::test_support
