// WatchRegistry against a stand-in lease table (WatchedKeys): parking and
// its bounds, wake() answering exactly the watchers whose key's version
// moved, timeouts and redirects from the wheel, and the per-client counts.
#include "shardlock/lease/server/internal/watch_registry.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "shardlock/lease/server/internal/deferred_reply.h"

namespace shardlock::lease::internal {
namespace {

constexpr ClientId kAlice{0x1'0000'0001, 1};
constexpr ClientId kBob{0x2'0000'0001, 2};

// Versions by key; a described key reports one holder per version token.
class FakeKeys final : public WatchedKeys {
 public:
  KeyVersion version(const KeyRef& key) const noexcept override {
    const auto it = versions.find(std::string(key.text));
    return it == versions.end() ? KeyVersion{} : it->second;
  }
  void describe(const KeyRef& key, std::size_t room, std::int64_t /*now_ms*/,
                std::vector<std::uint8_t>& /*entries*/, Message& summary) const override {
    rooms.push_back(room);
    summary.type = MessageType::kHoldersReply;
    summary.holders = version(key).holders;
  }
  std::map<std::string, KeyVersion> versions;
  mutable std::vector<std::size_t> rooms;
};

class WatchRegistryTest : public ::testing::Test {
 protected:
  WatchRegistryTest() { make({}, {}); }
  ~WatchRegistryTest() override { registry_.reset(); }

  void make(const WatchRegistry::Limits& limits, const ClientUsage::Limits& per_client) {
    registry_.reset();
    usage_ = std::make_unique<ClientUsage>(per_client, 0);
    registry_ = std::make_unique<WatchRegistry>(limits, 0, wheel_, *usage_, keys_, counters_);
  }

  WatchRegistry::Park park(const ClientId& client, std::string_view key, std::uint64_t request_id,
                           KeyVersion since = {}, std::uint32_t wait_ms = 1000) {
    Message m;
    m.type = MessageType::kWatch;
    m.request_id = request_id;
    m.key = key;
    m.token = since.token;
    m.holders = since.holders;
    m.wait_ms = wait_ms;
    return registry_->park(client, Peer{}, m, KeyRef{key, hash_key(key, 0)}, 512, now_);
  }
  void touch(std::string_view key) { registry_->touch(KeyRef{key, hash_key(key, 0)}); }
  // Moves time on, answering the watches whose timers fire.
  void advance(std::int64_t to) {
    now_ = to;
    wheel_.advance(now_, [&](TimerNode& node) { registry_->expire(node, now_, deferred_); });
  }

  std::int64_t now_ = 1000;
  TimerWheel wheel_{now_};
  FakeKeys keys_;
  ShardCounters counters_;
  std::unique_ptr<ClientUsage> usage_;
  std::unique_ptr<WatchRegistry> registry_;
  std::vector<DeferredReply> deferred_;
};

TEST_F(WatchRegistryTest, ParksOnceAndCountsTheClient) {
  EXPECT_EQ(park(kAlice, "k", 1), WatchRegistry::Park::kParked);
  EXPECT_EQ(park(kAlice, "k", 1), WatchRegistry::Park::kAlreadyParked);
  EXPECT_TRUE(registry_->parked(kAlice, 1));
  EXPECT_EQ(registry_->size(), 1U);
  EXPECT_EQ(usage_->of(kAlice).watches, 1U);
  EXPECT_EQ(wheel_.size(), 1U);
}

TEST_F(WatchRegistryTest, WakeAnswersOnlyTheWatchersWhoseVersionMoved) {
  ASSERT_EQ(park(kAlice, "k", 1, KeyVersion{}), WatchRegistry::Park::kParked);
  ASSERT_EQ(park(kBob, "k", 2, KeyVersion{7, 1}), WatchRegistry::Park::kParked);
  ASSERT_EQ(park(kBob, "other", 3), WatchRegistry::Park::kParked);
  keys_.versions["k"] = KeyVersion{7, 1};
  registry_->wake(now_, deferred_);
  EXPECT_TRUE(deferred_.empty());  // nothing touched yet
  touch("k");
  touch("k");  // once is enough
  registry_->wake(now_, deferred_);
  ASSERT_EQ(deferred_.size(), 1U);  // Bob saw {7, 1} already
  EXPECT_EQ(deferred_[0].client, kAlice);
  EXPECT_EQ(deferred_[0].request_id, 1U);
  EXPECT_EQ(deferred_[0].type, MessageType::kHoldersReply);
  EXPECT_EQ(deferred_[0].key, "k");
  EXPECT_EQ(deferred_[0].holders, 1U);
  EXPECT_EQ(deferred_[0].reply_credit, 512U);
  ASSERT_EQ(keys_.rooms.size(), 1U);
  EXPECT_EQ(keys_.rooms[0], watch_reply_room(512, 1));
  EXPECT_EQ(registry_->size(), 2U);
  EXPECT_EQ(usage_->of(kAlice).watches, 0U);
  EXPECT_EQ(usage_->clients(), 1U);
  EXPECT_EQ(wheel_.size(), 2U);
}

TEST_F(WatchRegistryTest, AWaitThatRunsOutIsAnsweredWithTheKeyAsItIs) {
  ASSERT_EQ(park(kAlice, "k", 1, {}, /*wait_ms=*/50), WatchRegistry::Park::kParked);
  advance(1049);
  EXPECT_TRUE(deferred_.empty());
  advance(1050);
  ASSERT_EQ(deferred_.size(), 1U);
  EXPECT_EQ(deferred_[0].type, MessageType::kHoldersReply);
  EXPECT_EQ(registry_->size(), 0U);
  EXPECT_EQ(usage_->clients(), 0U);
}

TEST_F(WatchRegistryTest, EndEarlyRedirectsTheWatchesOfKeysGivenAway) {
  ASSERT_EQ(park(kAlice, "moved", 1), WatchRegistry::Park::kParked);
  ASSERT_EQ(park(kBob, "kept", 2), WatchRegistry::Park::kParked);
  registry_->end_early([](std::string_view key) { return key == "moved"; });
  now_ += 1;
  wheel_.advance(now_, [&](TimerNode& node) {
    EXPECT_EQ(WatchRegistry::key_of(node), "moved");
    registry_->redirect(node, /*epoch=*/12, deferred_);
  });
  ASSERT_EQ(deferred_.size(), 1U);
  EXPECT_EQ(deferred_[0].type, MessageType::kRedirect);
  EXPECT_EQ(deferred_[0].epoch, 12U);
  EXPECT_EQ(counters_[StatCounter::kRedirects], 1U);
  EXPECT_TRUE(registry_->parked(kBob, 2));
}

TEST_F(WatchRegistryTest, BoundsRefuseWithNothingChanged) {
  make({.max_watches = 3, .max_watches_per_key = 2}, {.max_watches = 2});
  EXPECT_EQ(park(kAlice, "k", 1), WatchRegistry::Park::kParked);
  EXPECT_EQ(park(kBob, "k", 2), WatchRegistry::Park::kParked);
  EXPECT_EQ(park(kBob, "k", 3), WatchRegistry::Park::kRefused);  // per key
  EXPECT_EQ(park(kAlice, "j", 4), WatchRegistry::Park::kParked);
  EXPECT_EQ(park(kAlice, "i", 5), WatchRegistry::Park::kRefused);  // all keys
  make({}, {.max_watches = 1});
  EXPECT_EQ(park(kAlice, "k", 1), WatchRegistry::Park::kParked);
  EXPECT_EQ(park(kAlice, "j", 2), WatchRegistry::Park::kRefused);  // per client
  EXPECT_EQ(registry_->size(), 1U);
  EXPECT_EQ(usage_->of(kAlice).watches, 1U);
}

TEST_F(WatchRegistryTest, DestroyingCancelsTheTimersOfWatchesStillParked) {
  ASSERT_EQ(park(kAlice, "k", 1), WatchRegistry::Park::kParked);
  registry_.reset();
  EXPECT_EQ(wheel_.size(), 0U);
}

}  // namespace
}  // namespace shardlock::lease::internal
