// map_history.h: which maps a node adopts after a read of etcd, in order,
// with the ones its watch never delivered read back from the map key's
// history. No etcd, no clock: the caller passes what its watch delivered,
// the map it read, and a way to read the map key as it was before a
// revision (etcd's Range at a revision).
//
//   const auto maps = maps_to_adopt(current.epoch, watched, {published, revision},
//                                   kMaxMapHistoryReads, read_before);
//   for (const RevisedMap& m : maps) adopt(m);
//
// Why: consecutive maps keep each moved bucket's chain of possible holders
// (activation.h). A node whose watch fell behind its read (a slow watch, a
// cut from etcd that outlasted the watch's history, a watch etcd
// cancelled) would otherwise see an epoch jump, start its history over and
// make every bucket that moved to it wait out the lock-delay; a backup
// would skip the takeover of a bucket whose primary left in the missed map
// and lose that primary's holders. Read back from etcd,
// the missed maps are adopted in order, as the watch would have delivered
// them. The read is only a fallback: it costs one etcd Range per missing
// map and happens only on a gap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "shardlock/cluster/cluster_map.h"

namespace shardlock::cluster {

// A map with the revision of the put that wrote it (the map key's
// mod_revision then).
struct RevisedMap {
  ClusterMap map;
  std::int64_t mod_revision = 0;
};

// The map key's value just before `revision` (as of revision - 1), or
// nullopt when etcd cannot say: that history is compacted, etcd is
// unreachable, the key did not exist, or its value does not decode.
using ReadMapBefore = std::function<std::optional<RevisedMap>(std::int64_t revision)>;

// A node that missed more maps than this starts its history over (as after
// a start): each read is a round trip to etcd on the map thread.
inline constexpr std::size_t kMaxMapHistoryReads = 16;

// The maps to adopt after a read that found `published`, given the node's
// current epoch (0: none yet) and the maps its watch delivered since the
// last pass: every map of an epoch above `current_epoch` and below
// published's that the watch delivered or that `read_before` finds between
// the two, in epoch order, then `published` itself. `read_before` is called
// only for an epoch still missing between `current_epoch` and `published`
// (on a first map, current_epoch 0, between the oldest watched map and
// `published`; with nothing watched, never: there is no history), at most
// `max_reads` times; a gap it cannot fill stays a gap (the caller's
// activation treats it as missing history). A map put again at the same
// epoch (a republish) is walked through. Watched maps at or below
// `current_epoch`, or at or above published's, are dropped.
[[nodiscard]] std::vector<RevisedMap> maps_to_adopt(std::uint64_t current_epoch,
                                                    std::vector<RevisedMap> watched,
                                                    RevisedMap published, std::size_t max_reads,
                                                    const ReadMapBefore& read_before);

}  // namespace shardlock::cluster
