// Golden vectors: key -> owners(key, 3) for a fixed membership under the
// default options. They pin the mapping across versions and platforms; a
// change here moves keys between nodes in every deployment, so it is a
// breaking change that needs a release note.
//
// To regenerate after an intended change:
//   SHARDLOCK_REGENERATE_GOLDEN=1 build/<preset>/tests/router_golden_test
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "shardlock/router.h"

namespace shardlock {
namespace {

const char* const kGoldenPath = SHARDLOCK_TEST_DATA_DIR "/router_golden.txt";

// Mixed spellings and weights; the vectors must not depend on this order.
const std::vector<Node>& golden_membership() {
  static const std::vector<Node> nodes{
      {"10.0.0.7:7700", 1},  {"10.0.0.1:7700", 1},
      {"10.0.0.12:7700", 2}, {"db-east-1", 1},
      {"db-west-2", 3},      {"[2001:db8::5]:7700", 1},
      {"node-a", 1},         {"node-b", 1},
      {"node-c", 2},         {"z", 1},
  };
  return nodes;
}

std::vector<std::string> golden_keys() {
  std::vector<std::string> keys{"",
                                "a",
                                "user:42",
                                "order/2026/11/22/000017",
                                "lock:inventory:sku-998877",
                                "0123456789abcdef0123456789abcdef"};
  for (int i = 0; i < 58; ++i) keys.push_back("golden-key-" + std::to_string(i * 7919));
  return keys;
}

std::string line_for(const RouterSnapshot& snapshot, const std::string& key) {
  std::string line = "key \"" + key + "\"";
  for (const NodeId& owner : snapshot.owners(key, 3)) line += " " + owner;
  return line;
}

TEST(RouterGoldenTest, MappingMatchesGoldenVectors) {
  Router router(golden_membership());
  const auto snapshot = router.snapshot();
  ASSERT_EQ(snapshot->size(), golden_membership().size());

  if (std::getenv("SHARDLOCK_REGENERATE_GOLDEN") != nullptr) {
    std::ofstream out(kGoldenPath);
    out << "# Router golden vectors: key -> owners(key, 3) under the default options\n"
           "# (seed 0x53484152444C4B31, 2^22 buckets) for the membership in\n"
           "# tests/router_golden_test.cc. Changing them is a breaking change.\n";
    for (const std::string& key : golden_keys()) out << line_for(*snapshot, key) << "\n";
    GTEST_SKIP() << "regenerated " << kGoldenPath;
  }

  std::ifstream in(kGoldenPath);
  ASSERT_TRUE(in) << "missing " << kGoldenPath;
  std::vector<std::string> expected;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') expected.push_back(line);
  }
  const std::vector<std::string> keys = golden_keys();
  ASSERT_EQ(expected.size(), keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(line_for(*snapshot, keys[i]), expected[i]);
    EXPECT_EQ(snapshot->owner(keys[i]), snapshot->owners(keys[i], 1)[0]);
  }
}

// The golden membership maps the same whatever order its nodes were added
// in (at 2^16 buckets: ten incremental builds of the default table take
// seconds in unoptimised builds, and the order property does not depend on
// the bucket count).
TEST(RouterGoldenTest, InsertionOrderDoesNotMatter) {
  RouterOptions options;
  options.bucket_bits = 16;
  Router reversed(options);
  const std::vector<Node>& nodes = golden_membership();
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    ASSERT_EQ(reversed.add(it->id, it->weight), RouterStatus::kOk);
  }
  Router batch(nodes, options);
  for (const std::string& key : golden_keys()) {
    EXPECT_EQ(reversed.owners(key, 3), batch.owners(key, 3)) << key;
  }
}

}  // namespace
}  // namespace shardlock
