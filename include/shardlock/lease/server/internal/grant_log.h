// GrantLog: one line per lease event, for "who held X at 10:02" (docs/lease-server.md,
// "Grant log"). Off unless LeaseServerOptions::grant_log is set (shardlockd
// sets it at --log-level debug); a shard with no log pays one pointer test
// per event.
//
//   grant key=orders/7 owner=0123..cdef token=21474836481 epoch=5 ttl_ms=30000
//
// Events: grant (an ACQUIRE answered at once), handoff (a queued waiter
// given the key), release, expiry, abandon (a part of an ACQUIRE_MANY that
// gave up), takeover (a holder inherited from a primary that left). The
// epoch is the token's high half, printed only in cluster mode, where
// tokens are composed (docs/cluster.md). A line goes out under the shard's
// lock: the sink must be quick and must not call back into the server.
//
// Rate limit: at most `lines_per_second` lines in each second of the server
// clock; the rest are counted, and the first line of the next second that
// has room says how many were left out ("grant log: N events not logged"),
// so a busy node's log stays readable and nothing pretends to be complete.
//
// Thread-safe: any shard may record at any time (a small lock of its own).
// Not API.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lease/wire/protocol.h"
#include "shardlock/mutex.h"

namespace shardlock::lease::internal {

enum class LeaseEvent : std::uint8_t {
  kGrant,
  kHandOff,
  kRelease,
  kExpiry,
  kAbandon,
  kTakeover,
};

[[nodiscard]] std::string_view lease_event_name(LeaseEvent event) noexcept;

class GrantLog {
 public:
  GrantLog(std::function<void(std::string_view)> sink, std::uint32_t lines_per_second) noexcept;

  // Logs one event at `now_ms` (the server's clock). `cluster`: print the
  // token's epoch. Never throws: a line that cannot be built is counted as
  // left out.
  void record(LeaseEvent event, std::string_view key, const ClientId& owner, std::uint64_t token,
              std::uint32_t ttl_ms, bool cluster, std::int64_t now_ms) noexcept;

  [[nodiscard]] std::uint64_t logged() const;
  [[nodiscard]] std::uint64_t left_out() const;

 private:
  std::function<void(std::string_view)> sink_;
  std::uint32_t lines_per_second_;
  mutable Mutex mu_;
  std::int64_t second_ SHARDLOCK_GUARDED_BY(mu_) = -1;
  std::uint32_t in_second_ SHARDLOCK_GUARDED_BY(mu_) = 0;
  std::uint64_t pending_left_out_ SHARDLOCK_GUARDED_BY(mu_) = 0;  // not yet reported
  std::uint64_t logged_ SHARDLOCK_GUARDED_BY(mu_) = 0;
  std::uint64_t left_out_ SHARDLOCK_GUARDED_BY(mu_) = 0;
};

}  // namespace shardlock::lease::internal
