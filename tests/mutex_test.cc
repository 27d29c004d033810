// Mutex, the futex-parking lock, through the shared conformance suite, plus
// its adaptive spin phase.
#include "shardlock/mutex.h"

#include <gtest/gtest.h>

#include <thread>

#include "lock_conformance.h"
#include "poll_until.h"

namespace shardlock {
namespace {

INSTANTIATE_TYPED_TEST_SUITE_P(Mutex, ExclusiveLockTest, ::testing::Types<Mutex>);

TEST(MutexAdaptiveSpin, ANewLockSpinsTheFullBudget) {
  Mutex mutex;
  EXPECT_EQ(mutex.spin_budget_ns(), Mutex::kMaxSpinNs);
  mutex.lock();
  mutex.unlock();
  EXPECT_EQ(mutex.spin_budget_ns(), Mutex::kMaxSpinNs);  // the fast path learns nothing
}

// A waiter can only leave the spin phase of a lock that stays held by
// spending its whole budget, and then it must shorten the next waiter's.
TEST(MutexAdaptiveSpin, AWaiterThatHadToParkShortensTheBudget) {
  Mutex mutex;
  mutex.lock();
  std::thread waiter([&] {
    mutex.lock();
    mutex.unlock();
  });
  EXPECT_TRUE(test_support::poll_until([&] { return mutex.spin_budget_ns() < Mutex::kMaxSpinNs; }));
  mutex.unlock();
  waiter.join();
  EXPECT_LT(mutex.spin_budget_ns(), Mutex::kMaxSpinNs);
  EXPECT_GE(mutex.spin_budget_ns(), Mutex::kMinSpinNs);
}

// Each further waiter that parks shortens it again, and the budget stays at
// or above the short probe that lets the lock notice when spinning starts to
// work again. (16 rounds keep every step large enough to be seen: the budget
// is an integer number of nanoseconds.)
TEST(MutexAdaptiveSpin, EveryWaiterThatParksShortensItFurther) {
  Mutex mutex;
  for (int round = 0; round < 16; ++round) {
    mutex.lock();
    const std::int64_t before = mutex.spin_budget_ns();
    std::thread waiter([&] {
      mutex.lock();
      mutex.unlock();
    });
    EXPECT_TRUE(test_support::poll_until([&] { return mutex.spin_budget_ns() < before; }));
    mutex.unlock();
    waiter.join();
    EXPECT_GE(mutex.spin_budget_ns(), Mutex::kMinSpinNs);
  }
  EXPECT_LT(mutex.spin_budget_ns(), Mutex::kMaxSpinNs / 2);
}

}  // namespace
}  // namespace shardlock
