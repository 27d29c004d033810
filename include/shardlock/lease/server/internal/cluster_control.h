// ClusterControl: the cluster layer's hooks into a LeaseServer (cluster
// mode and replication; docs/cluster.md). src/cluster/etcd/cluster_node.cc
// drives a server through it, and tests do; nothing else includes this
// header (tests/layout_test.py). A view: it owns nothing, is cheap to make,
// and must not outlive its server. Each call needs a successful start().
//
// Not API: the cluster layer's building block.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "shardlock/lease/server/server_types.h"
#include "shardlock/router.h"

namespace shardlock::lease {

class LeaseServer;

namespace internal {

struct ClusterGate;

class ClusterControl {
 public:
  explicit ClusterControl(LeaseServer& server) noexcept : server_(&server) {}

  // ---- Cluster mode ----
  // Every grant, renew and QUERY then asks `gate` first, and MAP answers
  // from it; returns once every shard has it (internal/cluster_gate.h).
  void publish_cluster_gate(std::shared_ptr<const ClusterGate> gate);
  // Leases held on keys `pred` is true for (each shard under its lock).
  [[nodiscard]] std::size_t count_leases(
      const std::function<bool(std::string_view key)>& pred) const;
  // Whether some shard cannot grant in the current epoch until a newer one
  // is published: its token counter ran out there, or the epoch is at or
  // below token_floor() >> 32.
  [[nodiscard]] bool needs_new_epoch() const;
  // The highest token an earlier run on the data dir may have issued, in
  // either mode (read at start(); 0 without a data dir). In cluster mode the
  // server grants only in epochs above token_floor() >> 32 (others answer
  // RECOVERING and raise needs_new_epoch()), so the node should ask for such
  // an epoch at start.
  [[nodiscard]] std::uint64_t token_floor() const noexcept;

  // ---- Replication (LeaseServerOptions::replication) ----
  // Adopts the replica layout of the map `routing` of `epoch` for the node
  // at index `self`, with `replicas` owners per bucket and the nodes flagged
  // in `learners` backing up only (RouterSnapshot::replica_set());
  // `addresses[i]` is node i's "HOST:PORT". New backups (and buckets new to
  // a backup) are sent snapshots before this returns. kBadOptions, with the
  // server's error_detail(), when an address does not resolve; nothing
  // changes then.
  std::error_code set_replica_layout(std::uint64_t epoch, const RouterSnapshot& routing,
                                     const std::vector<bool>& learners, std::uint16_t self,
                                     std::size_t replicas,
                                     const std::vector<std::string>& addresses);
  // As a backup of `primary`: whether the stream that has `bucket` said the
  // primary's process had been up for its lock-delay, or had `bucket`
  // active (so its snapshots cover every lease it, or an earlier run of it,
  // may have granted there).
  [[nodiscard]] bool replica_primary_settled(const std::string& primary,
                                             std::uint32_t bucket) const;
  // As a backup: the buckets backed up in the current layout, caught up,
  // and caught up on an active primary; zeros without replication.
  [[nodiscard]] ReplicaProgress replica_progress() const;
  // The end of this node's primary lease for `bucket` on the server's
  // now() clock (the earliest its backups gave); far in the future for a
  // bucket without backups. Lock-free: a gate's replica_deadline calls it.
  [[nodiscard]] std::chrono::nanoseconds replica_lease_until(std::size_t bucket) const noexcept;
  // The replicas (node ids: backups of this node, primaries it backs up)
  // not heard from for `silence`, for the cluster layer's eviction.
  [[nodiscard]] std::vector<std::string> silent_replicas(std::chrono::milliseconds silence) const;
  // Takes `bucket` over from `primary` (a node id) once this node was its
  // caught-up backup and its promise to the primary has run out: installs
  // every replicated holder, to expire `hold` from now (the largest max TTL
  // plus the drift margin, since the primary may have renewed any of them
  // just before it stopped). Returns how many holders it installed, or
  // nullopt while the takeover is not allowed yet (or never: not a bucket
  // this node backed up for `primary`), and when a replicated holder could
  // not be installed beside one this node kept from an earlier ownership of
  // the bucket (a later call, once that one has expired, succeeds).
  // `owner_active`, when given: whether `primary` had the bucket active
  // when it sent its snapshot (so nobody before it holds a lease there).
  [[nodiscard]] std::optional<std::size_t> take_over(const std::string& primary,
                                                     std::uint32_t bucket,
                                                     std::chrono::milliseconds hold,
                                                     bool* owner_active = nullptr);

 private:
  LeaseServer* server_;
};

}  // namespace internal
}  // namespace shardlock::lease
