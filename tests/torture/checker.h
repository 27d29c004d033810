// checker.h: judges a shardlock-torture history (see history.h).
//
// The checker is independent of the system it judges: it includes nothing
// from include/shardlock/ and links only the standard library, so a bug in
// the lease client or server cannot hide itself by also living here.
//
// Properties, per key (a correct system produces no violation):
//   overlap          no two different clients hold overlapping validity
//                    intervals (grant received .. its last known expiry, cut
//                    at the client's release invocation or loss);
//   token_order      a grant received before another grant's acquire was
//                    invoked has a smaller token;
//   duplicate_token  one token is never granted to two different clients;
//   fencing          accepted writes carry non-decreasing tokens;
//   lost_increment   accepted values count 1, 2, 3, ... and the final counter
//                    equals the number of accepted writes;
//   lock_delay       no grant invoked after a server start is received within
//                    that start's lock delay;
//   liveness         after the last fault heals, every client still active
//                    gets a grant within the liveness bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "history.h"

namespace shardlock::torture {

struct CheckOptions {
  std::int64_t liveness_bound_ms = 10000;
  std::size_t max_examples = 5;  // kept per violation kind
};

enum class ViolationKind : std::uint8_t {
  kOverlap,
  kTokenOrder,
  kDuplicateToken,
  kFencing,
  kLostIncrement,
  kLockDelay,
  kLiveness,
};

struct Violation {
  ViolationKind kind = ViolationKind::kOverlap;
  std::string key;     // empty for liveness (a client, not a key)
  std::string detail;  // one line, with clients, times (ns) and tokens
};

struct CheckReport {
  // Every violation counted; every kind present (zero when clean).
  std::map<ViolationKind, std::size_t> violation_counts;
  // The first max_examples of each kind, grouped by kind, in time order.
  std::vector<Violation> examples;
  // Completed operations by name ("acquire ok", "try-acquire busy", "renew ok",
  // "release ok", "lost", "read", "read refused", "write accepted", ...).
  // Invocations with no completion appear as "<op> unfinished".
  std::map<std::string, std::uint64_t> operations;
  // "server kill -9", "server pause", "client pause", "network faults".
  std::map<std::string, std::uint64_t> faults;
  // Acquire, renew and release completions, ok or not.
  std::uint64_t lease_operations = 0;
  // False when the history has no healed event.
  bool liveness_checked = false;

  [[nodiscard]] bool ok() const;
  [[nodiscard]] std::string text() const;  // a readable summary table
  [[nodiscard]] std::string json() const;  // one JSON object, one line
};

// "overlap", "token_order", "duplicate_token", "fencing", "lost_increment",
// "lock_delay", "liveness".
[[nodiscard]] std::string_view to_string(ViolationKind kind) noexcept;

// Judges `history` (any order; sorted by t_ns here, stable). Never throws on
// odd histories: unmatched invocations and completions are skipped.
[[nodiscard]] CheckReport check(const std::vector<Event>& history, const CheckOptions& options);

}  // namespace shardlock::torture
