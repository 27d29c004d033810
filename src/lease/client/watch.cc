// KeyWatch and Watcher: see watch.h.
#include "shardlock/lease/client/watch.h"

#include <algorithm>
#include <condition_variable>
#include <utility>

#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lock_guard.h"
#include "shardlock/mutex.h"

namespace shardlock::lease {
namespace internal {

// One KeyWatch's round in flight and its cancellation, shared with the
// round's completion, which runs on the client's I/O thread and must not
// block: it stores the answer and wakes next().
struct WatchRound {
  Mutex mutex;
  // condition_variable_any waits on the annotated Mutex itself, so the
  // analysis sees it held across the wait (as it is on return).
  std::condition_variable_any wake;
  bool in_flight SHARDLOCK_GUARDED_BY(mutex) = false;
  bool answered SHARDLOCK_GUARDED_BY(mutex) = false;
  bool cancelled SHARDLOCK_GUARDED_BY(mutex) = false;
  CallResult result SHARDLOCK_GUARDED_BY(mutex);
};

}  // namespace internal

using Clock = LeaseClock;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kShortestRound{100};
constexpr milliseconds kLongestRetry{1000};

}  // namespace

KeyWatch::KeyWatch(LeaseClient& client, std::string key, KeyWatchOptions options)
    : client_(client),
      key_(std::move(key)),
      options_(options),
      round_wait_(std::max(options.round, kShortestRound)),
      round_(std::make_shared<internal::WatchRound>()) {}

KeyWatch::~KeyWatch() { cancel(); }  // a round in flight completes into round_ alone

void KeyWatch::cancel() noexcept {
  {
    LockGuard lock(round_->mutex);
    round_->cancelled = true;
  }
  round_->wake.notify_all();
}

std::optional<WatchEvent> KeyWatch::next(milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  internal::WatchRound& round = *round_;
  std::optional<WatchEvent> failure;
  milliseconds retry = std::max(options_.retry, milliseconds(1));
  for (;;) {
    bool send = false;
    {
      LockGuard lock(round.mutex);
      if (round.cancelled) return std::nullopt;
      if (!round.in_flight) {
        round.in_flight = true;
        round.answered = false;
        send = true;
      }
    }
    if (send) {
      // The round outlives this call if next() times out first: the next
      // next() waits for the same round instead of sending another.
      client_.watch_async(key_, version_, round_wait_, [shared = round_](const CallResult& r) {
        {
          LockGuard lock(shared->mutex);
          shared->result = r;
          shared->answered = true;
        }
        shared->wake.notify_all();
      });
    }
    WatchEvent event;
    {
      LockGuard lock(round.mutex);
      while (!round.answered && !round.cancelled && Clock::now() < deadline) {
        round.wake.wait_until(round.mutex, deadline);
      }
      if (round.cancelled) return std::nullopt;
      if (!round.answered) return failure;
      round.in_flight = false;
      event = watch_event(round.result);
    }
    if (!event.error) {
      if (event.version == version_) continue;  // the round's wait ended: re-arm
      version_ = event.version;
      return event;
    }
    if (event.error == LeaseErrc::kServerError && event.wire_error == WireError::kWaitOutOfRange &&
        round_wait_ > kShortestRound) {
      round_wait_ = std::max(round_wait_ / 2, kShortestRound);  // the server's max_wait is lower
      continue;
    }
    if (event.error == LeaseErrc::kBadArgument) return event;
    // Unreachable, still recovering at the round's end, a limit: try again
    // after a back-off, within the timeout.
    failure = std::move(event);
    LockGuard lock(round.mutex);
    const Clock::time_point until = std::min(deadline, Clock::now() + retry);
    while (!round.cancelled && Clock::now() < until) round.wake.wait_until(round.mutex, until);
    if (round.cancelled) return std::nullopt;
    if (Clock::now() >= deadline) return failure;
    retry = std::min(retry * 2, kLongestRetry);
  }
}

Watcher::Watcher(LeaseClient& client, std::string key,
                 std::function<void(const WatchEvent&)> on_change, KeyWatchOptions options)
    : watch_(client, std::move(key), options), on_change_(std::move(on_change)) {
  thread_ = std::thread([this] {
    // A second at a time, so a failing server is reported about once a
    // second; nullopt is a quiet second, or stop().
    while (!stopped_.load(std::memory_order_acquire)) {  // pairs with stop()
      std::optional<WatchEvent> event = watch_.next(kLongestRetry);
      if (!event) continue;
      on_change_(*event);
      if (event->error == LeaseErrc::kBadArgument) return;  // a bad key: it never will
    }
  });
}

Watcher::~Watcher() { stop(); }

void Watcher::stop() noexcept {
  // Release pairs with the loop's acquire: it sees the flag after next()
  // returns nullopt for the cancellation.
  stopped_.store(true, std::memory_order_release);
  watch_.cancel();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

}  // namespace shardlock::lease
