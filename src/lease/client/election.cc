// Election and LeaderObserver: see election.h.
#include "shardlock/lease/client/election.h"

#include <utility>

#include "shardlock/lock_guard.h"

namespace shardlock::lease {

using Clock = LeaseClock;
using std::chrono::milliseconds;

std::optional<LeaderInfo> leader_of(LeaseMode mode, const std::vector<HolderInfo>& holders) {
  if (mode != LeaseMode::kExclusive || holders.size() != 1 || holders.front().pending) {
    return std::nullopt;
  }
  const HolderInfo& h = holders.front();
  return LeaderInfo{.value = h.value, .owner = h.owner, .term = h.token, .ttl_left = h.ttl_left};
}

Election::Election(LeaseClient& client, std::string name, ElectionOptions options)
    : client_(client), name_(std::move(name)), options_(options) {}

Election::~Election() { (void)resign(); }

void Election::on_lost(std::function<void(const LeaseLost&)> callback) {
  LockGuard lock(mutex_);
  on_lost_ = std::move(callback);
}

std::error_code Election::campaign(std::string_view value, milliseconds wait) {
  LeaseOptions options;
  options.watchdog = true;
  options.value = std::string(value);
  {
    LockGuard lock(mutex_);
    if (campaigning_ || !lease_.empty()) return LeaseErrc::kBusy;
    campaigning_ = true;
    options.on_lost = on_lost_;
  }
  // Blocks without the lock: leading(), term() and leader() stay callable.
  AcquireResult result = client_.acquire(name_, options_.ttl, wait, std::move(options));
  LockGuard lock(mutex_);
  campaigning_ = false;
  if (!result) return result.error;
  lease_ = std::move(result.lease);
  return {};
}

std::error_code Election::resign() {
  Lease lease;
  {
    LockGuard lock(mutex_);
    lease = std::move(lease_);
  }
  if (lease.empty()) return LeaseErrc::kLeaseInactive;
  return lease.release();
}

bool Election::leading() const {
  LockGuard lock(mutex_);
  return !lease_.empty() && lease_.valid();
}

std::uint64_t Election::term() const {
  LockGuard lock(mutex_);
  return !lease_.empty() && lease_.valid() ? lease_.token() : 0;
}

ClientId Election::owner() const {
  LockGuard lock(mutex_);
  return !lease_.empty() && lease_.valid() ? lease_.owner() : ClientId{};
}

std::optional<LeaderInfo> Election::leader(std::error_code* error) {
  const HoldersReply r = client_.holders(name_);
  if (error != nullptr) *error = r.error;
  if (r.error) return std::nullopt;
  return leader_of(r.mode, r.holders);
}

LeaderObserver::LeaderObserver(LeaseClient& client, std::string name, KeyWatchOptions options)
    : watch_(client, std::move(name), options) {}

std::optional<LeaderChange> LeaderObserver::next(milliseconds timeout, std::error_code* error) {
  if (error != nullptr) error->clear();
  const Clock::time_point deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    std::optional<WatchEvent> event = watch_.next(std::max(left, milliseconds(0)));
    if (!event) return std::nullopt;
    if (event->error) {
      if (error != nullptr) *error = event->error;
      return std::nullopt;
    }
    // A change of holders that is no change of leader (a pending part, a
    // shared holder) is skipped; a new term, or none, is reported once.
    std::optional<LeaderInfo> leader = leader_of(event->mode, event->holders);
    const std::uint64_t term = leader ? leader->term : 0;
    if (reported_ && term == last_term_) continue;
    reported_ = true;
    last_term_ = term;
    return LeaderChange{std::move(leader)};
  }
}

}  // namespace shardlock::lease
