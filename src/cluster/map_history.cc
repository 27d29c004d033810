#include "map_history.h"

#include <map>
#include <utility>

namespace shardlock::cluster {

std::vector<RevisedMap> maps_to_adopt(std::uint64_t current_epoch, std::vector<RevisedMap> watched,
                                      RevisedMap published, std::size_t max_reads,
                                      const ReadMapBefore& read_before) {
  std::map<std::uint64_t, RevisedMap> known;  // by epoch
  const std::uint64_t top = published.map.epoch;
  for (RevisedMap& m : watched) {
    if (m.map.epoch > current_epoch && m.map.epoch < top) known.emplace(m.map.epoch, std::move(m));
  }
  // The epoch the adopted maps continue from: the current one, or on a
  // first map the oldest the watch delivered (adopted first, so the maps
  // after it must not skip either).
  std::uint64_t base = current_epoch;
  if (base == 0 && !known.empty()) base = known.begin()->first;
  if (base != 0 && top > base + 1) {
    // Walk down from the newest: each missing epoch is the value the map
    // key had just before the put of the next one.
    std::uint64_t epoch = top;
    std::int64_t revision = published.mod_revision;
    std::size_t reads = 0;
    while (epoch > base + 1) {
      if (const auto it = known.find(epoch - 1); it != known.end()) {
        epoch = it->first;
        revision = it->second.mod_revision;
        continue;
      }
      if (reads == max_reads || revision <= 1) break;
      ++reads;
      std::optional<RevisedMap> before = read_before(revision);
      if (!before || before->mod_revision >= revision) break;
      if (before->map.epoch == epoch) {  // put again at the same epoch
        revision = before->mod_revision;
        continue;
      }
      // Below the current epoch, the published epochs themselves jumped
      // (they do, to stay above every epoch seen); above it, a map to adopt.
      if (before->map.epoch > epoch || before->map.epoch <= base) break;
      epoch = before->map.epoch;
      revision = before->mod_revision;
      known.emplace(epoch, std::move(*before));
    }
  }
  std::vector<RevisedMap> maps;
  maps.reserve(known.size() + 1);
  for (auto& [epoch, m] : known) maps.push_back(std::move(m));
  maps.push_back(std::move(published));
  return maps;
}

}  // namespace shardlock::cluster
