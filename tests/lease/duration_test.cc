#include "shardlock/lease/duration.h"

#include <gtest/gtest.h>

namespace shardlock::lease {
namespace {

using std::chrono::milliseconds;

TEST(Duration, ParsesUnits) {
  EXPECT_EQ(parse_duration("0"), milliseconds{0});
  EXPECT_EQ(parse_duration("500ms"), milliseconds{500});
  EXPECT_EQ(parse_duration("30s"), milliseconds{30'000});
  EXPECT_EQ(parse_duration("2m"), milliseconds{120'000});
  EXPECT_EQ(parse_duration("1h"), milliseconds{3'600'000});
  EXPECT_EQ(parse_duration("1m30s"), milliseconds{90'000});
  EXPECT_EQ(parse_duration("0s"), milliseconds{0});
}

TEST(Duration, ReadsFractionsAndBareSeconds) {
  EXPECT_EQ(parse_duration("1.5s"), milliseconds{1'500});
  EXPECT_EQ(parse_duration("0.25s"), milliseconds{250});
  EXPECT_EQ(parse_duration("1.5h"), milliseconds{5'400'000});
  EXPECT_EQ(parse_duration("1m0.5s"), milliseconds{60'500});
  EXPECT_EQ(parse_duration("30"), milliseconds{30'000});
  EXPECT_EQ(parse_duration("1.5"), milliseconds{1'500});
  EXPECT_EQ(parse_duration("0.001"), milliseconds{1});
}

TEST(Duration, RejectsGarbage) {
  for (const char* bad :
       {"", "ms", "-1s", "-1", "1.5ms", "0.0005", "1.s", ".5s", "1..5s", "1m30", "1x", "1s ", " 1s",
        "1sms", "s1", "1e3", "99999999999999999999ms", "9223372036854775807h", "1.0000000001s"}) {
    EXPECT_FALSE(parse_duration(bad).has_value()) << bad;
  }
}

TEST(Duration, PrintsWhatItParses) {
  for (const long long ms : {0LL, 1LL, 500LL, 1000LL, 1500LL, 90'000LL, 3'600'000LL, 3'723'004LL}) {
    const auto text = to_string(milliseconds{ms});
    EXPECT_EQ(parse_duration(text), milliseconds{ms}) << text;
  }
  EXPECT_EQ(to_string(milliseconds{1500}), "1s500ms");
  EXPECT_EQ(to_string(milliseconds{120'000}), "2m");
}

}  // namespace
}  // namespace shardlock::lease
