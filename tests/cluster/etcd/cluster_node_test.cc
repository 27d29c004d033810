// ClusterNode in-process, driving a real LeaseServer from a real etcd
// (tests/support/etcd_fixture.h starts one; skipped when /usr/bin/etcd is
// missing): what the driver hands the server's gate, and what it writes to
// etcd for the other nodes.
#include "cluster_node.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "poll_until.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/wire/epoch_token.h"
#include "support/etcd_fixture.h"
#include "support/loopback_server.h"

namespace shardlock::cluster {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string make_temp_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "shardlock-node-XXXXXX").string();
  return ::mkdtemp(pattern.data()) != nullptr ? pattern : std::string();
}

class ClusterNodeTest : public test_support::EtcdSuiteTest {
 protected:
  void SetUp() override {
    EtcdSuiteTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    dir_ = make_temp_dir();
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    if (node_) node_->stop();
    node_.reset();
    if (server_) server_->stop();
    server_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // One node of a cluster named after the test, active once its first map
  // settles (a lock-delay of a few hundred milliseconds).
  void start_node(milliseconds max_ttl = milliseconds(200)) {
    lease::LeaseServerOptions server_options = test_support::loopback_options();
    server_options.data_dir = dir_;
    server_options.max_ttl = max_ttl;
    server_options.lock_delay = max_ttl;
    server_options.start_closed = true;
    server_ = test_support::start_loopback_server(server_options);
    ASSERT_NE(server_, nullptr);
    ClusterNodeOptions options;
    options.endpoints = etcd_->endpoint();
    options.cluster_name = test_name() + cluster_suffix_;
    options.node_id = "n1";
    options.advertise = server_->listen_address();
    options.data_dir = dir_;
    options.lease_ttl = seconds(2);
    options.drift_margin = milliseconds(200);
    options.max_ttl = max_ttl;
    options.log = [](std::string_view) {};
    std::string detail;
    ASSERT_FALSE(ClusterNode::start(options, *server_, node_, detail)) << detail;
  }

  std::string dir_;
  std::string cluster_suffix_;
  std::unique_ptr<lease::LeaseServer> server_;
  std::unique_ptr<ClusterNode> node_;
};

// A gate built under one etcd lease must not grant again
// once the node registers under a new one. While the node had no lease the
// cluster may have given its buckets away; the old gate still shows them
// active, and the new lease's deadline would make it grant.
TEST_F(ClusterNodeTest, AGateFromAnEarlierRegistrationNeverGrantsAgain) {
  start_node();
  ASSERT_TRUE(test_support::poll_until([&] { return node_->stats().buckets_active > 0; },
                                       seconds(30), milliseconds(20)));
  const auto old_gate = node_->published_gate();
  ASSERT_NE(old_gate, nullptr);
  const auto now_ms = [&] {
    return std::chrono::duration_cast<milliseconds>(server_->now()).count();
  };
  // A single-member map gives this node every bucket.
  ASSERT_EQ(old_gate->check("some-key", now_ms()), lease::internal::ClusterGate::Verdict::kGrant);

  const std::uint64_t registration = node_->membership().registration();
  ASSERT_TRUE(node_->membership().etcd().revoke_lease(node_->membership().lease_id()).ok());
  ASSERT_TRUE(test_support::poll_until(
      [&] {
        return node_->membership().registration() > registration &&
               node_->membership().lease_alive();
      },
      seconds(30), milliseconds(5)));
  EXPECT_NE(old_gate->check("some-key", now_ms()), lease::internal::ClusterGate::Verdict::kGrant);
}

// The record carries the node's max TTL, and the
// lock-delay in use covers the largest one any member publishes.
TEST_F(ClusterNodeTest, TheMemberRecordCarriesTheMaxTtlAndTheLargestOneSetsTheLockDelay) {
  start_node(milliseconds(300));
  ASSERT_TRUE(test_support::poll_until([&] { return node_->stats().buckets_active > 0; },
                                       seconds(30), milliseconds(20)));
  const std::string prefix = cluster_prefix(test_name());
  const auto read = node_->membership().etcd().get(prefix + "members/n1");
  ASSERT_TRUE(read.ok());
  ASSERT_EQ(read.value.kvs.size(), 1u);
  const auto record = decode_member(read.value.kvs[0].value);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->max_ttl_ms, 300u);
  EXPECT_EQ(node_->stats().lock_delay, node_->lock_delay());

  // Another member (a node of the rolling raise) with a 120 s max TTL.
  const auto lease = node_->membership().etcd().grant_lease(30);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(node_->membership()
                  .etcd()
                  .put(prefix + "members/n2",
                       encode_member({"127.0.0.1:9", 1, MemberState::kDraining, 120'000}),
                       lease.value.id)
                  .ok());
  ASSERT_TRUE(test_support::poll_until([&] { return node_->stats().lock_delay >= seconds(120); },
                                       seconds(30), milliseconds(20)));
  EXPECT_EQ(node_->stats().lock_delay, seconds(120) + seconds(2) + milliseconds(200));
  (void)node_->membership().etcd().revoke_lease(lease.value.id);
}

// Tokens that never go back, the cluster side: a data dir whose tokens are in a
// higher epoch than the cluster's (its epoch file lost, or a new cluster)
// makes the node's first publish jump above them, so its first grants rise.
TEST_F(ClusterNodeTest, ANodeGrantsOnlyAboveTheTokensItsDataDirRecords) {
  std::uint64_t first_token = 0;
  const auto acquire = [&]() -> std::uint64_t {
    lease::LeaseClientOptions options;
    options.nodes = {server_->listen_address()};
    options.discover_cluster = true;
    lease::LeaseClient client(options);
    if (const std::error_code ec = client.start()) {
      ADD_FAILURE() << ec.message() << ": " << client.error_detail();
      return 0;
    }
    // A lease well above a loaded machine's round trip: a 150 ms one came
    // back "grant expired" under the sanitizers beside a parallel suite.
    lease::AcquireResult r = client.acquire("k", milliseconds(1500), seconds(20));
    EXPECT_TRUE(r) << r.error.message();
    return r ? r.lease.token() : 0;
  };
  const auto active = [&] {
    return test_support::poll_until([&] { return node_->stats().buckets_active > 0; }, seconds(30),
                                    milliseconds(20));
  };
  start_node(seconds(2));
  ASSERT_TRUE(active());
  first_token = acquire();
  ASSERT_NE(first_token, 0u);
  node_->stop();
  node_.reset();
  server_->stop();
  server_.reset();

  // The same data dir in a new cluster (its epochs start from 1 again),
  // without its epoch file: only the token floor remembers the old epochs.
  std::filesystem::remove(dir_ + "/cluster-epoch");
  cluster_suffix_ = "-again";
  start_node(seconds(2));
  ASSERT_TRUE(active());
  EXPECT_GT(node_->stats().min_grant_epoch, cluster::token_epoch(first_token));
  const std::uint64_t second_token = acquire();
  ASSERT_NE(second_token, 0u);
  EXPECT_GT(second_token, first_token);
}

}  // namespace
}  // namespace shardlock::cluster
