// BucketActivation, rule 3 of docs/cluster.md "Who may grant": which buckets
// one node may grant, driven by maps, hand-off records, member-key events and
// an injected monotonic time. Pure: no etcd.
#include "activation.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace shardlock::cluster {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;
using Time = BucketActivation::Time;

constexpr nanoseconds kLockDelay = seconds(47);
// 256 buckets: the mapping is the same function at any size.
constexpr int kBucketBits = 8;

RouterOptions router_options() {
  RouterOptions options;
  options.bucket_bits = kBucketBits;
  return options;
}

ClusterMap make_map(std::uint64_t epoch, const std::vector<std::string>& ids) {
  ClusterMap map;
  map.epoch = epoch;
  for (const std::string& id : ids) map.members.push_back({id, id + ":7700", 1});
  return map;
}

// The owner id of every bucket in `map`.
std::vector<std::string> owners(const ClusterMap& map) {
  std::unique_ptr<ClusterRouting> routing;
  EXPECT_EQ(ClusterRouting::build(map, router_options(), routing), RouterStatus::kOk);
  std::vector<std::string> out;
  for (std::size_t b = 0; b < routing->bucket_count(); ++b) {
    const ClusterMember* owner = routing->owner_of_bucket(b);
    out.push_back(owner ? owner->id : "");
  }
  return out;
}

// Buckets owned by `from` in `before` and by `to` in `after`.
std::vector<std::size_t> moved(const ClusterMap& before, const ClusterMap& after,
                               const std::string& from, const std::string& to) {
  const std::vector<std::string> a = owners(before);
  const std::vector<std::string> b = owners(after);
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == from && b[i] == to) out.push_back(i);
  }
  return out;
}

BucketActivation make(const std::string& self) {
  return BucketActivation(ActivationOptions{
      .node_id = self, .lock_delay = kLockDelay, .router_options = router_options()});
}

// Adopts `map` as the first map at `now` and opens the start-up gate: every
// other member acks its epoch and the lock-delay passes. Returns the time
// the gate opened.
Time settle_first_map(BucketActivation& activation, const ClusterMap& map, Time now) {
  EXPECT_EQ(activation.on_map(map, now), MapVerdict::kAdopted);
  for (const ClusterMember& member : map.members) activation.on_handoff(member.id, map.epoch);
  return now + kLockDelay;
}

const ClusterMap kThree = make_map(10, {"n1", "n2", "n3"});

TEST(BucketActivation, NothingIsActiveBeforeTheFirstMap) {
  BucketActivation activation = make("n2");
  EXPECT_FALSE(activation.may_grant(0, Time{0}));
  EXPECT_FALSE(activation.ready_to_ack(0, 0));
  EXPECT_TRUE(activation.buckets_to_hand_off().empty());
}

TEST(BucketActivation, FirstMapWaitsForEveryOtherMemberAndTheLockDelay) {
  BucketActivation activation = make("n2");
  const Time start = seconds(5);
  ASSERT_EQ(activation.on_map(kThree, start), MapVerdict::kAdopted);
  const std::vector<std::size_t> mine = moved(kThree, kThree, "n2", "n2");
  ASSERT_FALSE(mine.empty());
  const std::size_t b = mine.front();
  EXPECT_TRUE(activation.owns(b));
  const Time later = start + kLockDelay;
  EXPECT_FALSE(activation.may_grant(b, later));  // no acks yet
  activation.on_handoff("n1", 10);
  EXPECT_FALSE(activation.may_grant(b, later));  // n3 still missing
  activation.on_handoff("n3", 10);
  EXPECT_FALSE(activation.may_grant(b, later - nanoseconds(1)));
  EXPECT_TRUE(activation.may_grant(b, later));
  // Never a bucket the map gives to another node.
  for (std::size_t other : moved(kThree, kThree, "n1", "n1")) {
    EXPECT_FALSE(activation.may_grant(other, later));
  }
}

TEST(BucketActivation, UnchangedBucketsStayActiveAcrossAMapChange) {
  BucketActivation activation = make("n2");
  const Time open = settle_first_map(activation, kThree, seconds(0));
  const ClusterMap four = make_map(11, {"n1", "n2", "n3", "n4"});
  const std::vector<std::size_t> kept = moved(kThree, four, "n2", "n2");
  ASSERT_FALSE(kept.empty());
  for (std::size_t b : kept) ASSERT_TRUE(activation.may_grant(b, open));

  ASSERT_EQ(activation.on_map(four, open), MapVerdict::kAdopted);
  // No ack of epoch 11 from anyone, and no time passed.
  for (std::size_t b : kept) EXPECT_TRUE(activation.may_grant(b, open)) << b;
  // What n4 took is n2's no longer, at once.
  const std::vector<std::size_t> taken = moved(kThree, four, "n2", "n4");
  ASSERT_FALSE(taken.empty());
  for (std::size_t b : taken) EXPECT_FALSE(activation.may_grant(b, open)) << b;
}

TEST(BucketActivation, MovedBucketsWaitForThePreviousOwnersAckOfExactlyThisEpoch) {
  BucketActivation activation = make("n2");
  const Time open = settle_first_map(activation, kThree, seconds(0));
  const ClusterMap two = make_map(11, {"n2", "n3"});  // n1 drains: alive, not in the map
  const std::vector<std::size_t> gained = moved(kThree, two, "n1", "n2");
  const std::vector<std::size_t> kept = moved(kThree, two, "n2", "n2");
  ASSERT_FALSE(gained.empty());
  ASSERT_FALSE(kept.empty());
  ASSERT_EQ(activation.on_map(two, open), MapVerdict::kAdopted);

  const Time much_later = open + 10 * kLockDelay;
  for (std::size_t b : gained) EXPECT_FALSE(activation.may_grant(b, much_later)) << b;
  activation.on_handoff("n3", 11);  // not a holder of these buckets
  for (std::size_t b : gained) EXPECT_FALSE(activation.may_grant(b, much_later)) << b;
  // An ack of a newer map this node has not seen proves nothing about this
  // one (that map may give the buckets back to n1).
  activation.on_handoff("n1", 12);
  for (std::size_t b : gained) EXPECT_FALSE(activation.may_grant(b, much_later)) << b;
  for (std::size_t b : kept) EXPECT_TRUE(activation.may_grant(b, open)) << b;

  // Once this node adopts the map n1 acked, the ack counts.
  const ClusterMap two_again = make_map(12, {"n2", "n3"});
  ASSERT_EQ(activation.on_map(two_again, open), MapVerdict::kAdopted);
  for (std::size_t b : gained) EXPECT_TRUE(activation.may_grant(b, open)) << b;
}

TEST(BucketActivation, MovedBucketsActivateOnTheAckOfTheCurrentEpoch) {
  BucketActivation activation = make("n2");
  const Time open = settle_first_map(activation, kThree, seconds(0));
  const ClusterMap two = make_map(11, {"n2", "n3"});
  const std::vector<std::size_t> gained = moved(kThree, two, "n1", "n2");
  ASSERT_FALSE(gained.empty());
  ASSERT_EQ(activation.on_map(two, open), MapVerdict::kAdopted);
  for (std::size_t b : gained) EXPECT_FALSE(activation.may_grant(b, open)) << b;
  activation.on_handoff("n1", 11);
  for (std::size_t b : gained) EXPECT_TRUE(activation.may_grant(b, open)) << b;
}

TEST(BucketActivation, AnAckBeforeTheMapCountsWhenTheMapArrives) {
  BucketActivation activation = make("n2");
  const Time open = settle_first_map(activation, kThree, seconds(0));
  const ClusterMap two = make_map(11, {"n2", "n3"});
  activation.on_handoff("n1", 11);  // n1 saw the map first
  ASSERT_EQ(activation.on_map(two, open), MapVerdict::kAdopted);
  for (std::size_t b : moved(kThree, two, "n1", "n2")) EXPECT_TRUE(activation.may_grant(b, open));
}

TEST(BucketActivation, ADeadOwnersBucketsActivateExactlyAtGoneTimePlusLockDelay) {
  BucketActivation activation = make("n2");
  const Time open = settle_first_map(activation, kThree, seconds(0));
  const Time gone = open + seconds(100);
  activation.on_member_gone("n1", gone);
  const ClusterMap two = make_map(11, {"n2", "n3"});
  const std::vector<std::size_t> gained = moved(kThree, two, "n1", "n2");
  ASSERT_FALSE(gained.empty());
  ASSERT_EQ(activation.on_map(two, gone + seconds(5)), MapVerdict::kAdopted);
  activation.on_handoff("n3", 11);

  const Time ready = gone + kLockDelay;
  for (std::size_t b : gained) {
    EXPECT_FALSE(activation.may_grant(b, ready - milliseconds(1))) << b;
    EXPECT_FALSE(activation.may_grant(b, ready - nanoseconds(1))) << b;
    EXPECT_TRUE(activation.may_grant(b, ready)) << b;
  }
  // A second "gone" event does not move the time later.
  activation.on_member_gone("n1", ready);
  for (std::size_t b : gained) EXPECT_TRUE(activation.may_grant(b, ready)) << b;
}

TEST(BucketActivation, ANodeThatRegistersAgainMustAckForItsNewIncarnation) {
  BucketActivation activation = make("n2");
  const Time open = settle_first_map(activation, kThree, seconds(0));
  const Time gone = open + seconds(1);
  activation.on_member_gone("n1", gone);
  activation.on_member_registered("n1", gone + seconds(2));  // restarted quickly
  const ClusterMap two = make_map(11, {"n2", "n3"});
  const std::vector<std::size_t> gained = moved(kThree, two, "n1", "n2");
  ASSERT_FALSE(gained.empty());
  ASSERT_EQ(activation.on_map(two, gone + seconds(3)), MapVerdict::kAdopted);
  // The old gone time no longer releases n1.
  for (std::size_t b : gained) EXPECT_FALSE(activation.may_grant(b, gone + 10 * kLockDelay));
  activation.on_handoff("n1", 11);
  for (std::size_t b : gained) EXPECT_TRUE(activation.may_grant(b, gone + 10 * kLockDelay));
}

// A single-member map owns every bucket, which makes chains explicit.
class Chain : public ::testing::Test {
 protected:
  // C sees A own everything (E1, settled), then B (E2, A never acks, so B
  // never activates), then itself (E3).
  void SetUp() override {
    ASSERT_EQ(c_.on_map(make_map(1, {"A"}), Time{0}), MapVerdict::kAdopted);
    c_.on_handoff("A", 1);
    ASSERT_EQ(c_.on_map(make_map(2, {"B"}), seconds(60)), MapVerdict::kAdopted);
    ASSERT_EQ(c_.on_map(make_map(3, {"C"}), seconds(61)), MapVerdict::kAdopted);
    ASSERT_TRUE(c_.owns(kBucket));
  }
  static constexpr std::size_t kBucket = 17;
  const Time much_later_ = seconds(61) + 10 * kLockDelay;
  BucketActivation c_ = make("C");
};

TEST_F(Chain, TheOwnerBeforeTheUnactivatedOwnerMustStillAck) {
  EXPECT_FALSE(c_.may_grant(kBucket, much_later_));
  c_.on_handoff("B", 3);
  EXPECT_FALSE(c_.may_grant(kBucket, much_later_));  // A may still hold leases
  c_.on_handoff("A", 3);
  EXPECT_TRUE(c_.may_grant(kBucket, much_later_));
}

TEST_F(Chain, OrTheOwnerBeforeMustBeGoneForTheLockDelay) {
  c_.on_handoff("B", 3);
  const Time gone = seconds(70);
  c_.on_member_gone("A", gone);
  EXPECT_FALSE(c_.may_grant(kBucket, gone + kLockDelay - nanoseconds(1)));
  EXPECT_TRUE(c_.may_grant(kBucket, gone + kLockDelay));
}

TEST_F(Chain, TheUnactivatedOwnerMustAckToo) {
  c_.on_handoff("A", 3);
  EXPECT_FALSE(c_.may_grant(kBucket, much_later_));  // B may have activated after all
  c_.on_handoff("B", 3);
  EXPECT_TRUE(c_.may_grant(kBucket, much_later_));
}

TEST(BucketActivation, RegainingALostBucketWaitsForTheOwnerInBetween) {
  // A -> B -> A: B may have activated on A's ack of E2.
  BucketActivation a = make("A");
  ASSERT_EQ(a.on_map(make_map(1, {"A"}), Time{0}), MapVerdict::kAdopted);
  const Time open = Time{0} + kLockDelay;
  ASSERT_TRUE(a.may_grant(3, open));
  ASSERT_EQ(a.on_map(make_map(2, {"B"}), open), MapVerdict::kAdopted);
  EXPECT_FALSE(a.may_grant(3, open));
  ASSERT_EQ(a.on_map(make_map(3, {"A"}), open), MapVerdict::kAdopted);
  EXPECT_FALSE(a.may_grant(3, open));
  a.on_handoff("B", 3);
  EXPECT_TRUE(a.may_grant(3, open));
}

// A skipped map: n3 stalls while n1 drains (E11: n1's buckets to n2 and
// n3; n2 grants in them) and then n2 drains (E12: n3 alone). n3 wakes and
// reads only E12. Going by the maps it saw, b moved n1 -> n3 and n1's ack is
// all it needs; but n2 owned b in between and may hold a lease on it.
TEST(BucketActivation, ASkippedMapStartsTheMovedBucketsOver) {
  BucketActivation n3 = make("n3");
  const Time open = settle_first_map(n3, kThree, seconds(0));
  const ClusterMap skipped = make_map(11, {"n2", "n3"});
  const ClusterMap alone = make_map(12, {"n3"});
  const std::vector<std::size_t> via_n2 = moved(kThree, skipped, "n1", "n2");
  ASSERT_FALSE(via_n2.empty());
  const Time woke = open + seconds(1);
  ASSERT_EQ(n3.on_map(alone, woke), MapVerdict::kAdopted);
  EXPECT_EQ(n3.history_restarts(), 2u);  // the first map, and this one
  n3.on_handoff("n1", 12);
  const Time much_later = woke + 10 * kLockDelay;
  for (std::size_t b : via_n2) EXPECT_FALSE(n3.may_grant(b, much_later)) << b;
  n3.on_handoff("n2", 12);
  // And never before the lock-delay from the skip: nodes that came and went
  // unseen in between may have granted.
  for (std::size_t b : via_n2) {
    EXPECT_FALSE(n3.may_grant(b, woke + kLockDelay - nanoseconds(1))) << b;
    EXPECT_TRUE(n3.may_grant(b, woke + kLockDelay)) << b;
  }
  // What n3 owned throughout stays active: nobody could activate it in
  // between without n3's ack of the map n3 never saw.
  for (std::size_t b : moved(kThree, alone, "n3", "n3")) EXPECT_TRUE(n3.may_grant(b, woke)) << b;
}

TEST(BucketActivation, ConsecutiveEpochsKeepTheirHistory) {
  BucketActivation n3 = make("n3");
  const Time open = settle_first_map(n3, kThree, seconds(0));
  ASSERT_EQ(n3.on_map(make_map(11, {"n2", "n3"}), open), MapVerdict::kAdopted);
  ASSERT_EQ(n3.on_map(make_map(12, {"n3"}), open), MapVerdict::kAdopted);
  EXPECT_EQ(n3.history_restarts(), 1u);
  n3.on_handoff("n1", 12);
  n3.on_handoff("n2", 12);
  // Both previous owners acked the current map: no lock-delay needed.
  for (std::size_t b = 0; b < n3.bucket_count(); ++b) EXPECT_TRUE(n3.may_grant(b, open)) << b;
}

TEST(BucketActivation, AFirstMapWaitsForALiveNodeOutsideIt) {
  // n2 is draining: registered, alive, holding leases, and out of the map.
  BucketActivation n3 = make("n3");
  n3.on_member_registered("n2", Time{0});
  ASSERT_EQ(n3.on_map(make_map(12, {"n3"}), Time{0}), MapVerdict::kAdopted);
  const Time much_later = 10 * kLockDelay;
  EXPECT_FALSE(n3.may_grant(0, much_later));
  n3.on_handoff("n2", 12);
  EXPECT_TRUE(n3.may_grant(0, much_later));
}

TEST(BucketActivation, TheLockDelayCoversTheLargestMaxTtlOfAnyMember) {
  // This node's own max TTL gives 47 s; a member publishes a 120 s one.
  BucketActivation activation(ActivationOptions{.node_id = "n2",
                                                .lock_delay = kLockDelay,
                                                .lock_delay_margin = seconds(17),
                                                .router_options = router_options()});
  const Time open = settle_first_map(activation, kThree, seconds(0));
  activation.raise_max_ttl(seconds(120));
  activation.raise_max_ttl(seconds(10));  // never lowers it
  EXPECT_EQ(activation.lock_delay(), seconds(137));
  const Time gone = open + seconds(1);
  activation.on_member_gone("n1", gone);
  ASSERT_EQ(activation.on_map(make_map(11, {"n2", "n3"}), gone), MapVerdict::kAdopted);
  const std::vector<std::size_t> gained = moved(kThree, make_map(11, {"n2", "n3"}), "n1", "n2");
  ASSERT_FALSE(gained.empty());
  for (std::size_t b : gained) {
    EXPECT_FALSE(activation.may_grant(b, gone + kLockDelay)) << b;
    EXPECT_FALSE(activation.may_grant(b, gone + seconds(137) - nanoseconds(1))) << b;
    EXPECT_TRUE(activation.may_grant(b, gone + seconds(137))) << b;
  }
}

TEST(BucketActivation, AnOlderOrEqualMapIsIgnored) {
  BucketActivation activation = make("n2");
  const Time open = settle_first_map(activation, kThree, seconds(0));
  const std::vector<std::size_t> mine = moved(kThree, kThree, "n2", "n2");
  // An older map that would give n2's buckets away, and one with the same
  // epoch: neither is adopted.
  EXPECT_EQ(activation.on_map(make_map(9, {"n1", "n3"}), open), MapVerdict::kStale);
  EXPECT_EQ(activation.on_map(make_map(10, {"n1", "n3"}), open), MapVerdict::kStale);
  EXPECT_EQ(activation.epoch(), 10U);
  EXPECT_TRUE(activation.buckets_to_hand_off().empty());
  for (std::size_t b : mine) EXPECT_TRUE(activation.may_grant(b, open)) << b;
}

TEST(BucketActivation, LostBucketsAreReportedForHandOffAtOnce) {
  BucketActivation activation = make("n1");
  const Time open = settle_first_map(activation, kThree, seconds(0));
  const std::vector<std::size_t> had = moved(kThree, kThree, "n1", "n1");
  ASSERT_FALSE(had.empty());
  for (std::size_t b : had) ASSERT_TRUE(activation.may_grant(b, open));

  const ClusterMap two = make_map(11, {"n2", "n3"});  // n1 drains
  ASSERT_EQ(activation.on_map(two, open), MapVerdict::kAdopted);
  EXPECT_EQ(activation.buckets_to_hand_off(), had);
  for (std::size_t b : had) EXPECT_FALSE(activation.may_grant(b, open)) << b;
  // It may ack the new epoch only once its leases there are over.
  EXPECT_FALSE(activation.ready_to_ack(11, 3));
  EXPECT_TRUE(activation.ready_to_ack(11, 0));
  EXPECT_FALSE(activation.ready_to_ack(10, 0));
  EXPECT_FALSE(activation.ready_to_ack(12, 0));

  // The next map reports only what it takes.
  ASSERT_EQ(activation.on_map(make_map(12, {"n2", "n3"}), open), MapVerdict::kAdopted);
  EXPECT_TRUE(activation.buckets_to_hand_off().empty());
}

TEST(BucketActivation, AnEmptyMapOwnsNothing) {
  BucketActivation activation = make("n1");
  const Time open = settle_first_map(activation, kThree, seconds(0));
  ASSERT_EQ(activation.on_map(make_map(11, {}), open), MapVerdict::kAdopted);
  EXPECT_EQ(activation.buckets_to_hand_off(), moved(kThree, kThree, "n1", "n1"));
  for (std::size_t b = 0; b < activation.bucket_count(); ++b) {
    EXPECT_FALSE(activation.may_grant(b, open));
  }
}

// ---- Replication: a takeover releases the old primary for that bucket ----

TEST(BucketActivation, ATakeoverReleasesTheDeadPrimaryForThatBucketOnly) {
  BucketActivation activation = make("n2");
  const Time opened = settle_first_map(activation, kThree, Time{0});
  const ClusterMap without_n1 = make_map(11, {"n2", "n3"});
  const std::vector<std::size_t> to_n2 = moved(kThree, without_n1, "n1", "n2");
  ASSERT_FALSE(to_n2.empty());
  ASSERT_EQ(activation.on_map(without_n1, opened), MapVerdict::kAdopted);
  activation.on_member_gone("n1", opened);

  // Which of them n2 backed up for n1 (first backup in the map before).
  std::vector<std::size_t> backed;
  std::vector<std::size_t> not_backed;
  for (const std::size_t b : to_n2) {
    const auto primary = activation.previous_primary_backed_by_self(b, 2);
    if (primary) {
      EXPECT_EQ(*primary, "n1");
      backed.push_back(b);
    } else {
      not_backed.push_back(b);
    }
    EXPECT_FALSE(activation.may_grant(b, opened)) << b;  // n1 has not let go
  }
  // With 3 nodes and 2 replicas, every bucket n1 lost to n2 had n2 as its
  // first backup: the heir is the next in the ranking.
  EXPECT_EQ(backed.size(), to_n2.size());
  EXPECT_FALSE(activation.previous_primary_backed_by_self(to_n2[0], 1).has_value());

  activation.on_taken_over(backed[0], "n1");
  EXPECT_TRUE(activation.may_grant(backed[0], opened));
  if (backed.size() > 1) {
    EXPECT_FALSE(activation.may_grant(backed[1], opened));
  }
  // Taking over from a node not in the chain, or from itself, changes nothing.
  activation.on_taken_over(backed.back(), "n3");
  activation.on_taken_over(backed.back(), "n2");
  if (backed.size() > 1) {
    EXPECT_FALSE(activation.may_grant(backed.back(), opened));
  }
  // The lock-delay still releases the rest.
  EXPECT_TRUE(activation.may_grant(backed.back(), opened + kLockDelay));
}

TEST(BucketActivation, WithThreeReplicasTheSecondBackupTakesOverWhenPrimaryAndFirstBackupLeave) {
  // Four nodes, three owners per bucket. n1 and n2 leave in one map: the
  // buckets n1 owned and n2 backed first now belong to their second backup.
  const ClusterMap four = make_map(10, {"n1", "n2", "n3", "n4"});
  std::unique_ptr<ClusterRouting> routing;
  ASSERT_EQ(ClusterRouting::build(four, router_options(), routing), RouterStatus::kOk);
  const ClusterMap two = make_map(11, {"n3", "n4"});
  std::map<std::string, std::vector<std::size_t>> second_backup_of_n1;  // by that backup
  for (std::size_t b = 0; b < routing->bucket_count(); ++b) {
    const std::vector<std::uint16_t> ranking = routing->snapshot().ranking_of_bucket(b, 3);
    ASSERT_EQ(ranking.size(), 3u);
    const auto id = [&](std::size_t rank) { return routing->snapshot().nodes()[ranking[rank]].id; };
    if (id(0) == "n1" && id(1) == "n2") second_backup_of_n1[id(2)].push_back(b);
  }
  ASSERT_FALSE(second_backup_of_n1.empty());
  for (const auto& [self, buckets] : second_backup_of_n1) {
    BucketActivation activation = make(self);
    const Time opened = settle_first_map(activation, four, Time{0});
    ASSERT_EQ(activation.on_map(two, opened), MapVerdict::kAdopted);
    for (const std::size_t b : buckets) {
      ASSERT_TRUE(activation.owns(b)) << b;
      EXPECT_EQ(activation.previous_primary_backed_by_self(b, 3), std::optional<std::string>("n1"))
          << self << " bucket " << b;
      // With two owners per bucket it was no backup at all.
      EXPECT_FALSE(activation.previous_primary_backed_by_self(b, 2).has_value()) << b;
    }
  }
}

TEST(BucketActivation, ALearnerTakesOverTheBucketsItBackedUpWhenItIsPromoted) {
  // n4 joins as a learner, catches up, and becomes a member in the next map:
  // the buckets it owns now it backed up for their primary as a learner, so
  // it takes each over from that primary. Where it was not a learner, it
  // owns nothing now.
  ClusterMap learning = make_map(10, {"n1", "n2", "n3"});
  learning.learners = {{"n4", "n4:7700", 1}};
  const ClusterMap promoted = make_map(11, {"n1", "n2", "n3", "n4"});
  std::unique_ptr<ReplicaRouting> before;
  ASSERT_EQ(ReplicaRouting::build(learning, router_options(), before), RouterStatus::kOk);
  BucketActivation activation = make("n4");
  const Time opened = settle_first_map(activation, learning, Time{0});
  ASSERT_EQ(activation.on_map(promoted, opened), MapVerdict::kAdopted);
  std::size_t taken = 0;
  for (std::size_t b = 0; b < before->snapshot().bucket_count(); ++b) {
    if (!activation.owns(b)) continue;
    const std::vector<std::uint16_t> set = before->replicas_of(b, 2);
    ASSERT_EQ(set.size(), 3u) << b;  // it was this bucket's learner
    EXPECT_EQ(activation.previous_primary_backed_by_self(b, 2),
              std::optional<std::string>(before->nodes()[set[0]].id))
        << b;
    ++taken;
  }
  EXPECT_GT(taken, 0u);
}

TEST(BucketActivation, ATakeoverOfABucketItsPrimaryHadActiveNeedsNoOtherWait) {
  // A node that has just started knows nothing of the history: every bucket
  // waits for the lock-delay. Taken over from a primary that had it active
  // (every earlier owner's lease there was over), a bucket is active at
  // once; without that word, it still waits.
  ClusterMap learning = make_map(10, {"n1", "n2", "n3"});
  learning.learners = {{"n4", "n4:7700", 1}};
  const ClusterMap promoted = make_map(11, {"n1", "n2", "n3", "n4"});
  BucketActivation activation = make("n4");
  ASSERT_EQ(activation.on_map(learning, Time{0}), MapVerdict::kAdopted);
  for (const ClusterMember& m : learning.members) activation.on_handoff(m.id, learning.epoch);
  ASSERT_EQ(activation.on_map(promoted, seconds(1)), MapVerdict::kAdopted);
  for (const ClusterMember& m : learning.members) activation.on_handoff(m.id, promoted.epoch);
  std::vector<std::size_t> taken;
  for (std::size_t b = 0; b < (std::size_t{1} << kBucketBits) && taken.size() < 2; ++b) {
    if (activation.owns(b) && activation.previous_primary_backed_by_self(b, 2)) taken.push_back(b);
  }
  ASSERT_EQ(taken.size(), 2u);
  const std::string p0 = *activation.previous_primary_backed_by_self(taken[0], 2);
  const std::string p1 = *activation.previous_primary_backed_by_self(taken[1], 2);
  activation.on_taken_over(taken[0], p0, /*owner_active=*/true);
  activation.on_taken_over(taken[1], p1, /*owner_active=*/false);
  EXPECT_TRUE(activation.may_grant(taken[0], seconds(2)));
  EXPECT_FALSE(activation.may_grant(taken[1], seconds(2)));
  EXPECT_TRUE(activation.may_grant(taken[1], kLockDelay + seconds(1)));
}

// The history floor (the server's own lock-delay end)
// holds every bucket of a map without history past the cluster's
// lock-delay, except one taken over complete, which grants at once.
TEST(BucketActivation, TheHistoryFloorHoldsEveryBucketButOneTakenOverComplete) {
  ClusterMap learning = make_map(10, {"n1", "n2", "n3"});
  learning.learners = {{"n4", "n4:7700", 1}};
  const ClusterMap promoted = make_map(11, {"n1", "n2", "n3", "n4"});
  const Time floor = 3 * kLockDelay;
  BucketActivation activation(ActivationOptions{.node_id = "n4",
                                                .lock_delay = kLockDelay,
                                                .router_options = router_options(),
                                                .history_floor = floor});
  ASSERT_EQ(activation.on_map(learning, Time{0}), MapVerdict::kAdopted);
  ASSERT_EQ(activation.on_map(promoted, seconds(1)), MapVerdict::kAdopted);
  for (const ClusterMember& m : learning.members) activation.on_handoff(m.id, promoted.epoch);
  std::vector<std::size_t> taken;
  for (std::size_t b = 0; b < (std::size_t{1} << kBucketBits) && taken.size() < 2; ++b) {
    if (activation.owns(b) && activation.previous_primary_backed_by_self(b, 2)) taken.push_back(b);
  }
  ASSERT_EQ(taken.size(), 2u);
  activation.on_taken_over(taken[0], *activation.previous_primary_backed_by_self(taken[0], 2),
                           /*owner_active=*/true);
  EXPECT_TRUE(activation.may_grant(taken[0], seconds(2)));
  EXPECT_FALSE(activation.may_grant(taken[1], kLockDelay + seconds(1))) << "past the lock-delay";
  EXPECT_FALSE(activation.may_grant(taken[1], floor - seconds(1)));
  EXPECT_TRUE(activation.may_grant(taken[1], floor));
}

TEST(BucketActivation, NoTakeoverAcrossASkippedMap) {
  BucketActivation activation = make("n2");
  const Time opened = settle_first_map(activation, kThree, Time{0});
  // Epoch 12 after 10: 11 was missed, so nothing is known of the history.
  const ClusterMap skipped = make_map(12, {"n2", "n3"});
  ASSERT_EQ(activation.on_map(skipped, opened), MapVerdict::kAdopted);
  for (std::size_t b = 0; b < activation.bucket_count(); ++b) {
    EXPECT_FALSE(activation.previous_primary_backed_by_self(b, 2).has_value()) << b;
  }
}

TEST(BucketActivation, ABucketWithALongerChainWaitsForTheRestAfterATakeover) {
  // b moves n1 -> n3 in epoch 11 (n3 not active yet), then n3 dies and b
  // moves to n2 in epoch 12: n2 waits for n1 too, whatever it took over from n3.
  BucketActivation activation = make("n2");
  const Time opened = settle_first_map(activation, make_map(10, {"n1", "n3"}), Time{0});
  // n2 joins: it was not in epoch 10; take a map where n2 is present.
  ASSERT_EQ(activation.on_map(make_map(11, {"n1", "n2", "n3"}), opened), MapVerdict::kAdopted);
  activation.on_handoff("n1", 11);
  activation.on_handoff("n3", 11);
  const ClusterMap two = make_map(12, {"n2", "n3"});
  const std::vector<std::size_t> from_n1 = moved(make_map(11, {"n1", "n2", "n3"}), two, "n1", "n3");
  const ClusterMap one = make_map(13, {"n2"});
  ASSERT_EQ(activation.on_map(two, opened), MapVerdict::kAdopted);
  ASSERT_EQ(activation.on_map(one, opened), MapVerdict::kAdopted);
  ASSERT_FALSE(from_n1.empty());
  const std::size_t b = from_n1[0];
  // In epoch 12 b's chain gained n1 (its owner before), and in 13 n3.
  ASSERT_EQ(activation.previous_primary_backed_by_self(b, 2), std::optional<std::string>("n3"));
  activation.on_taken_over(b, "n3");
  EXPECT_FALSE(activation.may_grant(b, opened));  // n1 never acked 12 nor 13
  activation.on_handoff("n1", 13);
  EXPECT_TRUE(activation.may_grant(b, opened));
}

TEST(BucketActivation, AnIncarnationIsSettledALockDelayAfterItsRegistration) {
  BucketActivation activation = make("n2");
  EXPECT_FALSE(activation.incarnation_settled("n1", Time{0}));  // never seen
  activation.on_member_registered("n1", seconds(10));
  EXPECT_FALSE(activation.incarnation_settled("n1", seconds(10) + kLockDelay - milliseconds(1)));
  EXPECT_TRUE(activation.incarnation_settled("n1", seconds(10) + kLockDelay));
  // It restarts: its new run's stream cannot carry the old run's leases.
  activation.on_member_gone("n1", seconds(100));
  activation.on_member_registered("n1", seconds(101));
  EXPECT_FALSE(activation.incarnation_settled("n1", seconds(102)));
  EXPECT_TRUE(activation.incarnation_settled("n1", seconds(101) + kLockDelay));
}

}  // namespace
}  // namespace shardlock::cluster
