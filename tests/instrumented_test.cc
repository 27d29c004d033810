// Instrumented<L> over a spinning, a FIFO and a parking lock through the
// shared conformance suite, plus its counters: acquisitions, contention and
// wait times, shared acquisitions, and how snapshots add up.
#include "shardlock/instrumented.h"

#include <gtest/gtest.h>

#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "lock_conformance.h"
#include "poll_until.h"
#include "shardlock/mutex.h"
#include "shardlock/rw_spin_lock.h"
#include "shardlock/spin_lock.h"
#include "shardlock/ticket_lock.h"

namespace shardlock {
namespace {

using InstrumentedLocks =
    ::testing::Types<Instrumented<SpinLock>, Instrumented<TicketLock>, Instrumented<Mutex>>;
INSTANTIATE_TYPED_TEST_SUITE_P(Instrumented, ExclusiveLockTest, InstrumentedLocks);

// Over a TicketLock because its queue shows when the waiter waits: the
// wrapper's lock() tries once and only then takes a ticket, so a queue of
// two proves the waiter's acquisition will count as contended.
TEST(InstrumentedTest, CountsAcquisitionsAndContention) {
  Instrumented<TicketLock> lock;
  lock.lock();
  lock.unlock();
  ASSERT_TRUE(lock.try_lock());
  lock.unlock();
  EXPECT_EQ(lock.stats().acquisitions, 2u);
  EXPECT_EQ(lock.stats().contended, 0u);

  lock.lock();
  std::thread waiter([&] {
    lock.lock();  // must wait: contended
    lock.unlock();
  });
  EXPECT_TRUE(test_support::poll_until([&] { return lock.underlying().queue_length() == 2; }))
      << "the waiter never queued";
  lock.unlock();
  waiter.join();
  const ContentionStats s = lock.stats();
  EXPECT_EQ(s.acquisitions, 4u);
  EXPECT_EQ(s.contended, 1u);
  EXPECT_GT(s.total_wait_ns, 0u);
  EXPECT_EQ(s.max_wait_ns, s.total_wait_ns);

  lock.reset_stats();
  EXPECT_EQ(lock.stats().acquisitions, 0u);
  EXPECT_EQ(lock.stats().contended, 0u);
  EXPECT_EQ(lock.stats().total_wait_ns, 0u);
  EXPECT_EQ(lock.stats().max_wait_ns, 0u);
}

TEST(InstrumentedTest, SharedAcquisitionsAreCounted) {
  Instrumented<RwSpinLock> lock;
  std::vector<std::thread> readers;
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&] {
      for (int j = 0; j < 1'000; ++j) {
        std::shared_lock guard(lock);
      }
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(lock.stats().acquisitions, 4'000u);
}

TEST(InstrumentedTest, SnapshotsAddCountsAndKeepTheLongestWait) {
  ContentionStats total{.acquisitions = 5, .contended = 2, .total_wait_ns = 30, .max_wait_ns = 20};
  total += ContentionStats{.acquisitions = 1, .contended = 1, .total_wait_ns = 7, .max_wait_ns = 7};
  EXPECT_EQ(total.acquisitions, 6u);
  EXPECT_EQ(total.contended, 3u);
  EXPECT_EQ(total.total_wait_ns, 37u);
  EXPECT_EQ(total.max_wait_ns, 20u);
  total += ContentionStats{.max_wait_ns = 50};
  EXPECT_EQ(total.max_wait_ns, 50u);
}

}  // namespace
}  // namespace shardlock
