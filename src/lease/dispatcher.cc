// The request path between the I/O loops and the shards. See dispatcher.h.
#include "dispatcher.h"

#include <algorithm>
#include <new>
#include <utility>

#include "shardlock/lease/internal/string_key.h"
#include "shardlock/lock_guard.h"

namespace shardlock::lease::internal {

Dispatcher::Dispatcher(DispatcherOptions options, std::vector<std::unique_ptr<Shard>> shards)
    : options_(std::move(options)) {
  shards_.reserve(shards.size());
  for (auto& shard : shards) {
    auto slot = std::make_unique<ShardSlot>();
    LockGuard lock(slot->mu);
    slot->shard = std::move(shard);
    shards_.push_back(std::move(slot));
  }
  for (unsigned w = 0; w < std::max(1U, options_.workers); ++w) {
    workers_.push_back(std::make_unique<Worker>());
  }
}

Dispatcher::~Dispatcher() = default;

std::int64_t Dispatcher::now_ms() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(options_.clock()).count();
}

namespace {

// The shard of a key hash: its high 32 bits scaled to [0, shards), leaving
// the low bits, which the shard's table indexes with, independent of it.
std::size_t shard_index(std::uint64_t key_hash, std::size_t shards) noexcept {
  return static_cast<std::size_t>(((key_hash >> 32) * shards) >> 32);
}

}  // namespace

std::size_t Dispatcher::shard_of(std::string_view key) const noexcept {
  return shard_index(hash_key(key, options_.key_seed), shards_.size());
}

void Dispatcher::handle(unsigned worker, std::span<const std::uint8_t> bytes, const Peer& peer,
                        std::vector<OutDatagram>& replies) noexcept {
  Worker& w = *workers_[worker];
  try {
    decide(w, bytes, peer, replies);
  } catch (const std::bad_alloc&) {
    // Given up whole: the client retransmits. Answers already decided for
    // waiters are remembered by their shards, so their retransmissions get
    // them too.
    w.deferred.clear();
    count(allocation_failures_);
  }
}

void Dispatcher::tick(unsigned worker, std::vector<OutDatagram>& replies) noexcept {
  Worker& w = *workers_[worker];
  try {
    const std::int64_t now = now_ms();
    for (std::size_t s = worker; s < shards_.size(); s += workers_.size()) {
      ShardSlot& slot = *shards_[s];
      if (slot.timers.load(std::memory_order_relaxed) == 0) continue;  // see ShardSlot::timers
      LockGuard lock(slot.mu);
      slot.shard->advance(now, w.deferred);
      slot.note_timers();
    }
    send_deferred(w, replies);
  } catch (const std::bad_alloc&) {
    w.deferred.clear();
    count(allocation_failures_);
  }
}

void Dispatcher::send_reply(const Datagram& d, std::size_t budget, const Peer& peer,
                            std::vector<OutDatagram>& replies) {
  // No source ever gets more reply bytes than it sent (before any auth tag).
  if (encoded_size(d) > budget) {
    count(amplification_drops_);
    return;
  }
  OutDatagram& o = replies.emplace_back();
  std::size_t written = 0;
  const std::size_t room = o.bytes.size() - (options_.auth_key ? kAuthTagSize : 0);
  if (encode(d, std::span(o.bytes).first(room), written) != ProtocolError::kOk) {
    replies.pop_back();  // cannot happen for replies within the request's size
    return;
  }
  if (options_.auth_key) written = seal_datagram(o.bytes, written, *options_.auth_key);
  o.peer = peer;
  o.length = static_cast<std::uint16_t>(written);
}

void Dispatcher::send_deferred(Worker& w, std::vector<OutDatagram>& replies) {
  for (const DeferredReply& d : w.deferred) {
    if (d.type == MessageType::kError) {
      options_.log("cannot issue a token to a waiter on a key; answered ERROR(internal)");
    }
    w.reply.count = 0;
    w.reply.batch = false;
    w.reply.client_id = d.client;
    (void)w.reply.push(d.message());
    w.reply.request_id = d.request_id;
    send_reply(w.reply, d.reply_credit, d.peer, replies);
  }
  w.deferred.clear();
}

void Dispatcher::refuse_unpadded(Worker& w, std::size_t budget, const Peer& peer,
                                 std::vector<OutDatagram>& replies) {
  // ERROR items are smaller than request items, but not than reply-type
  // items sent here (RELEASED has an empty body): send_reply() withholds
  // what does not fit.
  for (const Message& m : w.request.items()) {
    Message e;
    e.type = MessageType::kError;
    e.request_id = m.request_id;
    e.error = WireError::kRequestTooSmall;
    (void)w.reply.push(e);
    count(errors_);
  }
  send_reply(w.reply, budget, peer, replies);
}

void Dispatcher::decide(Worker& w, std::span<const std::uint8_t> bytes, const Peer& peer,
                        std::vector<OutDatagram>& replies) {
  // 1. A sealed datagram reaching a server without a key fails too: it
  // cannot be checked, and its sender expects sealed replies.
  bool rejected =
      bytes.size() > kHeaderFlagsOffset && (bytes[kHeaderFlagsOffset] & kFlagAuthenticated) != 0;
  if (options_.auth_key) {
    bytes = open_datagram(bytes, *options_.auth_key);
    rejected = bytes.empty();
  }
  if (rejected) {
    count(auth_failures_);
    return;
  }
  // 2.
  const ProtocolError err = decode(bytes, w.request);
  w.reply.count = 0;
  w.reply.batch = w.request.batch;
  w.reply.client_id = w.request.client_id;
  w.reply.request_id = w.request.request_id;
  if (err == ProtocolError::kUnsupportedVersion) {
    // Answered in our version so the sender learns why; only if it fits.
    count(errors_);
    Message m;
    m.type = MessageType::kError;
    m.request_id = w.request.request_id;
    m.error = WireError::kUnsupportedVersion;
    w.reply.batch = false;
    (void)w.reply.push(m);
    send_reply(w.reply, bytes.size(), peer, replies);
    return;
  }
  if (err != ProtocolError::kOk) {
    count(malformed_);
    return;
  }
  // 3.
  const std::size_t bound = max_immediate_reply_size(w.request);
  if (bound > bytes.size()) {
    refuse_unpadded(w, bytes.size(), peer, replies);
    return;
  }
  // The padding beyond the bound pays either for queued ACQUIREs' later
  // answers (deferred_reply_credit) or for one STATS page, never both.
  std::size_t stats_slack = bytes.size() - bound;
  for (const Message& m : w.request.items()) {
    if (may_answer_later(m)) stats_slack = 0;
  }
  // 4.
  const std::int64_t now = now_ms();
  for (std::size_t i = 0; i < w.request.count; ++i) {
    const Message& m = w.request.messages[i];
    Message r;
    r.request_id = m.request_id;
    if (m.type == MessageType::kStats) {
      fill_stats(w, m, stats_slack, r);
      stats_slack = 0;  // one page per datagram
    } else if (!is_request(m.type)) {
      r.type = MessageType::kError;
      r.error = WireError::kNotARequest;
      count(errors_);
    } else {
      const std::uint64_t key_hash = hash_key(m.key, options_.key_seed);
      ShardSlot& slot = *shards_[shard_index(key_hash, shards_.size())];
      const ClientId owner = m.owner.value_or(w.request.client_id);
      const auto credit = static_cast<std::uint16_t>(
          std::min(deferred_reply_credit(w.request, bytes.size(), i), kMaxDatagramSize));
      LockGuard lock(slot.mu);
      const bool answered =
          slot.shard->handle(owner, peer, m, key_hash, now, r, w.deferred, credit);
      slot.note_timers();
      if (!answered) continue;
      if (r.type == MessageType::kError && r.error == WireError::kInternal) {
        options_.log("shard " + std::to_string(slot.shard->index()) +
                     ": cannot issue a token: " + slot.shard->last_error());
      }
    }
    (void)w.reply.push(r);
  }
  // 5.
  if (w.reply.count > 0) send_reply(w.reply, bytes.size(), peer, replies);
  send_deferred(w, replies);
}

void Dispatcher::fill_stats(Worker& w, const Message& request, std::size_t slack, Message& reply) {
  reply.type = MessageType::kStatsReply;
  reply.shard_count = static_cast<std::uint32_t>(shards_.size());
  reply.first_shard = request.first_shard;
  for (const auto& slot : shards_) {
    LockGuard lock(slot->mu);
    const auto& c = slot->shard->counters();
    for (std::size_t i = 0; i < kStatCounterCount; ++i) reply.counters[i] += c[i];
  }
  add_own_counters(reply.counters);
  w.stats_tokens.clear();
  for (std::size_t s = request.first_shard;
       s < shards_.size() && w.stats_tokens.size() + 8 <= slack; ++s) {
    std::uint64_t token = 0;
    {
      LockGuard lock(shards_[s]->mu);
      token = shards_[s]->shard->last_token();
    }
    for (int b = 0; b < 8; ++b) {
      w.stats_tokens.push_back(static_cast<std::uint8_t>(token >> (8 * b)));
    }
  }
  reply.shard_tokens_le = w.stats_tokens;
}

void Dispatcher::add_own_counters(
    std::array<std::uint64_t, kStatCounterCount>& counters) const noexcept {
  const auto add = [&](StatCounter c, const std::atomic<std::uint64_t>& value) {
    // Relaxed: statistics, with no ordering against anything else.
    counters[static_cast<std::size_t>(c)] += value.load(std::memory_order_relaxed);
  };
  add(StatCounter::kMalformed, malformed_);
  add(StatCounter::kErrors, errors_);
  add(StatCounter::kAuthFailures, auth_failures_);
  add(StatCounter::kAllocationFailures, allocation_failures_);
  add(StatCounter::kAmplificationDrops, amplification_drops_);
  add(StatCounter::kSendDrops, send_drops_);
}

ServerStats Dispatcher::stats() const {
  ServerStats s;
  for (const auto& slot : shards_) {
    LockGuard lock(slot->mu);
    const auto& c = slot->shard->counters();
    for (std::size_t i = 0; i < kStatCounterCount; ++i) s.counters[i] += c[i];
    s.shard_tokens.push_back(slot->shard->last_token());
  }
  add_own_counters(s.counters);
  return s;
}

}  // namespace shardlock::lease::internal
