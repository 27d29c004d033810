// ACQUIRE_MANY across the shards of its keys. See multi_driver.h.
#include "server/multi_driver.h"

#include <xxhash.h>

#include <algorithm>
#include <new>
#include <string>
#include <tuple>
#include <utility>

#include "shardlock/lease/wire/internal/string_key.h"
#include "shardlock/lock_guard.h"

namespace shardlock::lease::internal {

MultiDriver::MultiDriver(Env env)
    : env_(env),
      active_(16, SeededHash{env.key_seed}),
      answers_(env.limits.dedup_capacity, env.key_seed) {}

Shard& MultiDriver::shard_at(std::uint32_t index) SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS {
  return *env_.shards[index]->shard;  // callers hold its lock (lock_parts)
}

// Parts are sorted by shard, so one pass sees each shard once, in ascending
// order: every multi-shard locker takes them in the same order.
void MultiDriver::lock_parts(const MultiAcquire& m) SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS {
  for (std::size_t i = 0; i < m.parts.size(); ++i) {
    if (i == 0 || m.parts[i].shard != m.parts[i - 1].shard)
      env_.shards[m.parts[i].shard]->mu.lock();
  }
}

void MultiDriver::unlock_parts(const MultiAcquire& m) SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS {
  for (std::size_t i = m.parts.size(); i-- > 0;) {
    if (i == 0 || m.parts[i].shard != m.parts[i - 1].shard) {
      ShardSlot& slot = *env_.shards[m.parts[i].shard];
      slot.drain_journal(env_.replicator);
      slot.note_timers();
      slot.mu.unlock();
    }
  }
}

namespace {

// What a retransmission of an ACQUIRE_MANY must repeat: its mode and keys,
// in order.
std::uint64_t many_fingerprint(const Message& m, std::uint64_t seed) noexcept {
  // The mode picks one of three seeds derived from the secret one.
  const std::uint64_t mode_seed =
      seed ^ (0x9E3779B97F4A7C15ULL * (static_cast<std::uint64_t>(m.mode) + 1));
  return XXH3_64bits_withSeed(m.key_list.data(), m.key_list.size(), mode_seed);
}

// Why ACQUIRE_MANY `m` cannot be taken at all, if it cannot.
std::optional<WireError> check_many(const Message& m, const ShardLimits& limits) {
  if (m.mode != LeaseMode::kExclusive && m.mode != LeaseMode::kShared) return WireError::kBadMode;
  if (m.key_count == 0 || m.key_count > kMaxKeysPerRequest) return WireError::kBadKeyList;
  if (m.ttl_ms == 0 || m.ttl_ms > limits.max_ttl_ms) return WireError::kTtlOutOfRange;
  if (m.wait_ms > limits.max_wait_ms) return WireError::kWaitOutOfRange;
  std::array<std::string_view, kMaxKeysPerRequest> keys{};
  std::size_t n = 0;
  for (const std::string_view key : KeyList(m)) {
    if (key.size() < kMinKeyLength) return WireError::kBadKey;
    if (key.size() > kMaxKeyLength) return WireError::kKeyTooLong;
    keys[n++] = key;
  }
  std::sort(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n));
  if (std::adjacent_find(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n)) !=
      keys.begin() + static_cast<std::ptrdiff_t>(n)) {
    return WireError::kBadKeyList;
  }
  return std::nullopt;
}

}  // namespace

void MultiDriver::fill(const MultiAnswer& answer, std::span<std::uint8_t> tokens, Message& reply) {
  reply.type = answer.type;
  reply.ttl_ms = answer.ttl_ms;
  reply.index = answer.index;
  reply.error = answer.error;
  reply.epoch = answer.epoch;
  if (answer.type == MessageType::kRecovering) reply.retry_after_ms = answer.ttl_ms;
  if (answer.type != MessageType::kGrantedMany) return;
  for (std::size_t i = 0; i < answer.count; ++i) {
    for (std::size_t b = 0; b < 8; ++b) {
      tokens[i * 8 + b] = static_cast<std::uint8_t>(answer.tokens[i] >> (8 * b));
    }
  }
  reply.tokens_le = tokens.first(8 * std::size_t{answer.count});
}

std::unique_ptr<MultiAcquire> MultiDriver::build(const ClientId& owner, const Peer& peer,
                                                 const Message& m, std::uint16_t credit,
                                                 std::int64_t now) const {
  auto owned = std::make_unique<MultiAcquire>();
  MultiAcquire& multi = *owned;
  multi.client = owner;
  multi.request_id = m.request_id;
  multi.peer = peer;
  multi.mode = m.mode;
  multi.ttl_ms = m.ttl_ms;
  multi.wait_deadline_ms = now + m.wait_ms;
  multi.reply_credit = credit;
  multi.parts.reserve(m.key_count);
  std::uint8_t index = 0;
  for (const std::string_view key : KeyList(m)) {
    MultiAcquire::Part& part = multi.parts.emplace_back();
    part.key = std::string(key);
    part.hash = hash_key(key, env_.key_seed);
    part.shard = static_cast<std::uint32_t>(shard_index(part.hash, env_.shards.size()));
    part.index = index++;
  }
  std::sort(multi.parts.begin(), multi.parts.end(), [](const auto& a, const auto& b) {
    return std::tie(a.shard, a.hash, a.key) < std::tie(b.shard, b.hash, b.key);
  });
  return owned;
}

void MultiDriver::answer_again(const MultiAcquire& m, const MultiAnswer& cached, std::int64_t now,
                               std::span<std::uint8_t> tokens, Message& reply) {
  if (cached.type == MessageType::kGrantedMany) {
    for (const MultiAcquire::Part& part : m.parts) {
      ShardSlot& slot = *env_.shards[part.shard];
      LockGuard lock(slot.mu);
      if (slot.shard->gate() == nullptr) break;
      if (const auto verdict = slot.shard->verdict(part.key, now);
          verdict != ClusterGate::Verdict::kGrant) {
        slot.shard->refuse_by_gate(verdict, reply);
        return;
      }
    }
  }
  fill(cached, tokens, reply);
}

bool MultiDriver::acquire(const ClientId& owner, const Peer& peer, const Message& m,
                          std::uint16_t credit, std::int64_t now, std::span<std::uint8_t> tokens,
                          Message& reply, std::vector<DeferredReply>& deferred) {
  DispatchCounters& counters = env_.counters;
  DispatchCounters::count(counters.requests);
  const auto refuse = [&](WireError e) {
    reply.type = MessageType::kError;
    reply.error = e;
    DispatchCounters::count(counters.errors);
    return true;
  };
  if (const auto error = check_many(m, env_.limits)) return refuse(*error);
  const std::uint64_t fingerprint = many_fingerprint(m, env_.key_seed);
  if (now < env_.limits.recovering_until_ms) {
    reply.type = MessageType::kRecovering;
    reply.retry_after_ms = static_cast<std::uint32_t>(
        std::min<std::int64_t>(env_.limits.recovering_until_ms - now, UINT32_MAX));
    // Remembered, as finish() remembers a gate's refusal.
    LockGuard lock(mu_);
    try {
      answers_.put(owner, m.request_id,
                   MultiAnswer{.type = MessageType::kRecovering,
                               .ttl_ms = reply.retry_after_ms,
                               .fingerprint = fingerprint});
    } catch (const std::bad_alloc&) {
      DispatchCounters::count(counters.allocation_failures);
    }
    return true;
  }
  // Built whole before it is registered: a registered request that is never
  // stepped would wait forever. An allocation failure here leaves nothing.
  std::unique_ptr<MultiAcquire> owned = build(owner, peer, m, credit, now);
  MultiAcquire& multi = *owned;
  std::optional<MultiAnswer> cached;
  {
    LockGuard lock(mu_);
    if (active_.contains(RequestKey{owner, m.request_id})) return false;  // still waiting
    if (const MultiAnswer* answer = answers_.find(owner, m.request_id)) {
      if (answer->fingerprint != fingerprint) return refuse(WireError::kRequestIdReused);
      cached = *answer;
    } else {
      active_.emplace(RequestKey{owner, m.request_id}, std::move(owned));
    }
  }
  if (cached) {
    answer_again(multi, *cached, now, tokens, reply);
    return true;
  }
  multi.fingerprint = fingerprint;
  lock_parts(multi);
  std::optional<MultiAnswer> answer;
  try {
    answer = step(multi, true, now, deferred);
  } catch (const std::bad_alloc&) {
    abandon(multi, now, deferred);
    answer = MultiAnswer{.type = MessageType::kError, .error = WireError::kResourceExhausted};
    DispatchCounters::count(counters.allocation_failures);
  }
  // Each key is requested once, as a single ACQUIRE of it would be; the
  // key BUSY_MANY names was answered busy.
  for (const MultiAcquire::Part& part : multi.parts) {
    const bool busy =
        answer && answer->type == MessageType::kBusyMany && answer->index == part.index;
    shard_at(part.shard).note_request(part.hash, part.key, busy, now);
  }
  unlock_parts(multi);
  if (!answer) return false;  // queued: `multi` is the shards' now, until its step comes
  if (answer->type == MessageType::kError) DispatchCounters::count(counters.errors);
  fill(*answer, tokens, reply);
  finish(multi, *answer);
  return true;
}

std::optional<MultiAnswer> MultiDriver::resume(const DeferredReply& d, std::int64_t now,
                                               std::vector<DeferredReply>& deferred) {
  MultiAcquire& m = *d.multi;
  std::optional<MultiAnswer> answer;
  lock_parts(m);
  try {
    if (d.type == MessageType::kGranted) {
      answer = step(m, false, now, deferred);
    } else {
      abandon(m, now, deferred);
      answer = MultiAnswer{
          .type = d.type, .ttl_ms = d.retry_after_ms, .epoch = d.epoch, .error = d.error};
    }
  } catch (const std::bad_alloc&) {
    abandon(m, now, deferred);
    answer = MultiAnswer{.type = MessageType::kError, .error = WireError::kResourceExhausted};
    DispatchCounters::count(env_.counters.allocation_failures);
  }
  unlock_parts(m);
  if (answer && answer->type == MessageType::kError) DispatchCounters::count(env_.counters.errors);
  return answer;
}

std::optional<MultiAnswer> MultiDriver::step(MultiAcquire& m, bool first, std::int64_t now,
                                             std::vector<DeferredReply>& deferred) {
  const auto fail = [&](WireError e) {
    abandon(m, now, deferred);
    return MultiAnswer{.type = MessageType::kError, .error = e};
  };
  const auto state_error = [&](Shard::PartState state, Shard& shard) {
    if (state == Shard::PartState::kRedirect || state == Shard::PartState::kNotReady) {
      // The cluster gate refused a key: nothing is held, and the client
      // goes to the owner or tries again (under a fresh request id: finish()).
      abandon(m, now, deferred);
      Message refusal;
      shard.refuse_by_gate(state == Shard::PartState::kRedirect ? ClusterGate::Verdict::kRedirect
                                                                : ClusterGate::Verdict::kNotReady,
                           refusal);
      return MultiAnswer{
          .type = refusal.type, .ttl_ms = refusal.retry_after_ms, .epoch = refusal.epoch};
    }
    if (state == Shard::PartState::kKindMismatch) return fail(WireError::kLeaseKindMismatch);
    // kLimit: which bound, asked again under the same shard lock.
    return fail(shard.part_limit(m));
  };
  if (first) {
    if (auto again = prior_answer(m, now, deferred)) return again;
    // All or nothing: every key is looked at before any is taken.
    for (std::size_t i = 0; i < m.parts.size(); ++i) {
      std::uint32_t ttl_left = 0;
      const Shard::PartState state =
          shard_at(m.parts[i].shard).probe(m, m.parts[i], now, ttl_left, deferred);
      if (state == Shard::PartState::kFree) continue;
      if (state != Shard::PartState::kBusy) return state_error(state, shard_at(m.parts[i].shard));
      if (m.wait_deadline_ms <= now) {
        shard_at(m.parts[i].shard).count_outcome(StatCounter::kBusy);
        return MultiAnswer{
            .type = MessageType::kBusyMany, .ttl_ms = ttl_left, .index = m.parts[i].index};
      }
      break;  // waits: walk below
    }
  }
  // Take keys in the global order; queue on the first busy one.
  for (std::size_t i = m.taken; i < m.parts.size(); ++i) {
    MultiAcquire::Part& part = m.parts[i];
    Shard& shard = shard_at(part.shard);
    std::uint32_t ttl_left = 0;
    const Shard::PartState state = shard.probe(m, part, now, ttl_left, deferred);
    if (state == Shard::PartState::kBusy) {
      if (const auto refusal = shard.queue(m, i, now)) return fail(*refusal);
      return std::nullopt;
    }
    if (state != Shard::PartState::kFree) return state_error(state, shard);
    if (shard.take(m, part, now) == 0) {
      env_.log("shard " + std::to_string(shard.index()) +
               ": cannot issue a token: " + shard.last_error());
      return fail(WireError::kInternal);
    }
    m.taken = i + 1;
  }
  // A gate published while the request waited may have moved or closed a
  // key taken earlier: none may become a lease then.
  for (const MultiAcquire::Part& part : m.parts) {
    Shard& shard = shard_at(part.shard);
    switch (shard.verdict(part.key, now)) {
      case ClusterGate::Verdict::kGrant:
        continue;
      case ClusterGate::Verdict::kRedirect:
        return state_error(Shard::PartState::kRedirect, shard);
      case ClusterGate::Verdict::kNotReady:
        return state_error(Shard::PartState::kNotReady, shard);
    }
  }
  MultiAnswer granted{.type = MessageType::kGrantedMany, .ttl_ms = m.ttl_ms};
  granted.count = static_cast<std::uint8_t>(m.parts.size());
  for (const MultiAcquire::Part& part : m.parts) {
    shard_at(part.shard).confirm(m, part, now);
    granted.tokens[part.index] = part.token;
  }
  return granted;
}

std::optional<MultiAnswer> MultiDriver::prior_answer(MultiAcquire& m, std::int64_t now,
                                                     std::vector<DeferredReply>& deferred) {
  MultiAnswer again{.type = MessageType::kGrantedMany, .ttl_ms = UINT32_MAX};
  std::size_t granted = 0;
  std::optional<std::size_t> first_prior;
  std::uint32_t first_ttl_left = 0;
  for (std::size_t i = 0; i < m.parts.size(); ++i) {
    std::uint64_t token = 0;
    std::uint32_t ttl_left = 0;
    const Shard::PriorGrant prior =
        shard_at(m.parts[i].shard).prior_grant(m, m.parts[i], now, token, ttl_left, deferred);
    if (prior == Shard::PriorGrant::kNone) continue;
    if (!first_prior) {
      first_prior = i;
      first_ttl_left = ttl_left;
    }
    if (prior == Shard::PriorGrant::kThisRequest) {
      ++granted;
      again.tokens[m.parts[i].index] = token;
      again.ttl_ms = std::min(again.ttl_ms, ttl_left);
    }
  }
  if (!first_prior) return std::nullopt;
  Shard& shard = shard_at(m.parts[*first_prior].shard);
  if (granted == m.parts.size()) {
    // Every key still held from this very request: the same grant, with the
    // time surely left.
    again.count = static_cast<std::uint8_t>(m.parts.size());
    shard.count_outcome(StatCounter::kRetransmits);
    return again;
  }
  // Applied before (some of its leases have ended since) or older than a
  // request applied since: taking the keys again would hand the client
  // leases it does not know of. Nothing is taken.
  shard.count_outcome(StatCounter::kStaleRequests);
  return MultiAnswer{.type = MessageType::kBusyMany,
                     .ttl_ms = first_ttl_left,
                     .index = m.parts[*first_prior].index};
}

void MultiDriver::abandon(MultiAcquire& m, std::int64_t now, std::vector<DeferredReply>& deferred) {
  for (std::size_t i = 0; i < m.taken; ++i) {
    shard_at(m.parts[i].shard).abandon(m, m.parts[i], now, deferred);
  }
  m.taken = 0;
}

void MultiDriver::finish(const MultiAcquire& m, MultiAnswer answer) {
  answer.fingerprint = m.fingerprint;
  LockGuard lock(mu_);
  // A gate's refusal is remembered too: the client asks again under a fresh
  // request id, and a late copy of this one must not be granted with no
  // call left to take the grant (Shard::remember_refusal()).
  try {
    answers_.put(m.client, m.request_id, answer);
  } catch (const std::bad_alloc&) {
    DispatchCounters::count(
        env_.counters.allocation_failures);  // a retransmission then starts afresh
  }
  active_.erase(RequestKey{m.client, m.request_id});  // destroys m
}

}  // namespace shardlock::lease::internal
