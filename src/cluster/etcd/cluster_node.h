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
// The driver. One thread wakes on every view of the cluster's etcd prefix
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
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lease/server/internal/cluster_gate.h"
#include "shardlock/lease/server/server.h"
#include "shardlock/mutex.h"

namespace shardlock::cluster {

struct ClusterNodeOptions {
  std::string endpoints;  // etcd, "HOST:PORT[,HOST:PORT...]"
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

struct ClusterNodeStats {
  std::uint64_t epoch = 0;  // the current map's
  std::uint64_t min_grant_epoch = 0;
  std::uint64_t acked_epoch = 0;       // the newest handoff/<id> written
  std::size_t members = 0;             // in the current map
  std::size_t buckets_owned = 0;       // the map gives this node
  std::size_t buckets_active = 0;      // of those, grantable now
  std::size_t leases_to_hand_off = 0;  // at the last count
  std::uint64_t gates_published = 0;
  std::uint64_t acks_written = 0;
  std::uint64_t restarts = 0;  // start_over(): a new etcd lease after losing one
  // Maps adopted after a skipped epoch (their buckets start over as at a start).
  std::uint64_t maps_missed = 0;
  // Replication: buckets taken over from a primary that left (no
  // lock-delay), holders inherited with them, and replicas evicted.
  std::uint64_t buckets_taken_over = 0;
  std::uint64_t holders_inherited = 0;
  std::uint64_t replicas_evicted = 0;
  // Registrations that finished learning (asked to become a member).
  std::uint64_t learner_promotions = 0;
  // Members seen running with another --replicas (each incarnation once).
  std::uint64_t replicas_mismatched = 0;
  // The lock-delay now: the largest max TTL of any member seen, plus the
  // etcd lease TTL and the drift margin.
  std::chrono::nanoseconds lock_delay{0};
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
  ClusterNode(ClusterNodeOptions options, lease::LeaseServer& server);
  void run();
  // Steps 1-4 of the header comment, on the driver thread.
  void apply_views(const std::vector<ClusterView>& views, std::chrono::nanoseconds now);
  // Feeds one map to the activation (if newer) and routes by it.
  void adopt_map(const std::shared_ptr<const ClusterMap>& map, std::chrono::nanoseconds now);
  void publish(std::chrono::nanoseconds now);
  void hand_off(std::chrono::nanoseconds now);
  // Replication: the layout of the current map, the takeovers it allows,
  // and the eviction of replicas that fell silent.
  void adopt_replica_layout(bool history_restarted, std::chrono::nanoseconds now);
  bool take_over_pending(std::chrono::nanoseconds now);
  void evict_silent_replicas();
  // A learner (a registration with replication) asks to become a member once
  // it has caught up on every bucket it backs up (docs/cluster.md, "Repair").
  void finish_learning(std::chrono::nanoseconds now);
  void note_replicas_mismatch(const ClusterView::Member& member);
  // The node lost its etcd lease and registered again: everything it knew
  // may be stale (the cluster may have given its buckets away meanwhile),
  // so it closes the gate and starts over as at a start.
  void start_over();
  void publish_closed_gate();
  std::chrono::nanoseconds lock_delay_margin() const {
    return options_.lease_ttl + options_.drift_margin;
  }
  std::unique_ptr<BucketActivation> new_activation() const {
    return std::make_unique<BucketActivation>(
        ActivationOptions{.node_id = options_.node_id,
                          .lock_delay = lock_delay_,
                          .lock_delay_margin = lock_delay_margin(),
                          .router_options = cluster_router_options(),
                          .history_floor = server_recovered_at_});
  }
  void note(std::string_view line) { options_.log(line); }

  ClusterNodeOptions options_;
  lease::LeaseServer& server_;
  std::chrono::nanoseconds lock_delay_{0};
  std::chrono::nanoseconds server_recovered_at_{0};  // the server's lock-delay ends
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<BucketActivation> activation_;  // driver thread only

  // Driver-thread state.
  struct SeenMember {
    std::int64_t create_revision = 0;
    std::int64_t lease = 0;  // the etcd lease its member key is under
  };
  // Buckets that moved here from a primary this node backed up in the map
  // before: taken over (no lock-delay) once the server allows it.
  std::unordered_map<std::size_t, std::string> pending_takeovers_;
  std::unordered_set<std::int64_t> evicted_leases_;
  // Incarnations (id, create revision) already reported by
  // note_replicas_mismatch().
  std::set<std::pair<std::string, std::int64_t>> replicas_mismatch_noted_;
  std::unordered_map<std::string, SeenMember> seen_members_;
  std::shared_ptr<const ClusterMap> map_;
  std::shared_ptr<const ClusterRouting> routing_;
  std::shared_ptr<const lease::internal::ClusterGate> gate_;
  std::uint64_t new_epoch_asked_for_ = 0;
  bool activation_pending_ = false;  // an owned bucket is not active yet
  // The membership registration the activation state belongs to, and this
  // node's member key's create revision as the views last showed it.
  std::uint64_t registration_ = 0;
  std::chrono::nanoseconds learning_since_{0};  // the current registration's first tick
  std::int64_t self_create_revision_ = 0;
  // After a new registration: views read before it are skipped (those that
  // show this node's key older than this revision).
  std::int64_t skip_views_through_ = 0;

  mutable Mutex mutex_;
  std::condition_variable_any wake_;
  bool stopping_ SHARDLOCK_GUARDED_BY(mutex_) = false;
  std::vector<ClusterView> views_ SHARDLOCK_GUARDED_BY(mutex_);
  ClusterNodeStats stats_ SHARDLOCK_GUARDED_BY(mutex_);
  std::shared_ptr<const lease::internal::ClusterGate> published_gate_ SHARDLOCK_GUARDED_BY(mutex_);
  std::thread driver_;
};

}  // namespace shardlock::cluster
