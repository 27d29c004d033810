// DeferredReply: an answer a shard decided after its request (a queued
// ACQUIRE handed the key or timed out, a parked WATCH woken), and the step of
// an ACQUIRE_MANY a shard hands back to the Dispatcher. The shard appends
// them to the caller's vector; LeaseServer sends them.
//
// Not API: the shard's (shard.h) and its units' output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shardlock/lease/wire/internal/peer.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease::internal {

struct MultiAcquire;  // shard.h

// An answer decided after its request: a queued ACQUIRE granted on hand-off,
// or timed out.
struct DeferredReply {
  Peer peer;
  ClientId client;
  std::uint64_t request_id = 0;
  // kGranted, kTimeout, kError, or (the cluster gate refused the grant)
  // kRedirect or kRecovering.
  MessageType type = MessageType::kGranted;
  std::string key;
  std::uint64_t token = 0;
  std::uint32_t ttl_ms = 0;
  std::uint64_t epoch = 0;           // kRedirect
  std::uint32_t retry_after_ms = 0;  // kRecovering
  WireError error = WireError::kInternal;
  // Bytes this reply may take: what the queueing datagram left for it
  // (anti-amplification); LeaseServer withholds a larger reply.
  std::uint16_t reply_credit = 0;
  // kHoldersReply (a WATCH's answer): the key's summary and a tail page of
  // its holders, as HOLDERS_REPLY carries them (holder_entries is the
  // holder list's bytes).
  LeaseMode mode = LeaseMode::kExclusive;
  std::uint32_t permits = 0;
  std::uint32_t waiters = 0;
  std::uint32_t holders = 0;
  std::uint32_t first_holder = 0;
  std::uint8_t holder_list_count = 0;
  std::vector<std::uint8_t> holder_entries;
  // Not a reply but a step of this ACQUIRE_MANY for the Dispatcher: its
  // queued part was granted (kGranted; `multi->taken` counts it), its wait
  // ran out (kTimeout), or a token could not be issued (kError).
  MultiAcquire* multi = nullptr;

  // A view of this reply; valid while *this is.
  [[nodiscard]] Message message() const noexcept {
    Message m;
    m.type = type;
    m.request_id = request_id;
    m.key = key;
    m.token = token;
    m.ttl_ms = ttl_ms;
    m.error = error;
    m.epoch = epoch;
    m.retry_after_ms = retry_after_ms;
    m.mode = mode;
    m.permits = permits;
    m.waiters = waiters;
    m.holders = holders;
    m.first_holder = first_holder;
    m.holder_list_count = holder_list_count;
    m.holder_list = holder_entries;
    return m;
  }
};

// A deferred answer to the parked request `r` (a queued ACQUIRE or a parked
// WATCH): where it goes and the bytes it may take.
template <class Parked>
[[nodiscard]] DeferredReply addressed_to(const Parked& r) {
  DeferredReply out;
  out.peer = r.peer;
  out.client = r.client;
  out.request_id = r.request_id;
  out.reply_credit = r.reply_credit;
  return out;
}

// The holder-list bytes a WATCH's HOLDERS_REPLY for a key of `key_length`
// bytes may carry within `reply_credit` bytes, framed as a single message (a
// later answer is one; a batch item's header is smaller than the datagram
// header counted here).
[[nodiscard]] constexpr std::size_t watch_reply_room(std::size_t reply_credit,
                                                     std::size_t key_length) noexcept {
  const std::size_t fixed =
      kHeaderSize + message_body(MessageType::kHoldersReply)->fixed_size() + key_length;
  return reply_credit > fixed ? reply_credit - fixed : 0;
}

}  // namespace shardlock::lease::internal
