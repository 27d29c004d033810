// WATCH in the shard state machine (protocol.h, "Watches"): a blocking
// QUERY_HOLDERS answered when the key's version moves, or when its wait ends.
// Time is a number the test moves.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "shardlock/lease/server/internal/shard.h"
#include "support/shard_driver.h"

namespace shardlock::lease::internal {
namespace {

using shardlock::test_support::ShardDriver;

constexpr ClientId kAlice{1, 1};
constexpr ClientId kBob{2, 2};
constexpr ClientId kWatcher{9, 9};

// The shard, its clock and its deferred answers are the driver's
// (support/shard_driver.h); the fixture builds the requests and reads the
// holders a HOLDERS_REPLY lists.
class ShardWatchTest : public ::testing::Test, public ShardDriver {
 protected:
  struct Result : ShardDriver::Result {
    std::vector<HolderEntry> listed;
  };

  Result send(const ClientId& client, const Message& m, std::uint16_t credit = kMaxDatagramSize) {
    page_.room = watch_reply_room(credit, m.key.size());
    Result r{ShardDriver::send(client, m, credit, &page_), {}};
    if (r.answered && r.reply.type == MessageType::kHoldersReply) {
      for (const HolderEntry& e : HolderList(r.reply)) r.listed.push_back(e);
    }
    return r;
  }
  Result acquire(const ClientId& c, MessageType type = MessageType::kAcquire,
                 std::string_view value = {}, std::uint32_t wait = 0) {
    Message m;
    m.type = type;
    m.key = "k";
    m.ttl_ms = 1000;
    m.wait_ms = wait;
    m.value = value;
    return send(c, m);
  }
  Result release(const ClientId& c, std::uint64_t token) {
    Message m;
    m.type = MessageType::kRelease;
    m.key = "k";
    m.token = token;
    return send(c, m);
  }
  Result watch(std::uint64_t token, std::uint32_t holders, std::uint32_t wait = 30'000,
               std::uint64_t request_id = 0, const ClientId& client = kWatcher,
               std::uint16_t credit = kMaxDatagramSize) {
    Message m;
    m.type = MessageType::kWatch;
    m.key = "k";
    m.token = token;
    m.holders = holders;
    m.wait_ms = wait;
    m.request_id = request_id;
    return send(client, m, credit);
  }
  // The watch answers among `replies` (every other deferred reply skipped).
  static std::vector<DeferredReply> answers_of(const std::vector<DeferredReply>& replies) {
    std::vector<DeferredReply> out;
    for (const DeferredReply& d : replies) {
      if (d.type == MessageType::kHoldersReply || d.type == MessageType::kRedirect) {
        out.push_back(d);
      }
    }
    return out;
  }
  // What a client reads off an answer: the version it carries.
  static std::pair<std::uint64_t, std::uint32_t> version_of(const Message& m) {
    std::uint64_t last = 0;
    std::size_t listed = 0;
    for (const HolderEntry& e : HolderList(m)) {
      last = e.token;
      ++listed;
    }
    EXPECT_EQ(m.first_holder + listed, m.holders) << "the tail page ends at the last holder";
    return {last, m.holders};
  }
  HolderPage page_;
};

TEST_F(ShardWatchTest, AVersionNoKeyHasIsAnsweredAtOnceWithTheState) {
  auto free = watch(kNoVersionToken, 0);
  ASSERT_TRUE(free.answered);
  EXPECT_EQ(free.reply.type, MessageType::kHoldersReply);
  EXPECT_EQ(free.reply.holders, 0u);
  EXPECT_EQ(free.reply.holder_list_count, 0u);

  const auto g = acquire(kAlice, MessageType::kAcquire, "10.0.0.1:80 pid 7");
  ASSERT_EQ(g.reply.type, MessageType::kGranted);
  auto held = watch(0, 0);  // stale: the key moved since (0, 0)
  ASSERT_TRUE(held.answered);
  ASSERT_EQ(held.listed.size(), 1u);
  EXPECT_EQ(held.listed[0].token, g.reply.token);
  EXPECT_EQ(held.listed[0].owner, kAlice);
  EXPECT_EQ(held.listed[0].value, "10.0.0.1:80 pid 7");
  EXPECT_EQ(version_of(held.reply), std::make_pair(g.reply.token, 1u));
  EXPECT_EQ(shard_->parked_watches(), 0u);
}

TEST_F(ShardWatchTest, AParkedWatchIsAnsweredByARelease) {
  const auto g = acquire(kAlice);
  const auto w = watch(g.reply.token, 1, 30'000, 555);
  EXPECT_FALSE(w.answered);
  EXPECT_EQ(shard_->parked_watches(), 1u);

  release(kAlice, g.reply.token);
  const auto answers = answers_of(take_deferred());
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].request_id, 555u);
  EXPECT_EQ(answers[0].client, kWatcher);
  EXPECT_EQ(answers[0].key, "k");
  const Message m = answers[0].message();
  EXPECT_EQ(version_of(m), std::make_pair(std::uint64_t{0}, 0u));
  EXPECT_EQ(shard_->parked_watches(), 0u);
}

TEST_F(ShardWatchTest, AGrantWakesAWatcherOfAFreeKeyAndCarriesTheValue) {
  EXPECT_FALSE(watch(0, 0).answered);
  const auto g = acquire(kAlice, MessageType::kAcquire, "leader-a");
  const auto answers = answers_of(take_deferred());
  ASSERT_EQ(answers.size(), 1u);
  const Message m = answers[0].message();
  ASSERT_EQ(m.holder_list_count, 1u);
  const HolderEntry e = *HolderList(m).begin();
  EXPECT_EQ(e.token, g.reply.token);
  EXPECT_EQ(e.value, "leader-a");
  EXPECT_EQ(m.mode, LeaseMode::kExclusive);
}

TEST_F(ShardWatchTest, RenewalsAndWaitersDoNotWakeIt) {
  const auto g = acquire(kAlice);
  EXPECT_FALSE(watch(g.reply.token, 1).answered);
  Message renew;
  renew.type = MessageType::kRenew;
  renew.key = "k";
  renew.token = g.reply.token;
  renew.ttl_ms = 1000;
  EXPECT_EQ(send(kAlice, renew).reply.type, MessageType::kRenewed);
  EXPECT_FALSE(acquire(kBob, MessageType::kAcquire, {}, 5000).answered);  // queued
  EXPECT_TRUE(answers_of(take_deferred()).empty());
  EXPECT_EQ(shard_->parked_watches(), 1u);
}

TEST_F(ShardWatchTest, AnExpiryWakesItAndSoDoesTheHandOffThatFollows) {
  const auto g = acquire(kAlice);
  EXPECT_FALSE(acquire(kBob, MessageType::kAcquire, {}, 5000).answered);
  EXPECT_FALSE(watch(g.reply.token, 1).answered);
  advance_to(now_ + 1002);  // Alice's lease expires; Bob is handed the key
  const auto all = take_deferred();
  const auto answers = answers_of(all);
  ASSERT_EQ(answers.size(), 1u);
  // The answer is the state once the hand-off is done: Bob holds it.
  const Message m = answers[0].message();
  ASSERT_EQ(m.holder_list_count, 1u);
  EXPECT_EQ(HolderList(m).begin()->owner, kBob);
  EXPECT_GT(version_of(m).first, g.reply.token);
}

TEST_F(ShardWatchTest, ItsWaitRunningOutAnswersTheSameVersion) {
  const auto g = acquire(kAlice);
  EXPECT_FALSE(watch(g.reply.token, 1, 200).answered);
  advance_to(now_ + 199);
  EXPECT_TRUE(take_deferred().empty());
  advance_to(now_ + 2);
  const auto answers = answers_of(take_deferred());
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(version_of(answers[0].message()), std::make_pair(g.reply.token, 1u));
  EXPECT_EQ(shard_->parked_watches(), 0u);
}

TEST_F(ShardWatchTest, ARetransmissionOfAParkedWatchIsNotParkedTwice) {
  const auto g = acquire(kAlice);
  EXPECT_FALSE(watch(g.reply.token, 1, 30'000, 777).answered);
  EXPECT_FALSE(watch(g.reply.token, 1, 30'000, 777).answered);
  EXPECT_EQ(shard_->parked_watches(), 1u);
  release(kAlice, g.reply.token);
  EXPECT_EQ(answers_of(take_deferred()).size(), 1u);
  // Its answer was lost: the retransmission is answered afresh, at once.
  const auto again = watch(g.reply.token, 1, 30'000, 777);
  ASSERT_TRUE(again.answered);
  EXPECT_EQ(again.reply.holders, 0u);
}

TEST_F(ShardWatchTest, SharedHoldersListTheNewestAndEveryLeaveWakesIt) {
  std::vector<std::uint64_t> tokens;
  const std::string value(200, 'v');
  for (int i = 0; i < 8; ++i) {
    tokens.push_back(acquire(ClientId{10u + i, 1}, MessageType::kAcquireShared, value).reply.token);
  }
  // Room for a few 231-byte entries: the newest ones, ending at the last.
  const auto w = watch(0, 0, 30'000, 0, kWatcher, 800);
  ASSERT_TRUE(w.answered);
  ASSERT_GE(w.listed.size(), 1u);
  ASSERT_LT(w.listed.size(), 8u);
  EXPECT_EQ(w.reply.first_holder + w.listed.size(), 8u);
  EXPECT_EQ(w.listed.back().token, tokens.back());
  EXPECT_EQ(version_of(w.reply), std::make_pair(tokens.back(), 8u));
  // A leave that is not the newest holder still moves the version (the
  // count), and the answer stays within the credit it was parked with.
  EXPECT_FALSE(watch(tokens.back(), 8, 30'000, 0, kWatcher, 800).answered);
  release(ClientId{12, 1}, tokens[2]);
  const auto answers = answers_of(take_deferred());
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(version_of(answers[0].message()), std::make_pair(tokens.back(), 7u));
  Datagram d;
  ASSERT_TRUE(d.push(answers[0].message()));
  EXPECT_LE(encoded_size(d), 800u);
}

TEST_F(ShardWatchTest, ParkedWatchesAreBoundedPerKeyPerClientAndInTotal) {
  ShardLimits limits;
  limits.max_watches = 5;
  limits.max_watches_per_key = 3;
  limits.max_watches_per_client = 2;
  make_shard(limits);
  const auto refused = [](const Result& r) {
    return r.answered && r.reply.type == MessageType::kError &&
           r.reply.error == WireError::kLimitExceeded;
  };
  EXPECT_FALSE(watch(0, 0, 30'000, 0, ClientId{0, 1}).answered);
  EXPECT_FALSE(watch(0, 0, 30'000, 0, ClientId{0, 1}).answered);
  // Distinct clients differ above an owner's low 32 bits (owner_client()).
  EXPECT_TRUE(refused(watch(0, 0, 30'000, 0, ClientId{0, 1})));  // per client
  EXPECT_FALSE(watch(0, 0, 30'000, 0, ClientId{0, 2}).answered);
  EXPECT_TRUE(refused(watch(0, 0, 30'000, 0, ClientId{0, 3})));  // per key
  for (std::uint64_t c = 4; c < 6; ++c) {
    Message m;
    m.type = MessageType::kWatch;
    m.key = "other";
    m.wait_ms = 30'000;
    EXPECT_FALSE(send(ClientId{0, c}, m).answered);
  }
  Message m;
  m.type = MessageType::kWatch;
  m.key = "third";
  m.wait_ms = 30'000;
  EXPECT_TRUE(refused(send(ClientId{0, 7}, m)));  // in total
  EXPECT_EQ(shard_->parked_watches(), 5u);
  EXPECT_EQ(counter(StatCounter::kLimitRejections), 3u);
  // Answered, they free their room (and their clients' usage goes).
  acquire(kAlice);
  EXPECT_EQ(answers_of(take_deferred()).size(), 3u);
  EXPECT_EQ(shard_->parked_watches(), 2u);
  EXPECT_FALSE(watch(1, 1, 30'000, 0, ClientId{0, 1}).answered);
}

TEST_F(ShardWatchTest, ItIsRecoveringDuringTheLockDelayAndItsWaitIsBounded) {
  ShardLimits limits;
  limits.recovering_until_ms = now_ + 500;
  limits.max_wait_ms = 10'000;
  make_shard(limits);
  const auto r = watch(kNoVersionToken, 0, 5000);
  ASSERT_TRUE(r.answered);
  EXPECT_EQ(r.reply.type, MessageType::kRecovering);
  now_ += 501;
  const auto too_long = watch(0, 0, 10'001);
  ASSERT_TRUE(too_long.answered);
  EXPECT_EQ(too_long.reply.type, MessageType::kError);
  EXPECT_EQ(too_long.reply.error, WireError::kWaitOutOfRange);
}

TEST_F(ShardWatchTest, ManyWatchersOfOneKeyAreAllAnsweredOnce) {
  const auto g = acquire(kAlice);
  for (std::uint64_t c = 0; c < 50; ++c) {
    EXPECT_FALSE(watch(g.reply.token, 1, 30'000, 0, ClientId{0, 100 + c}).answered);
  }
  release(kAlice, g.reply.token);
  acquire(kBob);  // a second change before anyone re-arms: nobody is answered twice
  const auto answers = answers_of(take_deferred());
  EXPECT_EQ(answers.size(), 50u);
  EXPECT_EQ(shard_->parked_watches(), 0u);
  advance_to(now_ + 40'000);
  EXPECT_TRUE(answers_of(take_deferred()).empty());
}

}  // namespace
}  // namespace shardlock::lease::internal
