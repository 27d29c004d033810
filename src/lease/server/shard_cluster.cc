// The shard's entry points beside the request path: the cluster gate, the
// hot-key rows, replication (the journal, snapshots, takeovers) and the
// parts of ACQUIRE_MANY requests. See internal/shard.h.
#include <algorithm>
#include <string>
#include <utility>

#include "shardlock/lease/server/internal/shard.h"
#include "shardlock/lease/wire/epoch_token.h"

namespace shardlock::lease::internal {

// ---- Cluster mode ------------------------------------------------------------

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
  watches_.end_early([this](std::string_view key) { return foreign(key); });
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

std::size_t Shard::count_leases(const std::function<bool(std::string_view key)>& pred) const {
  std::size_t n = 0;
  for (const auto& [key, state] : keys_) {
    if (pred(key.text)) n += state.holders.size();
  }
  return n;
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

// ---- Hot keys and replication -----------------------------------------------

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

void Shard::take_journal(std::vector<replication::Entry>& out) { journal_.take(out); }

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
      out.push_back(
          ReplicationJournal::entry(replication::EntryKind::kGrant, bucket, journaled(h), 0));
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
  Holder* h = &new_holder(state, ref, holder.mode, holder.permits, holder.owner);
  state = h->state;
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

// ---- ACQUIRE_MANY parts ------------------------------------------------------

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
    return may_hold(m.client) ? PartState::kFree : PartState::kLimit;
  }
  if (!same_kind(*state, m.mode, 0)) return PartState::kKindMismatch;
  if (state->waiters.empty() && fits(*state, m.mode)) {
    return may_hold(m.client) ? PartState::kFree : PartState::kLimit;
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
  Holder* h = &new_holder(it == keys_.end() ? nullptr : &it->second, key, m.mode, 0, m.client);
  // Pending until the request's wait runs out, plus its TTL: it outlives the
  // request, which completes (confirm) or gives up (abandon) by then.
  hold(*h, m.request_id, token, m.mode, m.ttl_ms, std::max(m.wait_deadline_ms, now_ms));
  h->pending = true;
  part.token = token;
  count(StatCounter::kGrants);
  return token;
}

std::optional<WireError> Shard::queue(MultiAcquire& m, std::size_t part, std::int64_t now_ms) {
  const MultiAcquire::Part& p = m.parts[part];
  const auto it = keys_.find(KeyRef{p.key, p.hash});
  // probe() said busy under this lock: cannot happen.
  if (it == keys_.end()) return WireError::kLimitExceeded;
  KeyState& state = it->second;
  if (const auto refusal = queue_refusal(m.client, state)) {
    count(StatCounter::kLimitRejections);
    return refusal;
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
  return std::nullopt;
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
