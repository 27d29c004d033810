// Router properties: API contract, determinism, balance, movement, weights,
// replicas, bounded load and concurrent lookups during changes. Sampled
// properties use 1M keys from a fixed-seed PRNG; balance is also checked on
// the exact key-space share (bucket counts). No timing assertions.
#include "shardlock/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace shardlock {
namespace {

constexpr std::size_t kKeys = 1'000'000;

// 1M distinct keys of 16..32 bytes, the same in every run.
const std::vector<std::string>& sample_keys() {
  static const std::vector<std::string> keys = [] {
    std::mt19937_64 rng(0x5eed'0005);
    std::uniform_int_distribution<int> length(16, 32);
    std::uniform_int_distribution<int> letter('a', 'z');
    std::vector<std::string> out;
    out.reserve(kKeys);
    for (std::size_t i = 0; i < kKeys; ++i) {
      std::string key = "k" + std::to_string(i) + ":";
      const auto n = static_cast<std::size_t>(length(rng));
      while (key.size() < n) key.push_back(static_cast<char>(letter(rng)));
      out.push_back(std::move(key));
    }
    return out;
  }();
  return keys;
}

std::vector<Node> numbered_nodes(std::size_t n, std::uint32_t weight = 1) {
  std::vector<Node> nodes;
  for (std::size_t i = 0; i < n; ++i) nodes.push_back({"node-" + std::to_string(i), weight});
  return nodes;
}

RouterOptions with_bits(int bits) {
  RouterOptions options;
  options.bucket_bits = bits;
  return options;
}

double peak_over_mean(const std::vector<std::uint64_t>& counts) {
  const double total =
      static_cast<double>(std::accumulate(counts.begin(), counts.end(), std::uint64_t{0}));
  const double mean = total / static_cast<double>(counts.size());
  return static_cast<double>(*std::max_element(counts.begin(), counts.end())) / mean;
}

// Owner index per sample key.
std::vector<std::uint16_t> owners_of_samples(const RouterSnapshot& snapshot) {
  std::vector<std::uint16_t> out;
  out.reserve(kKeys);
  for (const std::string& key : sample_keys()) out.push_back(snapshot.owner_index(key));
  return out;
}

TEST(RouterTest, StatusesSizeNodesAndEpochs) {
  Router router(with_bits(12));
  EXPECT_EQ(router.epoch(), 0u);
  EXPECT_EQ(router.size(), 0u);
  EXPECT_EQ(router.owner("anything"), "");
  EXPECT_TRUE(router.owners("anything", 3).empty());

  EXPECT_EQ(router.add("b"), RouterStatus::kOk);
  EXPECT_EQ(router.epoch(), 1u);
  EXPECT_EQ(router.add("a", 2), RouterStatus::kOk);
  EXPECT_EQ(router.add("c"), RouterStatus::kOk);
  EXPECT_EQ(router.epoch(), 3u);
  EXPECT_EQ(router.add("a"), RouterStatus::kDuplicateNode);
  EXPECT_EQ(router.add(""), RouterStatus::kInvalidNodeId);
  EXPECT_EQ(router.add("d", 0), RouterStatus::kInvalidWeight);
  EXPECT_EQ(router.add("d", RouterSnapshot::kMaxWeight + 1), RouterStatus::kInvalidWeight);
  EXPECT_EQ(router.remove("zzz"), RouterStatus::kUnknownNode);
  EXPECT_EQ(router.set_weight("zzz", 2), RouterStatus::kUnknownNode);
  EXPECT_EQ(router.set_weight("a", 0), RouterStatus::kInvalidWeight);
  EXPECT_EQ(router.epoch(), 3u) << "failed changes must not publish";

  EXPECT_EQ(router.size(), 3u);
  const std::vector<Node> expected{{"a", 2}, {"b", 1}, {"c", 1}};
  EXPECT_EQ(router.nodes(), expected);

  EXPECT_EQ(router.set_weight("a", 1), RouterStatus::kOk);
  EXPECT_EQ(router.remove("b"), RouterStatus::kOk);
  EXPECT_EQ(router.epoch(), 5u);
  EXPECT_EQ(router.size(), 2u);
  const std::string owner = router.owner("key");
  EXPECT_TRUE(owner == "a" || owner == "c");

  const std::vector<Node> duplicate{{"x", 1}, {"x", 1}};
  EXPECT_EQ(router.assign(duplicate), RouterStatus::kDuplicateNode);
  EXPECT_EQ(router.assign({}), RouterStatus::kOk);
  EXPECT_EQ(router.size(), 0u);
  EXPECT_EQ(router.owner("key"), "");
  EXPECT_EQ(router.epoch(), 6u);
}

TEST(RouterTest, StatusesHaveNames) {
  EXPECT_EQ(to_string(RouterStatus::kOk), "ok");
  EXPECT_EQ(to_string(RouterStatus::kUnknownNode), "unknown node");
}

TEST(RouterTest, MappingIgnoresInsertionOrder) {
  const std::vector<Node> nodes{{"10.0.0.7:7700", 1}, {"10.0.0.1:7700", 3}, {"alpha", 1},
                                {"beta", 2},          {"10.0.0.2:7700", 1}, {"omega", 1}};
  Router forward(with_bits(14));
  for (const Node& node : nodes) ASSERT_EQ(forward.add(node.id, node.weight), RouterStatus::kOk);
  Router backward(with_bits(14));
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    ASSERT_EQ(backward.add(it->id, it->weight), RouterStatus::kOk);
  }
  Router batch(nodes, with_bits(14));
  const auto a = forward.snapshot();
  const auto b = backward.snapshot();
  const auto c = batch.snapshot();
  EXPECT_TRUE(std::ranges::equal(a->table(), b->table()));
  EXPECT_TRUE(std::ranges::equal(a->table(), c->table()));
  for (std::size_t i = 0; i < 1000; ++i) {
    const std::string& key = sample_keys()[i];
    EXPECT_EQ(a->owners(key, 6), c->owners(key, 6));
  }
}

// Every incremental change yields exactly the table of a full build of the
// resulting membership: the mapping is a function of the membership alone.
TEST(RouterTest, IncrementalChangesMatchFullBuild) {
  std::mt19937_64 rng(7);
  Router router(with_bits(14));
  std::vector<std::string> present;
  int next_name = 0;
  for (int step = 0; step < 80; ++step) {
    const int op = present.size() < 3 ? 0 : static_cast<int>(rng() % 3);
    if (op == 0) {
      const std::string id = "n" + std::to_string(next_name++);
      ASSERT_EQ(router.add(id, 1 + static_cast<std::uint32_t>(rng() % 4)), RouterStatus::kOk);
      present.push_back(id);
    } else if (op == 1) {
      const std::size_t i = rng() % present.size();
      ASSERT_EQ(router.remove(present[i]), RouterStatus::kOk);
      present.erase(present.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      const std::string& id = present[rng() % present.size()];
      ASSERT_EQ(router.set_weight(id, 1 + static_cast<std::uint32_t>(rng() % 4)),
                RouterStatus::kOk);
    }
    const auto incremental = router.snapshot();
    Router full(router.nodes(), with_bits(14));
    ASSERT_TRUE(std::ranges::equal(incremental->table(), full.snapshot()->table()))
        << "step " << step;
  }
}

// The default table at 1000 equal nodes: exact share from bucket counts.
TEST(RouterTest, BalanceAtDefaultBucketsExactShare) {
  Router router(numbered_nodes(1000));
  const auto snapshot = router.snapshot();
  const double peak = peak_over_mean(snapshot->bucket_counts());
  RecordProperty("peak_over_mean_exact", std::to_string(peak));
  // Measured 1.030 at 2^22 buckets; the 1.02 target needs 2^24 (next test).
  EXPECT_LE(peak, 1.035);

  // The 1M-key sample agrees with the exact shares within sampling error:
  // every node's count within 5 sigma of its binomial expectation.
  const std::vector<std::uint64_t> exact = snapshot->bucket_counts();
  std::vector<std::uint64_t> sampled(snapshot->size(), 0);
  for (const std::uint16_t owner : owners_of_samples(*snapshot)) ++sampled[owner];
  for (std::size_t i = 0; i < exact.size(); ++i) {
    const double p = static_cast<double>(exact[i]) / static_cast<double>(snapshot->bucket_count());
    const double expected = p * static_cast<double>(kKeys);
    const double sigma = std::sqrt(expected * (1 - p));
    EXPECT_NEAR(static_cast<double>(sampled[i]), expected, 5 * sigma) << "node " << i;
  }
}

TEST(RouterTest, BalanceMeetsTargetWith2Pow24Buckets) {
#ifndef __OPTIMIZE__
  // A 2^24-bucket build takes about 30 s unoptimised under ASan; the tsan
  // preset (-O1) runs this test.
  GTEST_SKIP() << "runs in optimised builds only";
#endif
  Router router(numbered_nodes(1000), with_bits(24));
  const double peak = peak_over_mean(router.snapshot()->bucket_counts());
  RecordProperty("peak_over_mean_exact", std::to_string(peak));
  EXPECT_LE(peak, 1.02);
}

// Adding a node or removing the first, a middle or the last one moves at
// most 1.1/n of the keys, and only keys of that node.
TEST(RouterTest, MovementIsMinimalAndOnlyTouchesTheChangedNode) {
  Router router(numbered_nodes(1000));
  const auto base = router.snapshot();
  const std::vector<std::uint16_t> before = owners_of_samples(*base);
  const auto check = [&](const std::string& changed, bool added) {
    const auto after = router.snapshot();
    const std::size_t n = std::max(base->size(), after->size());
    // Node index in `after` -> index in `base` (kNoOwner for the added node).
    std::vector<std::uint16_t> to_base(after->size(), RouterSnapshot::kNoOwner);
    for (std::size_t i = 0, j = 0; i < after->size(); ++i) {
      while (j < base->size() && base->nodes()[j].id < after->nodes()[i].id) ++j;
      if (j < base->size() && base->nodes()[j].id == after->nodes()[i].id) {
        to_base[i] = static_cast<std::uint16_t>(j);
      }
    }
    const auto moved_to_or_from_changed = [&](std::uint16_t was, std::uint16_t now) {
      return added ? after->nodes()[now].id == changed : base->nodes()[was].id == changed;
    };
    // Hoisted: unoptimised builds would call the accessors per iteration.
    const std::vector<std::string>& keys = sample_keys();
    const std::span<const std::uint16_t> base_table = base->table();
    const std::span<const std::uint16_t> after_table = after->table();
    std::size_t moved = 0;
    for (std::size_t k = 0; k < kKeys; ++k) {
      const std::uint16_t now = after_table[after->bucket_of_hash(after->hash(keys[k]))];
      if (to_base[now] == before[k]) continue;
      ++moved;
      ASSERT_TRUE(moved_to_or_from_changed(before[k], now)) << keys[k];
    }
    EXPECT_LE(static_cast<double>(moved) / kKeys, 1.1 / static_cast<double>(n)) << changed;
    EXPECT_GT(moved, 0u) << changed;
    // The same on the exact key space.
    std::size_t moved_buckets = 0;
    for (std::size_t b = 0; b < base_table.size(); ++b) {
      const std::uint16_t was = base_table[b];
      const std::uint16_t now = after_table[b];
      if (to_base[now] == was) continue;
      ++moved_buckets;
      ASSERT_TRUE(moved_to_or_from_changed(was, now)) << "bucket " << b;
    }
    EXPECT_LE(static_cast<double>(moved_buckets) / static_cast<double>(base->bucket_count()),
              1.1 / static_cast<double>(n));
  };
  ASSERT_EQ(router.add("node-new"), RouterStatus::kOk);
  check("node-new", true);
  ASSERT_EQ(router.remove("node-new"), RouterStatus::kOk);
  ASSERT_TRUE(std::ranges::equal(router.snapshot()->table(), base->table()));
  for (const std::string& id :
       {base->nodes().front().id, std::string("node-500"), base->nodes().back().id}) {
    ASSERT_EQ(router.remove(id), RouterStatus::kOk);
    check(id, false);
    ASSERT_EQ(router.add(id), RouterStatus::kOk);
  }
}

TEST(RouterTest, WeightTwoOwnsTwiceTheShare) {
  std::vector<Node> nodes = numbered_nodes(100);
  for (std::size_t i = 0; i < 10; ++i) nodes[i * 10].weight = 2;
  Router router(nodes, with_bits(20));
  const auto snapshot = router.snapshot();
  const std::vector<std::uint64_t> exact = snapshot->bucket_counts();
  std::vector<std::uint64_t> sampled_counts(snapshot->size(), 0);
  for (const std::uint16_t owner : owners_of_samples(*snapshot)) ++sampled_counts[owner];
  const std::vector<std::uint64_t>& sampled = sampled_counts;
  for (const std::vector<std::uint64_t>* counts : {&exact, &sampled}) {
    double weight1 = 0;
    std::size_t n1 = 0;
    for (std::size_t i = 0; i < snapshot->size(); ++i) {
      if (snapshot->nodes()[i].weight == 1) {
        weight1 += static_cast<double>((*counts)[i]);
        ++n1;
      }
    }
    const double mean1 = weight1 / static_cast<double>(n1);
    for (std::size_t i = 0; i < snapshot->size(); ++i) {
      if (snapshot->nodes()[i].weight == 2) {
        const double ratio = static_cast<double>((*counts)[i]) / mean1;
        EXPECT_NEAR(ratio, 2.0, 0.1) << snapshot->nodes()[i].id;
      }
    }
  }
}

TEST(RouterTest, SetWeightOnlyMovesKeysOfThatNode) {
  Router router(numbered_nodes(50), with_bits(18));
  const auto before = router.snapshot();
  ASSERT_EQ(router.set_weight("node-7", 3), RouterStatus::kOk);
  const auto after = router.snapshot();
  for (std::size_t b = 0; b < before->bucket_count(); ++b) {
    if (before->table()[b] != after->table()[b]) {
      ASSERT_EQ(after->nodes()[after->table()[b]].id, "node-7");
    }
  }
}

// owners(key, 3): distinct, led by owner(key); removing a node only
// promotes the successors of the keys it held.
// owners(key, 3): distinct, led by owner(key); removing a node only
// promotes the successors of the keys it held. A key's replicas depend only
// on its bucket, so they are computed once per bucket (4096 buckets) and the
// API is checked against that on the first 20000 keys.
TEST(RouterTest, ReplicasAreDistinctAndRemovalOnlyPromotesSuccessors) {
  std::vector<Node> nodes = numbered_nodes(20);
  nodes[3].weight = 2;
  nodes[11].weight = 3;
  Router router(nodes, with_bits(12));
  const auto replicas_of = [](const RouterSnapshot& snapshot) {
    std::vector<std::vector<NodeId>> by_bucket(snapshot.bucket_count());
    for (std::size_t b = 0; b < by_bucket.size(); ++b) {
      for (const std::uint16_t i : snapshot.ranking_of_bucket(b, 3)) {
        by_bucket[b].push_back(snapshot.nodes()[i].id);
      }
    }
    return by_bucket;
  };
  const auto before = router.snapshot();
  const auto replicas_before = replicas_of(*before);
  for (std::size_t k = 0; k < kKeys; ++k) {
    const std::string& key = sample_keys()[k];
    const std::vector<NodeId>& replicas =
        replicas_before[before->bucket_of_hash(before->hash(key))];
    ASSERT_EQ(replicas.size(), 3u);
    ASSERT_TRUE(replicas[0] != replicas[1] && replicas[0] != replicas[2] &&
                replicas[1] != replicas[2])
        << key;
    ASSERT_EQ(replicas[0], before->owner(key)) << key;
    if (k < 20'000) {
      ASSERT_EQ(before->owners(key, 3), replicas) << key;
      ASSERT_EQ(before->owners(key, 1), std::vector<NodeId>{before->owner(key)});
    }
  }
  EXPECT_EQ(before->owners("x", 50).size(), 20u);
  EXPECT_TRUE(before->owners("x", 0).empty());

  ASSERT_EQ(router.remove("node-3"), RouterStatus::kOk);
  const auto after = router.snapshot();
  const auto replicas_after = replicas_of(*after);
  for (std::size_t k = 0; k < kKeys; ++k) {
    const std::string& key = sample_keys()[k];
    const std::size_t bucket = after->bucket_of_hash(after->hash(key));
    const std::vector<NodeId>& was = replicas_before[bucket];
    const std::vector<NodeId>& now = replicas_after[bucket];
    ASSERT_EQ(now[0], after->owner(key));
    if (k < 20'000) {
      ASSERT_EQ(after->owners(key, 3), now);
    }
    const auto removed = std::find(was.begin(), was.end(), "node-3");
    if (removed == was.end()) {
      ASSERT_EQ(now, was) << key;
    } else {
      std::vector<NodeId> promoted = was;
      promoted.erase(promoted.begin() + (removed - was.begin()));
      ASSERT_EQ(std::vector<NodeId>(now.begin(), now.begin() + 2), promoted) << key;
    }
  }
}

TEST(RouterTest, BoundedLoadRespectsCapacity) {
  Router router(numbered_nodes(50), with_bits(16));
  const auto snapshot = router.snapshot();
  std::vector<std::uint64_t> loads(snapshot->size(), 0);
  std::uint64_t total = 0;
  std::size_t at_owner = 0;
  for (std::size_t k = 0; k < 200'000; ++k) {
    const std::string& key = sample_keys()[k];
    const std::uint16_t chosen = snapshot->owner_index_bounded(key, loads, 1.25);
    ASSERT_NE(chosen, RouterSnapshot::kNoOwner);
    // The chosen node is the first in the key's ranking with room.
    const double capacity = std::ceil(1.25 * static_cast<double>(total + 1) / 50.0);
    if (chosen == snapshot->owner_index(key)) {
      ++at_owner;
    } else {
      for (const std::uint16_t i : snapshot->ranking_of_bucket(
               snapshot->bucket_of_hash(snapshot->hash(key)), snapshot->size())) {
        if (i == chosen) break;
        ASSERT_GT(static_cast<double>(loads[i]) + 1, capacity);
      }
    }
    ++loads[chosen];
    ++total;
    ASSERT_LE(static_cast<double>(loads[chosen]), capacity);
  }
  EXPECT_GT(at_owner, 150'000u);
  EXPECT_EQ(snapshot->owner_index_bounded("k", std::vector<std::uint64_t>(3, 0)),
            RouterSnapshot::kNoOwner);
}

TEST(RouterTest, BatchLookupMatchesSingleLookups) {
  Router router(numbered_nodes(100), with_bits(16));
  const auto snapshot = router.snapshot();
  // Sizes around the prefetch group of 16, and a large one.
  for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16},
                                  std::size_t{17}, std::size_t{10'000}}) {
    std::vector<std::string_view> keys(sample_keys().begin(),
                                       sample_keys().begin() + static_cast<std::ptrdiff_t>(count));
    std::vector<std::uint16_t> out(count, RouterSnapshot::kNoOwner);
    ASSERT_EQ(snapshot->owner_indices(keys, out), count);
    for (std::size_t i = 0; i < count; ++i) {
      ASSERT_EQ(out[i], snapshot->owner_index(keys[i])) << "count " << count << " key " << i;
    }
  }
  // A shorter output span bounds the work; the rest is untouched.
  std::vector<std::string_view> keys(sample_keys().begin(), sample_keys().begin() + 40);
  std::vector<std::uint16_t> out(20, 0xABCD);
  EXPECT_EQ(snapshot->owner_indices(keys, std::span(out).first(10)), 10u);
  EXPECT_EQ(out[9], snapshot->owner_index(keys[9]));
  EXPECT_EQ(out[10], 0xABCD);
  // An empty snapshot answers kNoOwner for every key.
  Router empty(with_bits(12));
  std::vector<std::uint16_t> none(3, 0);
  EXPECT_EQ(empty.snapshot()->owner_indices(std::span(keys).first(3), none), 3u);
  EXPECT_EQ(none, std::vector<std::uint16_t>(3, RouterSnapshot::kNoOwner));
}

// Lookups on several threads while another thread keeps changing the
// membership: every answer is a member of a snapshot the reader holds, and
// epochs never go backwards. Runs under TSan (label "concurrent").
TEST(RouterTest, LookupsRunWhileMembershipChanges) {
  Router router(numbered_nodes(16), with_bits(12));
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> lookups{0};
  const auto reader = [&](std::size_t offset) {
    std::uint64_t last_epoch = 0;
    std::size_t i = offset;
    while (!stop.load(std::memory_order_relaxed)) {
      const std::string& key = sample_keys()[i++ % 4096];
      const NodeId owner = router.owner(key);
      ASSERT_FALSE(owner.empty());
      const auto snapshot = router.snapshot();
      ASSERT_GE(snapshot->epoch(), last_epoch);
      last_epoch = snapshot->epoch();
      const NodeId& held = snapshot->owner(key);
      ASSERT_TRUE(std::ranges::any_of(snapshot->nodes(),
                                      [&](const Node& node) { return node.id == held; }));
      ASSERT_EQ(snapshot->owners(key, 1)[0], held);
      ASSERT_GE(router.current().epoch(), last_epoch);
      lookups.fetch_add(1, std::memory_order_relaxed);
    }
  };
  std::vector<std::thread> readers;
  for (std::size_t t = 0; t < 3; ++t) readers.emplace_back(reader, t * 1000);
  for (int round = 0; round < 200; ++round) {
    const std::string id = "extra-" + std::to_string(round % 7);
    if (router.add(id, 1 + static_cast<std::uint32_t>(round % 3)) != RouterStatus::kOk) {
      ASSERT_EQ(router.remove(id), RouterStatus::kOk);
    }
    if (round % 10 == 0) {
      ASSERT_EQ(router.set_weight("node-3", 1 + static_cast<std::uint32_t>(round % 4)),
                RouterStatus::kOk);
    }
  }
  stop.store(true, std::memory_order_relaxed);
  for (std::thread& t : readers) t.join();
  EXPECT_GT(lookups.load(), 0u);
  EXPECT_GE(router.epoch(), 200u);
}

// Two routers used from one thread share its cache without mixing answers.
TEST(RouterTest, ThreadCacheKeepsRoutersApart) {
  std::vector<std::unique_ptr<Router>> routers;
  for (int r = 0; r < 6; ++r) {
    routers.push_back(std::make_unique<Router>(std::vector<Node>{{"only-" + std::to_string(r), 1}},
                                               with_bits(8)));
  }
  for (int round = 0; round < 3; ++round) {
    for (int r = 0; r < 6; ++r) {
      EXPECT_EQ(routers[r]->owner("key"), "only-" + std::to_string(r));
    }
  }
  ASSERT_EQ(routers[0]->add("second"), RouterStatus::kOk);
  ASSERT_EQ(routers[0]->remove("only-0"), RouterStatus::kOk);
  EXPECT_EQ(routers[0]->owner("key"), "second");
}

TEST(RouterMembershipTest, ParsesNodesWeightsCommentsAndBlankLines) {
  const MembershipParseResult parsed = parse_membership(
      "# cluster east\n"
      "\n"
      "10.0.0.1:7700\n"
      "  10.0.0.2:7700   2   # bigger box\r\n"
      "\tdb-1 1024\n"
      "last-without-newline");
  ASSERT_TRUE(parsed.ok()) << parsed.error;
  const std::vector<Node> expected{
      {"10.0.0.1:7700", 1}, {"10.0.0.2:7700", 2}, {"db-1", 1024}, {"last-without-newline", 1}};
  EXPECT_EQ(parsed.nodes, expected);
  EXPECT_TRUE(parse_membership("").ok());
  EXPECT_TRUE(parse_membership("# only a comment\n\n").nodes.empty());
}

TEST(RouterMembershipTest, ReportsTheFirstErrorWithItsLine) {
  struct Case {
    const char* text;
    std::size_t line;
    const char* fragment;
  };
  const Case cases[] = {
      {"a\nb 0\n", 2, "weight \"0\""},
      {"a\n\nb 1025\n", 3, "weight \"1025\""},
      {"a x\n", 1, "weight \"x\""},
      {"a 2x\n", 1, "weight \"2x\""},
      {"a -1\n", 1, "weight \"-1\""},
      {"a 99999999999999999999\n", 1, "weight"},
      {"a 1 extra\n", 1, "more than two fields"},
      {"a\n# c\nb\na 2\n", 4, "duplicate node \"a\""},
  };
  for (const Case& c : cases) {
    const MembershipParseResult parsed = parse_membership(c.text);
    EXPECT_FALSE(parsed.ok()) << c.text;
    EXPECT_EQ(parsed.error_line, c.line) << c.text;
    EXPECT_NE(parsed.error.find(c.fragment), std::string::npos) << parsed.error;
    EXPECT_TRUE(parsed.nodes.empty());
  }
  // Every truncation of a valid file parses or fails cleanly.
  const std::string text = "alpha 3\nbeta\n# x\ngamma 12\n";
  for (std::size_t n = 0; n <= text.size(); ++n) {
    const MembershipParseResult parsed = parse_membership(std::string_view(text).substr(0, n));
    if (!parsed.ok()) {
      EXPECT_GT(parsed.error_line, 0u);
    }
  }
}

}  // namespace
}  // namespace shardlock
