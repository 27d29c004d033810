#include "ctl/acquiring.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "ctl/diagnosis.h"

namespace shardlock::ctl {

using namespace lease;
using tools::usage_error;

namespace {

// What run, elect and acquire --wait wait for.
struct WaitTarget {
  std::vector<std::string> keys;
  milliseconds wait{0};   // kForever: until granted
  bool election = false;  // elect: the one key is the election's name
};

// The line a wait prints once it has lasted kNoticeAfter: what holds the
// acquire up (a holder and its time left, or the server's lock-delay and
// when it ends) and how long the wait goes on at most. It learns that from
// one WATCH per key that asks for the key's state at once: a WATCH takes
// nothing and moves no waiter, so the queued ACQUIRE keeps its place; and
// unlike QUERY it is answered RECOVERING during a lock-delay, with the time
// left. The WATCHes are asynchronous, so the caller's loop keeps taking
// signals while they are out.
class WaitNotice {
 public:
  WaitNotice(LeaseClient& client, WaitTarget target)
      : client_(client), target_(std::move(target)) {}

  // Called on every turn of the caller's waiting loop with how long it has
  // waited: sends the WATCHes at kNoticeAfter, prints once they are all
  // answered (each is, by the client's request timeout).
  void poll(milliseconds waited) {
    if (said_ || waited < kNoticeAfter) return;
    if (!answers_) {
      answers_ = std::make_shared<Answers>();
      answers_->events.resize(target_.keys.size());
      for (std::size_t i = 0; i < target_.keys.size(); ++i) {
        // The completion may run after this object is gone (the acquire
        // was granted first): it holds the answers, not `this`.
        client_.watch_async(target_.keys[i], KeyVersion{}, milliseconds{0},
                            [answers = answers_, i](const CallResult& r) {
                              std::lock_guard lock(answers->mutex);
                              answers->events[i] = watch_event(r);
                            });
      }
      return;
    }
    std::vector<WatchEvent> events;
    {
      std::lock_guard lock(answers_->mutex);
      for (const std::optional<WatchEvent>& e : answers_->events) {
        if (!e) return;
        events.push_back(*e);
      }
    }
    said_ = true;
    std::fprintf(stderr, "shardlockctl: %s\n", line(events).c_str());
    std::fflush(stderr);
  }

 private:
  struct Answers {
    std::mutex mutex;
    std::vector<std::optional<WatchEvent>> events;  // by key; empty until answered
  };

  // "up to 1m30s" or "until granted".
  [[nodiscard]] std::string how_long() const {
    if (target_.wait == kForever) return target_.election ? "until elected" : "until granted";
    return "up to " + seconds_text(static_cast<std::uint64_t>(target_.wait.count()));
  }
  [[nodiscard]] const char* verb() const { return target_.election ? "campaigning" : "waiting"; }

  // Who holds a key and how long its lease has left.
  [[nodiscard]] std::string holder_text(const WatchEvent& e) const {
    std::uint64_t longest = 0;
    std::uint64_t soonest = UINT64_MAX;
    for (const HolderInfo& h : e.holders) {
      const auto left = static_cast<std::uint64_t>(h.ttl_left.count());
      longest = std::max(longest, left);
      soonest = std::min(soonest, left);
    }
    if (e.holders.empty()) soonest = 0;
    if (e.mode == LeaseMode::kShared) {
      return "held shared by " + std::to_string(e.holder_count) + " owner" +
             (e.holder_count == 1 ? "" : "s") + ", " + tenths_text(longest) +
             " left on the longest lease";
    }
    if (e.mode == LeaseMode::kPermit) {
      return std::to_string(e.holder_count) + " of " + std::to_string(e.permits) +
             " permits held, the first to end has " + tenths_text(soonest) + " left";
    }
    // An exclusive holder is always listed, the newest last.
    if (e.holders.empty()) return "held by another owner";
    const HolderInfo& holder = e.holders.back();
    if (target_.election) {
      return "led by " +
             (holder.value.empty() ? std::string("another owner") : shown(holder.value)) +
             ", term " + std::to_string(holder.token) + ", " + tenths_text(longest) +
             " left on its lease";
    }
    return "held by another owner, " + tenths_text(longest) + " left on its lease";
  }

  [[nodiscard]] std::string line(const std::vector<WatchEvent>& events) const {
    const std::vector<std::string>& keys = target_.keys;
    const std::string what =
        target_.election ? "leadership of " + shown(keys.front()) : shown_keys(keys);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (events[i].error == LeaseErrc::kRecovering) {
        return "server " + client_.address_for(keys[i]) +
               " is recovering after a restart (its lock-delay): grants in " +
               tenths_text(events[i].retry_after_ms) + "; " + verb() + " for " + what + " " +
               how_long();
      }
    }
    // Several keys: the first that is held names the holder.
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const WatchEvent& e = events[i];
      if (e.error || !e.held()) continue;
      return std::string(verb()) + " for " + what + " (" +
             (keys.size() > 1 ? shown(keys[i]) + " is " : "") + holder_text(e) + "; " + verb() +
             " " + how_long() + ")";
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (!events[i].error) continue;
      return std::string(verb()) + " for " + what + " (the server " + client_.address_for(keys[i]) +
             " did not say what holds it up: " + error_name(events[i].error) + "; " + verb() + " " +
             how_long() + ")";
    }
    // Free, yet not granted: queued behind earlier waiters, or being granted now.
    std::uint32_t waiters = 0;
    for (const WatchEvent& e : events) waiters = std::max(waiters, e.waiters);
    return std::string(verb()) + " for " + what + " (not held, " + std::to_string(waiters) +
           " waiting; " + verb() + " " + how_long() + ")";
  }

  LeaseClient& client_;
  const WaitTarget target_;
  std::shared_ptr<Answers> answers_;  // null until the WATCHes are sent
  bool said_ = false;
};

}  // namespace

void add_kind_flags(CLI::App& sub, KeyFlags& flags) {
  sub.add_option("-w", flags.short_w,
                 "DUR: same as --wait (as flock's -w); json or text: same as --write-out");
  sub.add_flag("-s,--shared", flags.kind.shared,
               "Shared (read) lease: held alongside other shared leases, never with an "
               "exclusive one");
  sub.add_option("--permits", flags.kind.permits,
                 "One of at most P leases on the key (a semaphore); the first holder's P holds "
                 "while the key is in use. One key only; not with --shared")
      ->check(CLI::Range(1u, static_cast<unsigned>(kMaxPermits)));
  sub.add_option("--value", flags.kind.value,
                 "V: a value the lease carries, shown by query with its holder (the "
                 "holder's address, a host name and pid); at most 256 bytes, one key only");
}

std::optional<int> resolve_short_w(KeyFlags& flags, Session& session) {
  const std::string& short_w = flags.short_w;
  if (!short_w.empty()) {
    if (short_w == "json" || short_w == "text") {
      session.globals.output.write_out = short_w;
    } else if (!flags.wait.text.empty()) {
      return usage_error(kTool, "give the wait once: -w or --wait");
    } else {
      flags.wait.text = short_w;
    }
  }
  session.out.json = session.globals.output.json();
  return std::nullopt;
}

std::optional<int> check_kind(const KeyFlags& flags) {
  const KindArg& kind = flags.kind;
  const std::vector<std::string>& keys = flags.keys;
  if (kind.shared && kind.permits > 0) {
    return usage_error(kTool,
                       "--shared and --permits exclude each other: a key is a lock or a semaphore");
  }
  if (kind.permits > 0 && keys.size() > 1) return usage_error(kTool, "--permits takes one key");
  if (!kind.value.empty() && keys.size() > 1) return usage_error(kTool, "--value takes one key");
  if (kind.value.size() > kMaxHolderValueLength) {
    return usage_error(kTool,
                       "--value is at most " + std::to_string(kMaxHolderValueLength) + " bytes");
  }
  if (keys.size() > kMaxKeysPerRequest) {
    return usage_error(kTool, "at most " + std::to_string(kMaxKeysPerRequest) +
                                  " keys at once, got " + std::to_string(keys.size()));
  }
  const std::set<std::string> distinct(keys.begin(), keys.end());
  if (distinct.size() != keys.size()) return usage_error(kTool, "each key may be given only once");
  return std::nullopt;
}

Acquired acquire_keys(LeaseClient& client, const std::vector<std::string>& keys,
                      const KindArg& kind, milliseconds ttl, milliseconds wait,
                      LeaseOptions options) {
  Acquired out;
  options.value = kind.value;
  if (keys.size() == 1) {
    AcquireResult r = kind.permits > 0 ? client.acquire_permit(keys[0], kind.permits, ttl, wait,
                                                               std::move(options))
                      : kind.shared ? client.acquire_shared(keys[0], ttl, wait, std::move(options))
                                    : client.acquire(keys[0], ttl, wait, std::move(options));
    out.error = r.error;
    out.ttl_left_ms = r.holder_ttl_left_ms;
    out.retry_after_ms = r.retry_after_ms;
    out.wire_error = r.wire_error;
    if (!r.error) out.leases.push_back(std::move(r.lease));
    return out;
  }
  const std::vector<std::string_view> views(keys.begin(), keys.end());
  MultiAcquireResult r = client.acquire_many(views, ttl, wait, kind.mode(), std::move(options));
  out.error = r.error;
  out.busy_key = std::move(r.busy_key);
  out.ttl_left_ms = r.holder_ttl_left_ms;
  out.retry_after_ms = r.retry_after_ms;
  out.wire_error = r.wire_error;
  out.leases = std::move(r.leases);
  return out;
}

Acquired acquire_telling(LeaseClient& client, const std::vector<std::string>& keys,
                         const KindArg& kind, milliseconds ttl, milliseconds wait,
                         LeaseOptions options, bool quiet, bool election,
                         const std::function<void()>& pause) {
  Acquired acquired;
  std::atomic<bool> done{false};
  std::thread acquirer([&] {
    acquired = acquire_keys(client, keys, kind, ttl, wait, std::move(options));
    // Release pairs with the acquire loads below: `acquired` is written first.
    done.store(true, std::memory_order_release);
  });
  std::optional<WaitNotice> notice;
  if (!quiet && wait > kNoticeAfter) {
    notice.emplace(client, WaitTarget{keys, wait, election});
  }
  const auto start = std::chrono::steady_clock::now();
  while (!done.load(std::memory_order_acquire)) {
    pause();
    if (notice) {
      notice->poll(
          std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start));
    }
  }
  acquirer.join();
  return acquired;
}

Failure acquire_failure(LeaseClient& client, const Session& session,
                        const std::vector<std::string>& keys, const Acquired& a, milliseconds ttl) {
  Failure f = diagnosed(client, session, keys, a.error, a.wire_error, ttl);
  f.busy_key = a.busy_key;
  f.ttl_left_ms = a.ttl_left_ms;
  f.retry_after_ms = a.retry_after_ms;
  return f;
}

}  // namespace shardlock::ctl
