// The client's two pure reply decisions (client/reply.h), by table: how a
// reply bears on the call it answers, and where a REDIRECT leads. No
// sockets, no engine: what the call engine carries out is tested in
// client_test and cluster_client_test.
#include "client/reply.h"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace shardlock::lease::internal {
namespace {

using namespace std::chrono_literals;

constexpr LeaseClock::time_point kNow{100s};

struct DecisionRow {
  const char* name;
  MessageType call;
  std::optional<std::chrono::milliseconds> wait_left;  // nullopt: the call does not wait
  MessageType reply;
  const char* reply_key;
  ReplyVerdict verdict;
};

// The call's key is "k" throughout.
const DecisionRow kDecisions[] = {
    {"granted", MessageType::kAcquire, std::nullopt, MessageType::kGranted, "k",
     ReplyVerdict::kComplete},
    {"granted for another key", MessageType::kAcquire, std::nullopt, MessageType::kGranted, "j",
     ReplyVerdict::kIgnore},
    {"a reply of another request type", MessageType::kAcquire, std::nullopt, MessageType::kRenewed,
     "k", ReplyVerdict::kIgnore},
    {"a reply type without a key", MessageType::kRenew, std::nullopt, MessageType::kNotOwner, "",
     ReplyVerdict::kComplete},
    {"busy", MessageType::kAcquire, std::nullopt, MessageType::kBusy, "k", ReplyVerdict::kComplete},
    {"redirect", MessageType::kAcquire, std::nullopt, MessageType::kRedirect, "",
     ReplyVerdict::kRedirect},
    {"a renew redirected", MessageType::kRenew, std::nullopt, MessageType::kRedirect, "",
     ReplyVerdict::kRedirect},
    {"a release is never redirected", MessageType::kRelease, std::nullopt, MessageType::kRedirect,
     "", ReplyVerdict::kIgnore},
    {"recovering without a wait", MessageType::kAcquire, std::nullopt, MessageType::kRecovering, "",
     ReplyVerdict::kComplete},
    {"recovering within the wait", MessageType::kAcquire, 500ms, MessageType::kRecovering, "",
     ReplyVerdict::kRideThrough},
    {"recovering with just the margin left", MessageType::kAcquire, kLastTryMargin,
     MessageType::kRecovering, "", ReplyVerdict::kComplete},
    {"recovering after the wait", MessageType::kAcquire, -5ms, MessageType::kRecovering, "",
     ReplyVerdict::kComplete},
    {"a watch rides through", MessageType::kWatch, 1s, MessageType::kRecovering, "",
     ReplyVerdict::kRideThrough},
    {"a renew's recovering completes", MessageType::kRenew, std::nullopt, MessageType::kRecovering,
     "", ReplyVerdict::kComplete},
    {"a timeout of a waiting acquire", MessageType::kAcquire, 500ms, MessageType::kTimeout, "k",
     ReplyVerdict::kComplete},
    {"a map reply", MessageType::kMap, std::nullopt, MessageType::kMapReply, "",
     ReplyVerdict::kComplete},
    {"an error", MessageType::kQuery, std::nullopt, MessageType::kError, "",
     ReplyVerdict::kComplete},
};

TEST(ReplyTest, DecisionsByTable) {
  for (const DecisionRow& row : kDecisions) {
    CallShape call{.type = row.call, .key = "k"};
    if (row.wait_left) call.wait_end = kNow + *row.wait_left;
    Message reply{.type = row.reply, .key = row.reply_key};
    const ReplyDecision d = decide_reply(call, reply, kNow);
    EXPECT_EQ(d.verdict, row.verdict) << row.name;
    if (d.verdict == ReplyVerdict::kRideThrough) {
      EXPECT_EQ(d.latest_retry, *row.wait_left - kLastTryMargin) << row.name;
    }
  }
}

TEST(ReplyTest, AnAcquireManyReplyMustFitItsKeys) {
  const std::array<std::uint8_t, 16> two_tokens{1, 0, 0, 0, 0, 0, 0, 0, 2};
  const CallShape call{.type = MessageType::kAcquireMany, .key = "", .key_count = 2};
  struct Row {
    Message reply;
    ReplyVerdict verdict;
  };
  const Row rows[] = {
      {{.type = MessageType::kGrantedMany, .key = "", .tokens_le = two_tokens},
       ReplyVerdict::kComplete},
      {{.type = MessageType::kGrantedMany, .key = "", .tokens_le = std::span(two_tokens).first(8)},
       ReplyVerdict::kMalformed},
      {{.type = MessageType::kBusyMany, .key = "", .index = 1}, ReplyVerdict::kComplete},
      {{.type = MessageType::kBusyMany, .key = "", .index = 2}, ReplyVerdict::kMalformed},
      {{.type = MessageType::kTimeout, .key = ""}, ReplyVerdict::kComplete},  // its key is empty
  };
  for (const Row& row : rows) {
    EXPECT_EQ(decide_reply(call, row.reply, kNow).verdict, row.verdict)
        << to_string(row.reply.type) << " index " << int{row.reply.index};
  }
}

TEST(ReplyTest, ErrorsByReplyType) {
  const std::pair<MessageType, std::error_code> rows[] = {
      {MessageType::kGranted, {}},
      {MessageType::kReleased, {}},
      {MessageType::kHoldersReply, {}},
      {MessageType::kBusy, LeaseErrc::kBusy},
      {MessageType::kBusyMany, LeaseErrc::kBusy},
      {MessageType::kTimeout, LeaseErrc::kTimeout},
      {MessageType::kRecovering, LeaseErrc::kRecovering},
      {MessageType::kNotOwner, LeaseErrc::kNotOwner},
      {MessageType::kExpired, LeaseErrc::kExpired},
      {MessageType::kRedirect, LeaseErrc::kExpired},
      {MessageType::kError, LeaseErrc::kServerError},
  };
  for (const auto& [type, error] : rows) EXPECT_EQ(error_for(type), error) << to_string(type);
}

TEST(ReplyTest, ResultCopiesTheListsOutOfTheDatagram) {
  std::vector<std::uint8_t> holders;
  ASSERT_TRUE(append_holder_entry({.owner = {.lo = 7, .hi = 8},
                                   .token = 9,
                                   .ttl_left_ms = 1500,
                                   .flags = kHolderFlagPending,
                                   .value = "leader"},
                                  holders));
  const Message reply{.type = MessageType::kHoldersReply,
                      .key = "k",
                      .mode = LeaseMode::kShared,
                      .holders = 3,
                      .first_holder = 2,
                      .holder_list_count = 1,
                      .holder_list = holders};
  const CallResult r = result_of(reply);
  EXPECT_FALSE(r.error);
  EXPECT_EQ(r.reply, MessageType::kHoldersReply);
  EXPECT_EQ(r.holders, 3U);
  EXPECT_EQ(r.first_holder, 2U);
  ASSERT_EQ(r.holder_list.size(), 1U);
  EXPECT_EQ(r.holder_list[0], (HolderInfo{.owner = {.lo = 7, .hi = 8},
                                          .token = 9,
                                          .ttl_left = 1500ms,
                                          .pending = true,
                                          .value = "leader"}));
}

struct RedirectRow {
  const char* name;
  std::uint64_t node_epoch;
  std::optional<std::uint64_t> call_epoch;
  std::optional<std::uint64_t> map_epoch;
  unsigned redirects;
  RedirectStep step;
  unsigned redirects_after;
};

const RedirectRow kRedirects[] = {
    {"not in cluster mode", 3, std::nullopt, std::nullopt, 0, RedirectStep::kGiveUp, 0},
    {"a node behind our map", 4, 5, 5, 0, RedirectStep::kAskAgainSoon, 0},
    {"a node behind, at the hop limit", 4, 5, 5, kMaxRedirects, RedirectStep::kAskAgainSoon,
     kMaxRedirects},
    {"a node with a newer map", 6, 5, 5, 0, RedirectStep::kAwaitNewerMap, 1},
    {"routed under an older map", 5, 4, 5, 0, RedirectStep::kGoToOwner, 1},
    {"routed before any map", 5, std::nullopt, 5, 0, RedirectStep::kGoToOwner, 1},
    {"a node behind a call routed under an older map", 3, 4, 5, 0, RedirectStep::kGoToOwner, 1},
    {"the same map, another owner", 5, 5, 5, 0, RedirectStep::kAskAgainSoon, 1},
    {"the last hop allowed", 5, 5, 5, kMaxRedirects - 1, RedirectStep::kAskAgainSoon,
     kMaxRedirects},
    {"one hop too many", 6, 5, 5, kMaxRedirects, RedirectStep::kGiveUp, kMaxRedirects + 1},
};

TEST(ReplyTest, RedirectStepsByTable) {
  for (const RedirectRow& row : kRedirects) {
    unsigned redirects = row.redirects;
    EXPECT_EQ(next_redirect_step(row.node_epoch, row.call_epoch, row.map_epoch, redirects),
              row.step)
        << row.name;
    EXPECT_EQ(redirects, row.redirects_after) << row.name;
  }
}

}  // namespace
}  // namespace shardlock::lease::internal
