// Watches against a real LeaseServer on loopback: watch_once(), KeyWatch
// and Watcher see grants, releases and expiries without polling, carry the
// holder's value, ride through a lock-delay, and a flood of watches is
// refused; a raw peer checks the anti-amplification bound of parked answers.
#include "shardlock/lease/client/watch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lease/udp_test_peer.h"
#include "poll_until.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/server/server.h"
#include "shardlock/lock_guard.h"
#include "shardlock/mutex.h"
#include "support/loopback_server.h"

namespace shardlock::lease {
namespace {

using namespace std::chrono_literals;
using shardlock::test_support::loopback_options;
using shardlock::test_support::poll_until;
using shardlock::test_support::start_loopback_client;
using shardlock::test_support::start_loopback_server;
using std::chrono::milliseconds;

TEST(WatchTest, AWatchFromTheCurrentVersionIsAnsweredByTheRelease) {
  auto server = start_loopback_server();
  ASSERT_TRUE(server);
  auto holder = start_loopback_client(*server);
  auto watcher = start_loopback_client(*server);
  LeaseOptions with_value;
  with_value.value = "10.1.2.3:8080 pid 42";
  auto lease = holder->acquire("jobs/nightly", 30s, 0ms, with_value);
  ASSERT_TRUE(lease) << lease.error.message();

  const WatchEvent now = watcher->watch_once("jobs/nightly", KeyVersion{}, 20s);
  ASSERT_FALSE(now.error) << now.error.message();
  EXPECT_EQ(now.version, (KeyVersion{lease.lease.token(), 1}));
  ASSERT_EQ(now.holders.size(), 1u);
  EXPECT_EQ(now.holders[0].value, "10.1.2.3:8080 pid 42");
  EXPECT_EQ(now.holders[0].owner, lease.lease.owner());

  // Parked at the server until the release: with a 20 s wait, the same
  // version would come back only after it.
  std::thread releaser([&] {
    std::this_thread::sleep_for(100ms);
    EXPECT_FALSE(lease.lease.release());
  });
  const WatchEvent after = watcher->watch_once("jobs/nightly", now.version, 20s);
  releaser.join();
  ASSERT_FALSE(after.error) << after.error.message();
  EXPECT_EQ(after.version, (KeyVersion{0, 0}));
  EXPECT_FALSE(after.held());
}

TEST(WatchTest, KeyWatchReportsEachChangeOnceAndNotRenewals) {
  auto server = start_loopback_server();
  ASSERT_TRUE(server);
  auto a = start_loopback_client(*server);
  auto b = start_loopback_client(*server);
  auto observer = start_loopback_client(*server);
  KeyWatch watch(*observer, "leader/x");
  auto first = watch.next(5s);
  ASSERT_TRUE(first && !first->error);
  EXPECT_FALSE(first->held());

  LeaseOptions options;
  options.value = "a";
  auto la = a->acquire("leader/x", 30s, 0ms, options);
  ASSERT_TRUE(la);
  auto second = watch.next(5s);
  ASSERT_TRUE(second && !second->error);
  ASSERT_EQ(second->holders.size(), 1u);
  EXPECT_EQ(second->holders[0].value, "a");
  EXPECT_EQ(second->version.token, la.lease.token());

  EXPECT_FALSE(la.lease.renew());
  EXPECT_FALSE(watch.next(300ms)) << "a renewal is no change";

  // B waits behind A; A's release hands the key to B: one change (or two,
  // free then B, if the watch re-armed in between), ending with B.
  std::thread waiter([&] {
    options.value = "b";
    auto lb = b->acquire("leader/x", 30s, 10s, options);
    EXPECT_TRUE(lb);
    lb.lease.detach();
  });
  ASSERT_TRUE(poll_until([&] { return a->query("leader/x").waiters == 1; }, 5s));
  EXPECT_FALSE(la.lease.release());
  waiter.join();
  std::optional<WatchEvent> third;
  for (int i = 0; i < 2; ++i) {
    third = watch.next(5s);
    ASSERT_TRUE(third && !third->error);
    if (third->held()) break;
  }
  ASSERT_EQ(third->holders.size(), 1u);
  EXPECT_EQ(third->holders[0].value, "b");
  EXPECT_GT(third->version.token, la.lease.token());
}

TEST(WatchTest, AnExpiryWakesAWatcher) {
  auto server = start_loopback_server();
  ASSERT_TRUE(server);
  auto holder = start_loopback_client(*server);
  auto observer = start_loopback_client(*server);
  auto lease = holder->acquire("k", 300ms, 0ms);
  ASSERT_TRUE(lease);
  KeyWatch watch(*observer, "k");
  auto held = watch.next(5s);
  ASSERT_TRUE(held && held->held());
  lease.lease.detach();  // never released: it must expire
  auto freed = watch.next(5s);
  ASSERT_TRUE(freed && !freed->error);
  EXPECT_FALSE(freed->held());
}

TEST(WatchTest, AWatcherCallsBackOnItsThreadUntilStopped) {
  auto server = start_loopback_server();
  ASSERT_TRUE(server);
  auto holder = start_loopback_client(*server);
  auto observer = start_loopback_client(*server);
  Mutex mutex;
  std::vector<KeyVersion> seen;
  Watcher watcher(*observer, "w", [&](const WatchEvent& e) {
    if (e.error) return;
    LockGuard lock(mutex);
    seen.push_back(e.version);
  });
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(poll_until(
        [&] {
          LockGuard lock(mutex);
          return seen.size() == static_cast<std::size_t>(2 * i + 1);
        },
        5s))
        << i;
    auto lease = holder->acquire("w", 30s, 0ms);
    ASSERT_TRUE(lease);
    ASSERT_TRUE(poll_until(
        [&] {
          LockGuard lock(mutex);
          return seen.size() == static_cast<std::size_t>(2 * i + 2);
        },
        5s))
        << i;
    EXPECT_FALSE(lease.lease.release());
  }
  ASSERT_TRUE(poll_until(
      [&] {
        LockGuard lock(mutex);
        return seen.size() == 7;
      },
      5s));
  watcher.stop();
  LockGuard lock(mutex);
  for (std::size_t i = 1; i < seen.size(); ++i) EXPECT_NE(seen[i], seen[i - 1]) << i;
  EXPECT_EQ(seen.back(), (KeyVersion{0, 0}));
}

TEST(WatchTest, AWatchRidesThroughTheLockDelay) {
  // The server runs on a clock the test moves, so the lock-delay ends when
  // the test says, not some wall-clock time after a start-up of unknown
  // length (a start slow enough ate the lock-delay of a wall-clock bound).
  auto fake_ms = std::make_shared<std::atomic<std::int64_t>>(5'000);
  LeaseServerOptions options;
  options.lock_delay = 400ms;
  // Relaxed: the I/O threads only need to see the new time eventually.
  options.clock = [fake_ms] { return milliseconds{fake_ms->load(std::memory_order_relaxed)}; };
  auto server = start_loopback_server(options);
  ASSERT_TRUE(server);
  auto observer = start_loopback_client(*server);
  std::atomic<std::int64_t> answered_at{-1};
  WatchEvent e;
  std::thread watcher([&] {
    e = observer->watch_once("k", KeyVersion{}, 60s);
    answered_at.store(fake_ms->load(std::memory_order_relaxed), std::memory_order_release);
  });
  // The watch was answered RECOVERING at least once (so it waits), and is
  // still waiting while the server's clock stands inside the lock-delay.
  EXPECT_TRUE(poll_until([&] { return server->stats().counter(StatCounter::kRecovering) >= 1; }));
  EXPECT_EQ(answered_at.load(std::memory_order_acquire), -1) << "answered inside the lock-delay";
  fake_ms->fetch_add(400, std::memory_order_relaxed);
  watcher.join();
  ASSERT_FALSE(e.error) << e.error.message();
  EXPECT_FALSE(e.held());
  EXPECT_GE(answered_at.load(std::memory_order_acquire), 5'400) << "answered inside the lock-delay";
}

TEST(WatchTest, AFloodOfWatchesIsRefusedWithAClearError) {
  LeaseServerOptions options = loopback_options();
  options.shards = 1;
  options.max_watches_per_client = 3;
  options.max_watches = 4;
  auto server = start_loopback_server(options);
  ASSERT_TRUE(server);
  auto flooder = start_loopback_client(*server);
  std::atomic<int> parked{0};
  for (int i = 0; i < 3; ++i) {
    flooder->watch_async("key-" + std::to_string(i), KeyVersion{0, 0}, 5s,
                         [&](const CallResult&) { parked.fetch_add(1); });
  }
  ASSERT_TRUE(poll_until([&] { return server->stats().counter(StatCounter::kRequests) >= 3; }, 5s));
  const WatchEvent refused = flooder->watch_once("key-3", KeyVersion{0, 0}, 5s);
  EXPECT_EQ(refused.error, LeaseErrc::kServerError);
  EXPECT_EQ(refused.wire_error, WireError::kLimitExceeded);
  auto other = start_loopback_client(*server);
  EXPECT_FALSE(other->watch_once("key-4", KeyVersion{}, 0ms).error) << "not parked: not bounded";
  EXPECT_EQ(parked.load(), 0) << "the parked ones stay parked";
}

TEST(WatchTest, AParkedAnswerNeverExceedsItsRequestsBytes) {
  auto server = start_loopback_server();
  ASSERT_TRUE(server);
  auto holder = start_loopback_client(*server);
  // A shared key with many holders, each with the longest value.
  LeaseOptions options;
  options.value = std::string(kMaxHolderValueLength, 'v');
  std::vector<Lease> leases;
  for (int i = 0; i < 6; ++i) {
    auto other = start_loopback_client(*server);
    auto r = other->acquire_shared("crowd", 30s, 0ms, options);
    ASSERT_TRUE(r);
    r.lease.detach();
  }
  test_support::UdpTestPeer peer(server->port());
  Message watch;
  watch.type = MessageType::kWatch;
  watch.key = "crowd";
  watch.token = kNoVersionToken;
  watch.wait_ms = 5000;
  // Padded only to the bound: room for no holder at all. UdpTestPeer checks
  // every reply against the request's size.
  const Message bare = peer.call(watch);
  ASSERT_EQ(bare.type, MessageType::kHoldersReply);
  EXPECT_EQ(bare.holders, 6u);
  EXPECT_EQ(bare.holder_list_count, 0u);
  // Padded to a whole datagram: the newest holders, hence the version.
  const auto send_watch = [&](std::size_t pad_to) {
    watch.request_id = peer.next_id();
    Datagram d;
    EXPECT_TRUE(d.push(watch));
    d.request_id = watch.request_id;
    (void)peer.send(d, true, pad_to);
  };
  send_watch(kMaxDatagramSize);
  const Message full = peer.wait_for(watch.request_id);
  ASSERT_EQ(full.type, MessageType::kHoldersReply);
  ASSERT_GE(full.holder_list_count, 1u);
  std::uint64_t newest = 0;
  for (const HolderEntry& e : HolderList(full)) newest = e.token;
  // Parked with that version, answered at the next grant, within its bytes.
  watch.token = newest;
  watch.holders = 6;
  send_watch(600);
  EXPECT_TRUE(peer.quiet(200ms));
  auto leaver = start_loopback_client(*server);
  auto r = leaver->acquire_shared("crowd", 30s, 0ms, options);
  ASSERT_TRUE(r);
  const Message woken = peer.wait_for(watch.request_id);
  ASSERT_EQ(woken.type, MessageType::kHoldersReply);
  EXPECT_EQ(woken.holders, 7u);
  EXPECT_GE(woken.holder_list_count, 1u);
  EXPECT_LT(woken.holder_list_count, 7u);
}

}  // namespace
}  // namespace shardlock::lease
