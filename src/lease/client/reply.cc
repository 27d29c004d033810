// What one reply means for the call it answers. See reply.h.
#include "client/reply.h"

#include <string>

namespace shardlock::lease::internal {
namespace {

// Whether a reply that answers the call's type is well formed for this very
// call: a GRANTED_MANY must carry a token per key asked, and a BUSY_MANY
// must name one of them. Anything else would hand the caller leases it
// cannot match to keys.
bool fits_call(const CallShape& call, const Message& reply) noexcept {
  switch (reply.type) {
    case MessageType::kGrantedMany:
      return reply.listed_token_count() == call.key_count;
    case MessageType::kBusyMany:
      return reply.index < call.key_count;
    default:
      return true;
  }
}

void copy_members(const Message& m, CallResult& r) {
  r.member_count = m.member_count;
  r.first_member = m.first_member;
  r.members.reserve(m.member_list_count);
  for (const MemberEntry& e : MemberList(m)) {
    r.members.push_back(MapMember{std::string(e.id), std::string(e.address), e.weight});
  }
}

void copy_holders(const Message& m, CallResult& r) {
  r.first_holder = m.first_holder;
  r.holder_list.reserve(m.holder_list_count);
  for (const HolderEntry& e : HolderList(m)) {
    r.holder_list.push_back(HolderInfo{.owner = e.owner,
                                       .token = e.token,
                                       .ttl_left = std::chrono::milliseconds(e.ttl_left_ms),
                                       .pending = (e.flags & kHolderFlagPending) != 0,
                                       .value = std::string(e.value)});
  }
}

void copy_hot_keys(const Message& m, CallResult& r) {
  r.window_ms = m.window_ms;
  r.hot_keys.reserve(m.hot_key_count);
  for (const HotKeyEntry& e : HotKeyList(m)) {
    r.hot_keys.push_back(
        HotKeyInfo{std::string(e.key), e.requests, e.error, e.busy, e.holders, e.waiters});
  }
}

void copy_stats(const Message& m, CallResult& r) {
  r.shard_count = m.shard_count;
  r.first_shard = m.first_shard;
  for (std::size_t i = 0; i < kStatCounterCount; ++i) r.counters[i] = m.counter_at(i);
  r.counters_sent = m.counters_le.size() / 8;
  r.shard_tokens.reserve(m.shard_token_count());
  for (std::size_t i = 0; i < m.shard_token_count(); ++i)
    r.shard_tokens.push_back(m.shard_token(i));
}

}  // namespace

ReplyDecision decide_reply(const CallShape& call, const Message& reply,
                           LeaseClock::time_point now) noexcept {
  if (!reply_answers(call.type, reply.type) ||
      (reply_carries_key(reply.type) && reply.key != call.key)) {
    return {};
  }
  // Followed once the round's completions have run (follow_redirects()).
  if (reply.type == MessageType::kRedirect) return {.verdict = ReplyVerdict::kRedirect};
  if (reply.type == MessageType::kRecovering && call.wait_end != LeaseClock::time_point{}) {
    // A waiting acquire rides through the lock-delay while its wait lasts.
    // A hint that runs past the wait is cut to a last try just before it
    // ends: the caller asked to wait that long, and a node may be ready
    // sooner than it said (a failover, a lock-delay ending early).
    const LeaseClock::duration left = call.wait_end - now;
    if (left > kLastTryMargin) {
      return {.verdict = ReplyVerdict::kRideThrough, .latest_retry = left - kLastTryMargin};
    }
  }
  // Decodes, but cannot be this call's answer: counted, and the call waits
  // for a good one (or its deadline).
  if (!fits_call(call, reply)) return {.verdict = ReplyVerdict::kMalformed};
  return {.verdict = ReplyVerdict::kComplete};
}

std::error_code error_for(MessageType type) noexcept {
  switch (type) {
    case MessageType::kGranted:
    case MessageType::kGrantedMany:
    case MessageType::kRenewed:
    case MessageType::kReleased:
    case MessageType::kQueryReply:
    case MessageType::kStatsReply:
    case MessageType::kMapReply:
    case MessageType::kHoldersReply:
    case MessageType::kHotKeysReply:
      return {};
    case MessageType::kBusy:
    case MessageType::kBusyMany:
      return LeaseErrc::kBusy;
    case MessageType::kTimeout:
      return LeaseErrc::kTimeout;
    case MessageType::kRecovering:
      return LeaseErrc::kRecovering;
    case MessageType::kNotOwner:
      return LeaseErrc::kNotOwner;
    case MessageType::kExpired:
    case MessageType::kRedirect:
      return LeaseErrc::kExpired;
    default:
      return LeaseErrc::kServerError;
  }
}

CallResult result_of(const Message& m) {
  CallResult r;
  r.error = error_for(m.type);
  r.reply = m.type;
  r.token = m.token;
  r.ttl_ms = m.ttl_ms;
  r.retry_after_ms = m.retry_after_ms;
  r.wire_error = m.error;
  r.held = m.held;
  r.waiters = m.waiters;
  r.mode = m.mode;
  r.holders = m.holders;
  r.permits = m.permits;
  r.busy_index = m.index;
  r.epoch = m.epoch;
  switch (m.type) {
    case MessageType::kGrantedMany:
      r.tokens.reserve(m.listed_token_count());
      for (std::size_t i = 0; i < m.listed_token_count(); ++i)
        r.tokens.push_back(m.listed_token(i));
      break;
    case MessageType::kMapReply:
      copy_members(m, r);
      break;
    case MessageType::kHoldersReply:
      copy_holders(m, r);
      break;
    case MessageType::kHotKeysReply:
      copy_hot_keys(m, r);
      break;
    case MessageType::kStatsReply:
      copy_stats(m, r);
      break;
    default:
      break;
  }
  return r;
}

RedirectStep next_redirect_step(std::uint64_t node_epoch, std::optional<std::uint64_t> call_epoch,
                                std::optional<std::uint64_t> map_epoch,
                                unsigned& redirects) noexcept {
  if (!map_epoch) return RedirectStep::kGiveUp;  // not in cluster mode
  // The node is behind our map, which routed the call to it: it will catch
  // up. Not a hop, since the owner did not move.
  if (node_epoch < *map_epoch && call_epoch == map_epoch) return RedirectStep::kAskAgainSoon;
  if (++redirects > kMaxRedirects) return RedirectStep::kGiveUp;
  // Its map is newer: wait for ours to catch up, asking that node first.
  if (node_epoch > *map_epoch) return RedirectStep::kAwaitNewerMap;
  // Routed under an older map than ours (refreshed since it was sent): its
  // owner may have moved.
  if (call_epoch != map_epoch) return RedirectStep::kGoToOwner;
  // The same map, yet another owner: the node is mid-change or
  // misconfigured. Bounded by kMaxRedirects.
  return RedirectStep::kAskAgainSoon;
}

}  // namespace shardlock::lease::internal
