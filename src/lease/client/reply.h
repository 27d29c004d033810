// reply.h: what one reply means for the call it answers. Private to
// src/lease/.
//
// Two pure decisions the call engine makes for every reply it matches by
// request id, kept apart from its I/O thread and its mutex so each can be
// tested by a table (tests/lease/client/reply_test.cc) and shared with the
// Python client as vectors (clients/python/tests/reply_vectors.json, written
// by tests/lease/client/reply_vectors_test.cc):
//
//   decide_reply()        the reply -> ignore it, count it malformed, follow
//                         a REDIRECT, ride through a RECOVERING, or complete
//                         the call with result_of() of it;
//   next_redirect_step()  a REDIRECT followed -> ask the node again soon,
//                         wait for a newer map, go to the owner under the
//                         current map, or give up.
//
// Neither reads the clock, draws a random number or touches a socket: the
// engine passes the time and the map epochs in and does what they say
// (CallEngine::on_datagram() and follow_redirect()).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

#include "shardlock/lease/client/call.h"

namespace shardlock::lease::internal {

// A waiting acquire whose retry would fall after its wait ends tries once
// more this long before the end instead; with less than this left it
// reports RECOVERING.
inline constexpr std::chrono::milliseconds kLastTryMargin{10};

// What of a call decides how its replies are read.
struct CallShape {
  MessageType type = MessageType::kQuery;
  std::string_view key;        // empty for ACQUIRE_MANY (its TIMEOUT carries none)
  std::uint8_t key_count = 0;  // ACQUIRE_MANY: the keys asked
  // An acquire or a WATCH with a wait: when the wait ends; zero otherwise.
  LeaseClock::time_point wait_end{};
};

enum class ReplyVerdict : std::uint8_t {
  kIgnore,       // not this call's answer (type or key): a stray or late datagram
  kMalformed,    // answers the call's type, but cannot be its answer: counted, the call waits on
  kRedirect,     // REDIRECT: follow it (next_redirect_step())
  kRideThrough,  // RECOVERING within the wait: send again (fresh id) after the delay
  kComplete,     // the call ends with result_of(reply)
};

struct ReplyDecision {
  ReplyVerdict verdict = ReplyVerdict::kIgnore;
  // kRideThrough: the latest the retry may wait (the wait's end less
  // kLastTryMargin); the engine sends it after min(retry_delay(hint), this).
  LeaseClock::duration latest_retry{};
};

// How `reply` bears on `call` at `now`: ignored unless it answers the
// call's type (reply_answers()) and, for a reply that carries a key, the
// call's key; a REDIRECT is followed whatever the call; a RECOVERING rides
// through while more than kLastTryMargin of the call's wait is left; a
// GRANTED_MANY without a token per key or a BUSY_MANY naming no key asked is
// malformed; anything else completes the call. Pure.
[[nodiscard]] ReplyDecision decide_reply(const CallShape& call, const Message& reply,
                                         LeaseClock::time_point now) noexcept;

// The error a completing reply of `type` means: none for the successes,
// kBusy, kTimeout, kRecovering, kNotOwner, kExpired (EXPIRED; a REDIRECT
// maps there too, although decide_reply() follows every REDIRECT, so none
// completes a call), else kServerError.
[[nodiscard]] std::error_code error_for(MessageType type) noexcept;

// The result a completing reply gives: its error (error_for()) and every
// field it carries, lists copied out of the datagram. The call's own fields
// (first_sent, request_id, owner, transmissions, node) are the caller's.
[[nodiscard]] CallResult result_of(const Message& reply);

enum class RedirectStep : std::uint8_t {
  kGiveUp,         // complete kRedirected: not in cluster mode, or too many hops
  kAskAgainSoon,   // the same node, after kRedirectRetry (fresh id)
  kAwaitNewerMap,  // park until a map refresh from the redirecting node ends
  kGoToOwner,      // route under the current map and send now (fresh id)
};

// What a call answered REDIRECT does next, from the redirecting node's map
// epoch, the epoch the call was routed with (nullopt: before any map), the
// client's current map epoch (nullopt: no map, not in cluster mode) and the
// REDIRECTs the call followed so far, which it counts up for a hop:
//   * a node behind the map that routed the call will catch up: ask it
//     again soon, not a hop;
//   * past kMaxRedirects hops: give up;
//   * a node with a newer map: wait for ours to catch up;
//   * a call routed under an older map than ours: go to its owner now;
//   * the same map, yet another owner (mid-change): ask again soon.
// Pure.
[[nodiscard]] RedirectStep next_redirect_step(std::uint64_t node_epoch,
                                              std::optional<std::uint64_t> call_epoch,
                                              std::optional<std::uint64_t> map_epoch,
                                              unsigned& redirects) noexcept;

}  // namespace shardlock::lease::internal
