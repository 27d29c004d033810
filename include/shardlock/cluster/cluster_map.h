// cluster_map.h: the values a shardlock cluster agrees on through etcd (a
// member's record, the published map and its epoch), their one-line text
// encodings, and routing over a map (docs/cluster.md).
//
// Pure and free of gRPC: the node's membership (src/cluster/etcd/membership.h)
// writes and reads these values in etcd, and a client that learns a map from
// a node routes with the same ClusterRouting, so both sides compute the same
// bucket owners.
//
//   std::unique_ptr<ClusterRouting> routing;
//   if (ClusterRouting::build(map, cluster_router_options(), routing) == RouterStatus::kOk) {
//     const ClusterMember* owner = routing->owner_of("some-key");
//   }
//
// Decoders take untrusted bytes (whatever is in etcd) and never throw or
// crash on them: they return nothing for anything the encoders would not
// produce.
//
// Part of shardlock::lease (find_package(shardlock COMPONENTS lease)), not
// the core library: the limits on member ids and addresses are the wire's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardlock/router.h"

namespace shardlock::cluster {

// ---------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------

// A node id usable in an etcd key and a map line: 1..128 bytes of
// [A-Za-z0-9._-]. Cluster names follow the same rule.
[[nodiscard]] bool valid_node_id(std::string_view id) noexcept;

// HOST:PORT with a non-empty host (an IPv6 host in brackets) and a port in
// 1..65535, at most 300 bytes, no whitespace or control characters (which
// would break the map's line format).
[[nodiscard]] bool valid_member_address(std::string_view address) noexcept;

// The etcd key prefix of the cluster named `cluster_name`: "/shardlock/<name>/".
// Empty when the name is not valid_node_id() (so it cannot escape the
// /shardlock/ namespace or collide with another cluster's keys).
[[nodiscard]] std::string cluster_prefix(std::string_view cluster_name);

// A --cluster URL: the etcd endpoints, as EtcdClientOptions::endpoints
// takes them ("HOST:PORT[,HOST:PORT...]"), and whether they are reached
// over TLS.
struct EtcdUrl {
  std::string endpoints;
  bool tls = false;

  friend bool operator==(const EtcdUrl&, const EtcdUrl&) = default;
};

// Parses "SCHEME://HOST:PORT[,HOST:PORT...]": etcd:// and http:// are
// plaintext, etcds:// and https:// TLS (docs/cluster.md, "etcd over TLS").
// An endpoint after the first may repeat the scheme, as etcdctl's
// --endpoints spells a list ("https://a:2379,https://b:2379"), but not
// switch between plaintext and TLS. Nothing when the scheme is none of
// these, one endpoint's differs, or an endpoint is not
// valid_member_address().
[[nodiscard]] std::optional<EtcdUrl> parse_etcd_url(std::string_view url);

// ---------------------------------------------------------------------------
// Values and their encodings (pure: bytes in, a value or nothing out)
// ---------------------------------------------------------------------------

// kJoining: a node with replication that registered and is catching up as
// a learner; it becomes kActive once it has every bucket it will own or back
// up (docs/cluster.md, "Repair").
enum class MemberState : std::uint8_t { kActive, kDraining, kJoining };
[[nodiscard]] std::string_view to_string(MemberState state) noexcept;

// A member as its etcd key describes it.
struct MemberRecord {
  std::string address;  // HOST:PORT
  std::uint32_t weight = 1;
  MemberState state = MemberState::kActive;
  // The node's largest lease TTL (--max-ttl), so that every node's lock-delay
  // covers the longest lease any member may have granted; 0 when the record
  // does not say (a node of an earlier version).
  std::uint64_t max_ttl_ms = 0;
  // The node's --replicas: every node of a cluster must run with the same
  // count (docs/cluster.md, "Replication"); 0 when the record does not say (a
  // node of an earlier version, which does not replicate: one).
  std::uint32_t replicas = 0;

  friend bool operator==(const MemberRecord&, const MemberRecord&) = default;
};
[[nodiscard]] std::string encode_member(const MemberRecord& record);
// "address=... weight=... state=... [max_ttl_ms=...] [replicas=...]" in any order; unknown
// fields are ignored (a newer node may add some). Nothing when a required
// field is missing or malformed (the caller still counts such a member as
// present: docs/cluster.md, "etcd layout").
[[nodiscard]] std::optional<MemberRecord> decode_member(std::string_view text);

// A member of a published map.
struct ClusterMember {
  std::string id;
  std::string address;
  std::uint32_t weight = 1;
  // The etcd lease its member key was under when the map was published (0:
  // not recorded, a map of an earlier version): a member that registers
  // again is a new incarnation, which joins as a learner.
  std::int64_t lease = 0;

  friend bool operator==(const ClusterMember&, const ClusterMember&) = default;
};

// A published map: the membership the buckets are computed from, and its
// epoch (0 for "no map yet"). Epochs are the cluster's own counter, carried
// in the map's value: each publish writes the epoch it read plus one (by a
// compare-and-swap), so consecutive maps have consecutive epochs and a node
// that sees an epoch jump knows it missed a map. A map of the first format
// (v1) has no epoch in its value; its epoch is the map key's etcd
// mod_revision, and the first v2 map continues from it.
struct ClusterMap {
  std::uint64_t epoch = 0;
  std::vector<ClusterMember> members;  // sorted by id, ids distinct
  // Joining nodes (MemberState::kJoining) that back buckets up to catch up
  // but own none; clients never see them. Sorted by id, ids distinct and
  // not members'.
  std::vector<ClusterMember> learners{};

  friend bool operator==(const ClusterMap&, const ClusterMap&) = default;
};
// Whether the buckets of `map` have backups when each has `replicas` owners:
// some node besides a bucket's primary, a learner included (a learner backs
// up wherever it ranks among a bucket's first `replicas` nodes, and with two
// nodes or more and replicas >= 2 every bucket has one). A primary of such a
// map grants and renews only within its primary lease (ClusterGate::
// replicated): before, a lone member streamed every bucket
// to its learners but granted without that lease, so a learner promoted and
// taking buckets over found the lone member still granting them.
[[nodiscard]] bool has_backups(const ClusterMap& map, std::size_t replicas) noexcept;

// The map key's value for `map` (members sorted by id, epoch >= 1):
// "shardlock-map v2 epoch=E" and one "<id> <address> <weight>[ lease=L]"
// line per member, then one "+<id> <address> <weight>[ lease=L]" per
// learner.
[[nodiscard]] std::string encode_map(const ClusterMap& map);
// The map a map key's value describes: a v2 value carries its epoch, a v1
// value ("shardlock-map v1") takes `mod_revision`. Nothing for anything the
// encoders would not produce: a bad version line, an epoch of 0, a
// malformed line, ids out of order or repeated, a weight of 0 or above
// RouterSnapshot::kMaxWeight.
[[nodiscard]] std::optional<ClusterMap> decode_map(std::string_view text,
                                                   std::uint64_t mod_revision);
// decode_map()'s members only, for readers that do not need the epoch.
[[nodiscard]] std::optional<std::vector<ClusterMember>> decode_map_members(std::string_view text);

// ---------------------------------------------------------------------------
// Routing over a map
// ---------------------------------------------------------------------------

// The Router options every cluster node and every cluster client must use:
// all nodes and clients must agree, or they disagree on bucket owners and a
// client's request lands on a node that redirects it forever. 2^16 buckets
// (the lease client's own routing uses the same count: 128 KiB a table,
// balance within about 1% for a handful of nodes, built in well under a
// millisecond) and the Router's default seed. Changing either is a new wire
// version of the cluster, not a setting.
[[nodiscard]] RouterOptions cluster_router_options() noexcept;

// The Router's view of a ClusterMap: node ids are member ids and weights the
// members' weights, so equal maps give equal bucket owners in every process
// (the Router is a pure function of the nodes and RouterOptions). Immutable
// and thread-safe once built.
class ClusterRouting {
 public:
  // kOk, or the Router's reason for refusing the members (a map that
  // decode_map_members() accepted is always accepted here). `options` must
  // be what every node and client uses: leave it at cluster_router_options()
  // outside tests.
  [[nodiscard]] static RouterStatus build(const ClusterMap& map, const RouterOptions& options,
                                          std::unique_ptr<ClusterRouting>& out);
  [[nodiscard]] static RouterStatus build(const ClusterMap& map,
                                          std::unique_ptr<ClusterRouting>& out) {
    return build(map, cluster_router_options(), out);
  }

  [[nodiscard]] const ClusterMap& map() const noexcept { return map_; }
  [[nodiscard]] std::uint64_t epoch() const noexcept { return map_.epoch; }
  [[nodiscard]] const RouterSnapshot& snapshot() const noexcept { return *snapshot_; }
  [[nodiscard]] std::size_t bucket_count() const noexcept { return snapshot_->bucket_count(); }
  [[nodiscard]] std::size_t bucket_of(std::string_view key) const noexcept {
    return snapshot_->bucket_of_hash(snapshot_->hash(key));
  }
  // The owner of a key or a bucket; null when the map has no members.
  // `bucket` must be below bucket_count().
  [[nodiscard]] const ClusterMember* owner_of(std::string_view key) const noexcept {
    return owner_of_bucket(bucket_of(key));
  }
  [[nodiscard]] const ClusterMember* owner_of_bucket(std::size_t bucket) const noexcept;
  // How many buckets each member owns, in map().members order (the counts
  // sum to bucket_count() when the map has members). O(bucket_count()).
  [[nodiscard]] std::vector<std::size_t> buckets_per_member() const;

 private:
  ClusterRouting() = default;
  ClusterMap map_;
  std::shared_ptr<const RouterSnapshot> snapshot_;
};

// The replica sets of a map's buckets (docs/cluster.md, "Replication"): a
// Router over its members and learners together, so that each bucket's
// primary is its owner in the map's ClusterRouting and its backups are the
// next members and the learners ranked among them (RouterSnapshot::
// replica_set()). Immutable once built.
class ReplicaRouting {
 public:
  // `options` as for ClusterRouting::build().
  [[nodiscard]] static RouterStatus build(const ClusterMap& map, const RouterOptions& options,
                                          std::unique_ptr<ReplicaRouting>& out);
  [[nodiscard]] static RouterStatus build(const ClusterMap& map,
                                          std::unique_ptr<ReplicaRouting>& out) {
    return build(map, cluster_router_options(), out);
  }

  [[nodiscard]] const RouterSnapshot& snapshot() const noexcept { return *snapshot_; }
  // Members and learners, in snapshot() order (by id).
  [[nodiscard]] const std::vector<ClusterMember>& nodes() const noexcept { return nodes_; }
  [[nodiscard]] const std::vector<bool>& learners() const noexcept { return learners_; }
  // Indices into nodes(): the primary, then the backups.
  [[nodiscard]] std::vector<std::uint16_t> replicas_of(std::size_t bucket,
                                                       std::size_t replicas) const {
    return snapshot_->replica_set(bucket, replicas, learners_);
  }

 private:
  ReplicaRouting() = default;
  std::vector<ClusterMember> nodes_;
  std::vector<bool> learners_;
  std::shared_ptr<const RouterSnapshot> snapshot_;
};

}  // namespace shardlock::cluster
