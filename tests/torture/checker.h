// checker.h: judges a torture history (history.h). Shares no code with the
// lease client or server: it sees only the events.
//
// Properties, per key:
//   kOverlap         no two different clients' validity intervals overlap. A
//                    grant's interval runs from its kAcquireOk to the largest
//                    client-side expiry recorded for it (kAcquireOk,
//                    kRenewOk, kHold), cut short by its kReleaseInvoke or
//                    kLost.
//   kTokenOrder      a grant received before another grant's ACQUIRE was
//                    invoked has the lower token (real-time order), across
//                    restarts.
//   kDuplicateToken  one token granted to two clients.
//   kFencing         the resource accepted a write with a lower token than
//                    one it had already accepted.
//   kLostIncrement   an accepted write is not the previous accepted value + 1,
//                    or the final counter is not the number of accepted writes.
//   kLockDelay       a grant invoked after a server start and received before
//                    that start + its lock-delay.
//   kLiveness        after kHealed, a client that still ran did not acquire
//                    within the bound.
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
  std::size_t max_examples = 5;  // examples kept per violation kind
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
[[nodiscard]] std::string_view to_string(ViolationKind kind) noexcept;

struct Violation {
  ViolationKind kind = ViolationKind::kOverlap;
  std::string key;
  std::string detail;  // one line: clients, times (ns), tokens
};

struct CheckReport {
  std::map<ViolationKind, std::size_t> violation_counts;
  std::vector<Violation> examples;  // the first max_examples of each kind
  // Operations by type and outcome ("acquire ok", "try-acquire busy", ...).
  std::map<std::string, std::uint64_t> operations;
  // Faults injected, from the nemesis's events.
  std::map<std::string, std::uint64_t> faults;
  // Completed ACQUIRE, RENEW and RELEASE calls, whatever their outcome.
  std::uint64_t lease_operations = 0;
  bool liveness_checked = false;

  [[nodiscard]] bool ok() const noexcept { return violation_counts.empty(); }
  [[nodiscard]] std::size_t count(ViolationKind kind) const noexcept;
  // A summary table for people.
  [[nodiscard]] std::string text() const;
  // One JSON object.
  [[nodiscard]] std::string json() const;
};

// Judges `history` (any order; it is sorted by time first).
[[nodiscard]] CheckReport check(const std::vector<Event>& history, const CheckOptions& options);

}  // namespace shardlock::torture
