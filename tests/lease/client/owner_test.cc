// The owner is the handle: every acquire through a LeaseClient
// contends as an owner of its own, so threads sharing one client exclude
// each other exactly as processes do, against a real LeaseServer on
// loopback. Runs under TSan (label "concurrent").
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
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

class OwnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = test_support::start_loopback_server();
    ASSERT_TRUE(server_);
    client_ = test_support::start_loopback_client(*server_);
    observer_ = test_support::start_loopback_client(*server_);
  }

  std::uint32_t waiters(const std::string& key) { return observer_->query(key).waiters; }

  std::unique_ptr<LeaseServer> server_;
  std::unique_ptr<LeaseClient> client_;
  std::unique_ptr<LeaseClient> observer_;
};

// N threads on one client increment a counter inside a lock of one key, with
// a sleep between the read and the write: with one owner per client (as it
// once was) they all "held" the key at once and lost updates.
TEST_F(OwnerTest, ThreadsSharingOneClientExcludeEachOther) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 4;
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> failures{0};
  int counter = 0;  // guarded by the lease alone: TSan sees any overlap as a race too
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < kRounds; ++round) {
        AcquireResult r = client_->acquire("owner/threads", 10s, 30s);
        if (!r) {
          failures.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        // acq_rel: a thread that finds another inside saw its increment.
        if (inside.fetch_add(1, std::memory_order_acq_rel) != 0) {
          overlaps.fetch_add(1, std::memory_order_relaxed);
        }
        const int seen = counter;
        std::this_thread::sleep_for(3ms);
        counter = seen + 1;
        inside.fetch_sub(1, std::memory_order_acq_rel);
        if (r.lease.release()) failures.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(overlaps.load(), 0) << "two threads of one client held the key at once";
  EXPECT_EQ(counter, kThreads * kRounds);
}

// Two handles of one client: the second waits, in FIFO order behind a third,
// and each is granted at the release before it; the first stays valid (and
// renews) until it releases.
TEST_F(OwnerTest, HandlesOfOneClientAreServedInFifoOrder) {
  AcquireResult first = client_->try_acquire("owner/fifo", 10s);
  ASSERT_TRUE(first);
  std::mutex order_mutex;
  std::vector<int> order;
  std::vector<std::uint64_t> tokens(3);
  std::vector<std::thread> waiters_threads;
  for (int i = 1; i <= 2; ++i) {
    waiters_threads.emplace_back([&, i] {
      AcquireResult r = client_->acquire("owner/fifo", 10s, 20s);
      ASSERT_TRUE(r) << r.error.message();
      {
        std::lock_guard<std::mutex> lock(order_mutex);
        order.push_back(i);
        tokens[static_cast<std::size_t>(i)] = r.lease.token();
      }
      std::this_thread::sleep_for(20ms);
      EXPECT_FALSE(r.lease.release());
    });
    ASSERT_TRUE(poll_until([&] { return waiters("owner/fifo") == static_cast<std::uint32_t>(i); },
                           kPollTimeout, 2ms));
  }
  EXPECT_TRUE(first.lease.valid());
  EXPECT_FALSE(first.lease.renew(10s)) << "the first handle still holds its grant";
  EXPECT_EQ(observer_->query("owner/fifo").token, first.lease.token());
  EXPECT_FALSE(first.lease.release());
  for (auto& thread : waiters_threads) thread.join();
  ASSERT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_GT(tokens[1], first.lease.token());
  EXPECT_GT(tokens[2], tokens[1]);
}

// Each Lease has its own owner, sharing the client's upper 96 bits (the
// server's per-client bounds count them together).
TEST_F(OwnerTest, EveryLeaseIsItsOwnOwnerOfTheClient) {
  AcquireResult a = client_->try_acquire("owner/a", 10s);
  AcquireResult b = client_->try_acquire("owner/b", 10s);
  ASSERT_TRUE(a);
  ASSERT_TRUE(b);
  EXPECT_NE(a.lease.owner(), b.lease.owner());
  EXPECT_NE(a.lease.owner(), client_->client_id());
  EXPECT_EQ(owner_client(a.lease.owner()), owner_client(client_->client_id()));
  EXPECT_EQ(owner_client(b.lease.owner()), owner_client(client_->client_id()));
  const HoldersReply holders = observer_->holders("owner/a");
  ASSERT_FALSE(holders.error);
  ASSERT_EQ(holders.holders.size(), 1U);
  EXPECT_EQ(holders.holders[0].owner, a.lease.owner()) << "the server knows the handle's owner";
}

// An explicit owner acts as that owner: another process that knows it
// releases the lease by key, token and owner. The same owner acquiring the
// key again is a contender (busy), never a second grant.
TEST_F(OwnerTest, AnExplicitOwnerIsThatOwnerAndAContenderForItsOwnKey) {
  const ClientId known = random_client_id();
  LeaseOptions as_known;
  as_known.owner = known;
  AcquireResult held = client_->try_acquire("owner/known", 10s, as_known);
  ASSERT_TRUE(held);
  EXPECT_EQ(held.lease.owner(), known);

  AcquireResult again = client_->try_acquire("owner/known", 10s, as_known);
  EXPECT_EQ(again.error, LeaseErrc::kBusy) << "the same owner's second acquire is not re-granted";
  EXPECT_TRUE(held.lease.valid());
  EXPECT_FALSE(held.lease.renew(10s));

  LeaseClientOptions options;
  options.nodes = {test_support::loopback_address(*server_)};
  options.client_id = known;
  LeaseClient tool(options);
  ASSERT_FALSE(tool.start());
  const CallResult released = tool.release("owner/known", held.lease.token());
  EXPECT_FALSE(released.error) << released.error.message();
  EXPECT_FALSE(observer_->query("owner/known").held);
  held.lease.detach();
}

// The async calls: an acquire given no owner is made as a fresh one, which
// the result names for its release; released as the client id it is not.
TEST_F(OwnerTest, AnAsyncAcquireNamesItsFreshOwner) {
  std::atomic<bool> done{false};
  CallResult granted;
  client_->acquire_async("owner/async", 10s, 0ms, [&](const CallResult& r) {
    granted = r;
    done.store(true, std::memory_order_release);  // pairs with the poll's acquire load
  });
  ASSERT_TRUE(poll_until([&] { return done.load(std::memory_order_acquire); }, kPollTimeout, 1ms));
  ASSERT_FALSE(granted.error) << granted.error.message();
  EXPECT_NE(granted.owner, client_->client_id());
  EXPECT_EQ(client_->release("owner/async", granted.token).error, LeaseErrc::kNotOwner);
  done.store(false, std::memory_order_relaxed);  // nothing is in flight now
  CallResult released;
  client_->release_async(
      "owner/async", granted.token,
      [&](const CallResult& r) {
        released = r;
        done.store(true, std::memory_order_release);
      },
      granted.owner);
  ASSERT_TRUE(poll_until([&] { return done.load(std::memory_order_acquire); }, kPollTimeout, 1ms));
  EXPECT_FALSE(released.error) << released.error.message();
}

}  // namespace
}  // namespace shardlock::lease
