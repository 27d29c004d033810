// The conformance suite every exclusive lock passes: mutual exclusion at 2 to
// 16 threads, oversubscription, try_lock, and, where the lock has them, the
// timed try_lock contract and is_locked().
//
// Each lock's own <lock>_test.cc plugs in with two lines, naming the types (an alias, since
// a macro argument cannot hold a bare comma):
//
//   using SpinLocks = ::testing::Types<SpinLock, UnfairSpinLock>;
//   INSTANTIATE_TYPED_TEST_SUITE_P(SpinLock, ExclusiveLockTest, SpinLocks);
//
// and adds the tests only that lock needs (as Concurrency Kit's locks share
// one validate harness).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "shardlock/lockable.h"

// The suite drives locks the way no annotated program would (try_lock from
// a second thread while the first holds the lock, unlock inside lambdas), so
// the static analysis is off for the rest of every file that includes this;
// tests/thread_safety/ checks the annotations themselves.
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wthread-safety-analysis"
#endif

namespace shardlock::test_support {

// Whether a thread other than the caller gets `lock` with try_lock (and
// leaves it as it found it). The caller itself would re-enter a Recursive.
template <class L>
bool try_lock_from_another_thread(L& lock) {
  bool got = false;
  std::thread([&] {
    got = lock.try_lock();
    if (got) lock.unlock();
  }).join();
  return got;
}

// Every thread mixes every slot of a shared array under the lock. If two
// threads were ever inside together, their read-modify-write sequences would
// interleave and the slots would disagree; the plain counter would lose
// increments.
template <class L>
void run_mutual_exclusion(int threads, int iterations) {
  constexpr int kSlots = 16;
  L lock;
  std::uint64_t slots[kSlots] = {};
  std::uint64_t counter = 0;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < iterations; ++i) {
        std::scoped_lock guard(lock);
        const std::uint64_t mix = static_cast<std::uint64_t>(t * 1'000'003 + i);
        for (auto& slot : slots) slot = slot * 31 + mix;
        ++counter;
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(counter, static_cast<std::uint64_t>(threads) * iterations);
  for (int s = 1; s < kSlots; ++s) EXPECT_EQ(slots[s], slots[0]) << "slot " << s;
}

}  // namespace shardlock::test_support

namespace shardlock {

template <class L>
class ExclusiveLockTest : public ::testing::Test {};
TYPED_TEST_SUITE_P(ExclusiveLockTest);

TYPED_TEST_P(ExclusiveLockTest, MutualExclusion2Threads) {
  test_support::run_mutual_exclusion<TypeParam>(2, 20'000);
}
TYPED_TEST_P(ExclusiveLockTest, MutualExclusion4Threads) {
  test_support::run_mutual_exclusion<TypeParam>(4, 5'000);
}
TYPED_TEST_P(ExclusiveLockTest, MutualExclusion8Threads) {
  test_support::run_mutual_exclusion<TypeParam>(8, 2'000);
}
TYPED_TEST_P(ExclusiveLockTest, MutualExclusion16Threads) {
  test_support::run_mutual_exclusion<TypeParam>(16, 500);
}

// Oversubscription: 8 threads on a 2-core machine, a fixed amount of work
// each; it must finish (bounded by the ctest TIMEOUT, never by a speed bar).
TYPED_TEST_P(ExclusiveLockTest, OversubscribedThreadsAllFinish) {
  TypeParam lock;
  std::atomic<int> finished{0};
  std::uint64_t counter = 0;
  std::vector<std::thread> workers;
  for (int t = 0; t < 8; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < 3'000; ++i) {
        lock.lock();
        ++counter;
        lock.unlock();
      }
      finished.fetch_add(1, std::memory_order_relaxed);
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(finished.load(), 8);
  EXPECT_EQ(counter, 8u * 3'000u);
}

TYPED_TEST_P(ExclusiveLockTest, TryLockFailsWhileHeldAndSucceedsWhenFree) {
  TypeParam lock;
  ASSERT_TRUE(lock.try_lock());
  EXPECT_FALSE(test_support::try_lock_from_another_thread(lock));
  lock.unlock();
  EXPECT_TRUE(test_support::try_lock_from_another_thread(lock));
}

// is_locked() is a racy snapshot, but exact when one thread does everything.
TYPED_TEST_P(ExclusiveLockTest, IsLockedFollowsLockAndUnlock) {
  if constexpr (requires(const TypeParam& l) { l.is_locked(); }) {
    TypeParam lock;
    EXPECT_FALSE(lock.is_locked());
    lock.lock();
    EXPECT_TRUE(lock.is_locked());
    lock.unlock();
    EXPECT_FALSE(lock.is_locked());
    ASSERT_TRUE(lock.try_lock());
    EXPECT_TRUE(lock.is_locked());
    lock.unlock();
    EXPECT_FALSE(lock.is_locked());
  } else {
    GTEST_SKIP() << "no is_locked()";
  }
}

TYPED_TEST_P(ExclusiveLockTest, TimedTryWaitsAtLeastTheTimeoutWhenHeld) {
  using namespace std::chrono_literals;
  if constexpr (TimedLockable<TypeParam>) {
    TypeParam lock;
    lock.lock();
    bool got = true;
    std::chrono::steady_clock::duration waited{};
    std::thread([&] {
      const auto start = std::chrono::steady_clock::now();
      got = lock.try_lock_for(30ms);
      waited = std::chrono::steady_clock::now() - start;
      if (got) lock.unlock();
    }).join();
    EXPECT_FALSE(got);
    EXPECT_GE(waited, 30ms);  // lower bound only: the machine may be slow
    lock.unlock();

    std::thread([&] {
      got = lock.try_lock_until(std::chrono::steady_clock::now() + 30ms);
      if (got) lock.unlock();
    }).join();
    EXPECT_TRUE(got);
  } else {
    GTEST_SKIP() << "not TimedLockable (documented in the lock's header)";
  }
}

// A timed waiter that gives up must leave the lock fully usable.
TYPED_TEST_P(ExclusiveLockTest, TimedOutWaiterDoesNotBreakTheLock) {
  using namespace std::chrono_literals;
  if constexpr (TimedLockable<TypeParam>) {
    TypeParam lock;
    lock.lock();
    std::thread([&] { EXPECT_FALSE(lock.try_lock_for(5ms)); }).join();
    lock.unlock();
    test_support::run_mutual_exclusion<TypeParam>(2, 1'000);
    EXPECT_TRUE(lock.try_lock());
    lock.unlock();
  } else {
    GTEST_SKIP() << "not TimedLockable";
  }
}

REGISTER_TYPED_TEST_SUITE_P(ExclusiveLockTest, MutualExclusion2Threads, MutualExclusion4Threads,
                            MutualExclusion8Threads, MutualExclusion16Threads,
                            OversubscribedThreadsAllFinish,
                            TryLockFailsWhileHeldAndSucceedsWhenFree, IsLockedFollowsLockAndUnlock,
                            TimedTryWaitsAtLeastTheTimeoutWhenHeld,
                            TimedOutWaiterDoesNotBreakTheLock);

}  // namespace shardlock
