// node_driver.h: the decisions of one cluster node's driver, with no I/O
// (NodeDriver). ClusterNode (etcd/cluster_node.h) is the shell that feeds it
// etcd views and the time on its own thread and carries its actions out on
// the LeaseServer and the Membership; the deterministic simulation
// (tests/sim/, docs/simulation.md) drives the same class with simulated
// views, clocks and servers. Keeping one copy of the decisions is the point:
// a simulation of a copy would prove nothing about the shipped code.
//
//   NodeDriver driver(options, host);    // host: a NodeHost
//   driver.step(views, now, registration);  // each wake-up (views may be empty)
//   ...
//   driver.close();                       // publishes a closed gate
//
// One step, in order (the header comment of cluster_node.h has the why):
//   1. a new registration (a lost etcd lease) starts everything over;
//   2. the views become BucketActivation events (members gone, registered,
//      hand-offs, then every map in epoch order, with its replica layout);
//   3. a gate is built and published when it changed (takeovers first);
//   4. with replicas: silent replicas are evicted, a learner that caught up
//      asks to become a member;
//   5. at most every 100 ms: the hand-off count and acknowledgement, and a
//      new epoch when a shard's counter ran out.
//
// Threads: step() and close() from one thread at a time (the driver
// thread); stats() and published_gate() from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "activation.h"
#include "cluster_view.h"
#include "shardlock/cluster/cluster_map.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lease/server/internal/cluster_gate.h"
#include "shardlock/lease/server/server.h"
#include "shardlock/mutex.h"
#include "shardlock/router.h"

namespace shardlock::cluster {

// The outcome of one of the host's etcd writes.
struct HostResult {
  enum class Status : std::uint8_t {
    kOk,
    kRefused,  // etcd's comparison refused it, or the node is not registered (kNotFound)
    kFailed,   // any other error: the driver tries again later
  };
  Status status = Status::kOk;
  std::string detail;
  [[nodiscard]] bool ok() const noexcept { return status == Status::kOk; }
};

// What the driver acts on: the node's lease server and its membership. Every
// method is called on the driver's thread, except the two the gates call
// (replica_lease_until, lease_deadline_of), which any grant may call, under
// a shard lock, until a later gate replaces the one that captured them.
class NodeHost {
 public:
  virtual ~NodeHost() = default;

  // ---- The lease server (LeaseServer's methods of the same names) ----
  virtual void publish_gate(std::shared_ptr<const lease::internal::ClusterGate> gate) = 0;
  virtual std::error_code set_replica_layout(std::uint64_t epoch, const RouterSnapshot& routing,
                                             const std::vector<bool>& learners, std::uint16_t self,
                                             std::size_t replicas,
                                             const std::vector<std::string>& addresses,
                                             std::string& detail) = 0;
  [[nodiscard]] virtual bool replica_primary_settled(const std::string& primary,
                                                     std::uint32_t bucket) const = 0;
  virtual std::optional<std::size_t> take_over(const std::string& primary, std::uint32_t bucket,
                                               std::chrono::milliseconds hold,
                                               bool* owner_active) = 0;
  [[nodiscard]] virtual lease::ReplicaProgress replica_progress() const = 0;
  [[nodiscard]] virtual std::chrono::nanoseconds replica_lease_until(
      std::size_t bucket) const noexcept = 0;
  [[nodiscard]] virtual std::vector<std::string> silent_replicas(
      std::chrono::milliseconds silence) const = 0;
  [[nodiscard]] virtual std::size_t count_leases(
      const std::function<bool(std::string_view key)>& pred) const = 0;
  [[nodiscard]] virtual bool needs_new_epoch() const = 0;

  // ---- The membership (Membership's methods of the same names) ----
  [[nodiscard]] virtual std::chrono::nanoseconds lease_deadline_of(
      std::uint64_t registration) const noexcept = 0;
  [[nodiscard]] virtual bool learning() const = 0;
  virtual HostResult caught_up() = 0;
  virtual HostResult put_handoff(std::uint64_t epoch) = 0;
  virtual HostResult evict(std::string_view id, std::int64_t lease) = 0;
  virtual void request_new_epoch() = 0;

  // One line per notable event.
  virtual void log(std::string_view line) = 0;
};

struct NodeDriverOptions {
  std::string node_id;
  std::chrono::seconds lease_ttl{5};
  std::chrono::milliseconds drift_margin{500};
  std::chrono::milliseconds max_ttl{60'000};
  std::chrono::milliseconds retry_after{50};
  std::size_t replicas = 1;
  std::chrono::milliseconds evict_after{300};
  // Nothing is granted below this epoch (ClusterGate::min_grant_epoch).
  std::uint64_t min_grant_epoch = 0;
  // The server's own lock-delay ends then: no hand-off acknowledgement
  // before it (a restarted node's earlier leases).
  std::chrono::nanoseconds server_recovered_at{0};
  // Must be what every node and client routes with: cluster_router_options()
  // outside the simulation, which uses fewer buckets to run fast.
  RouterOptions router_options = cluster_router_options();
};

struct NodeDriverStats {
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
};

class NodeDriver {
 public:
  // `host` must outlive the driver and every gate it published.
  NodeDriver(NodeDriverOptions options, NodeHost& host);
  NodeDriver(const NodeDriver&) = delete;
  NodeDriver& operator=(const NodeDriver&) = delete;

  // One pass: `views` read since the last one (in order; may be empty),
  // `now` on the server's clock, `registration` the membership's count of
  // registrations (Membership::registration()). Never blocks beyond the
  // host's calls.
  void step(const std::vector<ClusterView>& views, std::chrono::nanoseconds now,
            std::uint64_t registration);
  // Publishes a gate that refuses everything (before the membership goes).
  void close();

  [[nodiscard]] NodeDriverStats stats() const;
  [[nodiscard]] std::shared_ptr<const lease::internal::ClusterGate> published_gate() const;
  // max TTL + etcd lease TTL + drift margin, for this node's own max TTL.
  [[nodiscard]] std::chrono::nanoseconds lock_delay() const noexcept { return lock_delay_; }

 private:
  void apply_views(const std::vector<ClusterView>& views, std::chrono::nanoseconds now);
  void adopt_map(const std::shared_ptr<const ClusterMap>& map, std::chrono::nanoseconds now);
  void publish(std::chrono::nanoseconds now);
  void hand_off(std::chrono::nanoseconds now);
  void adopt_replica_layout(bool history_restarted, std::chrono::nanoseconds now);
  bool take_over_pending(std::chrono::nanoseconds now);
  void evict_silent_replicas();
  void finish_learning(std::chrono::nanoseconds now);
  void note_replicas_mismatch(const ClusterView::Member& member);
  void start_over();
  std::chrono::nanoseconds lock_delay_margin() const {
    return options_.lease_ttl + options_.drift_margin;
  }
  std::unique_ptr<BucketActivation> new_activation() const {
    return std::make_unique<BucketActivation>(
        ActivationOptions{.node_id = options_.node_id,
                          .lock_delay = lock_delay_,
                          .lock_delay_margin = lock_delay_margin(),
                          .router_options = options_.router_options,
                          .history_floor = options_.server_recovered_at});
  }
  void note(std::string_view line) { host_.log(line); }

  NodeDriverOptions options_;
  NodeHost& host_;
  std::chrono::nanoseconds lock_delay_{0};
  std::unique_ptr<BucketActivation> activation_;

  struct SeenMember {
    std::int64_t create_revision = 0;
    std::int64_t lease = 0;  // the etcd lease its member key is under
  };
  // Buckets that moved here from a primary this node backed up in the map
  // before: taken over (no lock-delay) once the server allows it.
  std::unordered_map<std::size_t, std::string> pending_takeovers_;
  std::unordered_set<std::int64_t> evicted_leases_;
  std::set<std::pair<std::string, std::int64_t>> replicas_mismatch_noted_;
  std::unordered_map<std::string, SeenMember> seen_members_;
  std::shared_ptr<const ClusterMap> map_;
  std::shared_ptr<const ClusterRouting> routing_;
  std::shared_ptr<const lease::internal::ClusterGate> gate_;
  std::uint64_t new_epoch_asked_for_ = 0;
  bool activation_pending_ = false;  // an owned bucket is not active yet
  std::uint64_t registration_ = 0;
  std::chrono::nanoseconds learning_since_{0};
  std::int64_t self_create_revision_ = 0;
  std::int64_t skip_views_through_ = 0;
  std::chrono::nanoseconds last_count_{0};

  mutable Mutex mutex_;
  NodeDriverStats stats_ SHARDLOCK_GUARDED_BY(mutex_);
  std::shared_ptr<const lease::internal::ClusterGate> published_gate_ SHARDLOCK_GUARDED_BY(mutex_);
};

}  // namespace shardlock::cluster
