// The cluster's values (shardlock/cluster/cluster_map.h): their encodings on
// every malformed input etcd could hold, names and URLs, and routing over a
// map. Pure: no etcd, one thread.
#include "shardlock/cluster/cluster_map.h"

#include <gtest/gtest.h>

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

  EXPECT_EQ(etcd_endpoints_of_url("etcd://127.0.0.1:2379"), "127.0.0.1:2379");
  EXPECT_EQ(etcd_endpoints_of_url("etcd://a:1,[::1]:2,b.example:3"), "a:1,[::1]:2,b.example:3");
  for (const char* bad :
       {"", "etcd://", "127.0.0.1:2379", "http://127.0.0.1:2379", "etcd://127.0.0.1", "etcd://a:1,",
        "etcd://a:1,,b:2", "etcd://a:0", "etcd://a:1 ,b:2", "ETCD://a:1"}) {
    EXPECT_FALSE(etcd_endpoints_of_url(bad).has_value()) << "'" << bad << "'";
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
