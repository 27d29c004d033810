// TicketLock through the shared conformance suite, plus what only a FIFO
// lock promises: entry in ticket order, and no barging by try_lock.
#include "shardlock/ticket_lock.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "lock_conformance.h"
#include "poll_until.h"

namespace shardlock {
namespace {

using test_support::poll_until;

INSTANTIATE_TYPED_TEST_SUITE_P(TicketLock, ExclusiveLockTest, ::testing::Types<TicketLock>);

TEST(TicketLockTest, EntersInTicketOrder) {
  constexpr int kWaiters = 6;
  TicketLock lock;
  lock.lock();  // ticket 0, held while the waiters queue up
  std::vector<int> entry_order;
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      lock.lock();
      entry_order.push_back(i);  // guarded by the ticket lock
      lock.unlock();
    });
    // Wait until waiter i holds its ticket before starting waiter i+1, so
    // ticket order is known: waiter i has ticket i+1.
    EXPECT_TRUE(poll_until([&] {
      return lock.queue_length() == static_cast<std::uint32_t>(i + 2);
    })) << "waiter "
        << i << " never took a ticket";
  }
  lock.unlock();
  for (auto& w : waiters) w.join();
  std::vector<int> expected(kWaiters);
  for (int i = 0; i < kWaiters; ++i) expected[i] = i;
  EXPECT_EQ(entry_order, expected);
}

TEST(TicketLockTest, TryLockDoesNotJumpTheQueue) {
  TicketLock lock;
  lock.lock();
  std::thread waiter([&] {
    lock.lock();
    lock.unlock();
  });
  EXPECT_TRUE(poll_until([&] { return lock.queue_length() == 2; }));
  EXPECT_FALSE(lock.try_lock());
  lock.unlock();
  waiter.join();
  EXPECT_TRUE(lock.try_lock());
  lock.unlock();
}

}  // namespace
}  // namespace shardlock
