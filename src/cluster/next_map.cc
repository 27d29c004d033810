#include "next_map.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace shardlock::cluster {

MapDecision next_map(const MapInputs& in) {
  MapDecision decision;
  std::vector<ClusterMember> live;
  std::vector<ClusterMember> learners;
  const auto promoted = [&](const ClusterView::Member& member) {
    if (!in.published || member.lease == 0) return false;
    return std::any_of(
        in.published->members.begin(), in.published->members.end(),
        [&](const ClusterMember& m) { return m.id == member.id && m.lease == member.lease; });
  };
  for (const ClusterView::Member& member : in.view.members) {
    if (member.id == in.self_id) {
      decision.registered = in.self_lease != 0 && member.lease == in.self_lease;
    }
    if (!member.readable) continue;
    ClusterMember entry{member.id, member.record.address, member.record.weight, member.lease};
    if (member.record.state == MemberState::kActive ||
        (member.record.state == MemberState::kJoining && promoted(member))) {
      live.push_back(std::move(entry));
    } else if (member.record.state == MemberState::kJoining) {
      learners.push_back(std::move(entry));
    }
  }
  if (live.empty()) live.swap(learners);
  const bool refused = in.published && in.published->epoch < in.highest_epoch_seen;
  const bool republish = decision.registered && (in.epoch_wanted || refused);
  decision.unchanged =
      in.published && in.published->members == live && in.published->learners == learners;
  if (live.empty() || (decision.unchanged && !republish)) return decision;
  const std::uint64_t published_epoch = in.published ? in.published->epoch : 0;
  const std::uint64_t floor = in.epoch_floor > 0 ? in.epoch_floor - 1 : 0;
  decision.next = ClusterMap{std::max({published_epoch, in.highest_epoch_seen, floor}) + 1,
                             std::move(live), std::move(learners)};
  return decision;
}

}  // namespace shardlock::cluster
