// Two real LeaseServers with replication on (LeaseServerOptions::replication),
// on loopback, with the cluster layer's part played by the test: it builds
// each map's gates and replica layouts. A holder granted by the primary
// survives the primary's stop: the backup takes the bucket over once its
// promise has run out, and the holder renews there with its token.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lease/server/replicated_servers.h"
#include "poll_until.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/server/internal/cluster_control.h"
#include "shardlock/lease/server/server.h"
#include "shardlock/router.h"
#include "support/loopback_server.h"

namespace shardlock::lease {
namespace {

using namespace std::chrono_literals;
using internal::ClusterControl;
using test_support::gate_for;
using test_support::loopback_address;
using test_support::poll_until;
using test_support::replicated_options;
using test_support::routing_of;
using test_support::start_loopback_server;

TEST(ReplicatedServer, AHolderOfAStoppedPrimaryKeepsItsLeaseAtTheBackup) {
  const auto a = start_loopback_server(replicated_options());
  const auto b = start_loopback_server(replicated_options());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<std::string> addresses = {loopback_address(*a), loopback_address(*b)};
  // Epoch 1: nodes "a" and "b", each the other's backup.
  const auto routing = routing_of({"a", "b"});
  ASSERT_FALSE(ClusterControl(*a).set_replica_layout(1, *routing, {}, 0, 2, addresses))
      << a->error_detail();
  ASSERT_FALSE(ClusterControl(*b).set_replica_layout(1, *routing, {}, 1, 2, addresses))
      << b->error_detail();
  ClusterControl(*a).publish_cluster_gate(gate_for(*a, 1, routing, 0, true));
  ClusterControl(*b).publish_cluster_gate(gate_for(*b, 1, routing, 1, true));

  std::string key;
  for (int i = 0; key.empty(); ++i) {
    const std::string k = "orders/" + std::to_string(i);
    if (routing->owner(k) == "a") key = k;
  }
  const auto bucket = static_cast<std::uint32_t>(routing->bucket_of_hash(routing->hash(key)));

  LeaseClientOptions co;
  co.nodes = {addresses[0]};
  co.request_timeout = 5s;
  LeaseClient client(co);
  ASSERT_FALSE(client.start()) << client.error_detail();
  // Granted once "b" holds a primary lease and has the grant (the client
  // retries RECOVERING until the first heartbeat is acknowledged).
  AcquireResult held = client.acquire(key, 5s, 2s);
  ASSERT_TRUE(held) << held.error.message();
  const std::uint64_t token = held.lease.token();
  const ClientId owner = held.lease.owner();

  // Before "a" is gone, "b" may not take over: it is still promising.
  EXPECT_FALSE(ClusterControl(*b).take_over("a", bucket, 10s).has_value());

  // "a" stops (as if killed). Epoch 2 has "b" alone: it stops promising
  // "a" and, once its last promise has run out, takes the bucket over.
  a->stop();
  const auto alone = routing_of({"b"});
  ASSERT_FALSE(ClusterControl(*b).set_replica_layout(2, *alone, {}, 0, 2, {addresses[1]}))
      << b->error_detail();
  ClusterControl(*b).publish_cluster_gate(gate_for(*b, 2, alone, 0, false));
  std::optional<std::size_t> installed;
  ASSERT_TRUE(poll_until(
      [&] {
        installed = ClusterControl(*b).take_over("a", bucket, 10s);
        return installed.has_value();
      },
      5s, 5ms));
  EXPECT_EQ(*installed, 1U);

  // The holder renews at "b" with the token "a" gave it; nobody else gets
  // the key.
  LeaseClientOptions same = co;
  same.nodes = {addresses[1]};
  LeaseClient at_b(same);
  ASSERT_FALSE(at_b.start()) << at_b.error_detail();
  const CallResult renewed = at_b.renew(key, token, 5s, owner);
  EXPECT_FALSE(renewed.error) << renewed.error.message();
  EXPECT_EQ(renewed.reply, MessageType::kRenewed);

  LeaseClientOptions other = co;
  other.nodes = {addresses[1]};
  LeaseClient rival(other);
  ASSERT_FALSE(rival.start());
  const AcquireResult busy = rival.acquire(key, 5s, 0ms);
  EXPECT_EQ(busy.error, LeaseErrc::kBusy);
  // held's destructor releases at "a", which is gone: best effort, not waited.
  b->stop();
}

TEST(ReplicatedServer, WithoutABackupsLeaseNothingIsGranted) {
  const auto a = start_loopback_server(replicated_options());
  ASSERT_NE(a, nullptr);
  // "b" is in the map but never answers: "a" holds no primary lease.
  const std::vector<std::string> addresses = {loopback_address(*a), "127.0.0.1:9"};
  const auto routing = routing_of({"a", "b"});
  ASSERT_FALSE(ClusterControl(*a).set_replica_layout(1, *routing, {}, 0, 2, addresses))
      << a->error_detail();
  ClusterControl(*a).publish_cluster_gate(gate_for(*a, 1, routing, 0, true));
  std::string key;
  for (int i = 0; key.empty(); ++i) {
    const std::string k = "k" + std::to_string(i);
    if (routing->owner(k) == "a") key = k;
  }
  LeaseClientOptions co;
  co.nodes = {addresses[0]};
  co.request_timeout = 300ms;
  LeaseClient client(co);
  ASSERT_FALSE(client.start());
  const AcquireResult r = client.acquire(key, 5s, 0ms);
  EXPECT_FALSE(r);
  EXPECT_EQ(r.error, LeaseErrc::kRecovering) << r.error.message();

  EXPECT_EQ(ClusterControl(*a).set_replica_layout(1, *routing, {}, 0, 2,
                                                  {"127.0.0.1:1", "no.such.host.invalid:1"}),
            ServerError::kBadOptions);
  EXPECT_NE(a->error_detail().find("no.such.host.invalid"), std::string::npos);
  a->stop();
}

}  // namespace
}  // namespace shardlock::lease
