// The Lease handle's methods: release, renew, detach and the accessors, and
// the close/release steps LeaseClient::acquire() shares. See client.h.
#include <chrono>
#include <memory>
#include <utility>

#include "client/client_core.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lock_guard.h"

namespace shardlock::lease {
namespace internal {

bool close_lease(ClientCore& core, LeaseState& state) {
  bool was_active = false;
  {
    LockGuard lock(state.mutex);
    was_active = state.status != LeaseState::Status::kReleased;
    state.status = LeaseState::Status::kReleased;
  }
  if (!core.watchdog.on_thread()) {
    LockGuard gate(state.callback_mutex);  // the watchdog checks kReleased under it
  }
  return was_active;
}

void send_release(ClientCore& core, LeaseState& state) noexcept {
  try {
    // To the node that granted it (it may be handing the key off and holds
    // the lease until then), and, when the map now gives the key to another
    // node, to that one too: it may have taken the lease over. The token is
    // this lease's alone, so neither can free another grant.
    auto call = make_lease_call(core.engine, MessageType::kRelease, state);
    call->done = [](const CallResult&) {};
    if (state.node != nullptr && call->to != state.node) {
      auto pinned = make_lease_call(core.engine, MessageType::kRelease, state);
      pinned->to = state.node;
      pinned->done = [](const CallResult&) {};
      core.engine.submit(std::move(pinned));
    }
    core.engine.submit(std::move(call));
  } catch (...) {
    // Best effort: an allocation failure here leaves the lease to expire.
  }
}

}  // namespace internal

using internal::close_lease;
using internal::LeaseState;
using internal::make_lease_call;
using internal::make_renewal;
using internal::send_release;
using Clock = LeaseClock;
using std::chrono::milliseconds;

Lease::Lease() noexcept = default;
Lease::Lease(std::shared_ptr<internal::ClientCore> core, std::shared_ptr<LeaseState> state) noexcept
    : core_(std::move(core)), state_(std::move(state)) {}
Lease::Lease(Lease&& other) noexcept = default;
Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release_in_background();
    core_ = std::move(other.core_);
    state_ = std::move(other.state_);
  }
  return *this;
}
Lease::~Lease() { release_in_background(); }

void Lease::release_in_background() noexcept {
  if (!state_) return;
  if (close_lease(*core_, *state_)) send_release(*core_, *state_);
  state_.reset();
  core_.reset();
}

void Lease::detach() noexcept {
  if (!state_) return;
  (void)close_lease(*core_, *state_);
  state_.reset();
  core_.reset();
}

bool Lease::valid() const noexcept {
  if (!state_) return false;
  LockGuard lock(state_->mutex);
  return state_->status == LeaseState::Status::kHeld && Clock::now() < state_->expiry;
}

const std::string& Lease::key() const noexcept {
  static const std::string kEmpty;
  return state_ ? state_->key : kEmpty;
}
std::uint64_t Lease::token() const noexcept { return state_ ? state_->token : 0; }
LeaseMode Lease::mode() const noexcept {
  return state_ ? state_->kind.mode : LeaseMode::kExclusive;
}
std::uint32_t Lease::permits() const noexcept { return state_ ? state_->kind.permits : 0; }
ClientId Lease::owner() const noexcept { return state_ ? state_->owner : ClientId{}; }
LeaseClock::time_point Lease::expiry() const noexcept {
  if (!state_) return {};
  LockGuard lock(state_->mutex);
  return state_->expiry;
}
milliseconds Lease::ttl() const noexcept {
  if (!state_) return {};
  LockGuard lock(state_->mutex);
  return state_->ttl;
}

std::error_code Lease::renew(milliseconds ttl) {
  if (!state_) return LeaseErrc::kLeaseInactive;
  {
    LockGuard lock(state_->mutex);
    if (state_->status != LeaseState::Status::kHeld) return LeaseErrc::kLeaseInactive;
    if (ttl.count() <= 0) ttl = state_->ttl;
  }
  auto call = make_renewal(core_->engine, *state_, ttl);
  const std::uint64_t request_id = call->request_id;
  const milliseconds requested(call->ttl_ms);
  const CallResult r = core_->call_sync(std::move(call));
  bool lost = false;
  {
    LockGuard lock(state_->mutex);
    lost = state_->apply_renewal(r, request_id, requested, Clock::now());
  }
  if (lost) core_->watchdog.nudge();
  return r.error;
}

std::error_code Lease::release() {
  if (!state_) return LeaseErrc::kLeaseInactive;
  if (!close_lease(*core_, *state_)) return LeaseErrc::kLeaseInactive;
  // As send_release(): where the map puts the key now, and where it was
  // granted if that differs (it may still hold it, handing the key off).
  // The owner first: after a failover the granting node is gone, and the
  // backup that took the lease over has it.
  auto call = make_lease_call(core_->engine, MessageType::kRelease, *state_);
  const Endpoint* owner = call->to;
  const CallResult at_owner = core_->call_sync(std::move(call));
  if (!at_owner.error || state_->node == nullptr || owner == state_->node) {
    return at_owner.error;
  }
  auto pinned = make_lease_call(core_->engine, MessageType::kRelease, *state_);
  pinned->to = state_->node;
  return core_->call_sync(std::move(pinned)).error;
}

}  // namespace shardlock::lease
