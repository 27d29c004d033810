// checker_election.h: the checker's election properties (checker.h:
// one_leader, term_order, observer_order, observed_leader), apart from the
// lease properties because they follow campaigns and observers, not grants
// of keys. Not API: checker.cc's only.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "checker.h"
#include "history.h"

namespace shardlock::torture {

// Builds a violation's detail line; called only for the examples kept.
using DetailText = std::function<std::string()>;

// Judges every election event of `history` (`order`: its indices in time
// order), calling `violation(kind, name, detail)` for each violation, and
// counts the election operations into `report` (operations and
// election_operations).
void judge_elections(
    const std::vector<Event>& history, const std::vector<std::size_t>& order, CheckReport& report,
    const std::function<void(ViolationKind, std::string_view, const DetailText&)>& violation);

}  // namespace shardlock::torture
