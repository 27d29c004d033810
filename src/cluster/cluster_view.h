// cluster_view.h: what one read of the cluster's keys in etcd showed,
// decoded (ClusterView). Membership (etcd/membership.h) produces it; the
// gRPC-free parts of a node (BucketActivation) consume it, so it lives here,
// beside them, rather than with the etcd client.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardlock/cluster/cluster_map.h"

namespace shardlock::cluster {

// What one read of the cluster's prefix showed, decoded: the driver's input
// for everything but the map's adoption (which Membership does itself).
struct ClusterView {
  struct Member {
    std::string id;
    MemberRecord record;
    std::int64_t create_revision = 0;  // of the members/<id> key: a new one means re-registered
    std::int64_t lease = 0;            // the etcd lease the key is under
    // False when the value did not decode (a newer version's record, say):
    // the node is alive all the same, but left out of the map.
    bool readable = true;
  };
  struct Handoff {
    std::string id;
    std::uint64_t epoch = 0;  // handoff/<id>'s value
  };

  std::int64_t revision = 0;  // the etcd revision of the read
  // From Membership's on_view: current_map() once the map read was adopted
  // (or refused), so it may be a map this pass published, newer than
  // `revision`. From read_view(): the map key as read (its epoch the key's
  // mod_revision), or null when there is none or it does not decode.
  std::shared_ptr<const ClusterMap> map;
  // From Membership's on_view: every map this pass adopted, in epoch order
  // (`map` last when it was adopted here). Besides the map it read, a pass
  // adopts the maps its watch delivered in between, so that a node follows
  // every epoch even when several maps were published between two reads;
  // one the watch has not delivered yet shows as an epoch jump.
  std::vector<std::shared_ptr<const ClusterMap>> adopted;
  std::vector<Member> members;      // every members/<id>, in id order (see `readable`)
  std::vector<Handoff> handoffs;    // every handoff/<id> that decodes, in id order
  std::vector<std::string> drains;  // the ids with a drain/<id> key, in order
};

}  // namespace shardlock::cluster
