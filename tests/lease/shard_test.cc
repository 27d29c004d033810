// The lease state machine without sockets: time is a number the test moves.
#include "shardlock/lease/internal/shard.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "shardlock/lease/internal/string_key.h"
#include "shardlock/lease/internal/timer_wheel.h"

namespace shardlock::lease::internal {
namespace {

constexpr ClientId kAlice{1, 1};
constexpr ClientId kBob{2, 2};
constexpr ClientId kCarol{3, 3};

class ShardTest : public ::testing::Test {
 protected:
  ShardTest() { make_shard(ShardLimits{}); }

  void make_shard(const ShardLimits& limits) {
    shard_.reset();
    shard_ = std::make_unique<Shard>(0, limits, ShardTokens{}, now_);
  }

  struct Result {
    bool answered = false;
    Message reply;
  };

  Result send(const ClientId& client, Message m) {
    if (m.request_id == 0) m.request_id = ++next_id_;
    Result r;
    Peer peer;
    r.answered = shard_->handle(client, peer, m, now_, r.reply, deferred_);
    return r;
  }
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
  Result renew(const ClientId& c, std::uint64_t token, std::uint32_t ttl, std::uint64_t rid = 0) {
    Message m;
    m.type = MessageType::kRenew;
    m.key = "k";
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
  void advance_to(std::int64_t t) {
    now_ = t;
    shard_->advance(now_, deferred_);
  }
  std::vector<DeferredReply> take_deferred() { return std::exchange(deferred_, {}); }
  std::uint64_t counter(StatCounter c) const {
    return shard_->counters()[static_cast<std::size_t>(c)];
  }

  std::int64_t now_ = 1'000'000;
  std::uint64_t next_id_ = 100;
  std::vector<DeferredReply> deferred_;
  std::unique_ptr<Shard> shard_;
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

// Issue 11, hole 2: a holder that acquires again gets a new token, so the
// RELEASE of its older Lease (dropped, or declared lost) cannot free the new
// grant. The granting ACQUIRE itself, past its dedup entry, still gets the
// same grant; an older request of the holder gets BUSY.
TEST_F(ShardTest, ReacquireByHolderIsANewGrantWithANewToken) {
  make_shard(ShardLimits{.dedup_capacity = 0});  // every retransmission is past the cache
  const auto t = acquire(kAlice, 1000, 0, 500).reply.token;
  now_ += 400;
  auto retransmitted = acquire(kAlice, 1000, 0, 500);
  ASSERT_EQ(retransmitted.reply.type, MessageType::kGranted);
  EXPECT_EQ(retransmitted.reply.token, t);
  EXPECT_EQ(retransmitted.reply.ttl_ms, 600u);

  auto again = acquire(kAlice, 1000, 0, 501);
  ASSERT_EQ(again.reply.type, MessageType::kGranted);
  EXPECT_GT(again.reply.token, t);
  EXPECT_EQ(again.reply.ttl_ms, 1000u);

  EXPECT_EQ(release(kAlice, t, 502).reply.type, MessageType::kExpired) << "the old grant is gone";
  auto q = query();
  EXPECT_TRUE(q.reply.held);
  EXPECT_EQ(q.reply.token, again.reply.token);

  auto stale = acquire(kAlice, 1000, 0, 499);
  EXPECT_EQ(stale.reply.type, MessageType::kBusy);
  EXPECT_EQ(query().reply.token, again.reply.token);
  EXPECT_EQ(counter(StatCounter::kStaleRequests), 1u);
}

// Issue 11, hole 9: a holder's RENEW older than one already applied (a late
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

// Issue 11, hole 3: the clock reaches the shard truncated to milliseconds;
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
// Issue 11, hole 8: every structure a peer can grow is bounded, refused with
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
