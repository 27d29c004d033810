// LeaseState's renewal bookkeeping and the Watchdog thread. See watchdog.h.
#include "client/watchdog.h"

#include <algorithm>
#include <utility>

#include "shardlock/lock_guard.h"

namespace shardlock::lease::internal {

using std::chrono::milliseconds;

// ------------------------------------------------------------- LeaseState

void LeaseState::note_renewal_sent(std::uint64_t request_id, Clock::time_point now,
                                   milliseconds renew_ttl) {
  unconfirmed.push_back(SentRenewal{request_id, now, renew_ttl});
  expiry = std::min(expiry, margin.expiry(now, renew_ttl));
}

bool LeaseState::apply_renewal(const CallResult& r, std::uint64_t request_id,
                               milliseconds requested, Clock::time_point now) {
  if (status != Status::kHeld) return false;
  if (!r.error) {
    // An answer older than one already applied says nothing new: the
    // server applied the newer renewal after it.
    if (request_id <= confirmed_request_id) return false;
    confirmed_request_id = request_id;
    // The server ignores renewals older than this one from now on.
    std::erase_if(unconfirmed, [&](const SentRenewal& sr) { return sr.request_id <= request_id; });
    const milliseconds answered(r.ttl_ms);
    Clock::time_point bound = margin.expiry(r.first_sent, answered);
    for (const SentRenewal& sr : unconfirmed)
      bound = std::min(bound, margin.expiry(sr.sent, sr.ttl));
    expiry = std::max(expiry, bound);
    ttl = requested;
    next_renew = r.first_sent +
                 std::chrono::duration_cast<Clock::duration>(answered * options.renew_fraction);
    return false;
  }
  if (r.error == LeaseErrc::kNotOwner || r.error == LeaseErrc::kExpired ||
      r.error == LeaseErrc::kServerError) {
    status = Status::kLost;
    lost = LeaseLost{key, token, r.error, r.error != LeaseErrc::kServerError};
    return true;
  }
  if (r.error == LeaseErrc::kRecovering) {
    // The node cannot renew now (failed closed, or its map is behind):
    // asking again at once would spin, a RENEW per round trip. Ask when it
    // says, with jitter; the expiry check still ends the lease if it never
    // comes back.
    next_renew = now + retry_delay(r.retry_after_ms);
    return false;
  }
  // No answer (the call used its whole budget): try again at once; the
  // expiry check catches a dead server.
  next_renew = now;
  return false;
}

std::unique_ptr<Call> make_lease_call(const CallEngine& engine, MessageType type,
                                      const LeaseState& state) {
  auto call = engine.make_call(type, state.key);
  call->token = state.token;
  call->owner = state.owner;
  return call;
}

std::unique_ptr<Call> make_renewal(CallEngine& engine, LeaseState& state, milliseconds ttl) {
  // Routed to the key's owner now, not pinned to the node that granted it:
  // in cluster mode a primary that left hands its leases to its backup
  // (docs/cluster.md, "Replication"), and a renewal follows the key there.
  // Only a node holding this very token (unique in the cluster) renews it.
  auto call = make_lease_call(engine, MessageType::kRenew, state);
  call->ttl_ms = clamp_ms(ttl);
  call->request_id = engine.new_request_id();
  LockGuard state_lock(state.mutex);
  state.note_renewal_sent(call->request_id, Clock::now(), milliseconds(call->ttl_ms));
  return call;
}

// --------------------------------------------------------------- Watchdog

void Watchdog::watch(std::shared_ptr<LeaseState> state) {
  LockGuard lock(mutex_);
  if (stop_) return;
  watched_.push_back(std::move(state));
  dirty_ = true;
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  wake_.notify_one();
}

void Watchdog::nudge() {
  {
    LockGuard lock(mutex_);
    dirty_ = true;
  }
  wake_.notify_one();
}

// Relaxed is enough: only the watchdog thread can see its own id here, and
// it stored that id itself before running any callback.
bool Watchdog::on_thread() const noexcept {
  return std::this_thread::get_id() == thread_id_.load(std::memory_order_relaxed);
}

void Watchdog::stop() {
  std::thread thread;
  {
    LockGuard lock(mutex_);
    stop_ = true;
    thread.swap(thread_);  // watch() starts no thread from now on
  }
  wake_.notify_all();
  if (thread.joinable()) thread.join();
  std::vector<std::shared_ptr<LeaseState>> watched;
  {
    LockGuard lock(mutex_);
    watched.swap(watched_);  // their callbacks may hold what the caller tears down
  }
}

void Watchdog::run() {
  thread_id_.store(std::this_thread::get_id(), std::memory_order_relaxed);  // see on_thread()
  std::vector<std::shared_ptr<LeaseState>> leases;
  std::vector<std::pair<std::shared_ptr<LeaseState>, LeaseLost>> fire;
  for (;;) {
    {
      LockGuard lock(mutex_);
      if (stop_) break;
      leases = watched_;
      dirty_ = false;
    }
    const Clock::time_point now = Clock::now();
    Clock::time_point next = now + std::chrono::seconds(1);
    std::vector<const LeaseState*> finished;
    for (const auto& state : leases) {
      bool renew = false;
      milliseconds ttl{};
      Clock::time_point deadline;
      {
        LockGuard state_lock(state->mutex);
        if (state->status == LeaseState::Status::kHeld && now >= state->expiry) {
          state->status = LeaseState::Status::kLost;
          state->lost = LeaseLost{state->key, state->token, LeaseErrc::kExpired, false};
        }
        if (state->status == LeaseState::Status::kLost && !state->lost_fired) {
          state->lost_fired = true;
          fire.emplace_back(state, state->lost);
        }
        if (state->status != LeaseState::Status::kHeld) {
          finished.push_back(state.get());
          continue;
        }
        next = std::min(next, state->expiry);
        if (state->options.watchdog && !state->renew_in_flight) {
          if (now >= state->next_renew) {
            state->renew_in_flight = true;
            renew = true;
            ttl = state->ttl;
            deadline = state->expiry;
          } else {
            next = std::min(next, state->next_renew);
          }
        }
      }
      if (renew) issue_renewal(state, ttl, deadline, now);
    }
    for (auto& [state, event] : fire) {
      if (!state->options.on_lost) continue;
      LockGuard gate(state->callback_mutex);
      {
        LockGuard state_lock(state->mutex);
        // release(), detach() or the destructor began: never call back.
        if (state->status == LeaseState::Status::kReleased) continue;
      }
      state->options.on_lost(event);
    }
    fire.clear();
    leases.clear();
    LockGuard lock(mutex_);
    if (!finished.empty()) {
      std::erase_if(watched_, [&](const auto& s) {
        return std::find(finished.begin(), finished.end(), s.get()) != finished.end();
      });
    }
    // Unlocks mutex_ while it sleeps and takes it again to return.
    if (!dirty_ && !stop_) wake_.wait_until(mutex_, next);
  }
}

void Watchdog::issue_renewal(const std::shared_ptr<LeaseState>& state, milliseconds ttl,
                             Clock::time_point expiry, Clock::time_point now) {
  auto call = make_renewal(engine_, *state, ttl);
  // A renewal past the expiry is useless: the lease is lost by then. (The
  // call's budget starts as request_timeout.)
  call->budget = std::min<Clock::duration>(
      call->budget, std::max<Clock::duration>(expiry - now, Clock::duration(1)));
  std::weak_ptr<LeaseState> weak = state;
  const std::uint64_t request_id = call->request_id;
  const milliseconds requested(call->ttl_ms);
  call->done = [this, weak, request_id, requested](const CallResult& r) {
    const std::shared_ptr<LeaseState> s = weak.lock();
    if (!s) return;
    {
      LockGuard state_lock(s->mutex);
      s->renew_in_flight = false;
      (void)s->apply_renewal(r, request_id, requested, Clock::now());
    }
    nudge();
  };
  engine_.submit(std::move(call));
}

}  // namespace shardlock::lease::internal
