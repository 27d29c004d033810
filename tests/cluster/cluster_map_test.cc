// The cluster's values (shardlock/cluster/cluster_map.h): their encodings on
// every malformed input etcd could hold, names and URLs, and routing over a
// map. Pure: no etcd, one thread.
#include "shardlock/cluster/cluster_map.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace shardlock::cluster {
namespace {

// Small tables keep the Router's builds cheap under the sanitizers; the
// mapping is the same function at any size.
constexpr int kTestBucketBits = 12;

TEST(MemberValue, RoundTripsAndRejectsMalformedInput) {
  const MemberRecord record{"127.0.0.1:7700", 3, MemberState::kDraining, 0};
  EXPECT_EQ(encode_member(record), "address=127.0.0.1:7700 weight=3 state=draining");
  EXPECT_EQ(decode_member(encode_member(record)), record);
  // The max TTL travels when known, so every node's lock-delay can cover it.
  const MemberRecord with_ttl{"127.0.0.1:7700", 1, MemberState::kActive, 120000};
  EXPECT_EQ(encode_member(with_ttl),
            "address=127.0.0.1:7700 weight=1 state=active max_ttl_ms=120000");
  EXPECT_EQ(decode_member(encode_member(with_ttl)), with_ttl);
  // So does the replica count, which every node of a cluster must share.
  const MemberRecord with_replicas{"127.0.0.1:7700", 1, MemberState::kActive, 2000, 2};
  EXPECT_EQ(encode_member(with_replicas),
            "address=127.0.0.1:7700 weight=1 state=active max_ttl_ms=2000 replicas=2");
  EXPECT_EQ(decode_member(encode_member(with_replicas)), with_replicas);
  // Any order, unknown fields ignored.
  EXPECT_EQ(decode_member("state=active future=1 weight=1 address=[::1]:9"),
            (MemberRecord{"[::1]:9", 1, MemberState::kActive, 0}));
  for (const char* bad :
       {"", "address=h:1 weight=1", "address=h:1 weight=0 state=active",
        "address=h:1 weight=1025 state=active", "address=h weight=1 state=active",
        "address=h:1 weight=1 state=gone", "address=h:1  weight=1 state=active",
        "address=:1 weight=1 state=active", "address=h:70000 weight=1 state=active",
        "address=h:1 weight=1 state=active max_ttl_ms=x",
        "address=h:1 weight=1 state=active replicas=0",
        "address=h:1 weight=1 state=active replicas=two"}) {
    EXPECT_FALSE(decode_member(bad).has_value()) << "'" << bad << "'";
  }
}

TEST(MapValue, RoundTripsAndRejectsWhatEncodeWouldNotProduce) {
  const ClusterMap map{42, {{"a", "127.0.0.1:1", 1}, {"b", "127.0.0.1:2", 7}}};
  const std::string text = encode_map(map);
  EXPECT_EQ(text, "shardlock-map v2 epoch=42\na 127.0.0.1:1 1\nb 127.0.0.1:2 7\n");
  // A v2 value carries its epoch, whatever the key's mod_revision.
  EXPECT_EQ(decode_map(text, 9999), map);
  EXPECT_EQ(decode_map_members(text), map.members);
  // A v1 value (the first format) takes the key's mod_revision as its epoch,
  // so a cluster that upgrades continues from there.
  const auto v1 = decode_map("shardlock-map v1\na 127.0.0.1:1 1\nb 127.0.0.1:2 7\n", 777);
  ASSERT_TRUE(v1.has_value());
  EXPECT_EQ(v1->epoch, 777u);
  EXPECT_EQ(v1->members, map.members);
  EXPECT_EQ(decode_map_members("shardlock-map v1\n"), std::vector<ClusterMember>{});
  for (const char* bad :
       {"", "shardlock-map v1", "shardlock-map v2\n", "shardlock-map v2 epoch=0\n",
        "shardlock-map v2 epoch=\n", "shardlock-map v2 epoch=-1\n", "shardlock-map v3 epoch=1\n",
        "shardlock-map v2 epoch=99999999999999999999999\n",
        "shardlock-map v1\nb h:2 1\na h:1 1\n",  // out of order
        "shardlock-map v1\na h:1 1\na h:1 1\n",  // repeated
        "shardlock-map v1\na h:1 0\n", "shardlock-map v1\na h:1\n", "shardlock-map v1\na/b h:1 1\n",
        "shardlock-map v1\n\n"}) {
    EXPECT_FALSE(decode_map(bad, 5).has_value()) << "'" << bad << "'";
  }
  EXPECT_TRUE(valid_node_id("node-1.a_b"));
  EXPECT_FALSE(valid_node_id(""));
  EXPECT_FALSE(valid_node_id("a/b"));
  EXPECT_FALSE(valid_node_id(std::string(129, 'a')));
}

TEST(MapValue, LearnersAndLeasesRoundTripAndTheirMalformedLinesAreRejected) {
  ClusterMap map{7, {{"a", "127.0.0.1:1", 1, 11}, {"c", "127.0.0.1:3", 2}}};
  map.learners = {{"b", "127.0.0.1:2", 1, 22}};
  const std::string text = encode_map(map);
  EXPECT_EQ(text,
            "shardlock-map v2 epoch=7\na 127.0.0.1:1 1 lease=11\nc 127.0.0.1:3 2\n"
            "+b 127.0.0.1:2 1 lease=22\n");
  EXPECT_EQ(decode_map(text, 1), map);
  // Clients route over the members only.
  EXPECT_EQ(decode_map_members(text), map.members);
  for (const char* bad :
       {"shardlock-map v2 epoch=1\n+a h:1 1\na h:2 1\n",           // a member after a learner
        "shardlock-map v2 epoch=1\na h:1 1\n+a h:2 1\n",           // a member's id again
        "shardlock-map v2 epoch=1\n+b h:1 1\n+a h:2 1\n",          // learners out of order
        "shardlock-map v2 epoch=1\n+ h:1 1\n",                     // no id
        "shardlock-map v2 epoch=1\na h:1 1 lease=0\n",             // lease 0 is "unknown"
        "shardlock-map v2 epoch=1\na h:1 1 lease=-3\n",            //
        "shardlock-map v2 epoch=1\na h:1 1 lease=x\n",             //
        "shardlock-map v2 epoch=1\na h:1 1 term=4\n",              // an unknown field
        "shardlock-map v2 epoch=1\na h:1 1 lease=4 lease=4\n"}) {  // five fields
    EXPECT_FALSE(decode_map(bad, 5).has_value()) << "'" << bad << "'";
  }
  // A joining member's state.
  const MemberRecord joining{"127.0.0.1:7700", 1, MemberState::kJoining, 0, 2};
  EXPECT_EQ(encode_member(joining), "address=127.0.0.1:7700 weight=1 state=joining replicas=2");
  EXPECT_EQ(decode_member(encode_member(joining)), joining);
}

// A lone member with a learner streams every bucket to it,
// so its buckets have a backup and must be granted within the primary lease.
TEST(ReplicaRoutingTest, ALoneMemberWithALearnerHasBackups) {
  ClusterMap map;
  map.epoch = 3;
  map.members = {ClusterMember{"n1", "127.0.0.1:7001", 1}};
  EXPECT_FALSE(has_backups(map, 2)) << "alone: nobody to take over";
  map.learners = {ClusterMember{"n2", "127.0.0.1:7002", 1}};
  EXPECT_TRUE(has_backups(map, 2)) << "the learner backs every bucket up";
  EXPECT_FALSE(has_backups(map, 1)) << "unreplicated";
  map.learners.clear();
  map.members.push_back(ClusterMember{"n2", "127.0.0.1:7002", 1});
  EXPECT_TRUE(has_backups(map, 2));
  // Wherever has_backups() holds, the layout gives every bucket a backup.
  map.members.pop_back();
  map.learners = {ClusterMember{"n2", "127.0.0.1:7002", 1}};
  RouterOptions options = cluster_router_options();
  options.bucket_bits = kTestBucketBits;
  std::unique_ptr<ReplicaRouting> replicas;
  ASSERT_EQ(ReplicaRouting::build(map, options, replicas), RouterStatus::kOk);
  for (std::size_t b = 0; b < replicas->snapshot().bucket_count(); ++b) {
    EXPECT_EQ(replicas->replicas_of(b, 2).size(), 2U) << "bucket " << b;
  }
}

TEST(ReplicaRoutingTest, ALearnerBacksUpWhereItRanksAndOnceAMemberOwnsExactlyThere) {
  RouterOptions options = cluster_router_options();
  options.bucket_bits = kTestBucketBits;
  ClusterMap three{5, {{"n1", "h:1", 1}, {"n2", "h:2", 1}, {"n3", "h:3", 1}}};
  ClusterMap with_learner = three;
  with_learner.learners = {{"n0", "h:0", 1}};  // sorts first among the nodes
  ClusterMap promoted{6, {{"n0", "h:0", 1}, {"n1", "h:1", 1}, {"n2", "h:2", 1}, {"n3", "h:3", 1}}};
  std::unique_ptr<ClusterRouting> owners;
  std::unique_ptr<ClusterRouting> owners_after;
  std::unique_ptr<ReplicaRouting> learning;
  std::unique_ptr<ReplicaRouting> plain;
  std::unique_ptr<ReplicaRouting> after;
  ASSERT_EQ(ClusterRouting::build(with_learner, options, owners), RouterStatus::kOk);
  ASSERT_EQ(ClusterRouting::build(promoted, options, owners_after), RouterStatus::kOk);
  ASSERT_EQ(ReplicaRouting::build(with_learner, options, learning), RouterStatus::kOk);
  ASSERT_EQ(ReplicaRouting::build(three, options, plain), RouterStatus::kOk);
  ASSERT_EQ(ReplicaRouting::build(promoted, options, after), RouterStatus::kOk);
  ASSERT_EQ(learning->nodes().size(), 4u);
  ASSERT_TRUE(learning->learners()[0]);
  const auto ids = [](const ReplicaRouting& r, const std::vector<std::uint16_t>& set) {
    std::vector<std::string> out;
    for (const std::uint16_t i : set) out.push_back(r.nodes()[i].id);
    return out;
  };
  std::size_t learner_backs = 0;
  for (std::size_t b = 0; b < learning->snapshot().bucket_count(); ++b) {
    const std::vector<std::string> set = ids(*learning, learning->replicas_of(b, 2));
    const std::vector<std::string> without = ids(*plain, plain->replicas_of(b, 2));
    const std::vector<std::string> once_member = ids(*after, after->replicas_of(b, 2));
    ASSERT_GE(set.size(), 2u);
    // The learner never owns a bucket, and the owners' replica sets stay
    // what they are without it: it is one more backup where it ranks.
    EXPECT_EQ(set[0], owners->owner_of_bucket(b)->id) << b;
    std::vector<std::string> members_only = set;
    std::erase(members_only, "n0");
    EXPECT_EQ(members_only, without) << b;
    const bool learner_here = set.size() == 3;
    EXPECT_EQ(learner_here, std::find(set.begin(), set.end(), "n0") != set.end()) << b;
    // Once promoted it holds exactly the buckets it backed up: the primary
    // where it ranked first, a backup where second.
    const bool in_after =
        std::find(once_member.begin(), once_member.end(), "n0") != once_member.end();
    EXPECT_EQ(learner_here, in_after) << b;
    if (learner_here) {
      ++learner_backs;
      EXPECT_EQ(once_member[0] == "n0", owners_after->owner_of_bucket(b)->id == "n0") << b;
    }
  }
  // With two of four ranks, about half the buckets.
  EXPECT_GT(learner_backs, learning->snapshot().bucket_count() / 3);
  EXPECT_LT(learner_backs, learning->snapshot().bucket_count() * 2 / 3);
  // A map of learners only has no replica sets.
  ClusterMap only_learners{1, {}};
  only_learners.learners = {{"n0", "h:0", 1}};
  std::unique_ptr<ReplicaRouting> none;
  ASSERT_EQ(ReplicaRouting::build(only_learners, options, none), RouterStatus::kOk);
  EXPECT_TRUE(none->replicas_of(0, 2).empty());
}

TEST(ClusterRoutingTest, EqualMapsGiveEqualOwnersAndAKeyMapsToItsBucketsOwner) {
  RouterOptions options;
  options.bucket_bits = kTestBucketBits;
  const ClusterMap map{7, {{"a", "h:1", 1}, {"b", "h:2", 2}, {"c", "h:3", 1}}};
  ClusterMap shuffled = map;
  std::swap(shuffled.members[0], shuffled.members[2]);  // build() sorts
  std::unique_ptr<ClusterRouting> one;
  std::unique_ptr<ClusterRouting> two;
  ASSERT_EQ(ClusterRouting::build(map, options, one), RouterStatus::kOk);
  ASSERT_EQ(ClusterRouting::build(shuffled, options, two), RouterStatus::kOk);
  ASSERT_EQ(one->bucket_count(), std::size_t{1} << kTestBucketBits);
  for (std::size_t bucket = 0; bucket < one->bucket_count(); ++bucket) {
    ASSERT_NE(one->owner_of_bucket(bucket), nullptr);
    ASSERT_EQ(one->owner_of_bucket(bucket)->id, two->owner_of_bucket(bucket)->id) << bucket;
  }
  EXPECT_EQ(one->owner_of("some-key")->id, one->snapshot().owner("some-key"));
  EXPECT_EQ(one->owner_of("some-key"), one->owner_of_bucket(one->bucket_of("some-key")));
  EXPECT_EQ(one->epoch(), 7u);

  std::unique_ptr<ClusterRouting> empty;
  ASSERT_EQ(ClusterRouting::build(ClusterMap{}, options, empty), RouterStatus::kOk);
  EXPECT_EQ(empty->owner_of("k"), nullptr);
}

TEST(ClusterNames, PrefixAndUrlAcceptOnlyWhatCannotEscapeTheirPlace) {
  EXPECT_EQ(cluster_prefix("default"), "/shardlock/default/");
  EXPECT_EQ(cluster_prefix("prod-eu.1"), "/shardlock/prod-eu.1/");
  for (const char* bad : {"", "a/b", "..x/", "a b", "a\n"}) {
    EXPECT_EQ(cluster_prefix(bad), "") << "'" << bad << "'";
  }
  EXPECT_EQ(cluster_prefix(std::string(129, 'a')), "");

  const EtcdUrl plain{"127.0.0.1:2379", false};
  EXPECT_EQ(parse_etcd_url("etcd://127.0.0.1:2379"), plain);
  EXPECT_EQ(parse_etcd_url("http://127.0.0.1:2379"), plain);
  EXPECT_EQ(parse_etcd_url("etcd://a:1,[::1]:2,b.example:3"),
            (EtcdUrl{"a:1,[::1]:2,b.example:3", false}));
  const EtcdUrl tls{"10.0.0.1:2379,10.0.0.2:2379", true};
  EXPECT_EQ(parse_etcd_url("etcds://10.0.0.1:2379,10.0.0.2:2379"), tls);
  EXPECT_EQ(parse_etcd_url("https://10.0.0.1:2379,10.0.0.2:2379"), tls);
  // etcdctl's spelling: the scheme on every endpoint.
  EXPECT_EQ(parse_etcd_url("https://10.0.0.1:2379,https://10.0.0.2:2379"), tls);
  EXPECT_EQ(parse_etcd_url("etcds://10.0.0.1:2379,https://10.0.0.2:2379"), tls);
  EXPECT_EQ(parse_etcd_url("http://a:1,etcd://b:2"), (EtcdUrl{"a:1,b:2", false}));
  for (const char* bad : {"", "etcd://", "etcds://", "127.0.0.1:2379", "etcd://127.0.0.1",
                          "etcd://a:1,", "etcd://a:1,,b:2", "etcd://a:0", "etcd://a:1 ,b:2",
                          "ETCD://a:1", "unix://a:1", "grpc://a:1",
                          // Plaintext and TLS in one list: one of them would be a mistake.
                          "etcds://a:1,http://b:2", "http://a:1,https://b:2",
                          "etcd://a:1,etcds://b:2", "etcd://http://a:1"}) {
    EXPECT_FALSE(parse_etcd_url(bad).has_value()) << "'" << bad << "'";
  }
}

TEST(ClusterRoutingTest, EveryNodeAndClientRoutesWith65536BucketsAndTheDefaultSeed) {
  const RouterOptions options = cluster_router_options();
  EXPECT_EQ(options.bucket_bits, 16);
  EXPECT_EQ(options.seed, kDefaultRouterSeed);
  const ClusterMap map{3, {{"a", "h:1", 1}, {"b", "h:2", 3}}};
  std::unique_ptr<ClusterRouting> by_default;
  std::unique_ptr<ClusterRouting> explicit_options;
  ASSERT_EQ(ClusterRouting::build(map, by_default), RouterStatus::kOk);
  ASSERT_EQ(ClusterRouting::build(map, options, explicit_options), RouterStatus::kOk);
  ASSERT_EQ(by_default->bucket_count(), std::size_t{1} << 16);
  for (std::size_t bucket = 0; bucket < by_default->bucket_count(); ++bucket) {
    ASSERT_EQ(by_default->owner_of_bucket(bucket)->id,
              explicit_options->owner_of_bucket(bucket)->id)
        << bucket;
  }
}

TEST(ClusterRoutingTest, BucketsPerMemberCountsEveryBucketOnceInMemberOrder) {
  RouterOptions options;
  options.bucket_bits = kTestBucketBits;
  const ClusterMap map{9, {{"a", "h:1", 1}, {"b", "h:2", 2}, {"c", "h:3", 1}}};
  std::unique_ptr<ClusterRouting> routing;
  ASSERT_EQ(ClusterRouting::build(map, options, routing), RouterStatus::kOk);
  const std::vector<std::size_t> counts = routing->buckets_per_member();
  ASSERT_EQ(counts.size(), 3u);
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), std::size_t{0}), routing->bucket_count());
  std::vector<std::size_t> expected(3, 0);
  for (std::size_t bucket = 0; bucket < routing->bucket_count(); ++bucket) {
    const ClusterMember* owner = routing->owner_of_bucket(bucket);
    ASSERT_NE(owner, nullptr);
    ++expected[static_cast<std::size_t>(owner - routing->map().members.data())];
  }
  EXPECT_EQ(counts, expected);
  EXPECT_GT(counts[1], counts[0]);  // weight 2 against weight 1

  std::unique_ptr<ClusterRouting> empty;
  ASSERT_EQ(ClusterRouting::build(ClusterMap{}, options, empty), RouterStatus::kOk);
  EXPECT_TRUE(empty->buckets_per_member().empty());
}

}  // namespace
}  // namespace shardlock::cluster
