// What the tools share (tools/common/): the JSON string escaper, how keys
// that are any bytes are shown, duration flags and --auth-key files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>

#include "common/command_line.h"
#include "common/json.h"

namespace shardlock::tools {
namespace {

using std::chrono::milliseconds;

TEST(JsonStringTest, PlainTextIsQuotedAsItIs) {
  EXPECT_EQ(json_string(""), "\"\"");
  EXPECT_EQ(json_string("127.0.0.1:7420"), "\"127.0.0.1:7420\"");
  EXPECT_EQ(json_string("/tmp/data dir"), "\"/tmp/data dir\"");
}

TEST(JsonStringTest, QuoteAndBackslashAreEscaped) {
  EXPECT_EQ(json_string(R"(a"b)"), R"("a\"b")");
  EXPECT_EQ(json_string(R"(a\b)"), R"("a\\b")");
  EXPECT_EQ(json_string(R"(\")"), R"("\\\"")");
}

TEST(JsonStringTest, EveryControlCharacterIsEscaped) {
  for (int c = 0; c < 0x20; ++c) {
    char expected[16];
    std::snprintf(expected, sizeof expected, "\"\\u%04x\"", c);
    EXPECT_EQ(json_string(std::string(1, static_cast<char>(c))), expected) << c;
  }
  EXPECT_EQ(json_string("a\nb\tc"), R"("a\u000ab\u0009c")");
}

TEST(JsonStringTest, BytesFromSpaceUpAreCopied) {
  // DEL and UTF-8 need no escaping in JSON.
  EXPECT_EQ(json_string(" ~\x7f"), "\" ~\x7f\"");
  EXPECT_EQ(json_string("k\xc3\xa9y"), "\"k\xc3\xa9y\"");
}

TEST(JsonStringTest, AppendKeepsWhatIsThere) {
  std::string out = "{\"key\":";
  append_json_string(out, "x\"y");
  out += '}';
  EXPECT_EQ(out, R"({"key":"x\"y"})");
}

// How keys that are any bytes are shown (shardlockctl).
TEST(KeyTextTest, Utf8IsValidatedStrictly) {
  EXPECT_TRUE(valid_utf8(""));
  EXPECT_TRUE(valid_utf8("orders/42"));
  EXPECT_TRUE(valid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x94\x92"));  // é € 🔒
  for (const char* bad : {"caf\xe9", "\xc3", "\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80",
                          "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\x80", "\xe2\x82"}) {
    EXPECT_FALSE(valid_utf8(bad)) << bad;
  }
}

TEST(KeyTextTest, BytesOutsideUtf8AndBackslashesAreEscaped) {
  EXPECT_EQ(escaped_key("orders/42", false), "orders/42");
  EXPECT_EQ(escaped_key("caf\xc3\xa9", false), "caf\xc3\xa9");
  EXPECT_EQ(escaped_key("caf\xe9", false), "caf\\xe9");
  EXPECT_EQ(escaped_key("a\\xe9", false), "a\\x5cxe9");  // reads back unambiguously
  EXPECT_EQ(escaped_key("a\tb\x7f", false), "a\tb\x7f");
  EXPECT_EQ(escaped_key("a\tb\x7f", true), "a\\x09b\\x7f");
  EXPECT_EQ(hex_bytes("caf\xe9"), "636166e9");
  EXPECT_EQ(hex_bytes(""), "");
}

TEST(DurationFlagTest, ValidValues) {
  const DurationFlag ttl = parse_duration_flag("--ttl", "1m30s", ZeroDuration::kRejected);
  EXPECT_TRUE(ttl.error.empty()) << ttl.error;
  EXPECT_EQ(ttl.value, milliseconds(90'000));
  const DurationFlag wait = parse_duration_flag("--wait", "0", ZeroDuration::kAllowed);
  EXPECT_TRUE(wait.error.empty()) << wait.error;
  EXPECT_EQ(wait.value, milliseconds(0));
  const DurationFlag longest =
      parse_duration_flag("--ttl", "4294967295ms", ZeroDuration::kRejected);
  EXPECT_TRUE(longest.error.empty()) << longest.error;
  EXPECT_EQ(longest.value, kLongestWireDuration);
}

TEST(DurationFlagTest, ErrorsNameTheFlagAndTheReason) {
  EXPECT_EQ(parse_duration_flag("--ttl", "soon", ZeroDuration::kRejected).error,
            "--ttl: invalid duration \"soon\" (use e.g. 500ms, 1.5s, 30 (seconds), 2m)");
  EXPECT_EQ(parse_duration_flag("--ttl", "0", ZeroDuration::kRejected).error,
            "--ttl: must be more than 0");
  const std::string above =
      parse_duration_flag("--max-ttl", "4294967296ms", ZeroDuration::kRejected).error;
  EXPECT_EQ(above.rfind("--max-ttl: \"4294967296ms\" is above the maximum ", 0), 0u) << above;
  EXPECT_NE(above.find("(u32 milliseconds)"), std::string::npos) << above;
}

TEST(DurationFlagTest, ACallerChosenUpperBound) {
  const DurationFlag week =
      parse_duration_flag("--duration", "168h", ZeroDuration::kRejected, milliseconds::max());
  EXPECT_TRUE(week.error.empty()) << week.error;
  EXPECT_EQ(week.value, std::chrono::hours(168));
  const DurationFlag over =
      parse_duration_flag("--x", "2s", ZeroDuration::kAllowed, milliseconds(1000));
  EXPECT_EQ(over.error, "--x: \"2s\" is above the maximum 1s");
}

TEST(RunMainTest, ReturnsWhatRunReturns) {
  char name[] = "tool";
  char* argv[] = {name, nullptr};
  EXPECT_EQ(run_main(
                "tool", 9, [](int argc, char**) { return argc + 40; }, 1, argv),
            41);
}

TEST(RunMainTest, AnEscapingExceptionBecomesTheFailureStatus) {
  char name[] = "tool";
  char* argv[] = {name, nullptr};
  const auto throws = [](int, char**) -> int { throw std::bad_alloc(); };
  EXPECT_EQ(run_main("tool", 9, throws, 1, argv), 9);
  const auto throws_other = [](int, char**) -> int { throw 42; };
  EXPECT_EQ(run_main("tool", 3, throws_other, 1, argv), 3);
}

class AuthKeyFlagTest : public ::testing::Test {
 protected:
  std::filesystem::path write(const std::string& name, const std::string& text) {
    const auto path = dir_ / name;
    std::ofstream(path) << text;
    return path;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_ = [] {
    auto d = std::filesystem::temp_directory_path() /
             ("tool_support_test." + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
};

TEST_F(AuthKeyFlagTest, NoPathNoKeyNoError) {
  const AuthKeyFlag flag = load_auth_key_flag("");
  EXPECT_FALSE(flag.key);
  EXPECT_TRUE(flag.error.empty());
}

TEST_F(AuthKeyFlagTest, AGoodFileGivesItsKey) {
  const std::string hex(64, 'a');
  const AuthKeyFlag flag = load_auth_key_flag(write("good.key", hex + "\n"));
  ASSERT_TRUE(flag.key) << flag.error;
  EXPECT_EQ(lease::format_auth_key(*flag.key), hex);
}

TEST_F(AuthKeyFlagTest, ABadOrMissingFileIsAnError) {
  const AuthKeyFlag bad = load_auth_key_flag(write("bad.key", "not a key"));
  EXPECT_FALSE(bad.key);
  EXPECT_EQ(bad.error.rfind("--auth-key: ", 0), 0u) << bad.error;
  const AuthKeyFlag missing = load_auth_key_flag((dir_ / "missing.key").string());
  EXPECT_FALSE(missing.key);
  EXPECT_EQ(missing.error.rfind("--auth-key: ", 0), 0u) << missing.error;
}

}  // namespace
}  // namespace shardlock::tools
