// shardlock-route as a process: owners of stdin keys agree with the library,
// --random and --diff print their summaries, and bad membership files exit 2
// with FILE:LINE on stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "shardlock/router.h"

namespace shardlock {
namespace {

namespace fs = std::filesystem;

const std::string kRoute = SHARDLOCK_TOOL_SHARDLOCK_ROUTE;

struct ToolResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

class RouterToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kRoute)) GTEST_SKIP() << kRoute << " not built";
    dir_ = fs::temp_directory_path() / ("router_tool_test." + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  std::string write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << text;
    return path.string();
  }

  static std::string slurp(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // Runs the tool with `args` (already shell-quoted) and `input` on stdin.
  ToolResult run(const std::string& args, const std::string& input = "") {
    const std::string in = write("stdin.txt", input);
    const fs::path out = dir_ / "stdout.txt";
    const fs::path err = dir_ / "stderr.txt";
    const std::string command =
        kRoute + " " + args + " <" + in + " >" + out.string() + " 2>" + err.string();
    const int status = std::system(command.c_str());
    ToolResult result;
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    result.out = slurp(out);
    result.err = slurp(err);
    return result;
  }

  // Runs `command` through the shell; `{route}` and `{err}` stand for the
  // tool and a file that catches its stderr.
  ToolResult shell(std::string command) {
    const fs::path err = dir_ / "stderr.txt";
    for (const auto& [name, value] :
         {std::pair<std::string, std::string>{"{route}", kRoute}, {"{err}", err.string()}}) {
      command.replace(command.find(name), name.size(), value);
    }
    const int status = std::system(command.c_str());
    ToolResult result;
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    result.err = slurp(err);
    return result;
  }

  fs::path dir_;
};

TEST_F(RouterToolTest, PrintsTheLibrarysOwnersForStdinKeys) {
  const std::string nodes = write("nodes.txt", "# east\n10.0.0.1:7700\n10.0.0.2:7700 2\n\nz\n");
  const ToolResult r = run(nodes + " --replicas 2", "user:1\nuser:2\norder/77\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<Node> membership{{"10.0.0.1:7700", 1}, {"10.0.0.2:7700", 2}, {"z", 1}};
  const Router router(membership);
  std::string expected;
  for (const char* key : {"user:1", "user:2", "order/77"}) {
    const auto owners = router.owners(key, 2);
    expected += std::string(key) + "\t" + owners[0] + "," + owners[1] + "\n";
  }
  EXPECT_EQ(r.out, expected);
}

TEST_F(RouterToolTest, RandomPrintsSharesAndSummary) {
  const std::string nodes = write("nodes.txt", "a\nb\nc 2\n");
  const ToolResult r = run(nodes + " --random 20000 --bucket-bits 16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("sampled: peak/mean"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exact  : peak/mean"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stddev"), std::string::npos) << r.out;
}

TEST_F(RouterToolTest, DiffPrintsTheMovedFraction) {
  const std::string before = write("old.txt", "a\nb\nc\nd\n");
  const std::string after = write("new.txt", "a\nb\nc\nd\ne\n");
  const ToolResult r = run("--bucket-bits 16 --diff " + before + " " + after);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Adding one node to four moves its share, about a fifth of the keys.
  ASSERT_EQ(r.out.rfind("moved ", 0), 0u) << r.out;
  const double moved = std::stod(r.out.substr(6));
  EXPECT_NEAR(moved, 0.2, 0.02) << r.out;
  EXPECT_NE(r.out.find("minimum for this change 0.200000"), std::string::npos) << r.out;
}

TEST_F(RouterToolTest, VersionIsTheProjects) {
  const ToolResult r = run("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("shardlock-route ", 0), 0u) << r.out;
}

TEST_F(RouterToolTest, BadInputExitsTwoWithTheLine) {
  const std::string bad_weight = write("bad.txt", "a\n\nb 0\n");
  ToolResult r = run(bad_weight);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("bad.txt:3:"), std::string::npos) << r.err;

  const std::string duplicate = write("dup.txt", "a\nb\na\n");
  r = run(duplicate);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("dup.txt:3: duplicate node"), std::string::npos) << r.err;

  r = run(write("empty.txt", "# nothing\n"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no nodes"), std::string::npos) << r.err;

  r = run((dir_ / "missing.txt").string());
  EXPECT_EQ(r.exit_code, 2);

  r = run("");
  EXPECT_EQ(r.exit_code, 2);

  r = run("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--diff"), std::string::npos);
}

// Output that could not be written, or keys that could not be read, is a
// failure: an owner list cut short must not exit 0.
TEST_F(RouterToolTest, UnwritableOutputOrUnreadableInputFails) {
  const std::string nodes = write("nodes.txt", "a\nb\n");
  if (fs::exists("/dev/full")) {
    const ToolResult full = shell("{route} " + nodes + " --random 1000 >/dev/full 2>{err}");
    EXPECT_EQ(full.exit_code, 1) << full.err;
    EXPECT_NE(full.err.find("cannot write the output"), std::string::npos) << full.err;
  }
  // A directory opens for reading but every read fails (EISDIR).
  const ToolResult unreadable = shell("{route} " + nodes + " <" + dir_.string() + " 2>{err}");
  EXPECT_EQ(unreadable.exit_code, 2) << unreadable.err;
  EXPECT_NE(unreadable.err.find("cannot read the keys"), std::string::npos) << unreadable.err;
}

}  // namespace
}  // namespace shardlock
