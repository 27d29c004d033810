// ReentrantLeases and ReentrantLease: reentrancy keyed to the acquiring
// thread (or to the whole object), over plain Leases. See reentrant.h.
//
// Lock order: a table's mutex, then a hold's mutex, then (inside Lease) the
// lease's state mutex. No Lease is destroyed or released while either of
// ours is held: that takes the lease's callback mutex, which the watchdog
// holds while an on_lost runs, and an on_lost may call acquire().
#include "shardlock/lease/client/reentrant.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lock_guard.h"
#include "shardlock/mutex.h"

namespace shardlock::lease {
namespace internal {

// The shared state of one grant and the handles that hold it.
struct ReentrantHold {
  enum class State : std::uint8_t {
    kAcquiring,  // the first acquire's ACQUIRE is in flight
    kHeld,       // granted; `holds` handles hold it
    kFailed,     // the first acquire failed: nobody holds it
    kReleased,   // the last hold was dropped
  };

  ReentrantHold(std::thread::id hold_thread, std::string hold_key)
      : thread(hold_thread), key(std::move(hold_key)) {}

  // Joinable by another acquire: in flight, or held and still valid.
  [[nodiscard]] bool joinable() const SHARDLOCK_EXCLUDES(mutex) {
    LockGuard lock(mutex);
    return state == State::kAcquiring || (state == State::kHeld && lease.valid());
  }

  // Whose hold it is: the acquiring thread (ReentrancyScope::kThread), or
  // one id for every thread (kClient).
  const std::thread::id thread;
  const std::string key;
  // The grant. Written under `mutex` twice: when the first acquire settles
  // (before state becomes kHeld, which is what makes handles exist) and
  // when the last hold moves it out (after state becomes kReleased, when no
  // other handle exists). In between it is only read, through Lease's own
  // thread-safe const methods and renew(), so handles use it without
  // `mutex` (an annotation would make every accessor take it).
  Lease lease;

  mutable Mutex mutex;
  // Signalled when the first acquire settles (kHeld or kFailed).
  std::condition_variable_any settled;
  State state SHARDLOCK_GUARDED_BY(mutex) = State::kAcquiring;
  std::size_t holds SHARDLOCK_GUARDED_BY(mutex) = 0;
};

// Each (thread, key)'s current hold, shared by ReentrantLeases and its
// handles (which may outlive it).
struct ReentrantTable {
  using Slot = std::pair<std::thread::id, std::string>;

  // Drops the key's entry if it is still `hold` (a newer grant may have
  // replaced it).
  void forget(const ReentrantHold& hold) SHARDLOCK_EXCLUDES(mutex) {
    std::shared_ptr<ReentrantHold> erased;  // destroyed after the lock is let go
    LockGuard lock(mutex);
    auto it = holds.find(Slot(hold.thread, hold.key));
    if (it != holds.end() && it->second.get() == &hold) {
      erased = std::move(it->second);
      holds.erase(it);
    }
  }

  mutable Mutex mutex;
  // Ordered: std::thread::id has operator< but no portable hash for a pair.
  std::map<Slot, std::shared_ptr<ReentrantHold>> holds SHARDLOCK_GUARDED_BY(mutex);
};

}  // namespace internal

using internal::ReentrantHold;
using internal::ReentrantTable;
using std::chrono::milliseconds;

namespace {

// Ends the first acquire of `hold`: given the granted Lease, the hold takes
// it with one hold; given an empty one, it fails and leaves the table. Wakes
// the acquires waiting for it either way.
void settle(ReentrantTable& table, ReentrantHold& hold, Lease granted) {
  const bool held = !granted.empty();
  {
    LockGuard lock(hold.mutex);
    if (held) {
      hold.lease = std::move(granted);
      hold.holds = 1;
      hold.state = ReentrantHold::State::kHeld;
    } else {
      hold.state = ReentrantHold::State::kFailed;
    }
  }
  hold.settled.notify_all();
  if (!held) table.forget(hold);
}

}  // namespace

// ---------------------------------------------------------------------------
// ReentrantLease
// ---------------------------------------------------------------------------

ReentrantLease::ReentrantLease() noexcept = default;
ReentrantLease::ReentrantLease(std::shared_ptr<ReentrantTable> table,
                               std::shared_ptr<ReentrantHold> hold) noexcept
    : table_(std::move(table)), hold_(std::move(hold)) {}
ReentrantLease::ReentrantLease(ReentrantLease&& other) noexcept = default;
ReentrantLease& ReentrantLease::operator=(ReentrantLease&& other) noexcept {
  if (this != &other) {
    (void)drop_hold();  // the last hold's Lease releases in the background
    table_ = std::move(other.table_);
    hold_ = std::move(other.hold_);
  }
  return *this;
}
ReentrantLease::~ReentrantLease() { (void)drop_hold(); }

Lease ReentrantLease::drop_hold() noexcept {
  Lease last;
  if (!hold_) return last;
  {
    LockGuard lock(hold_->mutex);
    if (--hold_->holds == 0) {
      hold_->state = ReentrantHold::State::kReleased;
      last = std::move(hold_->lease);
    }
  }
  if (!last.empty()) table_->forget(*hold_);
  hold_.reset();
  table_.reset();
  return last;
}

bool ReentrantLease::valid() const noexcept { return hold_ && hold_->lease.valid(); }

std::size_t ReentrantLease::hold_count() const noexcept {
  if (!hold_) return 0;
  LockGuard lock(hold_->mutex);
  return hold_->holds;
}

const Lease& ReentrantLease::lease() const noexcept {
  static const Lease kEmpty;
  return hold_ ? hold_->lease : kEmpty;
}

std::error_code ReentrantLease::renew(milliseconds ttl) {
  if (!hold_) return LeaseErrc::kLeaseInactive;
  return hold_->lease.renew(ttl);
}

std::error_code ReentrantLease::release() {
  if (!hold_) return LeaseErrc::kLeaseInactive;
  Lease last = drop_hold();
  return last.empty() ? std::error_code{} : last.release();
}

// ---------------------------------------------------------------------------
// ReentrantLeases
// ---------------------------------------------------------------------------

ReentrantLeases::ReentrantLeases(LeaseClient& client, ReentrancyScope scope)
    : client_(client), scope_(scope), table_(std::make_shared<ReentrantTable>()) {}

std::thread::id ReentrantLeases::holder_thread() const noexcept {
  // kClient: every thread is the default id, which names no thread.
  return scope_ == ReentrancyScope::kThread ? std::this_thread::get_id() : std::thread::id{};
}
ReentrantLeases::~ReentrantLeases() = default;

ReentrantAcquireResult ReentrantLeases::acquire(std::string_view key, milliseconds ttl,
                                                milliseconds wait, LeaseOptions lease_options) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const auto wait_left = [&] {
    return std::max(milliseconds{0},
                    wait - std::chrono::duration_cast<milliseconds>(Clock::now() - start));
  };
  const std::thread::id thread = holder_thread();
  std::string key_text(key);
  for (;;) {
    std::shared_ptr<ReentrantHold> hold;
    std::shared_ptr<ReentrantHold> replaced;  // destroyed after the table's lock is let go
    bool first = false;
    {
      LockGuard lock(table_->mutex);
      std::shared_ptr<ReentrantHold>& slot = table_->holds[ReentrantTable::Slot(thread, key_text)];
      if (slot == nullptr || !slot->joinable()) {
        replaced = std::exchange(slot, std::make_shared<ReentrantHold>(thread, key_text));
        first = true;
      }
      hold = slot;
    }

    if (first) {
      AcquireResult granted;
      try {
        granted = client_.acquire(key, ttl, wait_left(), std::move(lease_options));
      } catch (...) {
        settle(*table_, *hold, Lease{});  // failed: nobody may wait for it
        throw;
      }
      ReentrantAcquireResult result;
      if (granted) {
        settle(*table_, *hold, std::move(granted.lease));
        result.lease = ReentrantLease(table_, std::move(hold));
        return result;
      }
      settle(*table_, *hold, Lease{});
      result.error = granted.error;
      result.holder_ttl_left_ms = granted.holder_ttl_left_ms;
      result.retry_after_ms = granted.retry_after_ms;
      result.wire_error = granted.wire_error;
      return result;
    }

    {
      LockGuard lock(hold->mutex);
      while (hold->state == ReentrantHold::State::kAcquiring) {
        const milliseconds left = wait_left();
        if (left.count() <= 0 ||
            hold->settled.wait_for(hold->mutex, left) == std::cv_status::timeout) {
          if (hold->state != ReentrantHold::State::kAcquiring) break;
          ReentrantAcquireResult result;
          result.error = wait.count() > 0 ? LeaseErrc::kTimeout : LeaseErrc::kBusy;
          return result;
        }
      }
      if (hold->state == ReentrantHold::State::kHeld && hold->lease.valid()) {
        ++hold->holds;
        ReentrantAcquireResult result;
        result.reentered = true;
        result.lease = ReentrantLease(table_, hold);
        return result;
      }
    }
    // The acquire we waited for failed, or the grant was lost or released
    // meanwhile: take the key ourselves on the next round.
  }
}

std::size_t ReentrantLeases::hold_count(std::string_view key) const {
  const ReentrantTable::Slot slot(holder_thread(), std::string(key));
  LockGuard lock(table_->mutex);
  const auto it = table_->holds.find(slot);
  if (it == table_->holds.end()) return 0;
  const ReentrantHold& hold = *it->second;
  LockGuard hold_lock(hold.mutex);
  return hold.state == ReentrantHold::State::kHeld ? hold.holds : 0;
}

}  // namespace shardlock::lease
