// The lease state machine without sockets: time is a number the test moves.
#include "shardlock/lease/server/internal/shard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "shardlock/lease/server/internal/timer_wheel.h"
#include "shardlock/lease/wire/internal/string_key.h"
#include "support/shard_driver.h"

namespace shardlock::lease::internal {
namespace {

using shardlock::test_support::ShardDriver;

constexpr ClientId kAlice{1, 1};
constexpr ClientId kBob{2, 2};
constexpr ClientId kCarol{3, 3};

// The shard, its clock and its deferred answers are the driver's
// (support/shard_driver.h); the fixture builds the requests.
class ShardTest : public ::testing::Test, public ShardDriver {
 protected:
  Result acquire(const ClientId& c, std::uint32_t ttl, std::uint32_t wait = 0,
                 std::uint64_t request_id = 0, const std::string& key = "k") {
    Message m;
    m.type = MessageType::kAcquire;
    m.key = key;
    m.ttl_ms = ttl;
    m.wait_ms = wait;
    m.request_id = request_id;
    return send(c, m);
  }
  Result acquire_shared(const ClientId& c, std::uint32_t ttl, std::uint32_t wait = 0,
                        std::uint64_t request_id = 0, const std::string& key = "k") {
    Message m;
    m.type = MessageType::kAcquireShared;
    m.key = key;
    m.ttl_ms = ttl;
    m.wait_ms = wait;
    m.request_id = request_id;
    return send(c, m);
  }
  Result acquire_permit(const ClientId& c, std::uint32_t permits, std::uint32_t ttl,
                        std::uint32_t wait = 0, std::uint64_t request_id = 0,
                        const std::string& key = "k") {
    Message m;
    m.type = MessageType::kAcquirePermit;
    m.key = key;
    m.ttl_ms = ttl;
    m.wait_ms = wait;
    m.permits = permits;
    m.request_id = request_id;
    return send(c, m);
  }
  Result renew(const ClientId& c, std::uint64_t token, std::uint32_t ttl, std::uint64_t rid = 0,
               const std::string& key = "k") {
    Message m;
    m.type = MessageType::kRenew;
    m.key = key;
    m.token = token;
    m.ttl_ms = ttl;
    m.request_id = rid;
    return send(c, m);
  }
  Result release(const ClientId& c, std::uint64_t token, std::uint64_t rid = 0,
                 const std::string& key = "k") {
    Message m;
    m.type = MessageType::kRelease;
    m.key = key;
    m.token = token;
    m.request_id = rid;
    return send(c, m);
  }
  Result query(const std::string& key = "k") {
    Message m;
    m.type = MessageType::kQuery;
    m.key = key;
    return send(kCarol, m);
  }
};

TEST_F(ShardTest, GrantBusyReleaseGrant) {
  auto a = acquire(kAlice, 1000);
  ASSERT_TRUE(a.answered);
  ASSERT_EQ(a.reply.type, MessageType::kGranted);
  EXPECT_EQ(a.reply.ttl_ms, 1000u);
  const auto t1 = a.reply.token;
  EXPECT_GT(t1, 0u);

  now_ += 300;
  auto b = acquire(kBob, 1000);
  ASSERT_EQ(b.reply.type, MessageType::kBusy);
  EXPECT_EQ(b.reply.ttl_ms, 700u);

  EXPECT_EQ(release(kAlice, t1).reply.type, MessageType::kReleased);
  auto c = acquire(kBob, 1000);
  ASSERT_EQ(c.reply.type, MessageType::kGranted);
  EXPECT_GT(c.reply.token, t1);
  EXPECT_EQ(counter(StatCounter::kGrants), 2u);
  EXPECT_EQ(counter(StatCounter::kBusy), 1u);
}

// One owner, one grant: an owner's new ACQUIRE of a key it holds
// exclusively is a contender like any other. It is never re-granted, which
// would leave the first handle believing it holds a lease that is gone:
// with no wait it is BUSY, with a wait it queues in FIFO order and is
// granted at the first grant's release. The granting ACQUIRE itself, past
// its dedup entry, still gets the same grant; an older request of the holder
// gets BUSY.
TEST_F(ShardTest, ReacquireByTheHolderIsAContenderNotANewGrant) {
  make_shard(ShardLimits{.dedup_capacity = 0});  // every retransmission is past the cache
  const auto t = acquire(kAlice, 1000, 0, 500).reply.token;
  now_ += 400;
  auto retransmitted = acquire(kAlice, 1000, 0, 500);
  ASSERT_EQ(retransmitted.reply.type, MessageType::kGranted);
  EXPECT_EQ(retransmitted.reply.token, t);
  EXPECT_EQ(retransmitted.reply.ttl_ms, 600u);

  auto again = acquire(kAlice, 1000, 0, 501);
  ASSERT_EQ(again.reply.type, MessageType::kBusy) << "no second grant to the same owner";
  EXPECT_EQ(again.reply.ttl_ms, 600u);
  EXPECT_EQ(query().reply.token, t);
  EXPECT_EQ(renew(kAlice, t, 1000, 502).reply.type, MessageType::kRenewed)
      << "the first grant stands";

  // With a wait: queued behind Bob, who asked first, in FIFO order.
  ASSERT_FALSE(acquire(kBob, 1000, 5000, 503).answered);
  ASSERT_FALSE(acquire(kAlice, 1000, 5000, 504).answered);
  EXPECT_EQ(query().reply.waiters, 2u);
  ASSERT_EQ(release(kAlice, t, 505).reply.type, MessageType::kReleased);
  auto handed = take_deferred();
  ASSERT_EQ(handed.size(), 1u);
  EXPECT_EQ(handed[0].client, kBob);
  ASSERT_EQ(handed[0].type, MessageType::kGranted);
  const auto bob = handed[0].token;
  ASSERT_EQ(release(kBob, bob, 506).reply.type, MessageType::kReleased);
  handed = take_deferred();
  ASSERT_EQ(handed.size(), 1u);
  EXPECT_EQ(handed[0].client, kAlice);
  ASSERT_EQ(handed[0].type, MessageType::kGranted);
  EXPECT_GT(handed[0].token, bob);

  auto stale = acquire(kAlice, 1000, 0, 499);
  EXPECT_EQ(stale.reply.type, MessageType::kBusy);
  EXPECT_EQ(query().reply.token, handed[0].token);
  EXPECT_GE(counter(StatCounter::kStaleRequests), 1u);
}

// A shared holder's second shared ACQUIRE is one more hold with its own
// token: both stand, so neither handle is left believing in a grant that
// is gone.
TEST_F(ShardTest, ASharedHolderAcquiringAgainTakesASecondHold) {
  const auto first = acquire_shared(kAlice, 1000, 0, 600);
  ASSERT_EQ(first.reply.type, MessageType::kGranted);
  const auto second = acquire_shared(kAlice, 1000, 0, 601);
  ASSERT_EQ(second.reply.type, MessageType::kGranted);
  EXPECT_GT(second.reply.token, first.reply.token);
  EXPECT_EQ(query().reply.holders, 2u);
  EXPECT_EQ(renew(kAlice, first.reply.token, 1000, 602).reply.type, MessageType::kRenewed);
  EXPECT_EQ(release(kAlice, second.reply.token, 603).reply.type, MessageType::kReleased);
  EXPECT_EQ(query().reply.holders, 1u);
}

// A holder's RENEW older than one already applied (a late
// duplicate or a replay past the dedup cache) moves nothing and reports the
// time surely left.
TEST_F(ShardTest, StaleRenewNeverMovesTheDeadline) {
  make_shard(ShardLimits{.dedup_capacity = 0});
  const auto t = acquire(kAlice, 1000, 0, 600).reply.token;
  now_ += 100;
  auto applied = renew(kAlice, t, 5000, 602);
  ASSERT_EQ(applied.reply.type, MessageType::kRenewed);
  EXPECT_EQ(applied.reply.ttl_ms, 5000u);
  now_ += 100;
  // Renewal 601 (sent before 602, 300 ms, arriving late) must not shorten
  // the lease; a replay of 602 must not extend it.
  auto late = renew(kAlice, t, 300, 601);
  ASSERT_EQ(late.reply.type, MessageType::kRenewed);
  EXPECT_EQ(late.reply.ttl_ms, 4900u);
  now_ += 1000;
  auto replay = renew(kAlice, t, 5000, 602);
  EXPECT_EQ(replay.reply.ttl_ms, 3900u);
  EXPECT_EQ(query().reply.ttl_ms, 3900u);
  EXPECT_EQ(counter(StatCounter::kStaleRequests), 2u);
  EXPECT_EQ(counter(StatCounter::kRenewed), 1u);
}

// The clock reaches the shard truncated to milliseconds;
// a deadline must still be at least the true receive time + ttl.
TEST_F(ShardTest, DeadlinesRoundUpAndTimeLeftRoundsDown) {
  now_ = 5;  // the true time may be 5.9 ms
  make_shard(ShardLimits{});
  const auto t = acquire(kAlice, 100).reply.token;
  advance_to(105);  // the true time may be 105.8 ms: 99.9 ms after the grant
  auto q = query();
  EXPECT_TRUE(q.reply.held);
  EXPECT_EQ(q.reply.token, t);
  EXPECT_EQ(q.reply.ttl_ms, 0u) << "less than 1 ms is surely left";
  advance_to(106);
  EXPECT_FALSE(query().reply.held);
}

TEST_F(ShardTest, RetransmissionGetsIdenticalAnswer) {
  auto first = acquire(kAlice, 1000, 0, 7);
  ASSERT_EQ(first.reply.type, MessageType::kGranted);
  EXPECT_EQ(release(kAlice, first.reply.token, 8).reply.type, MessageType::kReleased);
  auto bob = acquire(kBob, 1000);
  ASSERT_EQ(bob.reply.type, MessageType::kGranted);

  // Alice's ACQUIRE reply was "lost": the retransmission gets the old grant,
  // not Bob's lease and not a new token.
  auto dup = acquire(kAlice, 1000, 0, 7);
  EXPECT_EQ(dup.reply.type, MessageType::kGranted);
  EXPECT_EQ(dup.reply.token, first.reply.token);
  // Her RELEASE reply was lost too: RELEASED again, never NOT_OWNER.
  EXPECT_EQ(release(kAlice, first.reply.token, 8).reply.type, MessageType::kReleased);
  EXPECT_EQ(counter(StatCounter::kGrants), 2u);
  EXPECT_EQ(counter(StatCounter::kRetransmits), 2u);
  EXPECT_EQ(query().reply.token, bob.reply.token);
}

// A client that reuses a request id for another key or another type must not
// get the first request's answer: for an ACQUIRE that would be a GRANTED for a
// key nobody granted it.
TEST_F(ShardTest, ReusedRequestIdForAnotherRequestIsAnError) {
  const auto a = acquire(kAlice, 1000, 0, 42, "a");
  ASSERT_EQ(a.reply.type, MessageType::kGranted);

  const auto other_key = acquire(kAlice, 1000, 0, 42, "b");
  EXPECT_EQ(other_key.reply.type, MessageType::kError);
  EXPECT_EQ(other_key.reply.error, WireError::kRequestIdReused);
  EXPECT_FALSE(query("b").reply.held);

  const auto other_type = release(kAlice, a.reply.token, 42);  // key "k", type RELEASE
  EXPECT_EQ(other_type.reply.type, MessageType::kError);
  EXPECT_EQ(other_type.reply.error, WireError::kRequestIdReused);

  // The real retransmission still gets its answer, and the lease is intact.
  const auto dup = acquire(kAlice, 1000, 0, 42, "a");
  EXPECT_EQ(dup.reply.type, MessageType::kGranted);
  EXPECT_EQ(dup.reply.token, a.reply.token);
  EXPECT_TRUE(query("a").reply.held);
  EXPECT_EQ(counter(StatCounter::kGrants), 1u);

  // Answers given later to a queued waiter keep its fingerprint too.
  ASSERT_EQ(acquire(kBob, 1000, 5000, 7, "a").answered, false);
  EXPECT_EQ(release(kAlice, a.reply.token, 43, "a").reply.type, MessageType::kReleased);
  ASSERT_EQ(take_deferred().size(), 1u);
  EXPECT_EQ(acquire(kBob, 1000, 5000, 7, "a").reply.type, MessageType::kGranted);
  EXPECT_EQ(acquire(kBob, 1000, 5000, 7, "c").reply.error, WireError::kRequestIdReused);
}

TEST_F(ShardTest, LateRetransmissionAfterEvictionIsExpiredNotNotOwner) {
  ShardLimits limits;
  limits.dedup_capacity = 2;
  make_shard(limits);
  const auto t = acquire(kAlice, 1000, 0, 1).reply.token;
  EXPECT_EQ(release(kAlice, t, 2).reply.type, MessageType::kReleased);
  ASSERT_EQ(acquire(kBob, 1000, 0, 3).reply.type, MessageType::kGranted);
  for (std::uint64_t id = 10; id < 20; ++id) (void)query("other" + std::to_string(id));
  acquire(kCarol, 1000, 0, 4, "x");
  acquire(kCarol, 1000, 0, 5, "y");  // evicts Alice's entries
  EXPECT_EQ(release(kAlice, t, 2).reply.type, MessageType::kExpired);
  EXPECT_EQ(renew(kAlice, t, 1000, 9).reply.type, MessageType::kExpired);
}

TEST_F(ShardTest, OwnerChecks) {
  const auto t = acquire(kAlice, 1000).reply.token;
  EXPECT_EQ(renew(kBob, t, 1000).reply.type, MessageType::kNotOwner);  // right token, wrong client
  EXPECT_EQ(release(kAlice, t + 5).reply.type, MessageType::kNotOwner);  // wrong (future) token
  EXPECT_EQ(release(kBob, t - 1).reply.type, MessageType::kExpired);     // older lease
  EXPECT_EQ(counter(StatCounter::kNotOwner), 2u);
  auto r = renew(kAlice, t, 5000);
  ASSERT_EQ(r.reply.type, MessageType::kRenewed);
  EXPECT_EQ(r.reply.ttl_ms, 5000u);
  advance_to(now_ + 4000);  // past the original TTL, inside the renewed one
  EXPECT_TRUE(query().reply.held);
  advance_to(now_ + 1001);
  EXPECT_FALSE(query().reply.held);
  EXPECT_EQ(release(kAlice, t).reply.type, MessageType::kExpired);
  EXPECT_EQ(renew(kAlice, t, 1000).reply.type, MessageType::kExpired);
  EXPECT_EQ(counter(StatCounter::kExpirations), 1u);
}

TEST_F(ShardTest, FifoHandOffOnRelease) {
  const auto t = acquire(kAlice, 1000).reply.token;
  ASSERT_FALSE(acquire(kBob, 2000, 5000, 21).answered);
  ASSERT_FALSE(acquire(kCarol, 3000, 5000, 31).answered);
  EXPECT_EQ(counter(StatCounter::kQueued), 2u);
  EXPECT_EQ(query().reply.waiters, 2u);

  EXPECT_EQ(release(kAlice, t).reply.type, MessageType::kReleased);
  auto d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].type, MessageType::kGranted);
  EXPECT_EQ(d[0].client, kBob);
  EXPECT_EQ(d[0].request_id, 21u);
  EXPECT_EQ(d[0].key, "k");
  EXPECT_EQ(d[0].ttl_ms, 2000u);
  EXPECT_GT(d[0].token, t);
  const auto bob_token = d[0].token;

  // Bob's lease expires without release (its deadline is rounded up by
  // 1 ms): Carol is next.
  advance_to(now_ + 2000);
  EXPECT_TRUE(take_deferred().empty());
  advance_to(now_ + 1);
  d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].client, kCarol);
  EXPECT_EQ(d[0].request_id, 31u);
  EXPECT_GT(d[0].token, bob_token);
  EXPECT_EQ(counter(StatCounter::kExpirations), 1u);

  // A retransmission of Bob's queued-then-granted ACQUIRE replays GRANTED.
  auto dup = acquire(kBob, 2000, 5000, 21);
  EXPECT_EQ(dup.reply.type, MessageType::kGranted);
  EXPECT_EQ(dup.reply.token, bob_token);
}

// Waiter nodes are recycled: once handed off, timed out or dropped with their
// key they are kept as spares, and the next waiters reuse them in FIFO order.
TEST_F(ShardTest, WaiterNodesAreReused) {
  const auto t = acquire(kAlice, 1000).reply.token;
  ASSERT_FALSE(acquire(kBob, 1000, 5000, 21).answered);
  ASSERT_FALSE(acquire(kCarol, 1000, 100, 31).answered);
  EXPECT_EQ(shard_->spare_waiters(), 0u);
  advance_to(now_ + 100);  // Carol times out
  ASSERT_EQ(take_deferred().size(), 1u);
  EXPECT_EQ(shard_->spare_waiters(), 1u);
  ASSERT_EQ(release(kAlice, t).reply.type, MessageType::kReleased);  // Bob is granted
  EXPECT_EQ(shard_->spare_waiters(), 2u);
  auto d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  const auto bob_token = d[0].token;

  // Two new waiters take the spares; the hand-off order is still FIFO.
  ASSERT_FALSE(acquire(kCarol, 1000, 5000, 32).answered);
  ASSERT_FALSE(acquire(kAlice, 1000, 5000, 22).answered);
  EXPECT_EQ(shard_->spare_waiters(), 0u);
  EXPECT_EQ(query().reply.waiters, 2u);
  ASSERT_EQ(release(kBob, bob_token).reply.type, MessageType::kReleased);
  d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].client, kCarol);
  EXPECT_EQ(d[0].request_id, 32u);
  advance_to(now_ + 1001);  // Carol's lease expires: Alice is next
  d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].client, kAlice);
  EXPECT_EQ(shard_->spare_waiters(), 2u);
}

TEST_F(ShardTest, WaitTimesOut) {
  acquire(kAlice, 10'000);
  ASSERT_FALSE(acquire(kBob, 1000, 250, 55).answered);
  // A retransmission while queued is neither answered nor queued twice.
  ASSERT_FALSE(acquire(kBob, 1000, 250, 55).answered);
  EXPECT_EQ(query().reply.waiters, 1u);
  advance_to(now_ + 249);
  EXPECT_TRUE(take_deferred().empty());
  advance_to(now_ + 1);
  auto d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].type, MessageType::kTimeout);
  EXPECT_EQ(d[0].request_id, 55u);
  EXPECT_EQ(d[0].key, "k");
  EXPECT_EQ(query().reply.waiters, 0u);
  EXPECT_EQ(acquire(kBob, 1000, 250, 55).reply.type, MessageType::kTimeout);
  EXPECT_EQ(counter(StatCounter::kTimeouts), 1u);
}

TEST_F(ShardTest, ExpiryIsEnforcedEvenBeforeTheTimerIsDriven) {
  const auto t = acquire(kAlice, 100).reply.token;
  now_ += 101;  // no advance(): handle() must still see the lease expired
  auto b = acquire(kBob, 100);
  ASSERT_EQ(b.reply.type, MessageType::kGranted);
  EXPECT_GT(b.reply.token, t);
}

TEST_F(ShardTest, ValidationErrors) {
  const std::string long_key(kMaxKeyLength + 1, 'k');
  EXPECT_EQ(acquire(kAlice, 1000, 0, 0, "").reply.error, WireError::kBadKey);
  EXPECT_EQ(acquire(kAlice, 1000, 0, 0, long_key).reply.error, WireError::kKeyTooLong);
  EXPECT_EQ(acquire(kAlice, 0).reply.error, WireError::kTtlOutOfRange);
  EXPECT_EQ(acquire(kAlice, 60'001).reply.error, WireError::kTtlOutOfRange);
  EXPECT_EQ(acquire(kAlice, 1000, 300'001).reply.error, WireError::kWaitOutOfRange);
  Message m;
  m.type = MessageType::kGranted;
  m.key = "k";
  auto r = send(kAlice, m);
  EXPECT_EQ(r.reply.type, MessageType::kError);
  EXPECT_EQ(r.reply.error, WireError::kNotARequest);
  EXPECT_EQ(acquire(kAlice, 60'000, 0, 0, std::string(kMaxKeyLength, 'k')).reply.type,
            MessageType::kGranted);
}

TEST_F(ShardTest, RecoveringDuringLockDelay) {
  ShardLimits limits;
  limits.recovering_until_ms = now_ + 5000;
  make_shard(limits);
  auto r = acquire(kAlice, 1000);
  ASSERT_EQ(r.reply.type, MessageType::kRecovering);
  EXPECT_EQ(r.reply.retry_after_ms, 5000u);
  EXPECT_EQ(release(kAlice, 1).reply.type, MessageType::kExpired);
  now_ += 5000;
  EXPECT_EQ(acquire(kAlice, 1000).reply.type, MessageType::kGranted);
}

TEST_F(ShardTest, TokensStrictlyIncreaseUnderRandomTraffic) {
  std::mt19937_64 rng(3);
  const ClientId clients[] = {kAlice, kBob, kCarol};
  std::set<std::uint64_t> seen;
  std::uint64_t last = 0;
  // A token seen for the first time must exceed every token seen before.
  auto observe = [&](MessageType type, std::uint64_t token) {
    if (type != MessageType::kGranted || seen.contains(token)) return;
    EXPECT_GT(token, last);
    last = token;
    seen.insert(token);
  };
  auto drain = [&] {
    for (const DeferredReply& d : take_deferred()) observe(d.type, d.token);
  };
  for (int i = 0; i < 20'000; ++i) {
    const ClientId& c = clients[rng() % 3];
    const std::string key = "key" + std::to_string(rng() % 8);
    switch (rng() % 4) {
      case 0: {
        const auto ttl = static_cast<std::uint32_t>(1 + rng() % 50);
        const auto wait = static_cast<std::uint32_t>(rng() % 2 ? 0 : rng() % 50);
        auto r = acquire(c, ttl, wait, 0, key);
        drain();  // hand-offs decided inside handle() precede its own grant
        observe(r.reply.type, r.reply.token);
        break;
      }
      case 1: {
        Message m;
        m.type = MessageType::kRelease;
        m.key = key;
        m.token = last - rng() % 3;
        send(c, m);
        break;
      }
      case 2:
        now_ += static_cast<std::int64_t>(rng() % 20);
        break;
      default:
        shard_->advance(now_, deferred_);
        break;
    }
    drain();
  }
  EXPECT_EQ(last, shard_->last_token());
  // Every lease and waiter eventually times out and leaves nothing behind.
  // One jump fires every timer due by its end at once, so a waiter handed a
  // key on the way is granted at the jump's end: a second jump ends it.
  advance_to(now_ + 100'000);
  drain();
  advance_to(now_ + 100'000);
  drain();
  EXPECT_EQ(shard_->held_keys(), 0u);
  EXPECT_EQ(shard_->timers(), 0u);
}

TEST(TimerWheel, FiresInOrderOfDeadlinesAcrossRevolutions) {
  TimerWheel wheel(0, 16);
  std::vector<TimerNode> nodes(50);
  std::vector<std::int64_t> fired;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    wheel.schedule(nodes[i], static_cast<std::int64_t>((i * 37) % 200 + 1));
  }
  EXPECT_EQ(wheel.size(), 50u);
  for (std::int64_t t = 1; t <= 202; t += 3) {
    wheel.advance(t, [&](TimerNode& n) {
      EXPECT_LE(n.deadline_ms, t);
      EXPECT_GT(n.deadline_ms, t - 3);
      fired.push_back(n.deadline_ms);
    });
  }
  EXPECT_EQ(fired.size(), 50u);
  EXPECT_EQ(wheel.size(), 0u);
}

TEST(TimerWheel, LongJumpCancelAndReschedule) {
  TimerWheel wheel(0, 8);
  TimerNode a, b, c;
  wheel.schedule(a, 1000);
  wheel.schedule(b, 5);
  wheel.schedule(c, 7);
  wheel.cancel(c);
  wheel.schedule(b, 2000);  // re-arm
  int count = 0;
  wheel.advance(999, [&](TimerNode&) { ++count; });
  EXPECT_EQ(count, 0);
  wheel.advance(1500, [&](TimerNode& n) {
    EXPECT_EQ(&n, &a);
    ++count;
    wheel.schedule(n, 1);  // in the past: fires at the next advance
  });
  EXPECT_EQ(count, 1);
  wheel.advance(1501, [&](TimerNode& n) {
    EXPECT_EQ(&n, &a);
    ++count;
  });
  EXPECT_EQ(count, 2);
  wheel.cancel(b);
  EXPECT_EQ(wheel.size(), 0u);
}

TEST(TimerWheel, FireMayCancelAnotherDueNode) {
  TimerWheel wheel(0, 8);
  TimerNode a, b;
  wheel.schedule(a, 3);
  wheel.schedule(b, 3);
  int count = 0;
  wheel.advance(3, [&](TimerNode& n) {
    ++count;
    wheel.cancel(&n == &a ? b : a);
  });
  EXPECT_EQ(count, 1);
  EXPECT_EQ(wheel.size(), 0u);
}

// ---------------------------------------------------------------------------
// Every structure a peer can grow is bounded, refused with
// ERROR(kLimitExceeded) and counted; nothing already granted is touched.

TEST_F(ShardTest, HeldKeysAreBounded) {
  make_shard(ShardLimits{.max_keys = 2});
  const auto a = acquire(kAlice, 1000, 0, 0, "a");
  ASSERT_EQ(a.reply.type, MessageType::kGranted);
  ASSERT_EQ(acquire(kBob, 1000, 0, 0, "b").reply.type, MessageType::kGranted);
  const auto c = acquire(kCarol, 1000, 0, 0, "c");
  EXPECT_EQ(c.reply.type, MessageType::kError);
  EXPECT_EQ(c.reply.error, WireError::kLimitExceeded);
  EXPECT_EQ(counter(StatCounter::kLimitRejections), 1u);
  EXPECT_TRUE(query("a").reply.held);
  ASSERT_EQ(release(kAlice, a.reply.token, 0, "a").reply.type, MessageType::kReleased);
  EXPECT_EQ(acquire(kCarol, 1000, 0, 0, "c").reply.type, MessageType::kGranted);
}

TEST_F(ShardTest, WaitersAreBoundedPerKeyAndInTotal) {
  make_shard(ShardLimits{.max_waiters = 3, .max_waiters_per_key = 2});
  acquire(kAlice, 10'000, 0, 0, "a");
  acquire(kAlice, 10'000, 0, 0, "b");
  ASSERT_FALSE(acquire(kBob, 1000, 5000, 0, "a").answered);
  ASSERT_FALSE(acquire(kCarol, 1000, 5000, 0, "a").answered);
  const auto third = acquire(ClientId{4, 4}, 1000, 5000, 0, "a");
  ASSERT_TRUE(third.answered);
  EXPECT_EQ(third.reply.error, WireError::kLimitExceeded) << "per key";
  ASSERT_FALSE(acquire(kBob, 1000, 5000, 0, "b").answered);
  const auto fourth = acquire(kCarol, 1000, 5000, 0, "b");
  ASSERT_TRUE(fourth.answered);
  EXPECT_EQ(fourth.reply.error, WireError::kLimitExceeded) << "in total";
  EXPECT_EQ(counter(StatCounter::kLimitRejections), 2u);
  EXPECT_EQ(shard_->queued_waiters(), 3u);
  EXPECT_EQ(query("a").reply.waiters, 2u);
}

TEST_F(ShardTest, PerClientLeasesAndWaitersAreBounded) {
  make_shard(ShardLimits{.max_leases_per_client = 2, .max_waiters_per_client = 1});
  ASSERT_EQ(acquire(kAlice, 1000, 0, 0, "a").reply.type, MessageType::kGranted);
  const auto b = acquire(kAlice, 1000, 0, 0, "b");
  ASSERT_EQ(b.reply.type, MessageType::kGranted);
  EXPECT_EQ(acquire(kAlice, 1000, 0, 0, "c").reply.error, WireError::kLimitExceeded);
  EXPECT_EQ(acquire(kBob, 1000, 0, 0, "c").reply.type, MessageType::kGranted) << "others are not";
  ASSERT_FALSE(acquire(kBob, 1000, 5000, 0, "a").answered);
  EXPECT_EQ(acquire(kBob, 1000, 5000, 0, "b").reply.error, WireError::kLimitExceeded);
  // A released lease frees its slot.
  ASSERT_EQ(release(kAlice, b.reply.token, 0, "b").reply.type, MessageType::kReleased);
  EXPECT_EQ(acquire(kAlice, 1000, 0, 0, "d").reply.type, MessageType::kGranted);
  // Usage is forgotten once a client holds and waits for nothing.
  advance_to(now_ + 5001);
  take_deferred();
  EXPECT_EQ(shard_->tracked_clients(), 0u);
  EXPECT_EQ(shard_->queued_waiters(), 0u);
}

// The handles of one client are owners of their own (handle_owner() in
// client/call.h: the client's upper 96 bits, a handle count below) but
// count against one per-client quota: owner_client() groups them.
TEST_F(ShardTest, PerClientBoundsCountEveryHandleOfTheClient) {
  make_shard(ShardLimits{.max_leases_per_client = 2, .max_waiters_per_client = 1});
  const auto handle = [](std::uint64_t n) { return ClientId{0xABCD'0000'0000 | n, 42}; };
  const ClientId h1 = handle(1);
  const ClientId h2 = handle(2);
  const ClientId h3 = handle(3);
  ASSERT_NE(h1, h2);
  EXPECT_EQ(owner_client(h1), owner_client(h3));
  ASSERT_EQ(acquire(h1, 1000, 0, 0, "a").reply.type, MessageType::kGranted);
  ASSERT_EQ(acquire(h2, 1000, 0, 0, "b").reply.type, MessageType::kGranted);
  EXPECT_EQ(acquire(h3, 1000, 0, 0, "c").reply.error, WireError::kLimitExceeded)
      << "a third handle of the same client is over its quota";
  ASSERT_FALSE(acquire(h3, 1000, 5000, 0, "a").answered);
  EXPECT_EQ(acquire(h1, 1000, 5000, 0, "b").reply.error, WireError::kLimitExceeded)
      << "one waiter per client";
  EXPECT_EQ(shard_->tracked_clients(), 1u);
}

// The queued-retransmission lookup is an index, kept exact through every way
// a waiter leaves (hand-off, timeout, its key going away).
TEST_F(ShardTest, QueuedRetransmissionsAreFoundInLongQueues) {
  make_shard(ShardLimits{.dedup_capacity = 0});
  const auto t = acquire(kAlice, 1000).reply.token;
  constexpr int kWaiters = 2000;
  for (int i = 0; i < kWaiters; ++i) {
    ASSERT_FALSE(
        acquire(ClientId{10, static_cast<std::uint64_t>(i)}, 1000, 5000, 7000 + i).answered);
  }
  // Retransmissions of the first and the last: neither queued again.
  EXPECT_FALSE(acquire(ClientId{10, 0}, 1000, 5000, 7000).answered);
  EXPECT_FALSE(acquire(ClientId{10, kWaiters - 1}, 1000, 5000, 7000 + kWaiters - 1).answered);
  EXPECT_EQ(query().reply.waiters, static_cast<std::uint32_t>(kWaiters));
  EXPECT_EQ(shard_->queued_waiters(), static_cast<std::size_t>(kWaiters));
  ASSERT_EQ(release(kAlice, t).reply.type, MessageType::kReleased);
  EXPECT_EQ(shard_->queued_waiters(), static_cast<std::size_t>(kWaiters - 1));
  // The granted one, retransmitted, is the holder now: same grant.
  const auto again = acquire(ClientId{10, 0}, 1000, 5000, 7000);
  EXPECT_EQ(again.reply.type, MessageType::kGranted);
  advance_to(now_ + 5001);  // the rest time out, the lease expires
  take_deferred();
  EXPECT_EQ(shard_->queued_waiters(), 0u);
  EXPECT_EQ(shard_->held_keys(), 0u);
  EXPECT_EQ(shard_->tracked_clients(), 0u);
}

// ---------------------------------------------------------------------------
// Lease kinds: shared and permit holders, FIFO across modes.

constexpr ClientId kDave{4, 4};
constexpr ClientId kErin{5, 5};

TEST_F(ShardTest, ReadersShareAndAQueuedWriterWaitsForTheLastOne) {
  const auto r1 = acquire_shared(kAlice, 1000);
  const auto r2 = acquire_shared(kBob, 3000);
  ASSERT_EQ(r1.reply.type, MessageType::kGranted);
  ASSERT_EQ(r2.reply.type, MessageType::kGranted);
  EXPECT_GT(r1.reply.token, 0u);
  EXPECT_GT(r2.reply.token, r1.reply.token);
  auto q = query();
  EXPECT_TRUE(q.reply.held);
  EXPECT_EQ(q.reply.mode, LeaseMode::kShared);
  EXPECT_EQ(q.reply.holders, 2u);
  EXPECT_EQ(q.reply.permits, 0u);
  EXPECT_EQ(q.reply.token, r2.reply.token);
  EXPECT_EQ(q.reply.ttl_ms, 3000u) << "the longest any holder has left";

  const auto busy = acquire(kCarol, 1000);
  ASSERT_EQ(busy.reply.type, MessageType::kBusy);
  EXPECT_EQ(busy.reply.ttl_ms, 3000u);

  ASSERT_FALSE(acquire(kCarol, 500, 10'000, 31).answered);
  EXPECT_EQ(query().reply.waiters, 1u);
  ASSERT_EQ(release(kAlice, r1.reply.token).reply.type, MessageType::kReleased);
  EXPECT_TRUE(take_deferred().empty()) << "Bob still reads";

  // Bob's lease runs out without a release: the writer is next.
  advance_to(now_ + 3000);
  EXPECT_TRUE(take_deferred().empty());
  advance_to(now_ + 1);
  const auto d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].type, MessageType::kGranted);
  EXPECT_EQ(d[0].client, kCarol);
  EXPECT_EQ(d[0].request_id, 31u);
  EXPECT_EQ(d[0].ttl_ms, 500u);
  EXPECT_GT(d[0].token, r2.reply.token);
  q = query();
  EXPECT_EQ(q.reply.mode, LeaseMode::kExclusive);
  EXPECT_EQ(q.reply.holders, 1u);
  EXPECT_EQ(q.reply.waiters, 0u);
  EXPECT_EQ(q.reply.token, d[0].token);
  EXPECT_EQ(acquire_shared(kAlice, 1000).reply.type, MessageType::kBusy);
}

TEST_F(ShardTest, WriterQueuedBehindReadersIsGrantedWhenTheLastReleases) {
  const auto r1 = acquire_shared(kAlice, 1000).reply.token;
  const auto r2 = acquire_shared(kBob, 1000).reply.token;
  ASSERT_FALSE(acquire(kCarol, 1000, 5000, 31).answered);
  ASSERT_EQ(release(kBob, r2).reply.type, MessageType::kReleased);
  EXPECT_TRUE(take_deferred().empty());
  ASSERT_EQ(release(kAlice, r1).reply.type, MessageType::kReleased);
  const auto d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].type, MessageType::kGranted);
  EXPECT_EQ(d[0].client, kCarol);
  EXPECT_GT(d[0].token, r2);
}

// Writers do not starve: a reader that arrives after a queued writer queues
// too, though only readers hold, and the queue is served strictly in order.
TEST_F(ShardTest, ReadersBehindAQueuedWriterWaitAndFifoHoldsAcrossModes) {
  const auto r1 = acquire_shared(kAlice, 1000).reply.token;
  ASSERT_FALSE(acquire(kBob, 1000, 5000, 21).answered);  // W
  const auto r2 = acquire_shared(kCarol, 1000, 5000, 31);
  ASSERT_FALSE(r2.answered) << "a reader behind a queued writer waits";
  ASSERT_FALSE(acquire_shared(kDave, 1000, 5000, 41).answered);
  const auto no_wait = acquire_shared(kErin, 1000);
  ASSERT_EQ(no_wait.reply.type, MessageType::kBusy) << "not granted past the queue";
  auto q = query();
  EXPECT_EQ(q.reply.holders, 1u);
  EXPECT_EQ(q.reply.waiters, 3u);
  EXPECT_TRUE(take_deferred().empty());

  ASSERT_EQ(release(kAlice, r1).reply.type, MessageType::kReleased);
  auto d = take_deferred();
  ASSERT_EQ(d.size(), 1u) << "the writer alone";
  EXPECT_EQ(d[0].client, kBob);
  EXPECT_EQ(d[0].request_id, 21u);
  EXPECT_EQ(d[0].type, MessageType::kGranted);
  const auto w = d[0].token;
  EXPECT_GT(w, r1);
  q = query();
  EXPECT_EQ(q.reply.mode, LeaseMode::kExclusive);
  EXPECT_EQ(q.reply.holders, 1u);
  EXPECT_EQ(q.reply.waiters, 2u);

  ASSERT_EQ(release(kBob, w).reply.type, MessageType::kReleased);
  d = take_deferred();
  ASSERT_EQ(d.size(), 2u) << "both readers together";
  EXPECT_EQ(d[0].client, kCarol);
  EXPECT_EQ(d[0].request_id, 31u);
  EXPECT_EQ(d[1].client, kDave);
  EXPECT_EQ(d[1].request_id, 41u);
  EXPECT_EQ(d[0].type, MessageType::kGranted);
  EXPECT_EQ(d[1].type, MessageType::kGranted);
  EXPECT_GT(d[0].token, w);
  EXPECT_GT(d[1].token, d[0].token);
  q = query();
  EXPECT_EQ(q.reply.mode, LeaseMode::kShared);
  EXPECT_EQ(q.reply.holders, 2u);
  EXPECT_EQ(q.reply.waiters, 0u);
  // With the queue empty, a new reader joins at once.
  EXPECT_EQ(acquire_shared(kErin, 1000).reply.type, MessageType::kGranted);
  EXPECT_EQ(query().reply.holders, 3u);
}

TEST_F(ShardTest, EachSharedHolderExpiresOnItsOwn) {
  const auto t1 = acquire_shared(kAlice, 1000).reply.token;
  const auto t2 = acquire_shared(kBob, 3000).reply.token;
  advance_to(now_ + 1001);
  auto q = query();
  EXPECT_TRUE(q.reply.held);
  EXPECT_EQ(q.reply.holders, 1u);
  EXPECT_EQ(q.reply.token, t2);
  EXPECT_EQ(q.reply.ttl_ms, 1999u);
  EXPECT_EQ(counter(StatCounter::kExpirations), 1u);
  EXPECT_EQ(renew(kAlice, t1, 1000).reply.type, MessageType::kExpired);
  EXPECT_EQ(release(kAlice, t1).reply.type, MessageType::kExpired);
  const auto r = renew(kBob, t2, 5000);
  ASSERT_EQ(r.reply.type, MessageType::kRenewed);
  EXPECT_EQ(r.reply.ttl_ms, 5000u);
  EXPECT_EQ(query().reply.ttl_ms, 5000u);
}

// The same, with the newer holder expiring first: its token is above the
// remaining holder's, and it is still a lease that ended, not someone else's.
TEST_F(ShardTest, TheNewestSharedHolderExpiringGetsExpiredNotNotOwner) {
  const auto t1 = acquire_shared(kAlice, 3000).reply.token;
  const auto t2 = acquire_shared(kBob, 1000).reply.token;
  ASSERT_GT(t2, t1);
  advance_to(now_ + 1001);
  EXPECT_EQ(query().reply.holders, 1u);
  EXPECT_EQ(renew(kBob, t2, 1000).reply.type, MessageType::kExpired);
  EXPECT_EQ(release(kBob, t2).reply.type, MessageType::kExpired);
  EXPECT_EQ(counter(StatCounter::kNotOwner), 0u);
  EXPECT_EQ(renew(kAlice, t1, 1000).reply.type, MessageType::kRenewed);
  // A token never issued is still NOT_OWNER.
  EXPECT_EQ(release(kBob, shard_->last_token() + 1).reply.type, MessageType::kNotOwner);
}

// A lost RELEASED past the dedup cache must turn into EXPIRED, never a false
// NOT_OWNER (docs/lease-server.md), also when other readers remain.
TEST_F(ShardTest, LateReleaseRetransmissionOfASharedHolderIsExpired) {
  make_shard(ShardLimits{.dedup_capacity = 0});
  const auto t1 = acquire_shared(kAlice, 1000, 0, 10).reply.token;
  const auto t2 = acquire_shared(kBob, 1000, 0, 20).reply.token;
  ASSERT_EQ(release(kBob, t2, 21).reply.type, MessageType::kReleased);
  EXPECT_EQ(release(kBob, t2, 21).reply.type, MessageType::kExpired);
  ASSERT_EQ(release(kAlice, t1, 11).reply.type, MessageType::kReleased);
  EXPECT_EQ(release(kAlice, t1, 11).reply.type, MessageType::kExpired);
}

// Readers and writers under random traffic: after every step the holders
// QUERY reports are exactly the leases granted and not yet ended, an
// exclusive one is alone, and nothing is granted at once past a queue.
TEST_F(ShardTest, SharedAndExclusiveHoldersNeverMixUnderRandomTraffic) {
  std::mt19937_64 rng(11);
  struct Live {
    ClientId client;
    bool exclusive = false;
    std::int64_t deadline = 0;
  };
  std::map<std::uint64_t, Live> live;         // token -> lease
  std::map<std::uint64_t, bool> queued_mode;  // request id -> exclusive
  std::uint64_t rid = 1000;
  auto expire = [&] {
    std::erase_if(live, [&](const auto& e) { return e.second.deadline <= now_; });
  };
  auto drain = [&] {
    for (const DeferredReply& d : take_deferred()) {
      if (d.type != MessageType::kGranted) continue;
      live[d.token] = Live{d.client, queued_mode.at(d.request_id), now_ + d.ttl_ms + 1};
    }
  };
  for (int step = 0; step < 5000; ++step) {
    const ClientId c{9, rng() % 5};
    switch (rng() % 4) {
      case 0: {
        const bool exclusive = rng() % 3 == 0;
        const auto ttl = static_cast<std::uint32_t>(5 + rng() % 60);
        const auto wait = static_cast<std::uint32_t>(rng() % 2 ? 0 : rng() % 40);
        const auto id = ++rid;
        queued_mode[id] = exclusive;
        const auto waiting = query().reply.waiters;
        drain();
        expire();
        // An exclusive holder re-acquiring replaces its own grant.
        bool replaces = false;
        if (exclusive) {
          for (const auto& [t, l] : live) replaces |= l.exclusive && l.client == c;
        }
        const auto r = exclusive ? acquire(c, ttl, wait, id) : acquire_shared(c, ttl, wait, id);
        drain();
        if (r.answered && r.reply.type == MessageType::kGranted) {
          EXPECT_TRUE(waiting == 0 || replaces) << "granted past a queue, step " << step;
          if (replaces) live.clear();
          live[r.reply.token] = Live{c, exclusive, now_ + ttl + 1};
        }
        break;
      }
      case 1: {
        expire();
        if (live.empty()) break;
        const auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
        const auto r = release(it->second.client, it->first, ++rid);
        EXPECT_EQ(r.reply.type, MessageType::kReleased);
        live.erase(it);
        drain();
        break;
      }
      default:
        advance_to(now_ + static_cast<std::int64_t>(rng() % 15));
        drain();
        break;
    }
    expire();
    const auto q = query();
    drain();
    expire();
    ASSERT_EQ(q.reply.holders, live.size()) << "step " << step;
    std::size_t exclusive = 0;
    for (const auto& [t, l] : live) exclusive += l.exclusive ? 1 : 0;
    ASSERT_TRUE(exclusive == 0 || live.size() == 1) << "step " << step;
    if (q.reply.held) {
      EXPECT_EQ(q.reply.mode, exclusive ? LeaseMode::kExclusive : LeaseMode::kShared);
      EXPECT_EQ(q.reply.token, live.rbegin()->first);
    }
  }
  // The run went through queues, hand-offs and timeouts.
  EXPECT_GT(counter(StatCounter::kQueued), 100u);
  EXPECT_GT(counter(StatCounter::kTimeouts), 10u);
  EXPECT_GT(counter(StatCounter::kExpirations), 100u);
}

TEST_F(ShardTest, AnExclusiveTokenExceedsEveryEarlierGrantOnTheKey) {
  std::uint64_t highest = 0;
  std::vector<std::uint64_t> readers;
  for (const ClientId& c : {kAlice, kBob, kCarol}) {
    const auto r = acquire_shared(c, 1000);
    ASSERT_EQ(r.reply.type, MessageType::kGranted);
    EXPECT_GT(r.reply.token, highest);
    highest = r.reply.token;
    readers.push_back(r.reply.token);
  }
  ASSERT_FALSE(acquire(kDave, 1000, 5000, 41).answered);
  // Readers leave newest first: the writer's token must beat the highest
  // reader's, not just the last one to leave.
  ASSERT_EQ(release(kCarol, readers[2]).reply.type, MessageType::kReleased);
  ASSERT_EQ(release(kBob, readers[1]).reply.type, MessageType::kReleased);
  ASSERT_EQ(release(kAlice, readers[0]).reply.type, MessageType::kReleased);
  auto d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_GT(d[0].token, highest);
  highest = d[0].token;
  // The writer's release, a new exclusive grant, then readers, then an
  // exclusive grant on a free key after they expire: always above.
  ASSERT_EQ(release(kDave, d[0].token).reply.type, MessageType::kReleased);
  const auto again = acquire(kDave, 1000, 0, 42);
  ASSERT_EQ(again.reply.type, MessageType::kGranted);
  EXPECT_GT(again.reply.token, highest);
  highest = again.reply.token;
  ASSERT_EQ(release(kDave, again.reply.token).reply.type, MessageType::kReleased);
  EXPECT_EQ(query().reply.held, false);
  const auto r = acquire_shared(kAlice, 100);
  ASSERT_EQ(r.reply.type, MessageType::kGranted);
  EXPECT_GT(r.reply.token, highest);
  highest = r.reply.token;
  advance_to(now_ + 101);
  const auto w = acquire(kBob, 1000);
  ASSERT_EQ(w.reply.type, MessageType::kGranted);
  EXPECT_GT(w.reply.token, highest);
}

TEST_F(ShardTest, QueuedWriterTimingOutAtTheFrontLetsTheReadersBehindItIn) {
  const auto r1 = acquire_shared(kAlice, 10'000).reply.token;
  ASSERT_FALSE(acquire(kBob, 1000, 100, 21).answered);
  ASSERT_FALSE(acquire_shared(kCarol, 1000, 5000, 31).answered);
  ASSERT_FALSE(acquire_shared(kDave, 1000, 5000, 41).answered);
  advance_to(now_ + 99);
  EXPECT_TRUE(take_deferred().empty());
  advance_to(now_ + 1);
  const auto d = take_deferred();
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].type, MessageType::kTimeout);
  EXPECT_EQ(d[0].client, kBob);
  EXPECT_EQ(d[1].type, MessageType::kGranted);
  EXPECT_EQ(d[1].client, kCarol);
  EXPECT_EQ(d[2].type, MessageType::kGranted);
  EXPECT_EQ(d[2].client, kDave);
  EXPECT_GT(d[1].token, r1);
  EXPECT_GT(d[2].token, d[1].token);
  const auto q = query();
  EXPECT_EQ(q.reply.holders, 3u);
  EXPECT_EQ(q.reply.waiters, 0u);
  EXPECT_EQ(q.reply.mode, LeaseMode::kShared);
}

// A writer that times out behind another queued writer changes nothing for
// the readers behind both.
TEST_F(ShardTest, AWaiterTimingOutBehindTheFrontServesNobody) {
  const auto r1 = acquire_shared(kAlice, 10'000).reply.token;
  ASSERT_FALSE(acquire(kBob, 1000, 5000, 21).answered);
  ASSERT_FALSE(acquire(kCarol, 1000, 100, 31).answered);
  ASSERT_FALSE(acquire_shared(kDave, 1000, 5000, 41).answered);
  advance_to(now_ + 100);
  const auto d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].type, MessageType::kTimeout);
  EXPECT_EQ(d[0].client, kCarol);
  EXPECT_EQ(query().reply.holders, 1u);
  EXPECT_EQ(query().reply.waiters, 2u);
  ASSERT_EQ(release(kAlice, r1).reply.type, MessageType::kReleased);
  const auto h = take_deferred();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].client, kBob);
}

TEST_F(ShardTest, PermitsAdmitAtMostTheLimit) {
  std::set<std::uint64_t> tokens;
  for (const ClientId& c : {kAlice, kBob, kCarol}) {
    const auto r = acquire_permit(c, 3, 1000);
    ASSERT_EQ(r.reply.type, MessageType::kGranted);
    tokens.insert(r.reply.token);
  }
  EXPECT_EQ(tokens.size(), 3u);
  const auto busy = acquire_permit(kDave, 3, 1000);
  ASSERT_EQ(busy.reply.type, MessageType::kBusy);
  EXPECT_EQ(busy.reply.ttl_ms, 1000u);
  ASSERT_FALSE(acquire_permit(kDave, 3, 2000, 5000, 41).answered);
  auto q = query();
  EXPECT_EQ(q.reply.mode, LeaseMode::kPermit);
  EXPECT_EQ(q.reply.holders, 3u);
  EXPECT_EQ(q.reply.permits, 3u);
  EXPECT_EQ(q.reply.waiters, 1u);
  EXPECT_EQ(q.reply.token, *tokens.rbegin());

  ASSERT_EQ(release(kBob, *std::next(tokens.begin())).reply.type, MessageType::kReleased);
  const auto d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].client, kDave);
  EXPECT_EQ(d[0].type, MessageType::kGranted);
  EXPECT_EQ(d[0].ttl_ms, 2000u);
  EXPECT_GT(d[0].token, *tokens.rbegin());
  q = query();
  EXPECT_EQ(q.reply.holders, 3u);
  EXPECT_EQ(q.reply.waiters, 0u);
  EXPECT_EQ(acquire_permit(kErin, 3, 1000).reply.type, MessageType::kBusy);
}

TEST_F(ShardTest, PermitLimitAndKindMismatchesAreErrors) {
  ASSERT_EQ(acquire_permit(kAlice, 2, 1000).reply.type, MessageType::kGranted);
  const auto other_limit = acquire_permit(kBob, 3, 1000, 5000);
  ASSERT_TRUE(other_limit.answered) << "a mismatch is never queued";
  EXPECT_EQ(other_limit.reply.type, MessageType::kError);
  EXPECT_EQ(other_limit.reply.error, WireError::kLeaseKindMismatch);
  EXPECT_EQ(acquire(kBob, 1000).reply.error, WireError::kLeaseKindMismatch);
  EXPECT_EQ(acquire_shared(kBob, 1000, 5000).reply.error, WireError::kLeaseKindMismatch);
  EXPECT_EQ(query().reply.holders, 1u);
  EXPECT_EQ(query().reply.waiters, 0u);
  EXPECT_EQ(query().reply.permits, 2u);

  // The reverse: a lock key, exclusive or shared, refuses permits.
  ASSERT_EQ(acquire(kAlice, 1000, 0, 0, "x").reply.type, MessageType::kGranted);
  EXPECT_EQ(acquire_permit(kBob, 2, 1000, 5000, 0, "x").reply.error, WireError::kLeaseKindMismatch);
  ASSERT_EQ(acquire_shared(kAlice, 1000, 0, 0, "s").reply.type, MessageType::kGranted);
  EXPECT_EQ(acquire_permit(kBob, 2, 1000, 0, 0, "s").reply.error, WireError::kLeaseKindMismatch);

  EXPECT_EQ(acquire_permit(kBob, 0, 1000, 0, 0, "p").reply.error, WireError::kPermitsOutOfRange);
  EXPECT_EQ(acquire_permit(kBob, kMaxPermits + 1, 1000, 0, 0, "p").reply.error,
            WireError::kPermitsOutOfRange);
  EXPECT_FALSE(query("p").reply.held);
  ASSERT_EQ(acquire_permit(kBob, kMaxPermits, 1000, 0, 0, "p").reply.type, MessageType::kGranted);
  EXPECT_EQ(query("p").reply.permits, kMaxPermits);
}

TEST_F(ShardTest, AnIdleSemaphoreKeyTakesANewLimitOrBecomesALock) {
  const auto a = acquire_permit(kAlice, 1, 1000).reply.token;
  ASSERT_EQ(acquire_permit(kBob, 5, 1000).reply.error, WireError::kLeaseKindMismatch);
  ASSERT_EQ(release(kAlice, a).reply.type, MessageType::kReleased);
  EXPECT_FALSE(query().reply.held);
  std::vector<std::uint64_t> held;
  for (int i = 0; i < 5; ++i) {
    const auto r = acquire_permit(ClientId{7, static_cast<std::uint64_t>(i)}, 5, 100);
    ASSERT_EQ(r.reply.type, MessageType::kGranted) << i;
    held.push_back(r.reply.token);
  }
  EXPECT_EQ(query().reply.permits, 5u);
  EXPECT_EQ(acquire_permit(kBob, 5, 100).reply.type, MessageType::kBusy);
  EXPECT_EQ(acquire_permit(kBob, 1, 100).reply.error, WireError::kLeaseKindMismatch);
  advance_to(now_ + 101);  // all expire
  EXPECT_FALSE(query().reply.held);
  const auto lock = acquire(kBob, 1000);
  ASSERT_EQ(lock.reply.type, MessageType::kGranted);
  EXPECT_GT(lock.reply.token, held.back());
  EXPECT_EQ(query().reply.mode, LeaseMode::kExclusive);
  EXPECT_EQ(query().reply.permits, 0u);
}

TEST_F(ShardTest, OneClientTakingTwoPermitsGetsTwoTokens) {
  const auto a = acquire_permit(kAlice, 2, 1000, 0, 10);
  const auto b = acquire_permit(kAlice, 2, 1000, 0, 11);
  ASSERT_EQ(a.reply.type, MessageType::kGranted);
  ASSERT_EQ(b.reply.type, MessageType::kGranted);
  EXPECT_GT(b.reply.token, a.reply.token);
  EXPECT_EQ(query().reply.holders, 2u);
  EXPECT_EQ(acquire_permit(kBob, 2, 1000).reply.type, MessageType::kBusy);
  // Each has its own renewal and release.
  EXPECT_EQ(renew(kAlice, a.reply.token, 3000, 12).reply.ttl_ms, 3000u);
  ASSERT_EQ(release(kAlice, b.reply.token, 13).reply.type, MessageType::kReleased);
  auto q = query();
  EXPECT_EQ(q.reply.holders, 1u);
  EXPECT_EQ(q.reply.ttl_ms, 3000u);
  EXPECT_EQ(renew(kAlice, a.reply.token, 1000, 14).reply.type, MessageType::kRenewed);
  EXPECT_EQ(acquire_permit(kBob, 2, 1000).reply.type, MessageType::kGranted);
}

// Two shared leases of one owner are two grants too; an exclusive re-acquire
// by the holder is a contender, as any owner's: busy with no wait, queued behind
// the waiters already there with one, and the first grant stands.
TEST_F(ShardTest, SharedReacquireAddsAHolderExclusiveReacquireQueues) {
  const auto s1 = acquire_shared(kAlice, 1000, 0, 10).reply.token;
  const auto s2 = acquire_shared(kAlice, 1000, 0, 11);
  ASSERT_EQ(s2.reply.type, MessageType::kGranted);
  EXPECT_GT(s2.reply.token, s1);
  EXPECT_EQ(query().reply.holders, 2u);

  const auto e1 = acquire(kBob, 1000, 0, 20, "e").reply.token;
  ASSERT_FALSE(acquire(kCarol, 1000, 5000, 30, "e").answered);
  EXPECT_EQ(acquire(kBob, 1000, 0, 21, "e").reply.type, MessageType::kBusy);
  ASSERT_FALSE(acquire(kBob, 1000, 5000, 22, "e").answered) << "queued behind Carol";
  auto q = query("e");
  EXPECT_EQ(q.reply.holders, 1u);
  EXPECT_EQ(q.reply.waiters, 2u);
  EXPECT_EQ(q.reply.token, e1);
  ASSERT_EQ(release(kBob, e1, 23, "e").reply.type, MessageType::kReleased);
  auto d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].client, kCarol);
  ASSERT_EQ(release(kCarol, d[0].token, 31, "e").reply.type, MessageType::kReleased);
  d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].client, kBob);
  EXPECT_EQ(d[0].request_id, 22u);
}

// A client may hold a lease on a key and also wait on it (a second permit, a
// second read behind a queued writer). Its queued ACQUIRE, retransmitted past
// the dedup cache after the client's lease applied a newer request, is still
// queued: it must not be answered BUSY (the client would give up on it, and
// the permit granted to it later would be held by nobody until it expires).
TEST_F(ShardTest, QueuedRetransmissionOfAHolderIsNotAnsweredBusy) {
  make_shard(ShardLimits{.dedup_capacity = 0});
  const auto mine = acquire_permit(kAlice, 1, 1000, 0, 10).reply.token;
  ASSERT_FALSE(acquire_permit(kAlice, 1, 1000, 5000, 11).answered);
  ASSERT_EQ(renew(kAlice, mine, 1000, 12).reply.type, MessageType::kRenewed);
  const auto dup = acquire_permit(kAlice, 1, 1000, 5000, 11);
  EXPECT_FALSE(dup.answered) << "answered " << to_string(dup.reply.type);
  EXPECT_EQ(query().reply.waiters, 1u);
  ASSERT_EQ(release(kAlice, mine, 13).reply.type, MessageType::kReleased);
  const auto d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request_id, 11u);

  // The same for a reader queued behind a writer.
  const auto r = acquire_shared(kAlice, 1000, 0, 20, "s").reply.token;
  ASSERT_FALSE(acquire(kBob, 1000, 5000, 0, "s").answered);
  ASSERT_FALSE(acquire_shared(kAlice, 1000, 5000, 21, "s").answered);
  ASSERT_EQ(renew(kAlice, r, 1000, 22, "s").reply.type, MessageType::kRenewed);
  EXPECT_FALSE(acquire_shared(kAlice, 1000, 5000, 21, "s").answered);
  EXPECT_EQ(query("s").reply.waiters, 2u);
}

TEST_F(ShardTest, RetransmittedPermitAcquireNeverTakesASecondPermit) {
  for (const std::size_t dedup : {std::size_t{4096}, std::size_t{0}}) {
    SCOPED_TRACE(dedup);
    make_shard(ShardLimits{.dedup_capacity = dedup});
    const auto a = acquire_permit(kAlice, 2, 1000, 0, 500);
    ASSERT_EQ(a.reply.type, MessageType::kGranted);
    now_ += 100;
    const auto dup = acquire_permit(kAlice, 2, 1000, 0, 500);
    ASSERT_EQ(dup.reply.type, MessageType::kGranted);
    EXPECT_EQ(dup.reply.token, a.reply.token);
    EXPECT_EQ(query().reply.holders, 1u);
    ASSERT_EQ(acquire_permit(kBob, 2, 1000, 0, 600).reply.type, MessageType::kGranted);

    // Queued, retransmitted while queued, then granted and retransmitted.
    ASSERT_FALSE(acquire_permit(kCarol, 2, 1000, 5000, 700).answered);
    ASSERT_FALSE(acquire_permit(kCarol, 2, 1000, 5000, 700).answered);
    EXPECT_EQ(query().reply.waiters, 1u);
    ASSERT_EQ(release(kAlice, a.reply.token, 501).reply.type, MessageType::kReleased);
    const auto d = take_deferred();
    ASSERT_EQ(d.size(), 1u);
    const auto again = acquire_permit(kCarol, 2, 1000, 5000, 700);
    ASSERT_EQ(again.reply.type, MessageType::kGranted);
    EXPECT_EQ(again.reply.token, d[0].token);
    const auto q = query();
    EXPECT_EQ(q.reply.holders, 2u);
    EXPECT_EQ(q.reply.waiters, 0u);
  }
}

// Permit safety under random traffic: acquires (new and retransmitted),
// releases, renewals and expiry. After every step the holders the shard
// reports equal the leases the test knows are live, and never exceed P.
TEST_F(ShardTest, PermitHoldersNeverExceedTheLimitUnderRandomTraffic) {
  constexpr std::uint32_t kPermits = 3;
  for (const std::size_t dedup : {std::size_t{4096}, std::size_t{4}}) {
    SCOPED_TRACE(dedup);
    make_shard(ShardLimits{.dedup_capacity = dedup});
    deferred_.clear();
    std::mt19937_64 rng(dedup);
    struct Live {
      ClientId client;
      std::uint64_t request_id = 0;
      std::int64_t deadline = 0;
    };
    std::map<std::uint64_t, Live> live;  // token -> lease
    struct Sent {
      ClientId client;
      std::uint64_t request_id = 0;
      std::uint32_t ttl = 0;
      std::uint32_t wait = 0;
    };
    std::vector<Sent> sent;
    std::map<std::uint64_t, std::uint64_t> next_rid;  // client.lo -> id
    std::uint64_t last_token = 0;
    std::size_t max_seen = 0;

    auto on_grant = [&](const ClientId& c, std::uint64_t rid, std::uint64_t token,
                        std::uint32_t ttl) {
      if (const auto it = live.find(token); it != live.end()) {
        // The same grant again (a retransmission): never a new holder.
        EXPECT_EQ(it->second.client, c);
        EXPECT_EQ(it->second.request_id, rid);
        return;
      }
      EXPECT_GT(token, last_token);
      last_token = token;
      for (const auto& [t, l] : live) {
        EXPECT_FALSE(l.client == c && l.request_id == rid) << "one request, two live permits";
      }
      live[token] = Live{c, rid, now_ + ttl + 1};
    };
    auto drain = [&] {
      for (const DeferredReply& d : take_deferred()) {
        if (d.type != MessageType::kGranted) continue;
        on_grant(d.client, d.request_id, d.token, d.ttl_ms);
      }
    };
    auto expire = [&] {
      std::erase_if(live, [&](const auto& e) { return e.second.deadline <= now_; });
    };

    for (int step = 0; step < 5000; ++step) {
      const ClientId c{9, rng() % 6};
      switch (rng() % 6) {
        case 0:
        case 1: {  // a new ACQUIRE_PERMIT
          const std::uint64_t rid = ++next_rid[c.hi];
          const auto ttl = static_cast<std::uint32_t>(5 + rng() % 60);
          const auto wait = static_cast<std::uint32_t>(rng() % 2 ? 0 : rng() % 40);
          sent.push_back(Sent{c, rid, ttl, wait});
          expire();
          const auto r = acquire_permit(c, kPermits, ttl, wait, rid);
          drain();
          if (r.answered && r.reply.type == MessageType::kGranted) {
            on_grant(c, rid, r.reply.token, ttl);
          }
          break;
        }
        case 2: {  // a retransmission of an earlier one
          if (sent.empty()) break;
          const Sent s = sent[rng() % sent.size()];
          expire();
          const auto r = acquire_permit(s.client, kPermits, s.ttl, s.wait, s.request_id);
          drain();
          if (r.answered && r.reply.type == MessageType::kGranted) {
            // Live: the same token. Gone (released, expired): the cached
            // answer, or, past the cache, a fresh decision.
            const bool fresh = !live.contains(r.reply.token) && r.reply.token > last_token;
            if (fresh) {
              on_grant(s.client, s.request_id, r.reply.token, s.ttl);
            } else if (const auto it = live.find(r.reply.token); it != live.end()) {
              EXPECT_EQ(it->second.client, s.client);
              EXPECT_EQ(it->second.request_id, s.request_id);
            }
          }
          break;
        }
        case 3: {  // release a live lease
          expire();
          if (live.empty()) break;
          auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
          const auto token = it->first;
          const ClientId owner = it->second.client;
          const auto r = release(owner, token, ++next_rid[owner.hi]);
          EXPECT_EQ(r.reply.type, MessageType::kReleased);
          live.erase(token);
          drain();
          break;
        }
        case 4: {  // renew a live lease
          expire();
          if (live.empty()) break;
          auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
          const auto ttl = static_cast<std::uint32_t>(5 + rng() % 60);
          const auto r = renew(it->second.client, it->first, ttl, ++next_rid[it->second.client.hi]);
          drain();
          EXPECT_EQ(r.reply.type, MessageType::kRenewed);
          it->second.deadline = now_ + ttl + 1;
          break;
        }
        default:
          advance_to(now_ + static_cast<std::int64_t>(rng() % 15));
          expire();
          drain();
          break;
      }
      expire();
      const auto q = query();
      drain();
      ASSERT_LE(q.reply.holders, kPermits) << "step " << step;
      ASSERT_EQ(q.reply.holders, live.size()) << "step " << step;
      max_seen = std::max<std::size_t>(max_seen, q.reply.holders);
      if (q.reply.held) {
        EXPECT_EQ(q.reply.permits, kPermits);
      }
    }
    EXPECT_EQ(max_seen, kPermits) << "the limit was reached";
    // Leases granted to waiters by the first jump run out by the second.
    advance_to(now_ + 100'000);
    advance_to(now_ + 100'000);
    drain();
    EXPECT_EQ(shard_->held_keys(), 0u);
    EXPECT_EQ(shard_->timers(), 0u);
  }
}

// A restart continues the token counter (ShardTokens from the old shard's
// last token, as a data dir does) and forgets every lease: the first
// acquirer fixes the permit limit again, and every token is above the old.
TEST_F(ShardTest, PermitLimitAndTokensHoldAcrossARestart) {
  std::vector<std::uint64_t> old;
  for (const ClientId& c : {kAlice, kBob}) old.push_back(acquire_permit(c, 2, 5000).reply.token);
  ASSERT_EQ(acquire_permit(kCarol, 2, 5000).reply.type, MessageType::kBusy);
  const std::uint64_t last = shard_->last_token();
  EXPECT_EQ(last, old.back());

  // The restart: a lock-delay covering the old leases, the counter carried.
  make_shard(ShardLimits{.recovering_until_ms = now_ + 5000}, ShardTokens{last});
  EXPECT_EQ(acquire_permit(kCarol, 2, 1000).reply.type, MessageType::kRecovering);
  EXPECT_EQ(renew(kAlice, old[0], 1000).reply.type, MessageType::kExpired);
  advance_to(now_ + 5000);
  std::uint64_t highest = last;
  for (const ClientId& c : {kCarol, kDave}) {
    const auto r = acquire_permit(c, 2, 1000);
    ASSERT_EQ(r.reply.type, MessageType::kGranted);
    EXPECT_GT(r.reply.token, highest);
    highest = r.reply.token;
  }
  EXPECT_EQ(acquire_permit(kErin, 2, 1000).reply.type, MessageType::kBusy);
  EXPECT_EQ(acquire_permit(kErin, 3, 1000).reply.error, WireError::kLeaseKindMismatch);
  EXPECT_EQ(release(kAlice, old[0]).reply.type, MessageType::kExpired)
      << "an old token never frees a new permit";
  const auto q = query();
  EXPECT_EQ(q.reply.holders, 2u);
  EXPECT_EQ(q.reply.token, highest);
  EXPECT_EQ(shard_->last_token(), highest);
}

// ---------------------------------------------------------------------------
// ACQUIRE_MANY parts, driven as the Dispatcher does.

class ShardPartsTest : public ShardTest {
 protected:
  MultiAcquire make_multi(const ClientId& client, std::uint64_t request_id,
                          std::initializer_list<const char*> keys,
                          LeaseMode mode = LeaseMode::kExclusive) {
    MultiAcquire m;
    m.client = client;
    m.request_id = request_id;
    m.mode = mode;
    m.ttl_ms = 1000;
    m.wait_deadline_ms = now_ + 5000;
    m.reply_credit = kMaxDatagramSize;
    std::uint8_t index = 0;
    for (const char* key : keys) {
      m.parts.push_back(MultiAcquire::Part{
          .key = key, .hash = shard_->key_hash(key), .shard = 0, .index = index++});
    }
    return m;
  }
  Shard::PartState probe(const MultiAcquire& m, std::size_t part, std::uint32_t& ttl_left) {
    return shard_->probe(m, m.parts[part], now_, ttl_left, deferred_);
  }
};

TEST_F(ShardPartsTest, ProbeSaysFreeBusyOrKindMismatch) {
  acquire(kBob, 2000, 0, 0, "held");
  acquire_permit(kBob, 4, 1000, 0, 0, "sem");
  acquire_shared(kBob, 1000, 0, 0, "read");
  auto m = make_multi(kAlice, 900, {"free", "held", "sem", "read"});
  std::uint32_t ttl = 12345;
  EXPECT_EQ(probe(m, 0, ttl), Shard::PartState::kFree);
  EXPECT_EQ(probe(m, 1, ttl), Shard::PartState::kBusy);
  EXPECT_EQ(ttl, 2000u);
  EXPECT_EQ(probe(m, 2, ttl), Shard::PartState::kKindMismatch);
  EXPECT_EQ(probe(m, 3, ttl), Shard::PartState::kBusy) << "exclusive vs a reader";

  auto shared = make_multi(kAlice, 901, {"read", "held", "sem"}, LeaseMode::kShared);
  EXPECT_EQ(probe(shared, 0, ttl), Shard::PartState::kFree) << "readers share";
  EXPECT_EQ(probe(shared, 1, ttl), Shard::PartState::kBusy);
  EXPECT_EQ(probe(shared, 2, ttl), Shard::PartState::kKindMismatch);
  // A queued writer keeps a shared part out too.
  ASSERT_FALSE(acquire(kCarol, 1000, 5000, 0, "read").answered);
  EXPECT_EQ(probe(shared, 0, ttl), Shard::PartState::kBusy);
  // probe() changes nothing.
  EXPECT_FALSE(query("free").reply.held);
  EXPECT_EQ(query("read").reply.holders, 1u);
}

TEST_F(ShardPartsTest, TakenPartsArePendingUntilConfirmed) {
  auto m = make_multi(kAlice, 900, {"a", "b"});
  std::uint32_t ttl = 0;
  ASSERT_EQ(probe(m, 0, ttl), Shard::PartState::kFree);
  const auto before = shard_->last_token();
  const auto t = shard_->take(m, m.parts[0], now_);
  ASSERT_GT(t, before);
  EXPECT_EQ(m.parts[0].token, t);
  auto q = query("a");
  EXPECT_TRUE(q.reply.held);
  EXPECT_EQ(q.reply.holders, 1u);
  EXPECT_EQ(q.reply.token, t);
  EXPECT_EQ(acquire(kBob, 1000, 0, 0, "a").reply.type, MessageType::kBusy);
  EXPECT_EQ(probe(m, 0, ttl), Shard::PartState::kBusy);

  // Not a lease yet: its own client's RENEW and RELEASE with its token do
  // nothing.
  EXPECT_NE(renew(kAlice, t, 1000, 0, "a").reply.type, MessageType::kRenewed);
  EXPECT_NE(release(kAlice, t, 0, "a").reply.type, MessageType::kReleased);
  EXPECT_EQ(query("a").reply.holders, 1u);
  EXPECT_EQ(query("a").reply.token, t);

  shard_->confirm(m, m.parts[0], now_);
  now_ += 10;
  // Request ids above the ACQUIRE_MANY's: the holder applies them in order.
  const auto r = renew(kAlice, t, 3000, 1000, "a");
  ASSERT_EQ(r.reply.type, MessageType::kRenewed);
  EXPECT_EQ(query("a").reply.ttl_ms, 3000u);
  EXPECT_EQ(release(kAlice, t, 1001, "a").reply.type, MessageType::kReleased);
  EXPECT_FALSE(query("a").reply.held);
}

TEST_F(ShardPartsTest, AConfirmedPartExpiresTtlAfterConfirmation) {
  auto m = make_multi(kAlice, 900, {"a"});
  const auto t = shard_->take(m, m.parts[0], now_);
  ASSERT_GT(t, 0u);
  now_ += 300;
  shard_->confirm(m, m.parts[0], now_);
  EXPECT_EQ(query("a").reply.ttl_ms, 1000u);
  advance_to(now_ + 1000);
  EXPECT_TRUE(query("a").reply.held);
  advance_to(now_ + 1);
  EXPECT_FALSE(query("a").reply.held);
}

TEST_F(ShardPartsTest, AbandonHandsThePartToTheNextWaiter) {
  auto m = make_multi(kAlice, 900, {"a"});
  const auto t = shard_->take(m, m.parts[0], now_);
  ASSERT_GT(t, 0u);
  ASSERT_FALSE(acquire(kBob, 1000, 5000, 21, "a").answered);
  ASSERT_FALSE(acquire_shared(kCarol, 1000, 5000, 31, "a").answered);
  shard_->abandon(m, m.parts[0], now_, deferred_);
  const auto d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].client, kBob);
  EXPECT_EQ(d[0].type, MessageType::kGranted);
  EXPECT_EQ(d[0].key, "a");
  EXPECT_EQ(d[0].multi, nullptr);
  EXPECT_GT(d[0].token, t);
  const auto q = query("a");
  EXPECT_EQ(q.reply.holders, 1u);
  EXPECT_EQ(q.reply.token, d[0].token);
  EXPECT_EQ(q.reply.waiters, 1u);
  // Abandoning again (or a part not held) changes nothing.
  shard_->abandon(m, m.parts[0], now_, deferred_);
  EXPECT_TRUE(take_deferred().empty());
  EXPECT_EQ(query("a").reply.token, d[0].token);

  // Abandoned with nobody waiting: the key is free.
  auto n = make_multi(kAlice, 901, {"b"});
  ASSERT_GT(shard_->take(n, n.parts[0], now_), 0u);
  shard_->abandon(n, n.parts[0], now_, deferred_);
  EXPECT_FALSE(query("b").reply.held);
  EXPECT_EQ(shard_->leases(), 1u);
}

TEST_F(ShardPartsTest, AQueuedPartIsHandedOffInFifoOrder) {
  const auto bob = acquire(kBob, 1000, 0, 20, "b").reply.token;
  auto m = make_multi(kAlice, 900, {"a", "b"});
  std::uint32_t ttl = 0;
  ASSERT_EQ(probe(m, 0, ttl), Shard::PartState::kFree);
  const auto ta = shard_->take(m, m.parts[0], now_);
  ASSERT_GT(ta, 0u);
  m.taken = 1;
  ASSERT_EQ(probe(m, 1, ttl), Shard::PartState::kBusy);
  EXPECT_EQ(ttl, 1000u);
  ASSERT_EQ(shard_->queue(m, 1, now_), std::nullopt);
  // Carol queues behind the multi waiter; a reader behind both.
  ASSERT_FALSE(acquire(kCarol, 1000, 5000, 30, "b").answered);
  EXPECT_EQ(query("b").reply.waiters, 2u);
  EXPECT_TRUE(take_deferred().empty());

  ASSERT_EQ(release(kBob, bob, 21, "b").reply.type, MessageType::kReleased);
  auto d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].multi, &m);
  EXPECT_EQ(d[0].type, MessageType::kGranted);
  EXPECT_EQ(d[0].client, kAlice);
  EXPECT_EQ(d[0].request_id, 900u);
  EXPECT_GT(d[0].token, bob);
  EXPECT_EQ(m.taken, 2u);
  EXPECT_EQ(m.parts[1].token, d[0].token);
  auto q = query("b");
  EXPECT_EQ(q.reply.holders, 1u);
  EXPECT_EQ(q.reply.waiters, 1u);
  EXPECT_EQ(q.reply.token, d[0].token);

  // Pending: a RELEASE with its token does not free it for Carol.
  EXPECT_NE(release(kAlice, d[0].token, 0, "b").reply.type, MessageType::kReleased);
  EXPECT_TRUE(take_deferred().empty());
  EXPECT_EQ(query("b").reply.holders, 1u);

  shard_->confirm(m, m.parts[0], now_);
  shard_->confirm(m, m.parts[1], now_);
  EXPECT_EQ(release(kAlice, ta, 0, "a").reply.type, MessageType::kReleased);
  ASSERT_EQ(release(kAlice, m.parts[1].token, 0, "b").reply.type, MessageType::kReleased);
  d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].client, kCarol);
  EXPECT_EQ(d[0].multi, nullptr);
  EXPECT_GT(d[0].token, m.parts[1].token);
}

// The multi waiter queued behind a queued writer waits for it, and a
// shared one behind a reader-held key with nobody queued never queues at all.
TEST_F(ShardPartsTest, AQueuedPartWaitsBehindEarlierWaitersAndTimesOut) {
  const auto r = acquire_shared(kBob, 10'000, 0, 20, "k").reply.token;
  ASSERT_FALSE(acquire(kCarol, 1000, 50, 30).answered);  // W, gives up at +50
  auto m = make_multi(kAlice, 900, {"k"}, LeaseMode::kShared);
  m.wait_deadline_ms = now_ + 200;
  std::uint32_t ttl = 0;
  ASSERT_EQ(probe(m, 0, ttl), Shard::PartState::kBusy);
  ASSERT_EQ(shard_->queue(m, 0, now_), std::nullopt);
  EXPECT_EQ(query().reply.waiters, 2u);

  advance_to(now_ + 50);  // W times out at the front: the shared part fits
  auto d = take_deferred();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].type, MessageType::kTimeout);
  EXPECT_EQ(d[0].client, kCarol);
  EXPECT_EQ(d[1].type, MessageType::kGranted);
  EXPECT_EQ(d[1].multi, &m);
  EXPECT_EQ(m.taken, 1u);
  EXPECT_GT(m.parts[0].token, r);
  EXPECT_EQ(query().reply.holders, 2u);
  shard_->abandon(m, m.parts[0], now_, deferred_);
  EXPECT_EQ(query().reply.holders, 1u);

  // A multi waiter that runs out of time: TIMEOUT with the request attached.
  ASSERT_FALSE(acquire(kCarol, 1000, 5000, 31).answered);
  auto n = make_multi(kAlice, 901, {"k"}, LeaseMode::kShared);
  n.wait_deadline_ms = now_ + 100;
  ASSERT_EQ(probe(n, 0, ttl), Shard::PartState::kBusy);
  ASSERT_EQ(shard_->queue(n, 0, now_), std::nullopt);
  advance_to(now_ + 100);
  d = take_deferred();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].type, MessageType::kTimeout);
  EXPECT_EQ(d[0].multi, &n);
  EXPECT_EQ(n.taken, 0u);
  EXPECT_EQ(query().reply.waiters, 1u);
}

TEST(StringKeyHashTest, TheSeedChangesEveryHash) {
  const StringKeyHash a(1);
  const StringKeyHash b(2);
  int equal = 0;
  for (int i = 0; i < 64; ++i) {
    const std::string key = "key-" + std::to_string(i);
    equal += a(key) == b(key) ? 1 : 0;
  }
  EXPECT_EQ(equal, 0);
}

}  // namespace
}  // namespace shardlock::lease::internal
