// Recursive<L> over a spinning and a parking lock through the shared
// conformance suite, plus reentrancy: the owner nests, others wait for the
// outermost unlock, and a non-owner's unlock is caught in debug builds.
#include "shardlock/recursive.h"

#include <gtest/gtest.h>

#include "lock_conformance.h"
#include "shardlock/mutex.h"
#include "shardlock/spin_lock.h"

namespace shardlock {
namespace {

using test_support::try_lock_from_another_thread;

using RecursiveLocks = ::testing::Types<Recursive<SpinLock>, Recursive<Mutex>>;
INSTANTIATE_TYPED_TEST_SUITE_P(Recursive, ExclusiveLockTest, RecursiveLocks);

TEST(RecursiveTest, OwnerNestsOthersWaitForOutermostUnlock) {
  Recursive<Mutex> lock;
  lock.lock();
  lock.lock();
  ASSERT_TRUE(lock.try_lock());
  EXPECT_EQ(lock.depth(), 3u);
  EXPECT_TRUE(lock.owned_by_this_thread());
  lock.unlock();
  EXPECT_FALSE(try_lock_from_another_thread(lock));
  lock.unlock();
  EXPECT_FALSE(try_lock_from_another_thread(lock));
  lock.unlock();  // outermost
  EXPECT_EQ(lock.depth(), 0u);
  EXPECT_FALSE(lock.owned_by_this_thread());
  EXPECT_TRUE(try_lock_from_another_thread(lock));
}

TEST(RecursiveTest, TimedTryReentersAtOnceForTheOwner) {
  using namespace std::chrono_literals;
  Recursive<SpinLock> lock;
  lock.lock();
  // The owner is never made to wait, whatever the timeout.
  ASSERT_TRUE(lock.try_lock_for(0ms));
  EXPECT_EQ(lock.depth(), 2u);
  lock.unlock();
  lock.unlock();
  EXPECT_EQ(lock.depth(), 0u);
}

#if !defined(NDEBUG) && GTEST_HAS_DEATH_TEST
TEST(RecursiveDeathTest, UnlockByNonOwnerAsserts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Recursive<SpinLock> lock;
        lock.unlock();
      },
      "does not hold the lock");
}
#endif

}  // namespace
}  // namespace shardlock
