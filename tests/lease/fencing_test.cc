// FencingValidator on its own, under concurrency, and Kleppmann's scenario
// end to end against a real LeaseServer.
#include "shardlock/lease/fencing.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lease/udp_test_peer.h"
#include "shardlock/lease/server/server.h"
#include "support/loopback_server.h"

namespace shardlock::lease {
namespace {

using shardlock::test_support::loopback_options;
using shardlock::test_support::start_loopback_server;

TEST(FencingValidator, AcceptsEqualOrHigherRejectsLower) {
  FencingValidator fence;
  EXPECT_FALSE(fence.highest("k").has_value());
  EXPECT_TRUE(fence.check_and_advance("k", 5));
  EXPECT_TRUE(fence.check_and_advance("k", 5));  // the same holder writing again
  EXPECT_FALSE(fence.check_and_advance("k", 4));
  EXPECT_EQ(fence.highest("k"), 5u);
  EXPECT_TRUE(fence.check_and_advance("k", 9));
  EXPECT_FALSE(fence.check_and_advance("k", 5));
  EXPECT_TRUE(fence.check_and_advance("other", 1));  // keys are independent
  EXPECT_EQ(fence.highest("k"), 9u);
  fence.forget("k");
  EXPECT_TRUE(fence.check_and_advance("k", 1));
}

// Each rejection pinned down, so a validator that accepts everything, or
// that remembers a rejected token, fails here: the token just below the
// highest, token 0, a stale token on one key while another key is lower.
TEST(FencingValidator, RejectsEveryLowerTokenAndRemembersNothingOfIt) {
  FencingValidator fence;
  ASSERT_TRUE(fence.check_and_advance("k", 100));
  ASSERT_TRUE(fence.check_and_advance("low", 3));
  for (const std::uint64_t stale : {std::uint64_t{99}, std::uint64_t{50}, std::uint64_t{0}}) {
    EXPECT_FALSE(fence.check_and_advance("k", stale)) << "token " << stale;
    EXPECT_EQ(fence.highest("k"), 100u) << "a rejected token " << stale << " moved the key";
  }
  EXPECT_FALSE(fence.check_and_advance("low", 2));
  EXPECT_EQ(fence.highest("low"), 3u);
  // The equal token stays accepted after rejections, and changes nothing.
  EXPECT_TRUE(fence.check_and_advance("k", 100));
  EXPECT_EQ(fence.highest("k"), 100u);
  EXPECT_FALSE(fence.highest("never seen").has_value());
}

TEST(FencingValidator, ConcurrentWritersNeverMoveAKeyBackwards) {
  FencingValidator fence(16);
  constexpr int kThreads = 4;
  constexpr int kOps = 20'000;
  std::atomic<std::uint64_t> max_submitted[4] = {};
  std::atomic<int> regressions{0};
  std::atomic<int> rejections{0};
  std::atomic<int> wrong_rejections{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t));
      for (int i = 0; i < kOps; ++i) {
        const std::size_t k = rng() % 4;
        const std::string key = "key" + std::to_string(k);
        const std::uint64_t token = rng() % 100'000;
        // Relaxed: a running maximum read only after join().
        std::uint64_t seen = max_submitted[k].load(std::memory_order_relaxed);
        while (token > seen &&
               !max_submitted[k].compare_exchange_weak(seen, token, std::memory_order_relaxed)) {
        }
        if (fence.check_and_advance(key, token)) {
          // Whatever was accepted is now a floor for everyone.
          if (fence.highest(key).value_or(0) < token) ++regressions;
        } else {
          ++rejections;
          // Rejected only below an accepted token, and the key never moves
          // back, so it is still above this one.
          if (fence.highest(key).value_or(0) <= token) ++wrong_rejections;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(regressions.load(), 0);
  EXPECT_EQ(wrong_rejections.load(), 0);
  // 80,000 random tokens over four keys: most arrive below the key's
  // running maximum, so a validator that rejects none is broken.
  EXPECT_GT(rejections.load(), 0);
  for (std::size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(fence.highest("key" + std::to_string(k)), max_submitted[k].load());
  }
}

// Kleppmann's scenario: holder 1 takes the lease, stalls past its TTL, the
// server hands the key to holder 2 with a larger token, holder 2 writes, and
// holder 1's late write is rejected by the resource.
TEST(FencingValidator, KleppmannScenarioAgainstARealServer) {
  LeaseServerOptions o = loopback_options();
  o.io = IoBackend::kSocket;
  const auto server = start_loopback_server(o);
  ASSERT_NE(server, nullptr);

  FencingValidator storage_fence;
  std::string storage;
  auto write = [&](std::uint64_t token, const std::string& value) {
    if (!storage_fence.check_and_advance("file", token)) return false;
    storage = value;
    return true;
  };

  test_support::UdpTestPeer holder1(server->port());
  test_support::UdpTestPeer holder2(server->port());
  const Message lease1 = holder1.acquire("file", 200);
  ASSERT_EQ(lease1.type, MessageType::kGranted);
  ASSERT_TRUE(write(lease1.token, "holder 1, before the pause"));

  // Holder 2 waits in the queue; the server hands it the key when holder 1's
  // lease expires, while holder 1 is "paused" and believes it still holds it.
  const Message lease2 = holder2.acquire("file", 10'000, 5'000);
  ASSERT_EQ(lease2.type, MessageType::kGranted);
  EXPECT_GT(lease2.token, lease1.token);
  EXPECT_TRUE(write(lease2.token, "holder 2"));

  // Holder 1 wakes up and writes with its old token: rejected.
  EXPECT_FALSE(write(lease1.token, "holder 1, after the pause"));
  EXPECT_EQ(storage, "holder 2");
  // And the server agrees that holder 1's lease is gone.
  EXPECT_EQ(holder1.renew("file", lease1.token, 1000).type, MessageType::kExpired);
  EXPECT_EQ(server->stats().counter(StatCounter::kExpirations), 1u);
}

}  // namespace
}  // namespace shardlock::lease
