// cluster_node.h: one shardlockd node of a cluster. It joins the cluster in
// etcd (Membership), decides which buckets it may grant (BucketActivation),
// hands that decision to its LeaseServer as a ClusterGate, and writes its
// hand-off acknowledgements (docs/cluster.md).
//
//   LeaseServer server(server_options);       // with a data dir
//   server.start();
//   ClusterNodeOptions options;
//   options.endpoints = "127.0.0.1:2379";
//   options.node_id = "n1";
//   options.advertise = server.listen_address();
//   options.data_dir = server_options.data_dir;
//   std::unique_ptr<ClusterNode> node;
//   if (auto ec = ClusterNode::start(options, server, node, detail)) ...;
//   ...
//   node->stop();                             // before server.stop()
//
// The driver. Its decisions are NodeDriver's (../node_driver.h), which the
// deterministic simulation drives too; this class is the shell that feeds
// it and carries its actions out. One thread wakes on every view of the cluster's etcd prefix
// (Membership::on_view) and every `tick`, and in order:
//   1. turns the views into BucketActivation events: a member key gone (its
//      etcd lease ended), a member registered (new, or a new create
//      revision: it restarted), every handoff/<id> value, then the map;
//   2. builds the gate: each bucket foreign, owned or active at this time,
//      with the map's epoch, and publishes it to every shard when it
//      changed (a bucket activates when its lock-delay passes, so time
//      alone changes it);
//   3. while this node has not acknowledged the current epoch: counts its
//      leases in buckets the map no longer gives it (under the shard
//      locks, after the gate that refuses them is in every shard) and, when
//      there are none and the server's own lock-delay is over (a restarted
//      node's earlier leases), puts handoff/<id> = epoch;
//   4. asks for a new epoch when a shard's token counter ran out.
//
// Grants also need the node's etcd lease alive (the gate reads
// Membership::lease_deadline() on every grant), and an epoch above every
// epoch this node's previous runs saw (read from the epoch file before
// joining), so a restarted node never issues a token it issued before.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "activation.h"
#include "membership.h"
#include "node_driver.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lease/server/internal/cluster_gate.h"
#include "shardlock/lease/server/server.h"
#include "shardlock/mutex.h"

namespace shardlock::cluster {

struct ClusterNodeOptions {
  std::string endpoints;  // etcd, "HOST:PORT[,HOST:PORT...]"
  // TLS towards etcd and etcd's user/password authentication
  // (EtcdClientOptions); unset, plaintext and no credentials.
  std::optional<EtcdTls> etcd_tls{};
  std::optional<EtcdCredentials> etcd_credentials{};
  std::string cluster_name = "default";
  std::string node_id;
  std::string advertise;  // HOST:PORT clients reach this node's LeaseServer at
  std::uint32_t weight = 1;
  std::string data_dir;  // the LeaseServer's; required
  std::chrono::seconds lease_ttl{5};
  std::chrono::milliseconds drift_margin{500};
  // The server's largest lease TTL: part of the lock-delay.
  std::chrono::milliseconds max_ttl{60'000};
  // How often the driver looks again without news from etcd (activation by
  // lock-delay, hand-off counts).
  std::chrono::milliseconds tick{20};
  // How long RECOVERING answers ask clients to wait.
  std::chrono::milliseconds retry_after{50};
  // Owners per bucket (docs/cluster.md, "Replication"): 1, no replication;
  // 2 or 3, a primary and backups. Above 1 the server must have been
  // started with LeaseServerOptions::replication.
  std::size_t replicas = 1;
  // A replica (backup or primary of this node's) not heard from for this
  // long is evicted: its etcd lease is revoked, so the next map leaves it
  // out at once.
  std::chrono::milliseconds evict_after{300};
  // One line per notable event. Default: stderr.
  std::function<void(std::string_view)> log;
};

// The driver's counters (node_driver.h), and the membership's.
struct ClusterNodeStats : NodeDriverStats {
  bool lease_alive = false;
  MembershipStats membership;
};

class ClusterNode {
 public:
  // Joins the cluster for `server` (started, and alive until stop()):
  // Membership::start's errors, plus kInvalidOptions for a missing data dir
  // or a bad cluster name, and the epoch file's errors. Blocks for a few
  // etcd round trips.
  [[nodiscard]] static std::error_code start(ClusterNodeOptions options, lease::LeaseServer& server,
                                             std::unique_ptr<ClusterNode>& out,
                                             std::string& detail);
  // stop(kRevokeLease).
  ~ClusterNode();
  ClusterNode(const ClusterNode&) = delete;
  ClusterNode& operator=(const ClusterNode&) = delete;

  // Stops the driver (the server then grants nothing: its gate refuses
  // everything) and leaves the cluster as `mode` says. Idempotent.
  void stop(StopMode mode = StopMode::kRevokeLease);

  [[nodiscard]] ClusterNodeStats stats() const;
  // The gate last published to the server (null before the first map).
  [[nodiscard]] std::shared_ptr<const lease::internal::ClusterGate> published_gate() const;
  [[nodiscard]] Membership& membership() noexcept { return *membership_; }
  // The lock-delay a new owner waits for a vanished one, for this node's own
  // max TTL: max TTL + etcd lease TTL + drift margin. A member whose record
  // says a larger max TTL raises the one in use (stats().lock_delay).
  [[nodiscard]] std::chrono::nanoseconds lock_delay() const noexcept { return lock_delay_; }

 private:
  // The driver's host: this node's server and membership.
  class Host;

  ClusterNode(ClusterNodeOptions options, lease::LeaseServer& server);
  void run();
  void note(std::string_view line) { options_.log(line); }

  ClusterNodeOptions options_;
  lease::LeaseServer& server_;
  std::chrono::nanoseconds lock_delay_{0};
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<Host> host_;
  std::unique_ptr<NodeDriver> driver_;  // its step() on driver_thread_ only

  mutable Mutex mutex_;
  std::condition_variable_any wake_;
  bool stopping_ SHARDLOCK_GUARDED_BY(mutex_) = false;
  std::vector<ClusterView> views_ SHARDLOCK_GUARDED_BY(mutex_);
  std::thread driver_thread_;
};

}  // namespace shardlock::cluster
