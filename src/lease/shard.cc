// The per-shard lease state machine. See internal/shard.h.
#include "shardlock/lease/internal/shard.h"

#include <xxhash.h>

#include <algorithm>
#include <iterator>
#include <new>

namespace shardlock::lease::internal {

Message DeferredReply::message() const noexcept {
  return Message{.type = type,
                 .request_id = request_id,
                 .key = key,
                 .token = token,
                 .ttl_ms = ttl_ms,
                 .error = error};
}

Shard::Shard(std::uint32_t index, const ShardLimits& limits, ShardTokens tokens,
             std::int64_t now_ms)
    : index_(index),
      limits_(limits),
      tokens_(tokens),
      wheel_(now_ms),
      keys_(16),
      dedup_(limits.dedup_capacity, limits.hash_seed),
      waiter_index_(16, SeededHash{limits.hash_seed}),
      usage_(16, SeededHash{limits.hash_seed}) {}

std::size_t Shard::SeededHash::operator()(const WaiterId& id) const noexcept {
  const std::uint64_t words[3] = {id.client.lo, id.client.hi, id.request_id};
  return static_cast<std::size_t>(XXH3_64bits_withSeed(words, sizeof words, seed));
}

std::size_t Shard::SeededHash::operator()(const ClientId& id) const noexcept {
  const std::uint64_t words[2] = {id.lo, id.hi};
  return static_cast<std::size_t>(XXH3_64bits_withSeed(words, sizeof words, seed));
}

void Shard::use(const ClientId& client, long leases, long waiters) {
  auto it = usage_.find(client);
  if (it == usage_.end()) {
    if (leases <= 0 && waiters <= 0) return;
    it = usage_.try_emplace(client).first;  // may throw; nothing changed yet
  }
  it->second.leases = static_cast<std::size_t>(static_cast<long>(it->second.leases) + leases);
  it->second.waiters = static_cast<std::size_t>(static_cast<long>(it->second.waiters) + waiters);
  if (it->second.leases == 0 && it->second.waiters == 0) usage_.erase(it);
}

bool Shard::may_hold(const ClientId& client) const {
  const auto it = usage_.find(client);
  return it == usage_.end() || it->second.leases < limits_.max_leases_per_client;
}

bool Shard::may_queue(const ClientId& client, const KeyState& state) const {
  if (waiter_index_.size() >= limits_.max_waiters) return false;
  if (state.waiters.size() >= limits_.max_waiters_per_key) return false;
  const auto it = usage_.find(client);
  return it == usage_.end() || it->second.waiters < limits_.max_waiters_per_client;
}

void Shard::refuse(Message& reply) noexcept {
  reply.type = MessageType::kError;
  reply.error = WireError::kLimitExceeded;
  count(StatCounter::kLimitRejections);
  count(StatCounter::kErrors);
}

Shard::~Shard() {
  for (auto& [key, state] : keys_) {
    for (Waiter& w : state.waiters) wheel_.cancel(w);
    wheel_.cancel(state);
  }
}

std::int64_t Shard::deadline_for(std::int64_t now_ms, std::uint32_t ttl_ms) noexcept {
  // now_ms is the clock truncated to whole milliseconds, up to 1 ms before
  // the true receive time: one more keeps the deadline at or after the true
  // receive time + ttl, which is what a client counts from its send time.
  return now_ms + static_cast<std::int64_t>(ttl_ms) + 1;
}

std::uint32_t Shard::ttl_left(const KeyState& s, std::int64_t now_ms) noexcept {
  // The true time may be up to 1 ms past now_ms: report no more than is
  // surely left.
  const std::int64_t left = s.deadline_ms - now_ms - 1;
  return left <= 0 ? 0 : static_cast<std::uint32_t>(std::min<std::int64_t>(left, UINT32_MAX));
}

bool Shard::validate(const Message& request, Message& reply) const noexcept {
  reply.type = MessageType::kError;
  if (request.key.size() < kMinKeyLength) {
    reply.error = WireError::kBadKey;
  } else if (request.key.size() > kMaxKeyLength) {
    reply.error = WireError::kKeyTooLong;
  } else if ((request.type == MessageType::kAcquire || request.type == MessageType::kRenew) &&
             (request.ttl_ms == 0 || request.ttl_ms > limits_.max_ttl_ms)) {
    reply.error = WireError::kTtlOutOfRange;
  } else if (request.type == MessageType::kAcquire && request.wait_ms > limits_.max_wait_ms) {
    reply.error = WireError::kWaitOutOfRange;
  } else {
    return true;
  }
  return false;
}

Shard::KeyState* Shard::find_live(const KeyRef& key, std::int64_t now_ms,
                                  std::vector<DeferredReply>& deferred) {
  // Fire due timers first, so a lease whose expiry tick has not been driven
  // yet is never treated as live, and waiters are handed off in order.
  advance(now_ms, deferred);
  const auto it = keys_.find(key);
  return it == keys_.end() ? nullptr : &it->second;
}

Shard::OwnerCheck Shard::check_owner(const KeyState* state, const ClientId& client,
                                     std::uint64_t token) noexcept {
  if (state == nullptr) return OwnerCheck::kExpired;
  if (state->owner == client && state->token == token) return OwnerCheck::kOk;
  if (token < state->token) return OwnerCheck::kExpired;
  return OwnerCheck::kNotOwner;
}

std::uint64_t Shard::request_fingerprint(MessageType type, std::uint64_t key_hash) noexcept {
  // The key's secret-seeded hash, mixed with the type so that equal keys of
  // different types differ. Two requests that differ collide with
  // probability 2^-64, and the seed is not known to clients.
  const std::uint64_t words[2] = {key_hash, static_cast<std::uint64_t>(type)};
  return XXH3_64bits(words, sizeof words);
}

void Shard::remember(const ClientId& client, std::uint64_t request_id, const Answer& answer) {
  try {
    dedup_.put(client, request_id, answer);
  } catch (const std::bad_alloc&) {
    // Not remembered: a retransmission is decided afresh, which the
    // request-id rules keep safe (same grant, stale, or found queued).
    count(StatCounter::kAllocationFailures);
  }
}

bool Shard::handle(const ClientId& client, const Peer& peer, const Message& request,
                   std::uint64_t key_hash, std::int64_t now_ms, Message& reply,
                   std::vector<DeferredReply>& deferred, std::uint16_t reply_credit) {
  count(StatCounter::kRequests);
  reply = Message{};
  reply.request_id = request.request_id;
  reply.key = request.key;

  const bool mutating = request.type == MessageType::kAcquire ||
                        request.type == MessageType::kRenew ||
                        request.type == MessageType::kRelease;
  if (!mutating && request.type != MessageType::kQuery) {
    reply.type = MessageType::kError;
    reply.error = WireError::kNotARequest;
    count(StatCounter::kErrors);
    return true;
  }
  if (!validate(request, reply)) {
    count(StatCounter::kErrors);
    return true;
  }
  if (request.type == MessageType::kAcquire && now_ms < limits_.recovering_until_ms) {
    reply.type = MessageType::kRecovering;
    reply.retry_after_ms = static_cast<std::uint32_t>(
        std::min<std::int64_t>(limits_.recovering_until_ms - now_ms, UINT32_MAX));
    count(StatCounter::kRecovering);
    return true;
  }
  const KeyRef key{request.key, key_hash};
  const std::uint64_t fingerprint = mutating ? request_fingerprint(request.type, key_hash) : 0;
  if (mutating) {
    if (const Answer* cached = dedup_.find(client, request.request_id); cached != nullptr) {
      if (cached->fingerprint != fingerprint) {
        reply.type = MessageType::kError;
        reply.error = WireError::kRequestIdReused;
        count(StatCounter::kErrors);
        return true;
      }
      count(StatCounter::kRetransmits);
      if (cached->type == MessageType::kAcquire) return false;  // still queued
      reply.type = cached->type;
      reply.token = cached->token;
      reply.ttl_ms = cached->ttl_ms;
      return true;
    }
  }

  try {
    return decide(client, peer, request, key, fingerprint, reply_credit, now_ms, reply, deferred);
  } catch (const std::bad_alloc&) {
    // Every step allocates before it changes state, so the shard is as it
    // was before this request (a token may have been skipped).
    reply.type = MessageType::kError;
    reply.error = WireError::kResourceExhausted;
    count(StatCounter::kAllocationFailures);
    count(StatCounter::kErrors);
    return true;
  }
}

bool Shard::decide(const ClientId& client, const Peer& peer, const Message& request,
                   const KeyRef& key, std::uint64_t fingerprint, std::uint16_t reply_credit,
                   std::int64_t now_ms, Message& reply, std::vector<DeferredReply>& deferred) {
  KeyState* state = find_live(key, now_ms, deferred);
  switch (request.type) {
    case MessageType::kAcquire: {
      bool answered = true;
      acquire(client, peer, request, key, state, fingerprint, reply_credit, now_ms, reply,
              answered);
      return answered;
    }
    case MessageType::kRenew:
    case MessageType::kRelease: {
      const OwnerCheck check = check_owner(state, client, request.token);
      if (check == OwnerCheck::kExpired) {
        reply.type = MessageType::kExpired;
        count(StatCounter::kExpiredReplies);
      } else if (check == OwnerCheck::kNotOwner) {
        reply.type = MessageType::kNotOwner;
        count(StatCounter::kNotOwner);
      } else if (request.type == MessageType::kRenew) {
        reply.type = MessageType::kRenewed;
        if (request.request_id <= state->last_request_id) {
          // Older than a request of this holder already applied: a late
          // duplicate or a replay. Applying it could move the deadline back
          // (a shorter TTL) or extend a lease whose holder is gone; answer
          // the time surely left instead, which moves nothing.
          reply.ttl_ms = ttl_left(*state, now_ms);
          count(StatCounter::kStaleRequests);
        } else {
          state->last_request_id = request.request_id;
          wheel_.schedule(*state, deadline_for(now_ms, request.ttl_ms));
          reply.ttl_ms = request.ttl_ms;
          count(StatCounter::kRenewed);
        }
      } else {
        wheel_.cancel(*state);
        reply.type = MessageType::kReleased;
        count(StatCounter::kReleased);
        hand_off(*state, now_ms, deferred);  // may erase *state
      }
      remember(client, request.request_id,
               Answer{reply.type, reply.token, reply.ttl_ms, fingerprint});
      return true;
    }
    default: {  // kQuery
      reply.type = MessageType::kQueryReply;
      if (state != nullptr) {
        reply.held = true;
        reply.token = state->token;
        reply.ttl_ms = ttl_left(*state, now_ms);
        reply.waiters = static_cast<std::uint32_t>(state->waiters.size());
      }
      return true;
    }
  }
}

std::uint64_t Shard::next_token(Message& reply) {
  const std::uint64_t token = tokens_.next(last_error_);
  if (token == 0) {
    // Not remembered: a retry may succeed once the disk recovers.
    reply.type = MessageType::kError;
    reply.error = WireError::kInternal;
    count(StatCounter::kErrors);
  }
  return token;
}

void Shard::hold(KeyState& state, const ClientId& client, std::uint64_t request_id,
                 std::uint64_t token, std::uint32_t ttl_ms, std::int64_t now_ms) noexcept {
  state.owner = client;
  state.token = token;
  state.request_id = request_id;
  state.last_request_id = request_id;
  wheel_.schedule(state, deadline_for(now_ms, ttl_ms));
}

void Shard::grant(KeyState& state, const ClientId& client, const Message& request,
                  std::uint64_t token, std::uint64_t fingerprint, std::int64_t now_ms,
                  Message& reply) {
  hold(state, client, request.request_id, token, request.ttl_ms, now_ms);
  reply.type = MessageType::kGranted;
  reply.token = token;
  reply.ttl_ms = request.ttl_ms;
  count(StatCounter::kGrants);
  remember(client, request.request_id, Answer{reply.type, reply.token, reply.ttl_ms, fingerprint});
}

void Shard::acquire(const ClientId& client, const Peer& peer, const Message& request,
                    const KeyRef& key, KeyState* held, std::uint64_t fingerprint,
                    std::uint16_t reply_credit, std::int64_t now_ms, Message& reply,
                    bool& answered) {
  if (held == nullptr) {
    if (keys_.size() >= limits_.max_keys || !may_hold(client)) {
      refuse(reply);
      return;
    }
    const std::uint64_t token = next_token(reply);
    if (token == 0) return;
    // May throw: nothing changed. The stored key keeps its hash, so the
    // table never hashes the text again.
    const auto it = keys_.try_emplace(HashedKey{std::string(key.text), key.hash}).first;
    try {
      use(client, 1, 0);
    } catch (...) {
      keys_.erase(it);
      throw;
    }
    KeyState& state = it->second;
    state.key = &it->first;
    state.kind = kLeaseExpiry;
    grant(state, client, request, token, fingerprint, now_ms, reply);
    return;
  }

  KeyState& state = *held;
  if (state.owner == client) {
    if (request.request_id == state.request_id) {
      // The granting ACQUIRE again, past its dedup entry: the same grant,
      // with the TTL it has left.
      reply.type = MessageType::kGranted;
      reply.token = state.token;
      reply.ttl_ms = ttl_left(state, now_ms);
      count(StatCounter::kRetransmits);
      return;
    }
    if (request.request_id <= state.last_request_id) {
      // Older than what this holder had applied: a late duplicate or a
      // replay. Handing it the live grant would give two Lease objects one
      // token; it gets BUSY, and nothing changes.
      reply.type = MessageType::kBusy;
      reply.ttl_ms = ttl_left(state, now_ms);
      count(StatCounter::kStaleRequests);
      return;
    }
    // The holder acquiring again: a new grant with a new token, so the older
    // grant's RELEASE (from a dropped or lost Lease) can never free this one;
    // the old token's RENEW/RELEASE now get EXPIRED. Waiters keep their place.
    const std::uint64_t token = next_token(reply);
    if (token != 0) grant(state, client, request, token, fingerprint, now_ms, reply);
    return;
  }
  if (request.wait_ms == 0) {
    reply.type = MessageType::kBusy;
    reply.ttl_ms = ttl_left(state, now_ms);
    count(StatCounter::kBusy);
    remember(client, request.request_id, Answer{reply.type, 0, reply.ttl_ms, fingerprint});
    return;
  }
  // A retransmission of a queued request whose dedup entry was evicted must
  // not queue a second time.
  const WaiterId id{client, request.request_id};
  if (waiter_index_.find(id) != waiter_index_.end()) {
    answered = false;
    return;
  }
  if (!may_queue(client, state)) {
    refuse(reply);
    return;
  }
  // Everything that allocates comes first, undone if a later step throws.
  const auto slot = waiter_index_.try_emplace(id, nullptr).first;
  Waiter* queued = nullptr;
  try {
    use(client, 0, 1);
    try {
      queued = &new_waiter(state);
    } catch (...) {
      use(client, 0, -1);
      throw;
    }
  } catch (...) {
    waiter_index_.erase(slot);
    throw;
  }
  slot->second = queued;
  Waiter& w = *queued;
  w.kind = kWaitTimeout;
  w.client = client;
  w.request_id = request.request_id;
  w.peer = peer;
  w.ttl_ms = request.ttl_ms;
  w.fingerprint = fingerprint;
  w.reply_credit = reply_credit;
  w.state = &state;
  wheel_.schedule(w, now_ms + request.wait_ms);
  count(StatCounter::kQueued);
  remember(client, request.request_id, Answer{MessageType::kAcquire, 0, 0, fingerprint});
  answered = false;
}

void Shard::defer(const Waiter& w, const KeyState& state, MessageType type, std::uint64_t token,
                  std::vector<DeferredReply>& deferred) noexcept {
  try {
    DeferredReply out;
    out.peer = w.peer;
    out.client = w.client;
    out.request_id = w.request_id;
    out.reply_credit = w.reply_credit;
    out.key = state.key->text;
    out.type = type;
    out.token = token;
    out.ttl_ms = type == MessageType::kGranted ? w.ttl_ms : 0;
    out.error = WireError::kInternal;
    deferred.push_back(std::move(out));
  } catch (const std::bad_alloc&) {
    count(StatCounter::kAllocationFailures);
  }
}

void Shard::hand_off(KeyState& state, std::int64_t now_ms, std::vector<DeferredReply>& deferred) {
  // The holder is gone. Nothing below allocates or throws (use() only
  // adjusts entries that exist; defer() and remember() swallow allocation
  // failures), so a hand-off always completes.
  use(state.owner, -1, 0);
  while (!state.waiters.empty()) {
    Waiter& w = state.waiters.front();
    wheel_.cancel(w);
    std::uint64_t token = 0;
    try {
      token = tokens_.next(last_error_);
    } catch (const std::bad_alloc&) {
      count(StatCounter::kAllocationFailures);  // answered as a failed reservation
    }
    if (token == 0) {
      defer(w, state, MessageType::kError, 0, deferred);
      count(StatCounter::kErrors);
      remember(w.client, w.request_id, Answer{MessageType::kError, 0, 0, w.fingerprint});
      retire_waiter(state, state.waiters.begin());
      continue;
    }
    hold(state, w.client, w.request_id, token, w.ttl_ms, now_ms);
    defer(w, state, MessageType::kGranted, token, deferred);
    count(StatCounter::kGrants);
    remember(w.client, w.request_id, Answer{MessageType::kGranted, token, w.ttl_ms, w.fingerprint});
    use(w.client, 1, 0);  // its entry exists: it counts this waiter
    retire_waiter(state, state.waiters.begin());
    return;
  }
  erase(state);
}

void Shard::erase(KeyState& state) {
  while (!state.waiters.empty()) {
    wheel_.cancel(state.waiters.front());
    retire_waiter(state, state.waiters.begin());
  }
  wheel_.cancel(state);
  keys_.erase(keys_.find(*state.key));
}

void Shard::on_timer(TimerNode& node, std::int64_t now_ms, std::vector<DeferredReply>& deferred) {
  if (node.kind == kLeaseExpiry) {
    count(StatCounter::kExpirations);
    hand_off(static_cast<KeyState&>(node), now_ms, deferred);
    return;
  }
  auto& w = static_cast<Waiter&>(node);
  KeyState& state = *w.state;
  defer(w, state, MessageType::kTimeout, 0, deferred);
  count(StatCounter::kTimeouts);
  remember(w.client, w.request_id, Answer{MessageType::kTimeout, 0, 0, w.fingerprint});
  retire_waiter(state, w.self);
}

Shard::Waiter& Shard::new_waiter(KeyState& state) {
  if (spare_waiters_.empty()) {
    state.waiters.emplace_back();
  } else {
    state.waiters.splice(state.waiters.end(), spare_waiters_, spare_waiters_.begin());
  }
  Waiter& w = state.waiters.back();
  w.self = std::prev(state.waiters.end());
  return w;
}

void Shard::retire_waiter(KeyState& state, std::list<Waiter>::iterator waiter) {
  waiter_index_.erase(WaiterId{waiter->client, waiter->request_id});
  use(waiter->client, 0, -1);
  if (spare_waiters_.size() < kMaxSpareWaiters) {
    spare_waiters_.splice(spare_waiters_.end(), state.waiters, waiter);
  } else {
    state.waiters.erase(waiter);
  }
}

void Shard::advance(std::int64_t now_ms, std::vector<DeferredReply>& deferred) {
  wheel_.advance(now_ms, [&](TimerNode& node) { on_timer(node, now_ms, deferred); });
}

}  // namespace shardlock::lease::internal
