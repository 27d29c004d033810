// The request path's two small types and the answer memory behind them:
//   * RequestContext: the request a shard is deciding, with everything its
//     decision needs (who asked, where a later answer goes, the key and its
//     hash, the retransmission fingerprint, the reply credit, the time).
//   * ShardReply: the one way a decision answers. It fills the reply, counts
//     the outcome in the shard's counters and remembers it for
//     retransmissions, so the error idiom (type, code, counter) is written
//     once; park() marks a request that has no answer yet (queued, parked).
//   * AnswerLog: (client id, request id) -> the answer given (dedup_cache.h),
//     with each entry's request fingerprint.
//
// Not API: Shard's building blocks. Not thread-safe (the shard lock guards
// them). Everything here is inline: it is on every request's path.
#pragma once

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <new>

#include "shardlock/lease/server/internal/dedup_cache.h"
#include "shardlock/lease/server/internal/shard_counters.h"
#include "shardlock/lease/wire/internal/peer.h"
#include "shardlock/lease/wire/internal/string_key.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease::internal {

// One request under decision. A view: every reference outlives the call it
// is passed to.
struct RequestContext {
  const ClientId& client;
  const Peer& peer;  // where a later answer goes
  const Message& request;
  KeyRef key;                      // request.key with its hash
  std::uint64_t fingerprint = 0;   // AnswerLog::fingerprint() of a RENEW, RELEASE or ACQUIRE
  std::uint16_t reply_credit = 0;  // DeferredReply::reply_credit of a later answer
  std::int64_t now_ms = 0;
};

// An answer as remembered. 24 bytes: the dedup ring writes one per request,
// and its size shows in the request path's cache misses (a 40-byte layout
// cost ~8% of the 50-client throughput).
struct RememberedAnswer {
  MessageType type = MessageType::kError;  // kAcquire while the request is queued
  WireError error = WireError::kInternal;  // type kError
  std::uint32_t ttl_ms = 0;                // also a RECOVERING's retry_after_ms
  std::uint64_t token = 0;                 // also a REDIRECT's epoch
  std::uint64_t fingerprint = 0;           // AnswerLog::fingerprint() of the request answered
};
static_assert(sizeof(RememberedAnswer) == 24);

class AnswerLog {
 public:
  // Keeps up to `capacity` answers (FIFO); `seed` keys its index.
  AnswerLog(std::size_t capacity, std::uint64_t seed, ShardCounters& counters)
      : cache_(capacity, seed), counters_(counters) {}

  // The request's type and key (by its hash): what a retransmission must
  // repeat. Two requests that differ collide with probability 2^-64, and the
  // key hash's seed is not known to clients.
  [[nodiscard]] static std::uint64_t fingerprint(MessageType type,
                                                 std::uint64_t key_hash) noexcept {
    // The type mixed in, so that equal keys of different types differ.
    const std::uint64_t words[2] = {key_hash, static_cast<std::uint64_t>(type)};
    return XXH3_64bits(words, sizeof words);
  }

  [[nodiscard]] const RememberedAnswer* find(const ClientId& client,
                                             std::uint64_t request_id) const noexcept {
    return cache_.find(client, request_id);
  }
  // Never throws: an answer that cannot be stored is counted and forgotten
  // (its retransmission is decided afresh, which the request-id rules keep
  // safe: the same grant, stale, or found queued).
  void remember(const ClientId& client, std::uint64_t request_id,
                const RememberedAnswer& answer) noexcept {
    try {
      cache_.put(client, request_id, answer);
    } catch (const std::bad_alloc&) {
      counters_.count(StatCounter::kAllocationFailures);
    }
  }

 private:
  DedupCache<RememberedAnswer> cache_;
  ShardCounters& counters_;
};

class ShardReply {
 public:
  // Answers `request` into `reply` (reset: its request id and key set).
  ShardReply(Message& reply, const RequestContext& request, ShardCounters& counters,
             AnswerLog& answers) noexcept
      : reply_(reply), request_(request), counters_(counters), answers_(answers) {
    reply_ = Message{};
    reply_.type = MessageType::kError;  // until a decision answers
    reply_.request_id = request.request.request_id;
    reply_.key = request.request.key;
  }
  ShardReply(const ShardReply&) = delete;
  ShardReply& operator=(const ShardReply&) = delete;

  // The reply's fields, for the answers that carry more than a type.
  [[nodiscard]] Message& message() noexcept { return reply_; }
  // Whether there is an answer now (false after park()).
  [[nodiscard]] bool answered() const noexcept { return answered_; }

  // Answers `type`, counted in `counter`.
  void answer(MessageType type, StatCounter counter) noexcept {
    reply_.type = type;
    counters_.count(counter);
  }
  // ERROR(`error`), counted in kErrors (and first in `also`, when given).
  void fail(WireError error) noexcept {
    reply_.type = MessageType::kError;
    reply_.error = error;
    counters_.count(StatCounter::kErrors);
  }
  void fail(WireError error, StatCounter also) noexcept {
    counters_.count(also);
    fail(error);
  }
  // A request refused by a limit: ERROR(kLimitExceeded), or the tenant
  // bound's own code (is_limit_exceeded()).
  void refuse(WireError error = WireError::kLimitExceeded) noexcept {
    fail(error, StatCounter::kLimitRejections);
  }
  // No answer now: the request is queued or parked, or a retransmission of
  // one that is.
  void park() noexcept { answered_ = false; }

  // Remembers the reply as the request's answer (RENEW, RELEASE, ACQUIRE).
  void remember() noexcept {
    remember_as(RememberedAnswer{.type = reply_.type,
                                 .error = reply_.error,
                                 .ttl_ms = reply_.ttl_ms,
                                 .token = reply_.token,
                                 .fingerprint = request_.fingerprint});
  }
  // Remembers that the request is queued: its retransmission is not queued
  // again.
  void remember_queued() noexcept {
    remember_as(
        RememberedAnswer{.type = MessageType::kAcquire, .fingerprint = request_.fingerprint});
  }
  // Remembers an ACQUIRE's RECOVERING or REDIRECT. Refused for now, it is
  // asked again under a fresh request id (every client rides through so:
  // CallEngine, the Python and Java clients). A copy of this one still in
  // flight must get the same refusal, never a grant: that grant's answer
  // would reach no call, and its lease would keep the key for the TTL, with
  // the client's next request (the same owner) waiting behind it (the e2e
  // return test's TIMEOUT: a retransmission sent before the RECOVERING
  // arrived was granted just after the bucket went active).
  void remember_refusal() noexcept {
    remember_as(RememberedAnswer{
        .type = reply_.type,
        .ttl_ms = reply_.type == MessageType::kRecovering ? reply_.retry_after_ms : 0,
        .token = reply_.type == MessageType::kRedirect ? reply_.epoch : 0,
        .fingerprint = request_.fingerprint});
  }

 private:
  void remember_as(const RememberedAnswer& answer) noexcept {
    answers_.remember(request_.client, request_.request.request_id, answer);
  }

  Message& reply_;
  const RequestContext& request_;
  ShardCounters& counters_;
  AnswerLog& answers_;
  bool answered_ = true;
};

}  // namespace shardlock::lease::internal
