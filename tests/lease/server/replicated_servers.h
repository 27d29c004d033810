// The cluster layer's part, played by hand, for tests of replicating
// LeaseServers on loopback (replicated_server_test, replication_forgery_test):
// the servers' options, a map's routing, and each node's gate of a map.
//
//   auto a = start_loopback_server(replicated_options());
//   const auto routing = routing_of({"a", "b"});
//   ClusterControl(*a).set_replica_layout(1, *routing, {}, 0, 2, addresses);
//   ClusterControl(*a).publish_cluster_gate(gate_for(*a, 1, routing, 0, true));
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardlock/lease/server/internal/cluster_control.h"
#include "shardlock/lease/server/internal/cluster_gate.h"
#include "shardlock/lease/server/server.h"
#include "shardlock/router.h"
#include "support/loopback_server.h"

namespace shardlock::test_support {

// A loopback server (support/loopback_server.h) that replicates, its gate
// closed until the test publishes one.
inline lease::LeaseServerOptions replicated_options() {
  lease::LeaseServerOptions o = loopback_options(/*shards=*/4);
  o.io_threads = 1;
  o.max_ttl = std::chrono::seconds{10};
  o.start_closed = true;
  o.replication = true;
  o.io = lease::IoBackend::kSocket;
  return o;
}

// The routing of a map of `ids`, each of weight 1, in 256 buckets.
inline std::shared_ptr<const RouterSnapshot> routing_of(const std::vector<std::string>& ids) {
  Router router(RouterOptions{.bucket_bits = 8});
  std::vector<Node> nodes;
  for (const std::string& id : ids) nodes.push_back(Node{id, 1});
  EXPECT_EQ(router.assign(nodes), RouterStatus::kOk);
  return router.snapshot();
}

// The gate of `epoch` for node `self` of `routing`: its buckets active, and
// replicated (granted only within its primary lease) when `replicated`.
inline std::shared_ptr<const lease::internal::ClusterGate> gate_for(
    lease::LeaseServer& server, std::uint64_t epoch, std::shared_ptr<const RouterSnapshot> routing,
    std::uint16_t self, bool replicated) {
  using lease::internal::ClusterGate;
  auto gate = std::make_shared<ClusterGate>();
  gate->epoch = epoch;
  gate->routing = std::move(routing);
  gate->buckets.assign(gate->routing->bucket_count(), ClusterGate::kForeign);
  gate->replicated.assign(gate->routing->bucket_count(), 0);
  for (std::size_t b = 0; b < gate->routing->bucket_count(); ++b) {
    if (gate->routing->table()[b] != self) continue;
    gate->buckets[b] = ClusterGate::kActive;
    gate->replicated[b] = replicated ? 1 : 0;
  }
  gate->lease_deadline = [] { return std::chrono::nanoseconds::max(); };
  gate->replica_deadline = [&server](std::size_t b) {
    return lease::internal::ClusterControl(server).replica_lease_until(b);
  };
  return gate;
}

}  // namespace shardlock::test_support
