// The per-shard lease state machine. See internal/shard.h.
#include "shardlock/lease/server/internal/shard.h"

#include <xxhash.h>

#include <algorithm>
#include <functional>
#include <iterator>
#include <new>

#include "shardlock/lease/wire/epoch_token.h"

namespace shardlock::lease::internal {

Message DeferredReply::message() const noexcept {
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

Shard::Shard(std::uint32_t index, const ShardLimits& limits, ShardTokens tokens,
             std::int64_t now_ms)
    : index_(index),
      limits_(limits),
      tokens_(tokens),
      floor_epoch_(cluster::token_epoch(limits.token_floor)),
      wheel_(now_ms),
      keys_(16),
      dedup_(limits.dedup_capacity, limits.hash_seed),
      waiter_index_(16, SeededHash{limits.hash_seed}),
      usage_(16, SeededHash{limits.hash_seed}),
      watch_index_(16, SeededHash{limits.hash_seed}),
      hot_keys_(limits.hot_keys, kMaxKeyLength, limits.hot_key_half_life_ms, now_ms) {}

std::size_t Shard::SeededHash::operator()(const WaiterId& id) const noexcept {
  const std::uint64_t words[3] = {id.client.lo, id.client.hi, id.request_id};
  return static_cast<std::size_t>(XXH3_64bits_withSeed(words, sizeof words, seed));
}

std::size_t Shard::SeededHash::operator()(const ClientId& id) const noexcept {
  const std::uint64_t words[2] = {id.lo, id.hi};
  return static_cast<std::size_t>(XXH3_64bits_withSeed(words, sizeof words, seed));
}

void Shard::use(const ClientId& owner, long leases, long waiters, long watches) {
  const ClientId client = owner_client(owner);
  auto it = usage_.find(client);
  if (it == usage_.end()) {
    if (leases <= 0 && waiters <= 0 && watches <= 0) return;
    it = usage_.try_emplace(client).first;  // may throw; nothing changed yet
  }
  Usage& u = it->second;
  u.leases = static_cast<std::size_t>(static_cast<long>(u.leases) + leases);
  u.waiters = static_cast<std::size_t>(static_cast<long>(u.waiters) + waiters);
  u.watches = static_cast<std::size_t>(static_cast<long>(u.watches) + watches);
  if (u.leases == 0 && u.waiters == 0 && u.watches == 0) usage_.erase(it);
}

bool Shard::may_hold(const ClientId& owner) const {
  const auto it = usage_.find(owner_client(owner));
  return it == usage_.end() || it->second.leases < limits_.max_leases_per_client;
}

bool Shard::may_queue(const ClientId& owner, const KeyState& state) const {
  if (waiter_index_.size() >= limits_.max_waiters) return false;
  if (state.waiters.size() >= limits_.max_waiters_per_key) return false;
  const auto it = usage_.find(owner_client(owner));
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
    for (Holder& h : state.holders) wheel_.cancel(h);
  }
  for (auto& [key, list] : watches_) {
    for (Watch& w : list.watches) wheel_.cancel(w);
  }
}

std::int64_t Shard::deadline_for(std::int64_t now_ms, std::uint32_t ttl_ms) noexcept {
  // now_ms is the clock truncated to whole milliseconds, up to 1 ms before
  // the true receive time: one more keeps the deadline at or after the true
  // receive time + ttl, which is what a client counts from its send time.
  return now_ms + static_cast<std::int64_t>(ttl_ms) + 1;
}

std::uint32_t Shard::ttl_left(const Holder& h, std::int64_t now_ms) noexcept {
  // The true time may be up to 1 ms past now_ms: report no more than is
  // surely left.
  const std::int64_t left = h.deadline_ms - now_ms - 1;
  return left <= 0 ? 0 : static_cast<std::uint32_t>(std::min<std::int64_t>(left, UINT32_MAX));
}

std::uint32_t Shard::ttl_left(const KeyState& s, std::int64_t now_ms) noexcept {
  std::uint32_t longest = 0;
  for (const Holder& h : s.holders) longest = std::max(longest, ttl_left(h, now_ms));
  return longest;
}

bool Shard::validate(const Message& request, Message& reply) const noexcept {
  reply.type = MessageType::kError;
  const bool acquire = is_acquire(request.type);
  if (request.key.size() < kMinKeyLength) {
    reply.error = WireError::kBadKey;
  } else if (request.key.size() > kMaxKeyLength) {
    reply.error = WireError::kKeyTooLong;
  } else if ((acquire || request.type == MessageType::kRenew) &&
             (request.ttl_ms == 0 || request.ttl_ms > limits_.max_ttl_ms)) {
    reply.error = WireError::kTtlOutOfRange;
  } else if ((acquire || request.type == MessageType::kWatch) &&
             request.wait_ms > limits_.max_wait_ms) {
    reply.error = WireError::kWaitOutOfRange;
  } else if (request.type == MessageType::kAcquirePermit &&
             (request.permits == 0 || request.permits > kMaxPermits)) {
    reply.error = WireError::kPermitsOutOfRange;
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

Shard::OwnerCheck Shard::check_owner(KeyState* state, const ClientId& client, std::uint64_t token,
                                     Holder*& holder) noexcept {
  if (state == nullptr) return OwnerCheck::kExpired;
  for (Holder& h : state->holders) {
    if (h.token != token) continue;
    if (h.pending || !(h.owner == client)) return OwnerCheck::kNotOwner;
    holder = &h;
    return OwnerCheck::kOk;
  }
  // Not the newest holder's token but the newest grant's: shared and permit
  // holders leave in any order, so the lease that ended may have been newer
  // than every holder left.
  return token <= state->newest_token ? OwnerCheck::kExpired : OwnerCheck::kNotOwner;
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

void Shard::remember_refusal(const ClientId& client, std::uint64_t request_id, const Message& reply,
                             std::uint64_t fingerprint) {
  // An ACQUIRE refused for now (RECOVERING, REDIRECT) is asked again under a
  // fresh request id: every client rides through so (CallEngine, the Python
  // and Java clients). A copy of this one still in flight must get the same
  // refusal, never a grant: that grant's answer would reach no call, and its
  // lease would keep the key for the TTL, with the client's next request
  // (the same owner) waiting behind it (the e2e return test's TIMEOUT: a
  // retransmission sent before the RECOVERING arrived was granted just after
  // the bucket went active).
  remember(client, request_id,
           Answer{.type = reply.type,
                  .ttl_ms = reply.type == MessageType::kRecovering ? reply.retry_after_ms : 0,
                  .token = reply.type == MessageType::kRedirect ? reply.epoch : 0,
                  .fingerprint = fingerprint});
}

bool Shard::handle(const ClientId& client, const Peer& peer, const Message& request,
                   std::uint64_t key_hash, std::int64_t now_ms, Message& reply,
                   std::vector<DeferredReply>& deferred, std::uint16_t reply_credit,
                   HolderPage* page) {
  const bool answered =
      answer(client, peer, request, key_hash, now_ms, reply, deferred, reply_credit, page);
  wake_watchers(now_ms, deferred);
  // Every request a key gets counts, refused ones too (they are traffic);
  // an empty key is no key.
  if (!request.key.empty()) {
    hot_keys_.record(key_hash, request.key, answered && reply.type == MessageType::kBusy, now_ms);
  }
  return answered;
}

void Shard::hot_keys(std::int64_t now_ms, std::vector<HotKeyCount>& out) {
  hot_keys_.for_each(now_ms, [&](const HotKeys::Entry& e) {
    HotKeyCount& row = out.emplace_back();
    row.key = e.key;
    row.requests = e.requests;
    row.error = e.error;
    row.busy = e.busy;
    if (const auto it = keys_.find(KeyRef{e.key, e.hash}); it != keys_.end()) {
      row.holders = static_cast<std::uint32_t>(it->second.holders.size());
      row.waiters = static_cast<std::uint32_t>(it->second.waiters.size());
    }
  });
}

bool Shard::answer(const ClientId& client, const Peer& peer, const Message& request,
                   std::uint64_t key_hash, std::int64_t now_ms, Message& reply,
                   std::vector<DeferredReply>& deferred, std::uint16_t reply_credit,
                   HolderPage* page) {
  count(StatCounter::kRequests);
  reply = Message{};
  reply.request_id = request.request_id;
  reply.key = request.key;

  const bool acquire = is_acquire(request.type) && request.type != MessageType::kAcquireMany;
  const bool mutating =
      acquire || request.type == MessageType::kRenew || request.type == MessageType::kRelease;
  if (!mutating && request.type != MessageType::kQuery &&
      request.type != MessageType::kQueryHolders && request.type != MessageType::kWatch) {
    // ACQUIRE_MANY is the Dispatcher's (it spans shards); STATS too.
    reply.type = MessageType::kError;
    reply.error = WireError::kNotARequest;
    count(StatCounter::kErrors);
    return true;
  }
  if (!validate(request, reply)) {
    count(StatCounter::kErrors);
    return true;
  }
  const std::uint64_t fingerprint = mutating ? request_fingerprint(request.type, key_hash) : 0;
  // A WATCH too: the holders of the lock-delay are unknown, so no version
  // read now could be trusted.
  if ((acquire || request.type == MessageType::kWatch) && now_ms < limits_.recovering_until_ms) {
    reply.type = MessageType::kRecovering;
    reply.retry_after_ms = static_cast<std::uint32_t>(
        std::min<std::int64_t>(limits_.recovering_until_ms - now_ms, UINT32_MAX));
    count(StatCounter::kRecovering);
    if (acquire) remember_refusal(client, request.request_id, reply, fingerprint);
    return true;
  }
  const KeyRef key{request.key, key_hash};
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
      // In cluster mode a grant is answered again only while its key may be
      // granted here. With replication its first answer may have been
      // dropped unsent (Replicator::set_layout()) because its backups
      // changed or this node lost the bucket, and a backup that never had
      // the grant may have taken the key over since; the answer is then
      // held behind the streams as they are now (Dispatcher::send_reply()).
      // Without, a key that moved away is the new owner's to answer.
      if (cached->type == MessageType::kGranted && gate_) {
        if (const auto verdict = gate_verdict(request.key, now_ms);
            verdict != ClusterGate::Verdict::kGrant) {
          refuse_by_gate(verdict, reply);
          return true;
        }
      }
      reply.type = cached->type;
      reply.token = cached->token;
      reply.ttl_ms = cached->ttl_ms;
      reply.error = cached->error;
      if (cached->type == MessageType::kRedirect) reply.epoch = cached->token;
      if (cached->type == MessageType::kRecovering) reply.retry_after_ms = cached->ttl_ms;
      return true;
    }
  }
  // RELEASE is never gated: a lease this node granted ends here, whoever
  // owns the key now, and ending it early only shortens a hand-off.
  if (request.type != MessageType::kRelease) {
    if (const auto verdict = gate_verdict(request.key, now_ms);
        verdict != ClusterGate::Verdict::kGrant) {
      refuse_by_gate(verdict, reply);
      if (acquire) remember_refusal(client, request.request_id, reply, fingerprint);
      return true;
    }
  }

  try {
    return decide(client, peer, request, key, fingerprint, reply_credit, now_ms, reply, deferred,
                  page);
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
                   std::int64_t now_ms, Message& reply, std::vector<DeferredReply>& deferred,
                   HolderPage* page) {
  KeyState* state = find_live(key, now_ms, deferred);
  switch (request.type) {
    case MessageType::kRenew:
    case MessageType::kRelease: {
      Holder* holder = nullptr;
      const OwnerCheck check = check_owner(state, client, request.token, holder);
      if (check == OwnerCheck::kExpired) {
        reply.type = MessageType::kExpired;
        count(StatCounter::kExpiredReplies);
      } else if (check == OwnerCheck::kNotOwner) {
        reply.type = MessageType::kNotOwner;
        count(StatCounter::kNotOwner);
      } else if (request.type == MessageType::kRenew) {
        reply.type = MessageType::kRenewed;
        if (request.request_id <= holder->last_request_id) {
          // Older than a request of this holder already applied: a late
          // duplicate or a replay. Applying it could move the deadline back
          // (a shorter TTL) or extend a lease whose holder is gone; answer
          // the time surely left instead, which moves nothing.
          reply.ttl_ms = ttl_left(*holder, now_ms);
          count(StatCounter::kStaleRequests);
        } else {
          holder->last_request_id = request.request_id;
          wheel_.schedule(*holder, deadline_for(now_ms, request.ttl_ms));
          reply.ttl_ms = request.ttl_ms;
          count(StatCounter::kRenewed);
        }
      } else {
        reply.type = MessageType::kReleased;
        count(StatCounter::kReleased);
        drop_holder(*holder, now_ms, deferred);  // may erase *state
      }
      remember(client, request.request_id,
               Answer{.type = reply.type,
                      .ttl_ms = reply.ttl_ms,
                      .token = reply.token,
                      .fingerprint = fingerprint});
      return true;
    }
    case MessageType::kQuery: {
      reply.type = MessageType::kQueryReply;
      if (state != nullptr) {
        reply.held = true;
        for (const Holder& h : state->holders) reply.token = std::max(reply.token, h.token);
        reply.ttl_ms = ttl_left(*state, now_ms);
        reply.waiters = static_cast<std::uint32_t>(state->waiters.size());
        reply.holders = static_cast<std::uint32_t>(state->holders.size());
        reply.permits = state->permits;
        reply.mode = key_mode(*state);
      }
      return true;
    }
    case MessageType::kQueryHolders:
      list_holders(state, request, now_ms, page, reply);
      return true;
    case MessageType::kWatch:
      return watch(client, peer, request, key, state, reply_credit, now_ms, reply, page);
    default: {  // the single-key ACQUIREs
      bool answered = true;
      acquire(client, peer, request, key, state, fingerprint, reply_credit, now_ms, reply,
              answered);
      return answered;
    }
  }
}

LeaseMode Shard::key_mode(const KeyState& state) noexcept {
  if (state.permits != 0) return LeaseMode::kPermit;
  return state.exclusive() ? LeaseMode::kExclusive : LeaseMode::kShared;
}

void Shard::list_holders(const KeyState* state, const Message& request, std::int64_t now_ms,
                         HolderPage* page, Message& reply) {
  reply.type = MessageType::kHoldersReply;
  reply.first_holder = request.first_holder;
  if (page != nullptr) page->entries.clear();
  if (state == nullptr) return;  // free: no holders, no waiters
  reply.mode = key_mode(*state);
  reply.permits = state->permits;
  reply.waiters = static_cast<std::uint32_t>(state->waiters.size());
  reply.holders = static_cast<std::uint32_t>(state->holders.size());
  if (page == nullptr || request.first_holder >= state->holders.size()) return;
  // Oldest grant first, as the list keeps them. Walking to first_holder
  // costs one step per holder skipped (a semaphore's 65535 at most).
  auto it = state->holders.begin();
  std::advance(it, request.first_holder);
  std::uint8_t listed = 0;
  for (; it != state->holders.end() && listed < 0xFF; ++it) {
    const HolderEntry entry{.owner = it->owner,
                            .token = it->token,
                            .ttl_left_ms = ttl_left(*it, now_ms),
                            .flags = it->pending ? kHolderFlagPending : std::uint8_t{0},
                            .value = it->value};
    if (page->entries.size() + holder_entry_size(entry) > page->room) break;
    if (!append_holder_entry(entry, page->entries)) break;
    ++listed;
  }
  reply.holder_list_count = listed;
  reply.holder_list = page->entries;
}

namespace {

LeaseMode mode_of(MessageType acquire) noexcept {
  switch (acquire) {
    case MessageType::kAcquireShared:
      return LeaseMode::kShared;
    case MessageType::kAcquirePermit:
      return LeaseMode::kPermit;
    default:
      return LeaseMode::kExclusive;
  }
}

}  // namespace

bool Shard::fits(const KeyState& state, LeaseMode mode) noexcept {
  switch (mode) {
    case LeaseMode::kExclusive:
      return state.holders.empty();
    case LeaseMode::kShared:
      return !state.exclusive();
    case LeaseMode::kPermit:
      return state.holders.size() < state.permits;
  }
  return false;
}

bool Shard::same_kind(const KeyState& state, LeaseMode mode, std::uint32_t permits) noexcept {
  return mode == LeaseMode::kPermit ? state.permits == permits : state.permits == 0;
}

void Shard::refuse_by_gate(ClusterGate::Verdict verdict, Message& reply) noexcept {
  if (verdict == ClusterGate::Verdict::kRedirect) {
    reply.type = MessageType::kRedirect;
    reply.epoch = gate_->epoch;
    count(StatCounter::kRedirects);
  } else {
    reply.type = MessageType::kRecovering;
    reply.retry_after_ms = gate_->retry_after_ms;
    count(StatCounter::kRecovering);
  }
}

void Shard::set_gate(std::shared_ptr<const ClusterGate> gate) noexcept {
  gate_ = std::move(gate);
  if (!gate_ || !gate_->routing) return;
  last_routing_ = gate_->routing;
  for (const auto& [id, w] : waiter_index_) {
    // Relinking a timer changes neither the index nor any queue.
    if (w->multi != nullptr && lost_a_key(*w->multi)) wheel_.schedule(*w, wheel_.now());
  }
  // A WATCH parked on a key that moved: answered REDIRECT at the next
  // advance(), so its client asks the key's new owner.
  for (const auto& [id, w] : watch_index_) {
    if (foreign(w->list->key->text)) wheel_.schedule(*w, wheel_.now());
  }
}

bool Shard::foreign(std::string_view key) const noexcept {
  if (!gate_ || !gate_->routing) return false;
  const std::size_t bucket = gate_->bucket_of(key);
  return bucket >= gate_->buckets.size() || gate_->buckets[bucket] == ClusterGate::kForeign;
}

bool Shard::lost_a_key(const MultiAcquire& m) const noexcept {
  return std::any_of(m.parts.begin(), m.parts.end(),
                     [this](const MultiAcquire::Part& part) { return foreign(part.key); });
}

std::uint64_t Shard::issue_token() {
  // Cluster mode: the epoch in the high half, a counter from 1 per epoch in
  // the low half. The counter is the durable one less its value before the
  // epoch's first token, so it rises within the epoch across everything this
  // run does; a restart never grants in an epoch it granted in before
  // (ClusterGate::min_grant_epoch), and no run in an epoch at or below the
  // data dir's token floor (gate_verdict()).
  if (gate_ && gate_->epoch != token_epoch_) {
    token_epoch_ = gate_->epoch;
    tokens_.begin_epoch(token_epoch_);
    counter_exhausted_ = false;
  }
  const std::uint64_t raw = tokens_.next(last_error_);
  if (raw == 0 || !gate_) return raw;
  const std::uint64_t token = cluster::compose_token(token_epoch_, raw - tokens_.epoch_base());
  if (token == cluster::kInvalidToken) {
    last_error_ = "the token counter of epoch " + std::to_string(token_epoch_) +
                  " is used up; the node needs a new epoch";
    counter_exhausted_ = true;
  }
  return token;
}

std::size_t Shard::count_leases(const std::function<bool(std::string_view key)>& pred) const {
  std::size_t n = 0;
  for (const auto& [key, state] : keys_) {
    if (pred(key.text)) n += state.holders.size();
  }
  return n;
}

std::uint64_t Shard::next_token(Message& reply) {
  const std::uint64_t token = issue_token();
  if (token == 0) {
    // Not remembered: a retry may succeed once the disk recovers.
    reply.type = MessageType::kError;
    reply.error = WireError::kInternal;
    count(StatCounter::kErrors);
  }
  return token;
}

Shard::KeyState& Shard::add_key(const KeyRef& key, LeaseMode mode, std::uint32_t permits) {
  // The stored key keeps its hash, so the table never hashes the text again.
  const auto it = keys_.try_emplace(HashedKey{std::string(key.text), key.hash}).first;
  KeyState& state = it->second;
  state.key = &it->first;
  state.permits = mode == LeaseMode::kPermit ? permits : 0;
  return state;
}

Shard::Holder& Shard::add_holder(KeyState& state, const ClientId& client) {
  use(client, 1, 0);  // may throw: nothing changed yet
  if (spare_holders_.empty()) {
    try {
      state.holders.emplace_back();
    } catch (...) {
      use(client, -1, 0);
      throw;
    }
  } else {
    state.holders.splice(state.holders.end(), spare_holders_, spare_holders_.begin());
  }
  Holder& h = state.holders.back();
  h.self = std::prev(state.holders.end());
  h.state = &state;
  h.owner = client;
  h.kind = kLeaseExpiry;
  h.pending = false;
  h.value.clear();  // a spare node's; keeps its capacity, frees nothing
  ++leases_;
  return h;
}

void Shard::hold(Holder& h, std::uint64_t request_id, std::uint64_t token, LeaseMode mode,
                 std::uint32_t ttl_ms, std::int64_t now_ms, LeaseEvent event) noexcept {
  h.token = token;
  h.request_id = request_id;
  h.last_request_id = request_id;
  h.mode = mode;
  h.state->newest_token = std::max(h.state->newest_token, token);
  wheel_.schedule(h, deadline_for(now_ms, ttl_ms));
  journal(replication::EntryKind::kGrant, h, ttl_ms);
  log_event(event, h, ttl_ms, now_ms);
  touch(*h.state);
}

void Shard::log_event(LeaseEvent event, const Holder& h, std::uint32_t ttl_ms,
                      std::int64_t now_ms) const noexcept {
  if (grant_log_ == nullptr) return;
  grant_log_->record(event, h.state->key->text, h.owner, h.token, ttl_ms, gate_ != nullptr, now_ms);
}

replication::Entry Shard::holder_entry(replication::EntryKind kind, std::size_t bucket,
                                       const Holder& h, std::uint32_t ttl_ms) {
  replication::Entry e;
  e.kind = kind;
  e.bucket = static_cast<std::uint32_t>(bucket);
  e.key = h.state->key->text;
  e.owner = h.owner;
  e.token = h.token;
  if (kind == replication::EntryKind::kGrant) {
    e.request_id = h.request_id;
    e.mode = h.mode;
    e.permits = h.state->permits;
    e.ttl_ms = ttl_ms;
    e.value = h.value;
  }
  return e;
}

void Shard::journal(replication::EntryKind kind, const Holder& h, std::uint32_t ttl_ms) noexcept {
  if (!gate_ || gate_->replicated.empty() || !gate_->routing) return;
  const std::size_t bucket = gate_->bucket_of(h.state->key->text);
  if (!gate_->replicated_bucket(bucket)) return;
  try {
    journal_.push_back(holder_entry(kind, bucket, h, ttl_ms));
  } catch (const std::bad_alloc&) {
    // take_journal()'s caller starts the streams over from snapshots.
    journal_lost_ = true;
    count(StatCounter::kAllocationFailures);
  }
}

void Shard::take_journal(std::vector<replication::Entry>& out) {
  if (journal_lost_) {
    journal_.clear();
  } else {
    for (replication::Entry& e : journal_) out.push_back(std::move(e));
    journal_.clear();
  }
  journal_lost_ = false;
}

bool Shard::snapshot_all(std::vector<replication::Entry>& out) const {
  // The gate's routing when it has one (set_gate() keeps it), else the last.
  const RouterSnapshot* routing = last_routing_.get();
  if (routing == nullptr) {
    return std::all_of(keys_.begin(), keys_.end(),
                       [](const auto& entry) { return entry.second.holders.empty(); });
  }
  for (const auto& [key, state] : keys_) {
    const std::size_t bucket = routing->bucket_of_hash(routing->hash(key.text));
    for (const Holder& h : state.holders) {
      out.push_back(holder_entry(replication::EntryKind::kGrant, bucket, h, 0));
    }
  }
  return true;
}

bool Shard::inherit(std::string_view key, const replication::ReplicaHolder& holder,
                    std::int64_t expiry_ms) {
  const KeyRef ref{key, key_hash(key)};
  const auto it = keys_.find(ref);
  KeyState* state = it == keys_.end() ? nullptr : &it->second;
  if (state != nullptr) {
    for (Holder& h : state->holders) {
      if (h.owner == holder.owner && h.token == holder.token) {
        if (expiry_ms > h.deadline_ms) wheel_.schedule(h, expiry_ms);
        return true;
      }
    }
    if (!same_kind(*state, holder.mode, holder.permits) || (holder.mode == LeaseMode::kExclusive) ||
        state->exclusive() ||
        (holder.mode == LeaseMode::kPermit && state->holders.size() >= state->permits)) {
      return false;
    }
  }
  std::string value(holder.value);  // may throw: nothing changed yet
  const bool added = state == nullptr;
  if (added) state = &add_key(ref, holder.mode, holder.permits);
  Holder* h = nullptr;
  try {
    h = &add_holder(*state, holder.owner);
  } catch (...) {
    if (added) keys_.erase(keys_.find(*state->key));
    throw;
  }
  h->token = holder.token;
  h->request_id = holder.request_id;
  h->last_request_id = holder.request_id;
  h->mode = holder.mode;
  h->value = std::move(value);
  state->newest_token = std::max(state->newest_token, holder.token);
  wheel_.schedule(*h, expiry_ms);
  touch(*state);
  // This node's own backups need it too.
  journal(replication::EntryKind::kGrant, *h, holder.ttl_ms);
  return true;
}

void Shard::grant(Holder& h, const Message& request, LeaseMode mode, std::uint64_t token,
                  std::string&& value, std::uint64_t fingerprint, std::int64_t now_ms,
                  Message& reply) noexcept {
  h.value = std::move(value);  // before hold(), which journals it
  hold(h, request.request_id, token, mode, request.ttl_ms, now_ms);
  reply.type = MessageType::kGranted;
  reply.token = token;
  reply.ttl_ms = request.ttl_ms;
  count(StatCounter::kGrants);
  remember(h.owner, request.request_id,
           Answer{.type = reply.type,
                  .ttl_ms = reply.ttl_ms,
                  .token = reply.token,
                  .fingerprint = fingerprint});
}

void Shard::acquire(const ClientId& client, const Peer& peer, const Message& request,
                    const KeyRef& key, KeyState* held, std::uint64_t fingerprint,
                    std::uint16_t reply_credit, std::int64_t now_ms, Message& reply,
                    bool& answered) {
  const LeaseMode mode = mode_of(request.type);
  // The holder value (kItemFlagValue), copied before anything changes: the
  // grant or the queueing below then only moves it.
  std::string value(request.value);
  if (held == nullptr) {
    if (leases_ >= limits_.max_keys || !may_hold(client)) {
      refuse(reply);
      return;
    }
    const std::uint64_t token = next_token(reply);
    if (token == 0) return;
    KeyState& state = add_key(key, mode, request.permits);  // may throw: nothing changed
    try {
      grant(add_holder(state, client), request, mode, token, std::move(value), fingerprint, now_ms,
            reply);
    } catch (...) {
      keys_.erase(keys_.find(*state.key));
      throw;
    }
    return;
  }

  KeyState& state = *held;
  // A retransmission of a queued request whose dedup entry was evicted must
  // not queue a second time, nor be taken below for a stale request of a
  // lease the client also holds on the key (a second permit or read): it is
  // still queued, and a BUSY would make the client drop the grant to come.
  if (waiter_index_.contains(WaiterId{client, request.request_id})) {
    answered = false;
    return;
  }
  if (!same_kind(state, mode, request.permits)) {
    reply.type = MessageType::kError;
    reply.error = WireError::kLeaseKindMismatch;
    count(StatCounter::kErrors);
    remember(client, request.request_id,
             Answer{.type = reply.type,
                    .error = WireError::kLeaseKindMismatch,
                    .fingerprint = fingerprint});
    return;
  }
  for (Holder& h : state.holders) {
    if (!(h.owner == client) || h.pending) continue;
    if (request.request_id == h.request_id) {
      // The granting ACQUIRE again, past its dedup entry: the same grant,
      // with the TTL it has left.
      reply.type = MessageType::kGranted;
      reply.token = h.token;
      reply.ttl_ms = ttl_left(h, now_ms);
      count(StatCounter::kRetransmits);
      return;
    }
    if (request.request_id <= h.last_request_id) {
      // Older than what this holder had applied: a late duplicate or a
      // replay. Granting it would give two Lease objects one token, or take
      // a second hold nobody asked for; it gets BUSY, and nothing changes.
      reply.type = MessageType::kBusy;
      reply.ttl_ms = ttl_left(h, now_ms);
      count(StatCounter::kStaleRequests);
      return;
    }
    // A new request of an owner that holds the key: a contender like any
    // other ("One owner, one grant", docs/lease-server.md). Re-granting it
    // would leave the earlier handle believing it holds a lease that is
    // gone; below, an exclusive holder's request is BUSY or waits in FIFO
    // order, and a shared or permit holder's may take one more hold.
  }
  if (state.waiters.empty() && fits(state, mode)) {
    // Another shared holder, or another permit.
    if (leases_ >= limits_.max_keys || !may_hold(client)) {
      refuse(reply);
      return;
    }
    const std::uint64_t token = next_token(reply);
    if (token == 0) return;
    grant(add_holder(state, client), request, mode, token, std::move(value), fingerprint, now_ms,
          reply);
    return;
  }
  if (request.wait_ms == 0) {
    reply.type = MessageType::kBusy;
    reply.ttl_ms = ttl_left(state, now_ms);
    count(StatCounter::kBusy);
    remember(client, request.request_id,
             Answer{.type = reply.type, .ttl_ms = reply.ttl_ms, .fingerprint = fingerprint});
    return;
  }
  if (!may_queue(client, state)) {
    refuse(reply);
    return;
  }
  Waiter& w = enqueue(state, client, request.request_id);
  w.peer = peer;
  w.ttl_ms = request.ttl_ms;
  w.mode = mode;
  w.fingerprint = fingerprint;
  w.reply_credit = reply_credit;
  w.value = std::move(value);
  wheel_.schedule(w, now_ms + request.wait_ms);
  count(StatCounter::kQueued);
  remember(client, request.request_id,
           Answer{.type = MessageType::kAcquire, .fingerprint = fingerprint});
  answered = false;
}

Shard::Waiter& Shard::enqueue(KeyState& state, const ClientId& client, std::uint64_t request_id) {
  // Everything that allocates comes first, undone if a later step throws.
  const WaiterId id{client, request_id};
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
  w.request_id = request_id;
  w.multi = nullptr;
  w.part = 0;
  w.state = &state;
  return w;
}

namespace {

// A deferred answer to the parked request `r` (a Waiter or a Watch): where
// it goes and the bytes it may take.
template <class Parked>
DeferredReply addressed_to(const Parked& r) {
  DeferredReply out;
  out.peer = r.peer;
  out.client = r.client;
  out.request_id = r.request_id;
  out.reply_credit = r.reply_credit;
  return out;
}

}  // namespace

void Shard::defer(const Waiter& w, const KeyState& state, MessageType type, std::uint64_t token,
                  std::vector<DeferredReply>& deferred) noexcept {
  try {
    DeferredReply out = addressed_to(w);
    out.multi = w.multi;
    if (w.multi == nullptr) out.key = state.key->text;
    out.type = type;
    out.token = token;
    out.ttl_ms = type == MessageType::kGranted ? w.ttl_ms : 0;
    out.error = WireError::kInternal;
    if (type == MessageType::kRedirect) out.epoch = gate_->epoch;
    if (type == MessageType::kRecovering) out.retry_after_ms = gate_->retry_after_ms;
    deferred.push_back(std::move(out));
  } catch (const std::bad_alloc&) {
    count(StatCounter::kAllocationFailures);
    // A single ACQUIRE's answer is remembered and its retransmission gets
    // it; an ACQUIRE_MANY's step must not be lost, or it waits forever.
    if (w.multi != nullptr) stall(*w.multi, type);
  }
}

void Shard::drop_holder(Holder& h, std::int64_t now_ms, std::vector<DeferredReply>& deferred,
                        LeaseEvent event) {
  KeyState& state = *h.state;
  journal(replication::EntryKind::kRelease, h, 0);
  log_event(event, h, 0, now_ms);
  touch(state);
  wheel_.cancel(h);
  use(h.owner, -1, 0);
  --leases_;
  spare_holders_.splice(spare_holders_.end(), state.holders, h.self);
  if (spare_holders_.size() > kMaxSpareWaiters) spare_holders_.pop_front();
  serve_waiters(state, now_ms, deferred);  // may erase state
}

void Shard::serve_waiters(KeyState& state, std::int64_t now_ms,
                          std::vector<DeferredReply>& deferred) {
  // Nothing below throws: add_holder() usually reuses the node the holder
  // that left gave back, and a waiter it cannot make a holder (no memory, no
  // token) is answered ERROR; defer() and remember() swallow allocation
  // failures. So a hand-off always completes.
  while (!state.waiters.empty() && fits(state, state.waiters.front().mode)) {
    Waiter& w = state.waiters.front();
    wheel_.cancel(w);
    if (const auto verdict = gate_verdict(state.key->text, now_ms);
        verdict != ClusterGate::Verdict::kGrant) {
      // The key is no longer grantable here (handed off, or the node failed
      // closed): every waiter learns it now instead of at its timeout.
      Message refusal;
      refuse_by_gate(verdict, refusal);
      defer(w, state, refusal.type, 0, deferred);
      if (w.multi == nullptr) {
        // The dedup entry said "queued"; a retransmission must now get this.
        remember(w.client, w.request_id,
                 Answer{.type = refusal.type,
                        .ttl_ms = refusal.retry_after_ms,
                        .token = refusal.epoch,
                        .fingerprint = w.fingerprint});
      }
      retire_waiter(state, state.waiters.begin());
      continue;
    }
    std::uint64_t token = 0;
    try {
      token = issue_token();
    } catch (const std::bad_alloc&) {
      count(StatCounter::kAllocationFailures);  // answered as a failed reservation
    }
    Holder* h = nullptr;
    if (token != 0) {
      try {
        h = &add_holder(state, w.client);
      } catch (const std::bad_alloc&) {
        count(StatCounter::kAllocationFailures);
      }
    }
    if (h == nullptr) {
      defer(w, state, MessageType::kError, 0, deferred);
      count(StatCounter::kErrors);
      if (w.multi == nullptr) {
        remember(w.client, w.request_id,
                 Answer{.type = MessageType::kError, .fingerprint = w.fingerprint});
      }
      retire_waiter(state, state.waiters.begin());
      continue;
    }
    count(StatCounter::kGrants);
    if (w.multi != nullptr) {
      // A part of an ACQUIRE_MANY: held pending until the request completes
      // or gives up, which the Dispatcher decides with every shard it spans.
      MultiAcquire& m = *w.multi;
      hold(*h, m.request_id, token, m.mode, m.ttl_ms, std::max(m.wait_deadline_ms, now_ms),
           LeaseEvent::kHandOff);
      h->pending = true;
      m.parts[w.part].token = token;
      m.taken = w.part + 1;
      defer(w, state, MessageType::kGranted, token, deferred);
    } else {
      h->value = std::move(w.value);  // before hold(), which journals it
      hold(*h, w.request_id, token, w.mode, w.ttl_ms, now_ms, LeaseEvent::kHandOff);
      defer(w, state, MessageType::kGranted, token, deferred);
      remember(w.client, w.request_id,
               Answer{.type = MessageType::kGranted,
                      .ttl_ms = w.ttl_ms,
                      .token = token,
                      .fingerprint = w.fingerprint});
    }
    retire_waiter(state, state.waiters.begin());
  }
  if (state.holders.empty()) erase(state);
}

void Shard::erase(KeyState& state) {
  while (!state.waiters.empty()) {
    wheel_.cancel(state.waiters.front());
    retire_waiter(state, state.waiters.begin());
  }
  keys_.erase(keys_.find(*state.key));
}

void Shard::on_timer(TimerNode& node, std::int64_t now_ms, std::vector<DeferredReply>& deferred) {
  if (node.kind == kLeaseExpiry) {
    count(StatCounter::kExpirations);
    drop_holder(static_cast<Holder&>(node), now_ms, deferred, LeaseEvent::kExpiry);
    return;
  }
  if (node.kind == kWatchTimeout) {
    // Its wait is over, or set_gate() gave its key to another node.
    auto& w = static_cast<Watch&>(node);
    answer_watch(w, foreign(w.list->key->text), now_ms, deferred);
    return;
  }
  auto& w = static_cast<Waiter&>(node);
  KeyState& state = *w.state;
  if (w.multi != nullptr && lost_a_key(*w.multi)) {
    // Ended early by set_gate() (or timed out after the move): the client
    // goes to the new owner.
    defer(w, state, MessageType::kRedirect, 0, deferred);
    count(StatCounter::kRedirects);
  } else {
    defer(w, state, MessageType::kTimeout, 0, deferred);
    count(StatCounter::kTimeouts);
  }
  if (w.multi == nullptr) {
    remember(w.client, w.request_id,
             Answer{.type = MessageType::kTimeout, .fingerprint = w.fingerprint});
  }
  const bool front = w.self == state.waiters.begin();
  retire_waiter(state, w.self);
  // A waiter that gave up at the front may have kept out those behind it (a
  // writer behind readers, readers behind it).
  if (front) serve_waiters(state, now_ms, deferred);
}

Shard::Waiter& Shard::new_waiter(KeyState& state) {
  if (spare_waiters_.empty()) {
    state.waiters.emplace_back();
  } else {
    state.waiters.splice(state.waiters.end(), spare_waiters_, spare_waiters_.begin());
  }
  Waiter& w = state.waiters.back();
  w.self = std::prev(state.waiters.end());
  w.value.clear();  // a spare node's
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
  wake_watchers(now_ms, deferred);
}

// ---- ACQUIRE_MANY parts ----------------------------------------------------

Shard::PartState Shard::probe(const MultiAcquire& m, const MultiAcquire::Part& part,
                              std::int64_t now_ms, std::uint32_t& ttl_left_ms,
                              std::vector<DeferredReply>& deferred) {
  KeyState* state = find_live(KeyRef{part.key, part.hash}, now_ms, deferred);
  switch (gate_verdict(part.key, now_ms)) {
    case ClusterGate::Verdict::kRedirect:
      return PartState::kRedirect;
    case ClusterGate::Verdict::kNotReady:
      return PartState::kNotReady;
    case ClusterGate::Verdict::kGrant:
      break;
  }
  if (state == nullptr) {
    return leases_ >= limits_.max_keys || !may_hold(m.client) ? PartState::kLimit
                                                              : PartState::kFree;
  }
  if (!same_kind(*state, m.mode, 0)) return PartState::kKindMismatch;
  if (state->waiters.empty() && fits(*state, m.mode)) {
    return leases_ >= limits_.max_keys || !may_hold(m.client) ? PartState::kLimit
                                                              : PartState::kFree;
  }
  ttl_left_ms = ttl_left(*state, now_ms);
  return PartState::kBusy;
}

Shard::PriorGrant Shard::prior_grant(const MultiAcquire& m, const MultiAcquire::Part& part,
                                     std::int64_t now_ms, std::uint64_t& token,
                                     std::uint32_t& ttl_left_ms,
                                     std::vector<DeferredReply>& deferred) {
  KeyState* state = find_live(KeyRef{part.key, part.hash}, now_ms, deferred);
  if (state == nullptr) return PriorGrant::kNone;
  PriorGrant found = PriorGrant::kNone;
  // The same rules as a single ACQUIRE by a holder (acquire()).
  for (const Holder& h : state->holders) {
    if (!(h.owner == m.client) || h.pending) continue;
    if (h.request_id == m.request_id) {
      token = h.token;
      ttl_left_ms = ttl_left(h, now_ms);
      return PriorGrant::kThisRequest;
    }
    if (m.request_id <= h.last_request_id) {
      ttl_left_ms = ttl_left(h, now_ms);
      found = PriorGrant::kStale;
    }
  }
  return found;
}

std::uint64_t Shard::take(const MultiAcquire& m, MultiAcquire::Part& part, std::int64_t now_ms) {
  const std::uint64_t token = issue_token();
  if (token == 0) return 0;
  const KeyRef key{part.key, part.hash};
  const auto it = keys_.find(key);
  KeyState* state = it == keys_.end() ? nullptr : &it->second;
  const bool added = state == nullptr;
  if (added) state = &add_key(key, m.mode, 0);
  Holder* h = nullptr;
  try {
    h = &add_holder(*state, m.client);
  } catch (...) {
    if (added) keys_.erase(keys_.find(*state->key));
    throw;
  }
  // Pending until the request's wait runs out, plus its TTL: it outlives the
  // request, which completes (confirm) or gives up (abandon) by then.
  hold(*h, m.request_id, token, m.mode, m.ttl_ms, std::max(m.wait_deadline_ms, now_ms));
  h->pending = true;
  part.token = token;
  count(StatCounter::kGrants);
  return token;
}

bool Shard::queue(MultiAcquire& m, std::size_t part, std::int64_t now_ms) {
  const MultiAcquire::Part& p = m.parts[part];
  const auto it = keys_.find(KeyRef{p.key, p.hash});
  if (it == keys_.end()) return false;  // probe() said busy under this lock: cannot happen
  KeyState& state = it->second;
  if (!may_queue(m.client, state)) {
    count(StatCounter::kLimitRejections);
    return false;
  }
  // The waiter index is keyed by (client, request id); each part waits in
  // its own shard at most once at a time, so the pair is unique here.
  Waiter& w = enqueue(state, m.client, m.request_id);
  w.peer = m.peer;
  w.ttl_ms = m.ttl_ms;
  w.mode = m.mode;
  w.reply_credit = m.reply_credit;
  w.multi = &m;
  w.part = part;
  wheel_.schedule(w, std::max(m.wait_deadline_ms, now_ms));
  count(StatCounter::kQueued);
  return true;
}

Shard::Holder* Shard::pending_holder(const MultiAcquire& m, const MultiAcquire::Part& part) {
  const auto it = keys_.find(KeyRef{part.key, part.hash});
  if (it == keys_.end()) return nullptr;
  for (Holder& h : it->second.holders) {
    if (h.pending && h.token == part.token && h.owner == m.client) return &h;
  }
  return nullptr;
}

void Shard::confirm(const MultiAcquire& m, const MultiAcquire::Part& part, std::int64_t now_ms) {
  Holder* h = pending_holder(m, part);
  if (h == nullptr) return;
  h->pending = false;
  wheel_.schedule(*h, deadline_for(now_ms, m.ttl_ms));
}

void Shard::abandon(const MultiAcquire& m, const MultiAcquire::Part& part, std::int64_t now_ms,
                    std::vector<DeferredReply>& deferred) {
  Holder* h = pending_holder(m, part);
  if (h != nullptr) drop_holder(*h, now_ms, deferred, LeaseEvent::kAbandon);
}

}  // namespace shardlock::lease::internal

namespace shardlock::lease::internal {

// ---- WATCH -------------------------------------------------------------------

Shard::Version Shard::version_of(const KeyState* state) noexcept {
  if (state == nullptr || state->holders.empty()) return {};
  return {state->holders.back().token, static_cast<std::uint32_t>(state->holders.size())};
}

void Shard::list_newest(const KeyState* state, std::size_t room, std::int64_t now_ms,
                        std::vector<std::uint8_t>& entries, Message& reply) {
  reply.type = MessageType::kHoldersReply;
  reply.first_holder = 0;
  reply.holder_list_count = 0;
  if (state == nullptr) return;
  reply.mode = key_mode(*state);
  reply.permits = state->permits;
  reply.waiters = static_cast<std::uint32_t>(state->waiters.size());
  reply.holders = static_cast<std::uint32_t>(state->holders.size());
  const auto entry_of = [now_ms](const Holder& h) {
    return HolderEntry{.owner = h.owner,
                       .token = h.token,
                       .ttl_left_ms = ttl_left(h, now_ms),
                       .flags = h.pending ? kHolderFlagPending : std::uint8_t{0},
                       .value = h.value};
  };
  // Back from the newest while the entries fit, then out oldest first.
  auto first = state->holders.end();
  std::size_t bytes = 0;
  std::uint8_t listed = 0;
  while (first != state->holders.begin() && listed < 0xFF) {
    const std::size_t size = holder_entry_size(entry_of(*std::prev(first)));
    if (bytes + size > room) break;
    bytes += size;
    ++listed;
    --first;
  }
  reply.first_holder = reply.holders - listed;
  for (auto it = first; it != state->holders.end(); ++it) {
    if (!append_holder_entry(entry_of(*it), entries)) break;  // a value the codec refuses
    ++reply.holder_list_count;
  }
}

bool Shard::watch(const ClientId& client, const Peer& peer, const Message& request,
                  const KeyRef& key, const KeyState* state, std::uint16_t reply_credit,
                  std::int64_t now_ms, Message& reply, HolderPage* page) {
  const Version now_version = version_of(state);
  if (request.wait_ms == 0 || !(now_version == Version{request.token, request.holders})) {
    if (page == nullptr) {
      std::vector<std::uint8_t> none;  // no room: stays empty, allocates nothing
      list_newest(state, 0, now_ms, none, reply);
    } else {
      page->entries.clear();
      list_newest(state, page->room, now_ms, page->entries, reply);
      reply.holder_list = page->entries;
    }
    return true;
  }
  if (watch_index_.contains(WaiterId{client, request.request_id})) {
    count(StatCounter::kRetransmits);
    return false;  // parked already
  }
  auto list_it = watches_.find(key);
  if (watch_index_.size() >= limits_.max_watches ||
      (list_it != watches_.end() &&
       list_it->second.watches.size() >= limits_.max_watches_per_key)) {
    refuse(reply);
    return true;
  }
  if (const auto it = usage_.find(owner_client(client));
      it != usage_.end() && it->second.watches >= limits_.max_watches_per_client) {
    refuse(reply);
    return true;
  }
  // Everything that allocates first, undone on a throw: the shard is then
  // as it was.
  const bool added = list_it == watches_.end();
  if (added) {
    list_it = watches_.try_emplace(HashedKey{std::string(key.text), key.hash}).first;
    list_it->second.key = &list_it->first;
  }
  WatchList& list = list_it->second;
  try {
    touched_.reserve(watches_.size());
    list.watches.emplace_back();
    try {
      watch_index_.emplace(WaiterId{client, request.request_id}, &list.watches.back());
      use(client, 0, 0, 1);
    } catch (...) {
      watch_index_.erase(WaiterId{client, request.request_id});
      list.watches.pop_back();
      throw;
    }
  } catch (...) {
    if (added) watches_.erase(list_it);
    throw;
  }
  Watch& w = list.watches.back();
  w.self = std::prev(list.watches.end());
  w.list = &list;
  w.client = client;
  w.request_id = request.request_id;
  w.peer = peer;
  w.since = Version{request.token, request.holders};
  w.reply_credit = reply_credit;
  w.kind = kWatchTimeout;
  wheel_.schedule(w, now_ms + static_cast<std::int64_t>(request.wait_ms));
  return false;
}

void Shard::touch(const KeyState& state) noexcept {
  if (watches_.empty()) return;
  const auto it = watches_.find(KeyRef{state.key->text, state.key->hash});
  if (it == watches_.end() || it->second.touched) return;
  it->second.touched = true;
  touched_.push_back(&it->second);  // within the capacity watch() reserved
}

void Shard::wake_watchers(std::int64_t now_ms, std::vector<DeferredReply>& deferred) noexcept {
  if (touched_.empty()) return;
  // Answering never touches a list, so touched_ stays as it is while this
  // walks it; emptied lists are erased afterwards.
  for (WatchList* list : touched_) {
    const auto it = keys_.find(KeyRef{list->key->text, list->key->hash});
    const Version now_version = version_of(it == keys_.end() ? nullptr : &it->second);
    for (auto w = list->watches.begin(); w != list->watches.end();) {
      Watch& watch = *w++;
      if (watch.since == now_version) continue;
      wheel_.cancel(watch);
      answer_watch(watch, false, now_ms, deferred);
    }
  }
  for (WatchList* list : touched_) {
    list->touched = false;
    if (list->watches.empty()) watches_.erase(watches_.find(*list->key));
  }
  touched_.clear();  // keeps the capacity touch() relies on
}

void Shard::answer_watch(Watch& w, bool redirect, std::int64_t now_ms,
                         std::vector<DeferredReply>& deferred) noexcept {
  try {
    DeferredReply out = addressed_to(w);
    out.key = w.list->key->text;
    if (redirect) {
      out.type = MessageType::kRedirect;
      out.epoch = gate_->epoch;
      count(StatCounter::kRedirects);
    } else {
      const auto it = keys_.find(KeyRef{w.list->key->text, w.list->key->hash});
      Message summary;
      list_newest(it == keys_.end() ? nullptr : &it->second,
                  watch_reply_room(w.reply_credit, out.key.size()), now_ms, out.holder_entries,
                  summary);
      out.type = MessageType::kHoldersReply;
      out.mode = summary.mode;
      out.permits = summary.permits;
      out.waiters = summary.waiters;
      out.holders = summary.holders;
      out.first_holder = summary.first_holder;
      out.holder_list_count = summary.holder_list_count;
    }
    deferred.push_back(std::move(out));
  } catch (const std::bad_alloc&) {
    count(StatCounter::kAllocationFailures);  // its retransmission is answered afresh
  }
  retire_watch(w);
}

void Shard::retire_watch(Watch& w) noexcept {
  WatchList& list = *w.list;
  watch_index_.erase(WaiterId{w.client, w.request_id});
  use(w.client, 0, 0, -1);  // shrinking never allocates
  list.watches.erase(w.self);
  if (list.watches.empty() && !list.touched) watches_.erase(watches_.find(*list.key));
}

}  // namespace shardlock::lease::internal
