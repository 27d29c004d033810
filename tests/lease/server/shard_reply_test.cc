// ShardReply and AnswerLog: one builder fills the reply, counts the outcome
// and remembers it under the request's (client id, request id) with its
// fingerprint, so a retransmission finds the very answer.
#include "shardlock/lease/server/internal/shard_reply.h"

#include <gtest/gtest.h>

namespace shardlock::lease::internal {
namespace {

constexpr ClientId kAlice{1, 1};

class ShardReplyTest : public ::testing::Test {
 protected:
  ShardReplyTest() {
    request_.type = MessageType::kAcquire;
    request_.request_id = 41;
    request_.key = "k";
  }
  RequestContext context() const {
    return RequestContext{.client = kAlice,
                          .peer = peer_,
                          .request = request_,
                          .key = KeyRef{request_.key, 5},
                          .fingerprint = AnswerLog::fingerprint(request_.type, 5),
                          .reply_credit = 512,
                          .now_ms = 1000};
  }

  Peer peer_;
  Message request_;
  Message reply_;
  ShardCounters counters_;
  AnswerLog answers_{16, 0, counters_};
};

TEST_F(ShardReplyTest, StartsAsAnAnsweredErrorForTheRequest) {
  reply_.token = 99;  // a previous request's
  const RequestContext ctx = context();
  const ShardReply out(reply_, ctx, counters_, answers_);
  EXPECT_TRUE(out.answered());
  EXPECT_EQ(reply_.type, MessageType::kError);
  EXPECT_EQ(reply_.request_id, 41U);
  EXPECT_EQ(reply_.key, "k");
  EXPECT_EQ(reply_.token, 0U);
}

TEST_F(ShardReplyTest, FailAndRefuseCountErrors) {
  const RequestContext ctx = context();
  ShardReply out(reply_, ctx, counters_, answers_);
  out.fail(WireError::kBadKey);
  EXPECT_EQ(reply_.type, MessageType::kError);
  EXPECT_EQ(reply_.error, WireError::kBadKey);
  EXPECT_EQ(counters_[StatCounter::kErrors], 1U);
  out.refuse();
  EXPECT_EQ(reply_.error, WireError::kLimitExceeded);
  EXPECT_EQ(counters_[StatCounter::kErrors], 2U);
  EXPECT_EQ(counters_[StatCounter::kLimitRejections], 1U);
  out.fail(WireError::kResourceExhausted, StatCounter::kAllocationFailures);
  EXPECT_EQ(counters_[StatCounter::kErrors], 3U);
  EXPECT_EQ(counters_[StatCounter::kAllocationFailures], 1U);
  EXPECT_EQ(answers_.find(kAlice, 41), nullptr);  // nothing remembered unasked
}

TEST_F(ShardReplyTest, RemembersTheAnswerWithTheRequestsFingerprint) {
  const RequestContext ctx = context();
  ShardReply out(reply_, ctx, counters_, answers_);
  out.message().token = 7;
  out.message().ttl_ms = 900;
  out.answer(MessageType::kGranted, StatCounter::kGrants);
  out.remember();
  EXPECT_EQ(counters_[StatCounter::kGrants], 1U);
  const RememberedAnswer* a = answers_.find(kAlice, 41);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->type, MessageType::kGranted);
  EXPECT_EQ(a->token, 7U);
  EXPECT_EQ(a->ttl_ms, 900U);
  EXPECT_EQ(a->fingerprint, ctx.fingerprint);
  EXPECT_NE(a->fingerprint, AnswerLog::fingerprint(MessageType::kRenew, 5));
  EXPECT_NE(a->fingerprint, AnswerLog::fingerprint(MessageType::kAcquire, 6));
}

TEST_F(ShardReplyTest, AParkedRequestIsRememberedAsQueued) {
  const RequestContext ctx = context();
  ShardReply out(reply_, ctx, counters_, answers_);
  out.remember_queued();
  out.park();
  EXPECT_FALSE(out.answered());
  ASSERT_NE(answers_.find(kAlice, 41), nullptr);
  EXPECT_EQ(answers_.find(kAlice, 41)->type, MessageType::kAcquire);
}

TEST_F(ShardReplyTest, ARefusalKeepsItsRetryOrEpoch) {
  const RequestContext ctx = context();
  ShardReply out(reply_, ctx, counters_, answers_);
  out.message().retry_after_ms = 250;
  out.answer(MessageType::kRecovering, StatCounter::kRecovering);
  out.remember_refusal();
  const RememberedAnswer* a = answers_.find(kAlice, 41);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->type, MessageType::kRecovering);
  EXPECT_EQ(a->ttl_ms, 250U);
  EXPECT_EQ(a->token, 0U);

  request_.request_id = 42;
  const RequestContext next = context();
  ShardReply redirect(reply_, next, counters_, answers_);
  redirect.message().epoch = 9;
  redirect.answer(MessageType::kRedirect, StatCounter::kRedirects);
  redirect.remember_refusal();
  ASSERT_NE(answers_.find(kAlice, 42), nullptr);
  EXPECT_EQ(answers_.find(kAlice, 42)->token, 9U);
  EXPECT_EQ(answers_.find(kAlice, 42)->ttl_ms, 0U);
}

TEST(AnswerLogTest, ForgetsTheOldestPastItsCapacity) {
  ShardCounters counters;
  AnswerLog log(2, 0, counters);
  for (std::uint64_t id = 1; id <= 3; ++id) {
    log.remember(kAlice, id, RememberedAnswer{.type = MessageType::kReleased});
  }
  EXPECT_EQ(log.find(kAlice, 1), nullptr);
  EXPECT_NE(log.find(kAlice, 2), nullptr);
  EXPECT_NE(log.find(kAlice, 3), nullptr);
}

}  // namespace
}  // namespace shardlock::lease::internal
