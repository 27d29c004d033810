// The per-shard lease state machine: the request path, the lease table and
// its FIFO hand-off. See internal/shard.h; WATCH is in shard_watch.cc, and
// the cluster, replication and ACQUIRE_MANY entry points in shard_cluster.cc.
#include "shardlock/lease/server/internal/shard.h"

#include <algorithm>
#include <iterator>
#include <new>

#include "shardlock/lease/wire/epoch_token.h"

namespace shardlock::lease::internal {

namespace {

// RENEW, RELEASE and the single-key ACQUIREs: the requests that change the
// table and are remembered for their retransmissions.
bool is_mutating(MessageType type) noexcept {
  return (is_acquire(type) && type != MessageType::kAcquireMany) || type == MessageType::kRenew ||
         type == MessageType::kRelease;
}

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

Shard::Shard(std::uint32_t index, const ShardLimits& limits, ShardTokens tokens,
             std::int64_t now_ms)
    : index_(index),
      limits_(limits),
      tokens_(tokens),
      floor_epoch_(cluster::token_epoch(limits.token_floor)),
      wheel_(now_ms),
      keys_(16),
      answers_(limits.dedup_capacity, limits.hash_seed, counters_),
      waiter_index_(16, SeededHash{limits.hash_seed}),
      usage_(ClientUsage::Limits{.max_leases = limits.max_leases_per_client,
                                 .max_waiters = limits.max_waiters_per_client,
                                 .max_watches = limits.max_watches_per_client},
             limits.hash_seed, limits.tenant_usage),
      watches_(WatchRegistry::Limits{.max_watches = limits.max_watches,
                                     .max_watches_per_key = limits.max_watches_per_key},
               limits.hash_seed, wheel_, usage_, watched_table_, counters_),
      hot_keys_(limits.hot_keys, kMaxKeyLength, limits.hot_key_half_life_ms, now_ms) {}

Shard::~Shard() {
  for (auto& [key, state] : keys_) {
    for (Waiter& w : state.waiters) wheel_.cancel(w);
    for (Holder& h : state.holders) wheel_.cancel(h);
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

std::optional<WireError> Shard::invalid(const Message& request) const noexcept {
  const bool acquire = is_acquire(request.type);
  if (request.key.size() < kMinKeyLength) return WireError::kBadKey;
  if (request.key.size() > kMaxKeyLength) return WireError::kKeyTooLong;
  if ((acquire || request.type == MessageType::kRenew) &&
      (request.ttl_ms == 0 || request.ttl_ms > limits_.max_ttl_ms)) {
    return WireError::kTtlOutOfRange;
  }
  if ((acquire || request.type == MessageType::kWatch) && request.wait_ms > limits_.max_wait_ms) {
    return WireError::kWaitOutOfRange;
  }
  if (request.type == MessageType::kAcquirePermit &&
      (request.permits == 0 || request.permits > kMaxPermits)) {
    return WireError::kPermitsOutOfRange;
  }
  return std::nullopt;
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

bool Shard::handle(const ClientId& client, const Peer& peer, const Message& request,
                   std::uint64_t key_hash, std::int64_t now_ms, Message& reply,
                   std::vector<DeferredReply>& deferred, std::uint16_t reply_credit,
                   HolderPage* page) {
  const RequestContext ctx{
      .client = client,
      .peer = peer,
      .request = request,
      .key = KeyRef{request.key, key_hash},
      .fingerprint = is_mutating(request.type) ? AnswerLog::fingerprint(request.type, key_hash) : 0,
      .reply_credit = reply_credit,
      .now_ms = now_ms};
  ShardReply out(reply, ctx, counters_, answers_);
  answer(ctx, out, deferred, page);
  watches_.wake(now_ms, deferred);
  // Every request a key gets counts, refused ones too (they are traffic);
  // an empty key is no key.
  if (!request.key.empty()) {
    hot_keys_.record(key_hash, request.key, out.answered() && reply.type == MessageType::kBusy,
                     now_ms);
  }
  return out.answered();
}

void Shard::answer(const RequestContext& ctx, ShardReply& out, std::vector<DeferredReply>& deferred,
                   HolderPage* page) {
  count(StatCounter::kRequests);
  const Message& request = ctx.request;
  const bool mutating = is_mutating(request.type);
  const bool acquire = mutating && is_acquire(request.type);
  if (!mutating && request.type != MessageType::kQuery &&
      request.type != MessageType::kQueryHolders && request.type != MessageType::kWatch) {
    // ACQUIRE_MANY is the Dispatcher's (it spans shards); STATS too.
    out.fail(WireError::kNotARequest);
    return;
  }
  if (const auto error = invalid(request)) {
    out.fail(*error);
    return;
  }
  // A WATCH too: the holders of the lock-delay are unknown, so no version
  // read now could be trusted.
  if ((acquire || request.type == MessageType::kWatch) &&
      ctx.now_ms < limits_.recovering_until_ms) {
    out.message().retry_after_ms = static_cast<std::uint32_t>(
        std::min<std::int64_t>(limits_.recovering_until_ms - ctx.now_ms, UINT32_MAX));
    out.answer(MessageType::kRecovering, StatCounter::kRecovering);
    if (acquire) out.remember_refusal();
    return;
  }
  if (mutating && replay(ctx, out)) return;
  // RELEASE is never gated: a lease this node granted ends here, whoever
  // owns the key now, and ending it early only shortens a hand-off.
  if (request.type != MessageType::kRelease) {
    if (const auto verdict = gate_verdict(request.key, ctx.now_ms);
        verdict != ClusterGate::Verdict::kGrant) {
      refuse_by_gate(verdict, out.message());
      if (acquire) out.remember_refusal();
      return;
    }
  }
  try {
    decide(ctx, out, deferred, page);
  } catch (const std::bad_alloc&) {
    // Every step allocates before it changes state, so the shard is as it
    // was before this request (a token may have been skipped).
    out.fail(WireError::kResourceExhausted, StatCounter::kAllocationFailures);
  }
}

bool Shard::replay(const RequestContext& ctx, ShardReply& out) noexcept {
  const RememberedAnswer* cached = answers_.find(ctx.client, ctx.request.request_id);
  if (cached == nullptr) return false;
  if (cached->fingerprint != ctx.fingerprint) {
    out.fail(WireError::kRequestIdReused);
    return true;
  }
  count(StatCounter::kRetransmits);
  if (cached->type == MessageType::kAcquire) {  // still queued
    out.park();
    return true;
  }
  Message& reply = out.message();
  // In cluster mode a grant is answered again only while its key may be
  // granted here. With replication its first answer may have been dropped
  // unsent (Replicator::set_layout()) because its backups changed or this
  // node lost the bucket, and a backup that never had the grant may have
  // taken the key over since; the answer is then held behind the streams as
  // they are now (Dispatcher::send_reply()). Without, a key that moved away
  // is the new owner's to answer.
  if (cached->type == MessageType::kGranted && gate_) {
    if (const auto verdict = gate_verdict(ctx.request.key, ctx.now_ms);
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

void Shard::decide(const RequestContext& ctx, ShardReply& out, std::vector<DeferredReply>& deferred,
                   HolderPage* page) {
  KeyState* state = find_live(ctx.key, ctx.now_ms, deferred);
  switch (ctx.request.type) {
    case MessageType::kRenew:
    case MessageType::kRelease:
      renew_or_release(ctx, state, out, deferred);
      return;
    case MessageType::kQuery:
      query(state, ctx.now_ms, out.message());
      return;
    case MessageType::kQueryHolders:
      list_holders(state, ctx.request, ctx.now_ms, page, out.message());
      return;
    case MessageType::kWatch:
      watch(ctx, state, out, page);
      return;
    default:  // the single-key ACQUIREs
      acquire(ctx, state, out);
      return;
  }
}

void Shard::renew_or_release(const RequestContext& ctx, KeyState* state, ShardReply& out,
                             std::vector<DeferredReply>& deferred) {
  const Message& request = ctx.request;
  Message& reply = out.message();
  Holder* holder = nullptr;
  const OwnerCheck check = check_owner(state, ctx.client, request.token, holder);
  if (check == OwnerCheck::kExpired) {
    out.answer(MessageType::kExpired, StatCounter::kExpiredReplies);
  } else if (check == OwnerCheck::kNotOwner) {
    out.answer(MessageType::kNotOwner, StatCounter::kNotOwner);
  } else if (request.type == MessageType::kRenew) {
    if (request.request_id <= holder->last_request_id) {
      // Older than a request of this holder already applied: a late
      // duplicate or a replay. Applying it could move the deadline back (a
      // shorter TTL) or extend a lease whose holder is gone; answer the time
      // surely left instead, which moves nothing.
      reply.ttl_ms = ttl_left(*holder, ctx.now_ms);
      out.answer(MessageType::kRenewed, StatCounter::kStaleRequests);
    } else {
      holder->last_request_id = request.request_id;
      wheel_.schedule(*holder, deadline_for(ctx.now_ms, request.ttl_ms));
      reply.ttl_ms = request.ttl_ms;
      out.answer(MessageType::kRenewed, StatCounter::kRenewed);
    }
  } else {
    out.answer(MessageType::kReleased, StatCounter::kReleased);
    drop_holder(*holder, ctx.now_ms, deferred);  // may erase *state
  }
  out.remember();
}

void Shard::query(const KeyState* state, std::int64_t now_ms, Message& reply) noexcept {
  reply.type = MessageType::kQueryReply;
  if (state == nullptr) return;
  reply.held = true;
  for (const Holder& h : state->holders) reply.token = std::max(reply.token, h.token);
  reply.ttl_ms = ttl_left(*state, now_ms);
  reply.waiters = static_cast<std::uint32_t>(state->waiters.size());
  reply.holders = static_cast<std::uint32_t>(state->holders.size());
  reply.permits = state->permits;
  reply.mode = key_mode(*state);
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

std::uint64_t Shard::next_token(ShardReply& out) {
  const std::uint64_t token = issue_token();
  // Not remembered: a retry may succeed once the disk recovers.
  if (token == 0) out.fail(WireError::kInternal);
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
  usage_.add_lease(client);  // may throw: nothing changed yet
  if (spare_holders_.empty()) {
    try {
      state.holders.emplace_back();
    } catch (...) {
      usage_.drop_lease(client);
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

Shard::Holder& Shard::new_holder(KeyState* state, const KeyRef& key, LeaseMode mode,
                                 std::uint32_t permits, const ClientId& client) {
  if (state != nullptr) return add_holder(*state, client);
  KeyState& added = add_key(key, mode, permits);  // may throw: nothing changed
  try {
    return add_holder(added, client);
  } catch (...) {
    keys_.erase(keys_.find(*added.key));
    throw;
  }
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

void Shard::grant(Holder& h, const RequestContext& ctx, LeaseMode mode, std::uint64_t token,
                  std::string&& value, ShardReply& out) noexcept {
  h.value = std::move(value);  // before hold(), which journals it
  hold(h, ctx.request.request_id, token, mode, ctx.request.ttl_ms, ctx.now_ms);
  Message& reply = out.message();
  reply.token = token;
  reply.ttl_ms = ctx.request.ttl_ms;
  out.answer(MessageType::kGranted, StatCounter::kGrants);
  out.remember();
}

void Shard::acquire(const RequestContext& ctx, KeyState* held, ShardReply& out) {
  const Message& request = ctx.request;
  const LeaseMode mode = mode_of(request.type);
  // The holder value (kItemFlagValue), copied before anything changes: the
  // grant or the queueing below then only moves it.
  std::string value(request.value);
  if (held == nullptr) {
    if (const auto refusal = hold_refusal(ctx.client)) {
      out.refuse(*refusal);
      return;
    }
    const std::uint64_t token = next_token(out);
    if (token == 0) return;
    grant(new_holder(nullptr, ctx.key, mode, request.permits, ctx.client), ctx, mode, token,
          std::move(value), out);
    return;
  }

  KeyState& state = *held;
  // A retransmission of a queued request whose dedup entry was evicted must
  // not queue a second time, nor be taken below for a stale request of a
  // lease the client also holds on the key (a second permit or read): it is
  // still queued, and a BUSY would make the client drop the grant to come.
  if (waiter_index_.contains(RequestKey{ctx.client, request.request_id})) {
    out.park();
    return;
  }
  if (!same_kind(state, mode, request.permits)) {
    out.fail(WireError::kLeaseKindMismatch);
    out.remember();
    return;
  }
  if (answer_holder(ctx, state, out)) return;
  if (state.waiters.empty() && fits(state, mode)) {
    // Another shared holder, or another permit.
    if (const auto refusal = hold_refusal(ctx.client)) {
      out.refuse(*refusal);
      return;
    }
    const std::uint64_t token = next_token(out);
    if (token == 0) return;
    grant(add_holder(state, ctx.client), ctx, mode, token, std::move(value), out);
    return;
  }
  if (request.wait_ms == 0) {
    out.message().ttl_ms = ttl_left(state, ctx.now_ms);
    out.answer(MessageType::kBusy, StatCounter::kBusy);
    out.remember();
    return;
  }
  if (const auto refusal = queue_refusal(ctx.client, state)) {
    out.refuse(*refusal);
    return;
  }
  Waiter& w = enqueue(state, ctx.client, request.request_id);
  w.peer = ctx.peer;
  w.ttl_ms = request.ttl_ms;
  w.mode = mode;
  w.fingerprint = ctx.fingerprint;
  w.reply_credit = ctx.reply_credit;
  w.value = std::move(value);
  wheel_.schedule(w, ctx.now_ms + request.wait_ms);
  count(StatCounter::kQueued);
  out.remember_queued();
  out.park();
}

bool Shard::answer_holder(const RequestContext& ctx, const KeyState& state,
                          ShardReply& out) noexcept {
  const std::uint64_t request_id = ctx.request.request_id;
  for (const Holder& h : state.holders) {
    if (!(h.owner == ctx.client) || h.pending) continue;
    if (request_id == h.request_id) {
      // The granting ACQUIRE again, past its dedup entry: the same grant,
      // with the TTL it has left.
      out.message().token = h.token;
      out.message().ttl_ms = ttl_left(h, ctx.now_ms);
      out.answer(MessageType::kGranted, StatCounter::kRetransmits);
      return true;
    }
    if (request_id <= h.last_request_id) {
      // Older than what this holder had applied: a late duplicate or a
      // replay. Granting it would give two Lease objects one token, or take
      // a second hold nobody asked for; it gets BUSY, and nothing changes.
      out.message().ttl_ms = ttl_left(h, ctx.now_ms);
      out.answer(MessageType::kBusy, StatCounter::kStaleRequests);
      return true;
    }
    // A new request of an owner that holds the key: a contender like any
    // other ("One owner, one grant", docs/lease-server.md). Re-granting it
    // would leave the earlier handle believing it holds a lease that is
    // gone; acquire() then makes an exclusive holder's request BUSY or wait
    // in FIFO order, and lets a shared or permit holder take one more hold.
  }
  return false;
}

Shard::Waiter& Shard::enqueue(KeyState& state, const ClientId& client, std::uint64_t request_id) {
  // Everything that allocates comes first, undone if a later step throws.
  const RequestKey id{client, request_id};
  const auto slot = waiter_index_.try_emplace(id, nullptr).first;
  Waiter* queued = nullptr;
  try {
    usage_.add_waiter(client);
    try {
      queued = &new_waiter(state);
    } catch (...) {
      usage_.drop_waiter(client);
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
  usage_.drop_lease(h.owner);
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
      // The dedup entry said "queued"; a retransmission must now get this.
      remember(w,
               RememberedAnswer{
                   .type = refusal.type, .ttl_ms = refusal.retry_after_ms, .token = refusal.epoch});
    } else {
      hand_off(state, w, now_ms, deferred);
    }
    retire_waiter(state, state.waiters.begin());
  }
  if (state.holders.empty()) erase(state);
}

void Shard::hand_off(KeyState& state, Waiter& w, std::int64_t now_ms,
                     std::vector<DeferredReply>& deferred) {
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
    remember(w, RememberedAnswer{.type = MessageType::kError});
    return;
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
    remember(w,
             RememberedAnswer{.type = MessageType::kGranted, .ttl_ms = w.ttl_ms, .token = token});
  }
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
    if (foreign(WatchRegistry::key_of(node))) {
      watches_.redirect(node, gate_->epoch, deferred);
    } else {
      watches_.expire(node, now_ms, deferred);
    }
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
  remember(w, RememberedAnswer{.type = MessageType::kTimeout});
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
  waiter_index_.erase(RequestKey{waiter->client, waiter->request_id});
  usage_.drop_waiter(waiter->client);
  if (spare_waiters_.size() < kMaxSpareWaiters) {
    spare_waiters_.splice(spare_waiters_.end(), state.waiters, waiter);
  } else {
    state.waiters.erase(waiter);
  }
}

void Shard::advance(std::int64_t now_ms, std::vector<DeferredReply>& deferred) {
  wheel_.advance(now_ms, [&](TimerNode& node) { on_timer(node, now_ms, deferred); });
  watches_.wake(now_ms, deferred);
}

}  // namespace shardlock::lease::internal
