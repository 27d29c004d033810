// The torture run's fenced resource: reads and writes pass only with a token
// at least the highest seen for the key, and every decision is recorded.
#include "resource.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "history.h"

namespace shardlock::torture {
namespace {

std::string fresh_dir() {
  char tmpl[] = "/tmp/shardlock-resource-test-XXXXXX";
  EXPECT_NE(::mkdtemp(tmpl), nullptr);
  return tmpl;
}

TEST(FencedResourceTest, FencesReadsAndWritesAndRecordsEveryDecision) {
  const std::string dir = fresh_dir();
  FencedResource resource;
  const std::string name = "shardlock-resource-test-" + std::to_string(::getpid());
  ASSERT_TRUE(resource.start(name, dir + "/resource.log")) << resource.error();
  ResourceConnection a;
  ResourceConnection b;
  ASSERT_TRUE(a.connect(name));
  ASSERT_TRUE(b.connect(name));

  EXPECT_EQ(a.call("R k 5 0"), "OK 0");
  EXPECT_EQ(a.call("W k 5 1 0"), "OK");
  // A newer holder reads: from now on token 5 is fenced out, reads included.
  EXPECT_EQ(b.call("R k 6 1"), "OK 1");
  EXPECT_EQ(a.call("W k 5 2 0"), "NO 6") << "Kleppmann's late write";
  EXPECT_EQ(a.call("R k 5 0"), "NO 6");
  EXPECT_EQ(b.call("W k 6 2 1"), "OK");
  EXPECT_EQ(b.call("R other 1 1"), "OK 0") << "keys are fenced apart";
  EXPECT_EQ(a.call("garbage"), "ERR");
  resource.stop();

  std::vector<Event> events;
  std::string error;
  ASSERT_TRUE(read_history(dir, events, error)) << error;
  std::vector<std::string> seen;
  for (const Event& e : events) {
    seen.push_back(std::string(to_string(e.kind)) + " " + e.key + " " + std::to_string(e.token) +
                   " " + std::to_string(e.value));
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"write_accepted k 5 1", "write_rejected k 5 2",
                                            "write_rejected k 5 -1", "write_accepted k 6 2",
                                            "final_counter k 0 2", "final_counter other 0 0"}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardlock::torture
