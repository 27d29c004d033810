// watch.h: following a key without polling. KeyWatch is the iterator form
// (each next() blocks for the key's next state); Watcher the callback form
// (a thread of its own calls back on each change).
//
//   shardlock::lease::KeyWatch watch(client, "jobs/nightly");
//   while (auto event = watch.next(std::chrono::minutes(1))) {
//     if (event->error) continue;          // retried by itself; here for logging
//     if (event->held()) use(event->holders.back().value);
//   }
//
// Design (docs/client.md, "Watches")
//   * Each round is one WATCH (LeaseClient::watch_once(), protocol.h
//     "Watches"): the server parks it until the key's version moves from the
//     one this watch last reported, or the round's wait ends (then the same
//     version comes back and the watch re-arms silently). The first next()
//     reports the key's state at once.
//   * Each change is reported once, and never the same version twice in a
//     row. A watcher that was slow (or a server that was unreachable) sees
//     the key's newest state next, not every state in between: the
//     guarantee is the last one, as etcd's watch after a compaction or
//     Consul's blocking queries give.
//   * Rounds ride through a lock-delay, a redirect and a failover as a
//     waiting acquire does; a round that fails (unreachable, limit) is
//     retried after a back-off, and next() returns the failure only when
//     its timeout runs out with no state to report.
//   * A round waits at most `round` (30 s by default, under the server's
//     default max_wait of 300 s); a server with a shorter max_wait makes
//     the watch halve it until the server takes it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "shardlock/lease/client/client.h"

namespace shardlock::lease {

struct KeyWatchOptions {
  // The longest one WATCH waits at the server before it re-arms.
  std::chrono::milliseconds round{30'000};
  // The back-off after a failed round, doubled up to 1 s.
  std::chrono::milliseconds retry{50};
};

namespace internal {
struct WatchRound;
}  // namespace internal

// Follows one key. One thread calls next() at a time; cancel() may be
// called from any thread. The client must outlive the KeyWatch.
class KeyWatch {
 public:
  KeyWatch(LeaseClient& client, std::string key, KeyWatchOptions options = {});
  ~KeyWatch();
  KeyWatch(const KeyWatch&) = delete;
  KeyWatch& operator=(const KeyWatch&) = delete;

  // The key's next state: at once on the first call; afterwards the first
  // state whose version differs from the one last returned. Blocks up to
  // `timeout`; nullopt when it passed with nothing to report, or when
  // cancel() was called. An event with an error: no state could be read for
  // the whole timeout (the last round's error; kBadArgument at once for a
  // bad key).
  [[nodiscard]] std::optional<WatchEvent> next(std::chrono::milliseconds timeout);
  // Wakes a next() that is blocked (it returns nullopt) and every later one.
  void cancel() noexcept;
  [[nodiscard]] const std::string& key() const noexcept { return key_; }
  // The version of the last state next() returned (KeyVersion{} before).
  [[nodiscard]] KeyVersion version() const noexcept { return version_; }

 private:
  LeaseClient& client_;
  std::string key_;
  KeyWatchOptions options_;
  std::chrono::milliseconds round_wait_;  // options_.round, halved by a server that refuses it
  KeyVersion version_;
  // The round in flight, shared with its completion on the I/O thread.
  std::shared_ptr<internal::WatchRound> round_;
};

// Calls `on_change` with each state of `key` (the first at once), on a
// thread of its own, until stopped. Failed rounds are retried; their events
// (with error set) are passed on too, at most one per back-off, so the
// callback can log them. The callback must not destroy the Watcher.
class Watcher {
 public:
  Watcher(LeaseClient& client, std::string key, std::function<void(const WatchEvent&)> on_change,
          KeyWatchOptions options = {});
  // Stops and joins the thread; a callback that is running finishes first.
  ~Watcher();
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;
  // Stops it early; returns once the thread has ended. Not from the callback.
  void stop() noexcept;

 private:
  KeyWatch watch_;
  std::function<void(const WatchEvent&)> on_change_;
  std::atomic<bool> stopped_{false};
  std::thread thread_;
};

}  // namespace shardlock::lease
