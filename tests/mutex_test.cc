// Mutex, the futex-parking lock, through the shared conformance suite, plus
// its adaptive spin phase.
#include "shardlock/mutex.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>

#include "lock_conformance.h"

namespace shardlock {
namespace {

INSTANTIATE_TYPED_TEST_SUITE_P(Mutex, ExclusiveLockTest, ::testing::Types<Mutex>);

using internal::next_spin_success_rate;
using internal::SpinOutcome;

TEST(MutexAdaptiveSpin, ANewLockSpinsTheFullBudget) {
  Mutex mutex;
  EXPECT_EQ(mutex.spin_budget_ns(), Mutex::kMaxSpinNs);
  mutex.lock();
  mutex.unlock();
  EXPECT_EQ(mutex.spin_budget_ns(), Mutex::kMaxSpinNs);  // the fast path learns nothing
}

TEST(MutexAdaptiveSpin, TheBudgetSpansTheProbeToTheMaximum) {
  EXPECT_EQ(Mutex::spin_budget_for(0), Mutex::kMinSpinNs);
  EXPECT_EQ(Mutex::spin_budget_for(Mutex::kSpinRateOne), Mutex::kMaxSpinNs);
  EXPECT_LT(Mutex::spin_budget_for(Mutex::kSpinRateOne / 2), Mutex::kMaxSpinNs);
  EXPECT_GT(Mutex::spin_budget_for(Mutex::kSpinRateOne / 2), Mutex::kMinSpinNs);
}

// Spinners that lose their CPUs (threads > cores) talk the lock down to the
// probe; it never goes below it.
TEST(MutexAdaptiveSpin, WaitersThatLoseTheirCpuShortenTheBudgetToTheProbe) {
  std::uint32_t rate = Mutex::kSpinRateOne;
  std::int64_t budget = Mutex::spin_budget_for(rate);
  for (int i = 0; i < 16; ++i) {
    rate = next_spin_success_rate(rate, SpinOutcome::kParkedAfterLosingCpu);
    EXPECT_LT(Mutex::spin_budget_for(rate), budget);
    budget = Mutex::spin_budget_for(rate);
  }
  EXPECT_LT(budget, Mutex::kMaxSpinNs / 2);
  for (int i = 0; i < 1000; ++i) {
    rate = next_spin_success_rate(rate, SpinOutcome::kParkedAfterLosingCpu);
  }
  EXPECT_EQ(Mutex::spin_budget_for(rate), Mutex::kMinSpinNs);
}

// A waiter that kept its CPU had nothing better to do with it: its failed
// spin says nothing against spinning.
TEST(MutexAdaptiveSpin, WaitersThatKeepTheirCpuLeaveTheRateAlone) {
  for (const std::uint32_t rate : {0u, 1000u, Mutex::kSpinRateOne / 2, Mutex::kSpinRateOne}) {
    EXPECT_EQ(next_spin_success_rate(rate, SpinOutcome::kParkedWhileRunning), rate);
  }
}

// A few winners restore most of the budget, even from the probe.
TEST(MutexAdaptiveSpin, WinnersRestoreTheBudgetQuickly) {
  std::uint32_t rate = 0;
  for (int i = 0; i < 8; ++i) rate = next_spin_success_rate(rate, SpinOutcome::kWon);
  EXPECT_GT(Mutex::spin_budget_for(rate), Mutex::kMaxSpinNs * 9 / 10);
  EXPECT_LE(rate, Mutex::kSpinRateOne);
  EXPECT_EQ(next_spin_success_rate(Mutex::kSpinRateOne, SpinOutcome::kWon), Mutex::kSpinRateOne);
}

// Through the lock itself: a waiter that parks (whatever it learnt) keeps
// the budget within its bounds, and the lock still excludes.
TEST(MutexAdaptiveSpin, AParkedWaiterKeepsTheBudgetInBounds) {
  Mutex mutex;
  int value = 0;
  mutex.lock();
  std::thread waiter([&] {
    mutex.lock();
    ++value;
    mutex.unlock();
  });
  std::this_thread::yield();
  value = 1;
  mutex.unlock();
  waiter.join();
  EXPECT_EQ(value, 2);
  EXPECT_GE(mutex.spin_budget_ns(), Mutex::kMinSpinNs);
  EXPECT_LE(mutex.spin_budget_ns(), Mutex::kMaxSpinNs);
}

}  // namespace
}  // namespace shardlock
