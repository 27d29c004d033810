// next_map(): which map a node publishes after a read of etcd, without etcd
// (the decision Membership::reconcile() puts with a compare-and-swap).
#include "next_map.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace shardlock::cluster {
namespace {

ClusterView::Member member(std::string id, MemberState state, std::int64_t lease) {
  ClusterView::Member m;
  m.id = std::move(id);
  m.record.address = "127.0.0.1:7" + std::to_string(lease % 1000);
  m.record.state = state;
  m.lease = lease;
  return m;
}

ClusterMember entry(const ClusterView::Member& m) {
  return ClusterMember{m.id, m.record.address, m.record.weight, m.lease};
}

std::vector<std::string> ids(const std::vector<ClusterMember>& members) {
  std::vector<std::string> out;
  for (const ClusterMember& m : members) out.push_back(m.id);
  return out;
}

class NextMapTest : public ::testing::Test {
 protected:
  MapDecision decide() const {
    return next_map({.view = view_,
                     .published = published_,
                     .self_id = "n1",
                     .self_lease = 101,
                     .highest_epoch_seen = highest_,
                     .epoch_wanted = wanted_,
                     .epoch_floor = floor_});
  }

  ClusterView view_;
  std::optional<ClusterMap> published_;
  std::uint64_t highest_ = 0;
  bool wanted_ = false;
  std::uint64_t floor_ = 0;
};

TEST_F(NextMapTest, TheFirstMapHasEpochOneAndTheActiveMembers) {
  view_.members = {member("n1", MemberState::kActive, 101), member("n2", MemberState::kActive, 102),
                   member("n3", MemberState::kDraining, 103)};
  const MapDecision d = decide();
  ASSERT_TRUE(d.next);
  EXPECT_EQ(d.next->epoch, 1U);
  EXPECT_EQ(ids(d.next->members), (std::vector<std::string>{"n1", "n2"}));
  EXPECT_TRUE(d.next->learners.empty());
  EXPECT_TRUE(d.registered);
  EXPECT_FALSE(d.unchanged);
}

TEST_F(NextMapTest, AJoiningNodeIsALearnerUntilAMapPromotesItThenStaysAMember) {
  const auto n1 = member("n1", MemberState::kActive, 101);
  auto n2 = member("n2", MemberState::kJoining, 102);
  view_.members = {n1, n2};
  MapDecision d = decide();
  ASSERT_TRUE(d.next);
  EXPECT_EQ(ids(d.next->members), (std::vector<std::string>{"n1"}));
  EXPECT_EQ(ids(d.next->learners), (std::vector<std::string>{"n2"}));
  // A map that made it a member (its key, same lease, still says joining).
  published_ = ClusterMap{4, {entry(n1), entry(n2)}, {}};
  d = decide();
  EXPECT_FALSE(d.next) << "a promoted learner demoted again";
  EXPECT_TRUE(d.unchanged);
  // Registered again (a new etcd lease): a new incarnation learns again.
  n2.lease = 202;
  view_.members = {n1, n2};
  d = decide();
  ASSERT_TRUE(d.next);
  EXPECT_EQ(d.next->epoch, 5U);
  EXPECT_EQ(ids(d.next->learners), (std::vector<std::string>{"n2"}));
}

TEST_F(NextMapTest, LearnersWithNoMemberToLearnFromAreMembersAtOnce) {
  view_.members = {member("n1", MemberState::kJoining, 101),
                   member("n2", MemberState::kJoining, 102)};
  const MapDecision d = decide();
  ASSERT_TRUE(d.next);
  EXPECT_EQ(ids(d.next->members), (std::vector<std::string>{"n1", "n2"}));
  EXPECT_TRUE(d.next->learners.empty());
}

TEST_F(NextMapTest, AnEmptyOrUnreadableMembershipKeepsTheLastMap) {
  published_ = ClusterMap{7, {entry(member("n1", MemberState::kActive, 101))}, {}};
  EXPECT_FALSE(decide().next);
  auto unreadable = member("n1", MemberState::kActive, 101);
  unreadable.readable = false;
  view_.members = {unreadable};
  const MapDecision d = decide();
  EXPECT_FALSE(d.next);
  EXPECT_TRUE(d.registered);
}

TEST_F(NextMapTest, TheSameMembershipIsPutAgainOnlyForAWantedOrRefusedEpoch) {
  const auto n1 = member("n1", MemberState::kActive, 101);
  view_.members = {n1};
  published_ = ClusterMap{7, {entry(n1)}, {}};
  EXPECT_FALSE(decide().next);
  wanted_ = true;  // a fresh epoch on this node's start
  MapDecision d = decide();
  ASSERT_TRUE(d.next);
  EXPECT_TRUE(d.unchanged);
  EXPECT_EQ(d.next->epoch, 8U);
  wanted_ = false;
  highest_ = 12;  // etcd restored from a snapshot: the map went back
  d = decide();
  ASSERT_TRUE(d.next);
  EXPECT_EQ(d.next->epoch, 13U) << "consecutive above every epoch seen";
  // Neither is this node's to ask for while it is not registered under
  // its current lease (its key is a previous run's).
  view_.members = {member("n1", MemberState::kActive, 99)};
  published_ = ClusterMap{7, {entry(view_.members[0])}, {}};
  d = decide();
  EXPECT_FALSE(d.registered);
  EXPECT_FALSE(d.next);
}

TEST_F(NextMapTest, TheEpochReachesTheFloor) {
  view_.members = {member("n1", MemberState::kActive, 101)};
  published_ = ClusterMap{3, {}, {}};
  floor_ = 20;
  const MapDecision d = decide();
  ASSERT_TRUE(d.next);
  EXPECT_EQ(d.next->epoch, 20U);
}

}  // namespace
}  // namespace shardlock::cluster
