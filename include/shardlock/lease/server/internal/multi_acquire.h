// MultiAcquire: one ACQUIRE_MANY in progress, as the Dispatcher keeps it and
// the shards of its keys see it; StalledSteps: a shard's list of the steps
// of such requests it could not hand back for want of memory.
//
// The Dispatcher takes a request's keys in the global order (shard, hash,
// key) through each shard's probe() / take() / queue() (shard.h). A queued
// part's hand-off or timeout is a DeferredReply carrying the request
// (DeferredReply::multi); when that reply cannot be allocated, the step is
// linked into the shard's StalledSteps instead (intrusively: no allocation)
// and the Dispatcher takes it on its next tick.
//
// Not API: the Dispatcher's and the shards' shared record. Not thread-safe
// (the locks of the shards involved guard it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardlock/lease/wire/internal/peer.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease::internal {

// One ACQUIRE_MANY in progress: the Dispatcher owns it; shards see it
// through their pending holders and waiters of its parts.
struct MultiAcquire {
  struct Part {
    std::string key;
    std::uint64_t hash = 0;   // hash_key(key)
    std::uint32_t shard = 0;  // the Dispatcher's shard index
    std::uint8_t index = 0;   // position in the request's key list
    std::uint64_t token = 0;  // once taken
  };
  ClientId client;
  std::uint64_t request_id = 0;
  Peer peer;
  LeaseMode mode = LeaseMode::kExclusive;
  std::uint32_t ttl_ms = 0;
  std::int64_t wait_deadline_ms = 0;  // arrival + wait_ms
  std::uint16_t reply_credit = 0;
  std::uint64_t fingerprint = 0;  // the Dispatcher's, for retransmissions
  std::vector<Part> parts;        // in the global order (shard, hash, key)
  std::size_t taken = 0;          // parts[0, taken) are held, pending until confirmed
  // A step whose DeferredReply could not be allocated waits here, linked in
  // its shard's stalled list (no allocation), for the Dispatcher's next tick.
  MessageType stalled_step = MessageType::kGranted;
  MultiAcquire* next_stalled = nullptr;
};

// The stalled steps of one shard, newest first, linked through
// MultiAcquire::next_stalled.
class StalledSteps {
 public:
  [[nodiscard]] bool empty() const noexcept { return head_ == nullptr; }
  // Links `m`, whose `step` (kGranted, kTimeout, kError or a gate refusal)
  // could not be handed back. Precondition: `m` is in no stalled list.
  void stall(MultiAcquire& m, MessageType step) noexcept {
    m.stalled_step = step;
    m.next_stalled = head_;
    head_ = &m;
  }
  // Unlinks and returns the newest stalled request (its step in
  // stalled_step), or null.
  [[nodiscard]] MultiAcquire* take() noexcept {
    MultiAcquire* m = head_;
    if (m != nullptr) head_ = std::exchange(m->next_stalled, nullptr);
    return m;
  }

 private:
  MultiAcquire* head_ = nullptr;
};

}  // namespace shardlock::lease::internal
