// ReentrantLeases against a real LeaseServer on loopback: a second acquire by
// the holding thread shares the grant and counts a hold, only the last
// release frees the key, a lost grant invalidates every hold, another
// thread waits for the grant like another process (the default,
// ReentrancyScope::kThread), and with kClient threads share holds without
// ever taking a second grant while one is held.
#include "shardlock/lease/client/reentrant.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "poll_until.h"
#include "shardlock/lease/client/client.h"
#include "support/loopback_server.h"

namespace shardlock::lease {
namespace {

using namespace std::chrono_literals;
using test_support::kPollTimeout;
using test_support::poll_until;

std::uint64_t grants(const LeaseServer& server) {
  return server.stats().counter(StatCounter::kGrants);
}

// Whether another owner could take `key` now (and lets it go again).
bool free_for_others(LeaseClient& other, std::string_view key) {
  AcquireResult r = other.try_acquire(key, 5s);
  return static_cast<bool>(r);
}

class ReentrantLeasesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = test_support::start_loopback_server();
    ASSERT_TRUE(server_);
    owner_ = test_support::start_loopback_client(*server_);
    other_ = test_support::start_loopback_client(*server_);
    leases_ = std::make_unique<ReentrantLeases>(*owner_);
  }

  // Two acquires of one key through leases_, each on its thread, while the
  // other owner holds the key (`blocker`): the second starts once the first
  // is queued at the server.
  struct TwoAcquires {
    AcquireResult blocker;
    ReentrantAcquireResult first;
    ReentrantAcquireResult second;
    std::thread first_thread;
    std::thread second_thread;
    void join() {
      first_thread.join();
      second_thread.join();
    }
  };
  std::unique_ptr<TwoAcquires> two_acquires_behind_other(const std::string& key,
                                                         std::chrono::milliseconds first_wait,
                                                         std::chrono::milliseconds second_wait) {
    auto two = std::make_unique<TwoAcquires>();
    two->blocker = other_->try_acquire(key, 10s);
    EXPECT_TRUE(two->blocker) << two->blocker.error.message();
    TwoAcquires& t = *two;
    t.first_thread = std::thread(
        [&t, this, key, first_wait] { t.first = leases_->acquire(key, 10s, first_wait); });
    EXPECT_TRUE(poll_until([&] { return other_->query(key).waiters == 1; }, kPollTimeout, 5ms));
    t.second_thread = std::thread(
        [&t, this, key, second_wait] { t.second = leases_->acquire(key, 10s, second_wait); });
    return two;
  }

  void use_scope(ReentrancyScope scope) {
    leases_ = std::make_unique<ReentrantLeases>(*owner_, scope);
  }

  std::unique_ptr<LeaseServer> server_;
  std::unique_ptr<LeaseClient> owner_;
  std::unique_ptr<LeaseClient> other_;
  std::unique_ptr<ReentrantLeases> leases_;
};

TEST_F(ReentrantLeasesTest, ASecondAcquireSharesTheTokenAndCountsAHold) {
  ReentrantAcquireResult outer = leases_->acquire("orders/42", 10s, 0ms);
  ASSERT_TRUE(outer) << outer.error.message();
  EXPECT_FALSE(outer.reentered);
  EXPECT_EQ(outer.lease.hold_count(), 1U);
  const std::uint64_t granted = grants(*server_);

  ReentrantAcquireResult inner = leases_->try_acquire("orders/42", 10s);
  ASSERT_TRUE(inner) << inner.error.message();
  EXPECT_TRUE(inner.reentered);
  EXPECT_EQ(inner.lease.token(), outer.lease.token());
  EXPECT_EQ(inner.lease.key(), "orders/42");
  EXPECT_EQ(inner.lease.lease().owner(), outer.lease.lease().owner()) << "one grant, one owner";
  EXPECT_EQ(owner_client(inner.lease.lease().owner()), owner_client(owner_->client_id()));
  EXPECT_EQ(outer.lease.hold_count(), 2U);
  EXPECT_EQ(inner.lease.hold_count(), 2U);
  EXPECT_EQ(leases_->hold_count("orders/42"), 2U);
  EXPECT_TRUE(inner.lease.valid());
  EXPECT_EQ(grants(*server_), granted) << "a reentrant acquire sends no ACQUIRE";

  // A handle renews the one grant for every hold.
  EXPECT_FALSE(inner.lease.renew(20s));
  EXPECT_EQ(outer.lease.lease().ttl(), 20s);

  // Other keys and other owners are unaffected.
  EXPECT_EQ(leases_->hold_count("orders/43"), 0U);
  EXPECT_EQ(other_->try_acquire("orders/42", 5s).error, LeaseErrc::kBusy);
}

TEST_F(ReentrantLeasesTest, OnlyTheLastReleaseFreesTheKey) {
  ReentrantAcquireResult first = leases_->acquire("jobs/nightly", 10s, 0ms);
  ASSERT_TRUE(first);
  ReentrantAcquireResult second = leases_->acquire("jobs/nightly", 10s, 0ms);
  ASSERT_TRUE(second);

  // Dropping one hold (either one: it is not a stack) keeps the key.
  EXPECT_FALSE(first.lease.release());
  EXPECT_TRUE(first.lease.empty());
  EXPECT_EQ(first.lease.release(), LeaseErrc::kLeaseInactive);
  EXPECT_TRUE(second.lease.valid());
  EXPECT_EQ(second.lease.hold_count(), 1U);
  EXPECT_FALSE(free_for_others(*other_, "jobs/nightly"));

  // The last release frees it, waiting for the server's answer.
  EXPECT_FALSE(second.lease.release());
  EXPECT_EQ(leases_->hold_count("jobs/nightly"), 0U);
  EXPECT_TRUE(free_for_others(*other_, "jobs/nightly"));

  // The same through destructors: the last one sends RELEASE in the
  // background.
  {
    ReentrantAcquireResult third = leases_->acquire("jobs/hourly", 10s, 0ms);
    ASSERT_TRUE(third);
    {
      ReentrantAcquireResult fourth = leases_->acquire("jobs/hourly", 10s, 0ms);
      ASSERT_TRUE(fourth.reentered);
    }
    EXPECT_EQ(third.lease.hold_count(), 1U);
    EXPECT_FALSE(free_for_others(*other_, "jobs/hourly"));
  }
  EXPECT_TRUE(
      poll_until([&] { return free_for_others(*other_, "jobs/hourly"); }, kPollTimeout, 10ms));
}

TEST_F(ReentrantLeasesTest, ALostGrantInvalidatesEveryHoldAndFiresOnce) {
  std::atomic<int> lost{0};
  LeaseOptions options;  // no watchdog: the grant is lost at its client-side expiry
  options.on_lost = [&](const LeaseLost&) { lost.fetch_add(1); };
  ReentrantAcquireResult a = leases_->acquire("short", 300ms, 0ms, options);
  ASSERT_TRUE(a);
  ReentrantAcquireResult b = leases_->acquire("short", 300ms, 0ms);
  ASSERT_TRUE(b.reentered);
  ReentrantAcquireResult c = leases_->acquire("short", 300ms, 0ms);
  ASSERT_TRUE(c.reentered);
  ASSERT_TRUE(poll_until([&] { return lost.load() > 0; }, kPollTimeout, 5ms));
  EXPECT_FALSE(a.lease.valid());
  EXPECT_FALSE(b.lease.valid());
  EXPECT_FALSE(c.lease.valid());
  EXPECT_EQ(b.lease.renew(), LeaseErrc::kLeaseInactive);

  // The next acquire is not let into the lost grant: a new one, new token.
  ReentrantAcquireResult fresh = leases_->acquire("short", 10s, 5s);
  ASSERT_TRUE(fresh) << fresh.error.message();
  EXPECT_FALSE(fresh.reentered);
  EXPECT_GT(fresh.lease.token(), a.lease.token());
  EXPECT_EQ(fresh.lease.hold_count(), 1U);
  EXPECT_EQ(leases_->hold_count("short"), 1U);

  // Dropping the lost grant's holds, the last one included, leaves the new
  // grant alone.
  EXPECT_FALSE(b.lease.release());
  EXPECT_FALSE(c.lease.release());
  EXPECT_TRUE(a.lease.release()) << "the server no longer has the lost grant";
  EXPECT_TRUE(fresh.lease.valid());
  EXPECT_EQ(leases_->hold_count("short"), 1U);
  EXPECT_FALSE(free_for_others(*other_, "short"));
  EXPECT_EQ(lost.load(), 1) << "on_lost fires once for the grant, not per hold";
}

TEST_F(ReentrantLeasesTest, AnAcquireInFlightIsJoinedNotRepeated) {
  use_scope(ReentrancyScope::kClient);
  auto two = two_acquires_behind_other("queue", 10s, 10s);
  // The second acquire waits for the first instead of queueing its own.
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(other_->query("queue").waiters, 1U);
  // A try does not wait for an acquire in flight.
  EXPECT_EQ(leases_->try_acquire("queue", 10s).error, LeaseErrc::kBusy);
  EXPECT_FALSE(two->blocker.lease.release());
  two->join();
  ASSERT_TRUE(two->first) << two->first.error.message();
  ASSERT_TRUE(two->second) << two->second.error.message();
  EXPECT_FALSE(two->first.reentered);
  EXPECT_TRUE(two->second.reentered);
  EXPECT_EQ(two->first.lease.token(), two->second.lease.token());
  EXPECT_EQ(leases_->hold_count("queue"), 2U);
}

TEST_F(ReentrantLeasesTest, AFailedAcquireInFlightLetsTheWaiterTryItself) {
  use_scope(ReentrancyScope::kClient);
  auto two = two_acquires_behind_other("contended", 300ms, 20s);
  two->first_thread.join();
  EXPECT_EQ(two->first.error, LeaseErrc::kTimeout);
  // The waiter queues its own ACQUIRE once the first gave up, and gets the
  // key when the other owner lets go.
  EXPECT_TRUE(
      poll_until([&] { return other_->query("contended").waiters == 1; }, kPollTimeout, 5ms));
  EXPECT_FALSE(two->blocker.lease.release());
  two->second_thread.join();
  ASSERT_TRUE(two->second) << two->second.error.message();
  EXPECT_FALSE(two->second.reentered);
  EXPECT_EQ(two->second.lease.hold_count(), 1U);
}

// kClient: threads of one owner share holds: while any thread holds the key there is
// one grant, every hold sees its token, and the key is free for another owner
// only once the last hold is gone. Runs under TSan (label "concurrent").
TEST_F(ReentrantLeasesTest, ThreadsOfOneOwnerShareHolds) {
  use_scope(ReentrancyScope::kClient);
  constexpr int kThreads = 4;
  constexpr int kRounds = 40;
  ReentrantAcquireResult pin = leases_->acquire("shared/state", 10s, 0ms);
  ASSERT_TRUE(pin);
  const std::uint64_t token = pin.lease.token();

  // Relaxed counters: they are read after join(), which orders them.
  std::atomic<int> failures{0};
  std::atomic<int> wrong_tokens{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        ReentrantAcquireResult r = leases_->acquire("shared/state", 10s, 10s);
        if (!r || !r.lease.valid()) {
          failures.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        if (r.lease.hold_count() == 0) failures.fetch_add(1, std::memory_order_relaxed);
        if (r.lease.token() != token) wrong_tokens.fetch_add(1, std::memory_order_relaxed);
        if (round % 2 == t % 2) {
          (void)r.lease.release();
        }  // else its destructor drops it
      }
    });
  }
  std::thread reader([&] {
    // Acquire: pairs with the release store below (nothing else is handed over).
    while (!stop.load(std::memory_order_acquire)) (void)leases_->hold_count("shared/state");
  });
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(wrong_tokens.load(), 0) << "every hold under the pin shares its grant";
  EXPECT_EQ(pin.lease.hold_count(), 1U);
  EXPECT_FALSE(free_for_others(*other_, "shared/state"));

  // Without the pin, grants come and go while the threads churn; each
  // acquire still succeeds, and at the end nothing is held.
  EXPECT_FALSE(pin.lease.release());
  stop.store(true, std::memory_order_release);  // pairs with the reader's acquire load
  reader.join();
  threads.clear();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < kRounds; ++round) {
        ReentrantAcquireResult r = leases_->acquire("shared/state", 10s, 10s);
        if (!r) failures.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(leases_->hold_count("shared/state"), 0U);
  EXPECT_TRUE(
      poll_until([&] { return free_for_others(*other_, "shared/state"); }, kPollTimeout, 10ms));
}

// kThread, the default (Redisson's rule): the holding thread re-enters with
// the same token; another thread of the same process is a contender that
// waits at the server, in FIFO order, until the last hold is released.
TEST_F(ReentrantLeasesTest, AnotherThreadWaitsForTheHoldingThreadsLastRelease) {
  ASSERT_EQ(leases_->scope(), ReentrancyScope::kThread);
  ReentrantAcquireResult outer = leases_->acquire("per/thread", 10s, 0ms);
  ASSERT_TRUE(outer);
  ReentrantAcquireResult inner = leases_->acquire("per/thread", 10s, 0ms);
  ASSERT_TRUE(inner);
  EXPECT_TRUE(inner.reentered);
  EXPECT_EQ(inner.lease.token(), outer.lease.token());
  EXPECT_EQ(leases_->hold_count("per/thread"), 2U);

  // Another thread, no wait: busy, although the same object holds the key.
  ReentrantAcquireResult tried;
  std::thread([&] { tried = leases_->try_acquire("per/thread", 10s); }).join();
  EXPECT_EQ(tried.error, LeaseErrc::kBusy);

  // Another thread, waiting: queued at the server behind this thread's grant.
  std::atomic<bool> done{false};
  ReentrantAcquireResult waited;
  std::thread waiter([&] {
    waited = leases_->acquire("per/thread", 10s, 20s);
    done.store(true, std::memory_order_release);  // pairs with the loads below
  });
  ASSERT_TRUE(
      poll_until([&] { return other_->query("per/thread").waiters == 1; }, kPollTimeout, 5ms));
  EXPECT_FALSE(inner.lease.release());  // one hold fewer: still held
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(done.load(std::memory_order_acquire)) << "let in before the last release";
  EXPECT_EQ(other_->query("per/thread").token, outer.lease.token());
  EXPECT_FALSE(outer.lease.release());
  waiter.join();
  ASSERT_TRUE(waited) << waited.error.message();
  EXPECT_FALSE(waited.reentered);
  EXPECT_GT(waited.lease.token(), outer.lease.token()) << "a grant of its own";
  EXPECT_EQ(leases_->hold_count("per/thread"), 0U) << "the waiter's hold is its thread's";
  EXPECT_FALSE(waited.lease.release());
}

TEST_F(ReentrantLeasesTest, HandlesOutliveTheirReentrantLeases) {
  ReentrantAcquireResult held = leases_->acquire("orphan", 10s, 0ms);
  ASSERT_TRUE(held);
  leases_.reset();
  EXPECT_TRUE(held.lease.valid());
  EXPECT_FALSE(held.lease.release());
  EXPECT_TRUE(free_for_others(*other_, "orphan"));
}

TEST(ReentrantLeaseTest, AnEmptyHandleIsInactive) {
  ReentrantLease empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_FALSE(empty.valid());
  EXPECT_EQ(empty.hold_count(), 0U);
  EXPECT_EQ(empty.token(), 0U);
  EXPECT_EQ(empty.key(), "");
  EXPECT_EQ(empty.renew(), LeaseErrc::kLeaseInactive);
  EXPECT_EQ(empty.release(), LeaseErrc::kLeaseInactive);
}

}  // namespace
}  // namespace shardlock::lease
