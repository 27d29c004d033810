// next_map.h: which map a node publishes after a read of etcd, the pure
// decision inside Membership::reconcile(). No etcd, no clock: the caller
// reads the prefix, calls next_map(), and puts the result with a
// compare-and-swap on the map key's revision (losing it means another node
// published first; the caller reads again).
//
//   const MapDecision d = next_map({.view = view, .published = published, ...});
//   if (d.next) put_if_mod_revision(map_key, encode_map(*d.next), revision);
//
// The rules (docs/cluster.md, "Membership"):
//   - Members are the readable member keys in state active, and those
//     joining whose key (same etcd lease) the published map already counts
//     as a member: a promoted learner stays a member. The other joining
//     keys are learners. With no member left to learn from, the learners
//     are the members at once.
//   - An empty membership publishes nothing: no owners at all is worse than
//     the last map.
//   - The same members and learners as the published map publish nothing,
//     unless this node (registered under its current lease) wants a higher
//     epoch, or the published map's epoch is below one this node has seen
//     (etcd restored from a snapshot, the map key deleted): then the same
//     membership is put again above every epoch seen.
//   - The next epoch is one above the published one, so consecutive maps
//     have consecutive epochs; it jumps only to stay above every epoch seen
//     or to reach the floor.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "cluster_view.h"
#include "shardlock/cluster/cluster_map.h"

namespace shardlock::cluster {

struct MapInputs {
  const ClusterView& view;                     // the read (members, in id order)
  const std::optional<ClusterMap>& published;  // the map key's value, if it decodes
  std::string_view self_id;                    // this node's id
  std::int64_t self_lease = 0;                 // this node's current etcd lease (0: none)
  std::uint64_t highest_epoch_seen = 0;        // EpochFile::highest()
  // This node wants a map of a fresh epoch (on every start), so puts the
  // same membership again if need be.
  bool epoch_wanted = false;
  // Any map put has at least this epoch (0: no floor).
  std::uint64_t epoch_floor = 0;
};

struct MapDecision {
  // The map to put, or nullopt: publish nothing.
  std::optional<ClusterMap> next;
  // Its membership equals the published map's (a republish for the epoch).
  bool unchanged = false;
  // This node's key is in the read under its current lease.
  bool registered = false;
};

[[nodiscard]] MapDecision next_map(const MapInputs& in);

}  // namespace shardlock::cluster
