// The spin-wait policy in internal/backoff.h: the per-process pause
// calibration, the doubling of the delay up to its cap, and the spin
// budget after which every round yields.
#include "shardlock/internal/backoff.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace shardlock::internal {
namespace {

TEST(BackoffTest, PauseCalibrationIsSaneAndFixedForTheProcess) {
  const std::uint32_t nanos = pause_nanos();
  EXPECT_GE(nanos, 1u);
  // A pause costs ~1 to ~150 ns on any x86 or ARM core; 10 us would mean
  // the calibration measured something else (a preemption in every run).
  EXPECT_LE(nanos, 10'000u);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(pause_nanos(), nanos) << "calibrated once";
}

// The delays wait() uses, round by round, for a backoff with `max_delay_ns`
// and a budget that is never spent.
std::vector<std::uint32_t> delays(std::uint32_t max_delay_ns, int rounds) {
  Backoff backoff(std::int64_t{3'600} * 1'000'000'000, max_delay_ns);
  std::vector<std::uint32_t> seen;
  for (int i = 0; i < rounds; ++i) {
    seen.push_back(backoff.next_delay_ns());
    EXPECT_FALSE(backoff.wait()) << "an hour's budget spent in round " << i;
  }
  return seen;
}

TEST(BackoffTest, DelayDoublesFromTheMinimumAndStaysAtTheCap) {
  const std::vector<std::uint32_t> seen = delays(Backoff::kMaxDelayNs, 12);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front(), Backoff::kMinDelayNs);
  for (std::size_t i = 1; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i], std::min(seen[i - 1] * 2, Backoff::kMaxDelayNs)) << "round " << i;
  }
  EXPECT_EQ(seen.back(), Backoff::kMaxDelayNs) << "12 doublings of 40 ns pass 2 us";
}

TEST(BackoffTest, ACustomCapBoundsTheDelay) {
  // SpinLock's heir polls with a cap of twice the minimum.
  EXPECT_EQ(delays(Backoff::kMinDelayNs * 2, 4), (std::vector<std::uint32_t>{40, 80, 80, 80}));
  EXPECT_EQ(delays(100, 4), (std::vector<std::uint32_t>{40, 80, 100, 100}));
}

TEST(BackoffTest, WaitedIsZeroUntilTheFirstWaitThenNeverDecreases) {
  Backoff backoff;
  EXPECT_EQ(backoff.waited_ns(), 0);
  (void)backoff.wait();
  std::int64_t last = backoff.waited_ns();
  EXPECT_GE(last, 0);
  for (int i = 0; i < 20; ++i) {
    (void)backoff.wait();
    const std::int64_t now = backoff.waited_ns();
    EXPECT_GE(now, last);
    last = now;
  }
}

TEST(BackoffTest, AZeroBudgetYieldsFromTheFirstRound) {
  Backoff backoff(0);
  EXPECT_TRUE(backoff.wait());
  EXPECT_TRUE(backoff.wait());
}

// wait() reports the budget spent once it has been, and from then on.
TEST(BackoffTest, ReportsTheBudgetSpentOnceItIs) {
  constexpr std::int64_t kBudgetNs = 50'000;
  Backoff backoff(kBudgetNs);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  bool spent = false;
  while (!spent && std::chrono::steady_clock::now() < deadline) spent = backoff.wait();
  ASSERT_TRUE(spent) << "the budget never ran out";
  EXPECT_GE(backoff.waited_ns(), kBudgetNs);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(backoff.wait());
}

}  // namespace
}  // namespace shardlock::internal
