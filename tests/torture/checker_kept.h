// checker_kept.h: the checker's kept property (checker.h), apart from the
// one-pass properties because it judges each loss against the whole nemesis
// history around it. Not API: checker.cc's only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "checker.h"
#include "history.h"

namespace shardlock::torture {

// One lease reported lost (a lost event, or a release refused while the
// client still held the lease), with what the checker's pass learned of its
// grant.
struct LostLease {
  std::size_t lost_event = 0;  // index into the history: the lost or release_fail event
  std::string_view key;
  std::int64_t granted_at = 0;  // its acquire_ok
  std::string_view node;        // the node that granted it
};

// Calls `violation(loss, detail)` for every loss in `losses` that the kept
// property does not excuse. `history` as check() got it, `order` its indices
// in time order. Returns how many losses it judged: a node fault their
// cause, and nothing but the timing rule to excuse them.
std::size_t judge_kept(const std::vector<Event>& history, const std::vector<std::size_t>& order,
                       const std::vector<LostLease>& losses, const CheckOptions& options,
                       const std::function<void(const LostLease&, std::string)>& violation);

}  // namespace shardlock::torture
