// The shardlock-torture checker. See checker.h.
//
// One sort of event indices by t_ns (ties in input order), then one pass in
// time order for every property but overlap and permit_limit, which need
// each grant's whole interval and so sweep a second, sorted list of
// intervals. Keys are interned to small ids so per-key state is a vector, not
// a map of strings; the history's own strings are referenced, never copied.
// Detail lines are built only for the violations kept as examples, so a
// badly broken run of millions of events costs no more than a clean one.
#include "checker.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <iterator>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "checker_election.h"
#include "checker_kept.h"
#include "common/json.h"

namespace shardlock::torture {
namespace {

using tools::append_json_string;

constexpr std::array<ViolationKind, 19> kAllKinds = {
    ViolationKind::kOverlap,       ViolationKind::kTokenOrder,     ViolationKind::kDuplicateToken,
    ViolationKind::kFencing,       ViolationKind::kLostIncrement,  ViolationKind::kLockDelay,
    ViolationKind::kLiveness,      ViolationKind::kPermitLimit,    ViolationKind::kAllOrNothing,
    ViolationKind::kOwner,         ViolationKind::kKeyLiveness,    ViolationKind::kWait,
    ViolationKind::kKept,          ViolationKind::kOneLeader,      ViolationKind::kTermOrder,
    ViolationKind::kObserverOrder, ViolationKind::kObservedLeader, ViolationKind::kDenied,
    ViolationKind::kIsolation,
};
// The server's refusal of a request outside the tenant's rights, as the
// workers record it.
constexpr std::string_view kPermissionDenied = "permission_denied";
// wait: how much earlier than its wait a waiting acquire may give up
// (the client's last try goes out kLastTryMargin, 10 ms, before the end).
constexpr std::int64_t kWaitSlackMs = 50;
constexpr std::size_t kModeCount = 3;

constexpr std::int64_t kNsPerMs = 1'000'000;

std::string num(std::int64_t v) { return std::to_string(v); }
std::string num(std::uint64_t v) { return std::to_string(v); }

// Counts every violation; keeps the first max_examples of each kind.
class Recorder {
 public:
  Recorder(CheckReport& report, std::size_t max_examples)
      : report_(report), max_examples_(max_examples) {}

  // `detail` is called only when the example is kept.
  template <typename Detail>
  void add(ViolationKind kind, std::string_view key, Detail&& detail) {
    ++report_.violation_counts[kind];
    std::vector<Violation>& kept = examples_[static_cast<std::size_t>(kind)];
    if (kept.size() < max_examples_) {
      kept.push_back(Violation{kind, std::string(key), std::forward<Detail>(detail)()});
    }
  }

  // Grouped by kind, each group in detection (time) order.
  void finish() {
    for (std::vector<Violation>& kept : examples_) {
      for (Violation& v : kept) report_.examples.push_back(std::move(v));
    }
  }

 private:
  CheckReport& report_;
  std::size_t max_examples_;
  std::array<std::vector<Violation>, kAllKinds.size()> examples_;
};

std::size_t mix(std::size_t seed, std::uint64_t v) {
  // boost::hash_combine's mixing, widened: keys here are small dense ints.
  return seed ^ (std::hash<std::uint64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
}

// One lease grant: a client's token for a key.
struct GrantId {
  std::int64_t client;
  std::uint32_t key;
  std::uint64_t token;
  bool operator==(const GrantId&) const = default;
};
struct GrantIdHash {
  std::size_t operator()(const GrantId& g) const {
    return mix(mix(std::hash<std::int64_t>{}(g.client), g.key), g.token);
  }
};

struct Grant {
  bool has_start = false;
  std::int64_t start = 0;  // the first acquire_ok
  bool has_end = false;
  // The client-side expiry as last recorded (events come in time order). A
  // renewal to a shorter TTL moves the client's expiry in, so the largest
  // one ever recorded would overstate what the client still relied on.
  std::int64_t end = 0;
  bool has_cut = false;
  std::int64_t cut = 0;                        // the first release invocation or loss
  AcquireMode mode = AcquireMode::kExclusive;  // the first acquire_ok's
  std::int64_t permits = 0;
  std::string_view node;  // the first acquire_ok's (cluster mode)
};

// The largest token granted, and which event granted it.
struct Best {
  bool set = false;
  std::uint64_t token = 0;
  std::size_t event = 0;
  void offer(std::uint64_t t, std::size_t e) {
    if (!set || t > token) *this = Best{true, t, e};
  }
  void offer(const Best& b) {
    if (b.set) offer(b.token, b.event);
  }
};

enum class Family : std::uint8_t { kAcquire, kRenew, kRelease };

struct OpId {
  Family family;
  std::int64_t client;
  std::int64_t op;
  bool operator==(const OpId&) const = default;
};
struct OpIdHash {
  std::size_t operator()(const OpId& o) const {
    return mix(mix(static_cast<std::size_t>(o.family), static_cast<std::uint64_t>(o.client)),
               static_cast<std::uint64_t>(o.op));
  }
};

struct Invocation {
  std::size_t event = 0;
  bool try_acquire = false;  // acquire with wait_ms == 0
  Best max_before;           // acquire: the largest token received before it
  // A multi-key acquire: each key's id and largest token received before it.
  std::vector<std::pair<std::uint32_t, Best>> many;
};

struct KeyState {
  // Token order: grants received strictly before the current time, and at it
  // (so an invocation at the same instant as a grant does not see it).
  Best before;
  Best at_now;
  std::int64_t now = 0;
  // The largest token received before `t` (t >= every grant seen so far).
  [[nodiscard]] Best received_before(std::int64_t t) const {
    Best b = before;
    if (now < t) b.offer(at_now);
    return b;
  }
  // Fencing and increments.
  bool any_write = false;
  std::uint64_t last_token = 0;
  std::size_t last_write = 0;
  std::int64_t last_value = 0;
  std::uint64_t accepted = 0;
};

struct Interval {
  std::int64_t start;
  std::int64_t end;
  std::int64_t client;
  std::uint32_t key;
  std::uint64_t token;
  AcquireMode mode;
  std::int64_t permits;
  std::string_view node;
};

// Whether holders in modes `a` and `b` (of different clients) may not
// overlap on one key.
bool conflicts(AcquireMode a, AcquireMode b) {
  return a == AcquireMode::kExclusive || b == AcquireMode::kExclusive || a != b;
}

// A key's permit holders open at the sweep's current instant: a min-heap by
// end, and the limits they were granted under.
struct OpenPermits {
  std::vector<Interval> open;
  std::multiset<std::int64_t> limits;

  static bool later_end(const Interval& a, const Interval& b) { return a.end > b.end; }
  // Drops the holders whose interval ended at or before `t`.
  void close_until(std::int64_t t) {
    while (!open.empty() && open.front().end <= t) {
      limits.erase(limits.find(open.front().permits));
      std::pop_heap(open.begin(), open.end(), later_end);
      open.pop_back();
    }
  }
  void add(const Interval& x) {
    open.push_back(x);
    std::push_heap(open.begin(), open.end(), later_end);
    limits.insert(x.permits);
  }
};

// The two latest-ending intervals of one key held by two different clients:
// enough to find, for any new interval, an overlapping one of another client.
struct TopTwo {
  bool has_first = false;
  bool has_second = false;
  Interval first{};
  Interval second{};

  void offer(const Interval& x) {
    if (has_first && first.client == x.client) {
      if (x.end > first.end) first = x;
    } else if (!has_first || x.end > first.end) {
      if (has_first) second = first, has_second = true;
      first = x, has_first = true;
    } else if (!has_second || x.end > second.end) {
      second = x, has_second = true;
    }
  }
  // The latest-ending interval of a client other than `client`, if any.
  const Interval* other_than(std::int64_t client) const {
    if (has_first && first.client != client) return &first;
    if (has_second) return &second;
    return nullptr;
  }
};

std::string interval_text(const Interval& x) {
  std::string text = "client " + num(x.client);
  if (x.mode != AcquireMode::kExclusive) text += " " + std::string(to_string(x.mode));
  text += " token " + num(x.token);
  if (!x.node.empty()) text += " from node " + std::string(x.node);
  return text + " [" + num(x.start) + ", " + num(x.end) + ")";
}

// " from node N" for an acquire_ok a cluster node answered, else "".
std::string from_node(const Event& e) {
  return e.node.empty() ? std::string() : " from node " + e.node;
}

// A cluster token's epoch: its high 32 bits (docs/cluster.md, "Tokens").
constexpr std::uint64_t token_epoch(std::uint64_t token) { return token >> 32; }

// "shared ", "permit ", "multi ", "multi shared ", or "" for an exclusive
// single-key acquire (the names the report had before the other kinds);
// "outside " first for a probe outside the tenant's rights.
std::string kind_prefix(const Event& e) {
  std::string prefix = e.outside ? "outside " : "";
  if (e.multi_key()) prefix += "multi ";
  if (e.mode != AcquireMode::kExclusive) prefix += std::string(to_string(e.mode)) + " ";
  return prefix;
}

std::string key_list(const std::vector<std::string_view>& keys) {
  std::string text = "{";
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i > 0) text += ",";
    text += keys[i];
  }
  return text + "}";
}

// "a,b,c" for a multi-key acquire event, else its key.
std::string keys_text(const Event& e) {
  if (!e.multi_key()) return e.key;
  std::string text;
  for (const std::string& key : e.keys) text += (text.empty() ? "" : ",") + key;
  return text;
}

// "token 5", or "tokens 5,9" for a multi-key grant.
std::string tokens_text(const Event& e) {
  if (!e.multi_key()) return "token " + num(e.token);
  std::string text;
  for (const std::uint64_t t : e.tokens) text += (text.empty() ? "" : ",") + num(t);
  return "tokens " + text;
}

// The token `e` (an acquire_ok) granted on `key`.
std::uint64_t token_of(const Event& e, std::string_view key) {
  for (std::size_t n = 0; n < std::min(e.keys.size(), e.tokens.size()); ++n) {
    if (e.keys[n] == key) return e.tokens[n];
  }
  return e.token;
}

// The keys an acquire event names (`keys`, or its one `key`).
std::vector<std::string_view> keys_of(const Event& e) {
  if (!e.multi_key()) return {e.key};
  return {e.keys.begin(), e.keys.end()};
}

// `s` and spaces up to `width`, always at least one space after it.
std::string pad(std::string_view s, std::size_t width) {
  std::string out(s);
  out.append(out.size() < width ? width - out.size() : 1, ' ');
  return out;
}

template <typename Map, typename KeyText>
void append_json_object(std::string& out, const Map& map, KeyText key_text) {
  out += '{';
  bool first = true;
  for (const auto& [name, count] : map) {
    if (!first) out += ',';
    first = false;
    append_json_string(out, key_text(name));
    out += ':';
    out += std::to_string(count);
  }
  out += '}';
}

}  // namespace

std::string_view to_string(ViolationKind kind) noexcept {
  switch (kind) {
    case ViolationKind::kOverlap:
      return "overlap";
    case ViolationKind::kTokenOrder:
      return "token_order";
    case ViolationKind::kDuplicateToken:
      return "duplicate_token";
    case ViolationKind::kFencing:
      return "fencing";
    case ViolationKind::kLostIncrement:
      return "lost_increment";
    case ViolationKind::kLockDelay:
      return "lock_delay";
    case ViolationKind::kLiveness:
      return "liveness";
    case ViolationKind::kPermitLimit:
      return "permit_limit";
    case ViolationKind::kAllOrNothing:
      return "all_or_nothing";
    case ViolationKind::kOwner:
      return "owner";
    case ViolationKind::kKeyLiveness:
      return "key_liveness";
    case ViolationKind::kWait:
      return "wait";
    case ViolationKind::kKept:
      return "kept";
    case ViolationKind::kOneLeader:
      return "one_leader";
    case ViolationKind::kTermOrder:
      return "term_order";
    case ViolationKind::kObserverOrder:
      return "observer_order";
    case ViolationKind::kObservedLeader:
      return "observed_leader";
    case ViolationKind::kDenied:
      return "denied";
    case ViolationKind::kIsolation:
      return "isolation";
  }
  return "unknown";
}

std::uint64_t CheckReport::grants() const {
  std::uint64_t n = 0;
  for (const auto& [name, count] : operations) {
    if (name.ends_with("acquire ok") || name == "campaign elected") n += count;
  }
  return n;
}

bool CheckReport::ok() const {
  return std::all_of(violation_counts.begin(), violation_counts.end(),
                     [](const auto& entry) { return entry.second == 0; });
}

std::string CheckReport::text() const {
  std::size_t total = 0;
  for (const auto& [kind, count] : violation_counts) total += count;
  std::string out =
      ok() ? "check: OK\n" : "check: FAILED, " + std::to_string(total) + " violations\n";
  // One column for every name, wide enough for the longest ("multi shared
  // try-acquire grant_expired").
  std::size_t width = 28;
  for (const auto& entry : operations) width = std::max(width, entry.first.size() + 2);
  out += "violations\n";
  for (const ViolationKind kind : kAllKinds) {
    const auto it = violation_counts.find(kind);
    const std::size_t count = it == violation_counts.end() ? 0 : it->second;
    out += "  " + pad(to_string(kind), width) + std::to_string(count) + "\n";
  }
  out += "operations (" + std::to_string(lease_operations) + " lease operations";
  if (election_operations > 0) {
    out += ", " + std::to_string(election_operations) + " election operations";
  }
  out += ")\n";
  for (const auto& [name, count] : operations) {
    out += "  " + pad(name, width) + std::to_string(count) + "\n";
  }
  out += "faults\n";
  for (const auto& [name, count] : faults) {
    out += "  " + pad(name, width) + std::to_string(count) + "\n";
  }
  if (maps > 0) out += "cluster maps published: " + std::to_string(maps) + "\n";
  if (kept_judged > 0) {
    out += "kept: " + std::to_string(kept_judged) + " losses judged after a node fault\n";
  }
  out += liveness_checked ? "liveness checked\n" : "liveness not checked (no healed event)\n";
  if (!examples.empty()) {
    out += "examples\n";
    for (const Violation& v : examples) {
      out += "  ";
      out += to_string(v.kind);
      if (!v.key.empty()) out += " key=" + v.key;
      out += ": " + v.detail + "\n";
    }
  }
  return out;
}

std::string CheckReport::json() const {
  std::string out = "{\"ok\":";
  out += ok() ? "true" : "false";
  out += ",\"violation_counts\":";
  append_json_object(out, violation_counts, [](ViolationKind k) { return to_string(k); });
  out += ",\"examples\":[";
  for (std::size_t i = 0; i < examples.size(); ++i) {
    if (i > 0) out += ',';
    out += "{\"kind\":";
    append_json_string(out, to_string(examples[i].kind));
    out += ",\"key\":";
    append_json_string(out, examples[i].key);
    out += ",\"detail\":";
    append_json_string(out, examples[i].detail);
    out += '}';
  }
  out += "],\"operations\":";
  append_json_object(out, operations, [](const std::string& s) -> std::string_view { return s; });
  out += ",\"faults\":";
  append_json_object(out, faults, [](const std::string& s) -> std::string_view { return s; });
  out += ",\"lease_operations\":" + std::to_string(lease_operations);
  out += ",\"election_operations\":" + std::to_string(election_operations);
  out += ",\"maps\":" + std::to_string(maps);
  out += ",\"kept_judged\":" + std::to_string(kept_judged);
  out += ",\"liveness_checked\":";
  out += liveness_checked ? "true" : "false";
  out += '}';
  return out;
}

CheckReport check(const std::vector<Event>& history, const CheckOptions& options) {
  CheckReport report;
  for (const ViolationKind kind : kAllKinds) report.violation_counts[kind] = 0;
  for (const char* name : {"server kill -9", "server pause", "client pause", "network faults"}) {
    report.faults[name] = 0;
  }
  Recorder recorder(report, options.max_examples);

  // Time order; ties keep the input order (one writer's file order). Sorting
  // (t, index) pairs keeps the comparisons in one contiguous array.
  std::vector<std::size_t> order(history.size());
  {
    std::vector<std::pair<std::int64_t, std::size_t>> by_time(history.size());
    for (std::size_t i = 0; i < history.size(); ++i) by_time[i] = {history[i].t_ns, i};
    std::sort(by_time.begin(), by_time.end());
    for (std::size_t i = 0; i < by_time.size(); ++i) order[i] = by_time[i].second;
  }

  // Keys, and the events the pass needs to look up by time.
  std::unordered_map<std::string_view, std::uint32_t> key_ids;
  std::vector<std::string_view> key_names;
  const auto key_id = [&](const std::string& key) {
    const auto [it, inserted] =
        key_ids.try_emplace(key, static_cast<std::uint32_t>(key_names.size()));
    if (inserted) key_names.push_back(key);
    return it->second;
  };
  // server_start events in time order, per node ("" for a single node's,
  // which bind every grant).
  std::unordered_map<std::string_view, std::vector<std::size_t>> starts;
  // Cluster mode: each published map's event, by epoch.
  std::unordered_map<std::uint64_t, std::size_t> maps;
  // Node replacements: the ids that answered from the address the workers
  // name by the key (node_replaced), besides the key itself.
  std::unordered_map<std::string_view, std::set<std::string_view>> aliases;
  bool healed = false;
  std::int64_t healed_t = 0;  // the last healed event
  for (const std::size_t i : order) {
    const Event& e = history[i];
    if (e.kind == EventKind::kServerStart) starts[e.node].push_back(i);
    if (e.kind == EventKind::kMap) maps.try_emplace(e.epoch, i);
    if (e.kind == EventKind::kNodeReplaced) aliases[e.node].insert(e.peer);
    if (e.kind == EventKind::kHealed) healed = true, healed_t = e.t_ns;
  }
  report.liveness_checked = healed;
  const std::int64_t live_until = healed_t + options.liveness_bound_ms * kNsPerMs;

  std::vector<KeyState> keys;
  const auto state = [&](std::uint32_t id) -> KeyState& {
    if (id >= keys.size()) keys.resize(id + 1);
    return keys[id];
  };
  std::unordered_map<GrantId, Grant, GrantIdHash> grants;
  const auto grant = [&](const Event& e, std::uint32_t id) -> Grant& {
    return grants[GrantId{e.client, id, e.token}];
  };
  std::unordered_map<OpId, Invocation, OpIdHash> invocations;
  // Completed invocations leave the map: what stays at the end is unfinished,
  // and a long run's memory holds only the operations in flight.
  const auto complete = [&](Family family, const Event& e) -> std::optional<Invocation> {
    const auto it = invocations.find(OpId{family, e.client, e.op});
    if (it == invocations.end()) return std::nullopt;
    Invocation inv = it->second;
    invocations.erase(it);
    return inv;
  };
  // (key id, token) -> the acquire_ok that first granted it.
  std::unordered_map<GrantId, std::size_t, GrantIdHash> first_grant;
  struct Liveness {
    bool active = false;
    std::int64_t first_active = 0;
    bool granted = false;
    bool any_later_grant = false;
    std::int64_t later_grant = 0;
  };
  std::map<std::int64_t, Liveness> clients;
  // Liveness: `e` (a grant to its client) served the client.
  const auto served = [&](const Event& e) {
    if (!healed || e.t_ns < healed_t) return;
    Liveness& live = clients[e.client];
    if (e.t_ns <= live_until) live.granted = true;
    if (!live.any_later_grant) live.any_later_grant = true, live.later_grant = e.t_ns;
  };
  // Per key: asked for within the liveness bound after the heal, and granted
  // after the heal.
  struct KeyLiveness {
    bool wanted = false;
    std::size_t first_invoke = 0;
    std::uint64_t failures = 0;
    std::size_t last_failure = 0;
    bool granted = false;
  };
  std::unordered_map<std::uint32_t, KeyLiveness> key_liveness;
  const auto keys_of_event = [&](const Event& e) {
    std::vector<std::uint32_t> ids;
    if (e.multi_key()) {
      for (const std::string& key : e.keys) ids.push_back(key_id(key));
    } else {
      ids.push_back(key_id(e.key));
    }
    return ids;
  };
  std::vector<std::size_t> finals;
  std::vector<LostLease> losses;  // kept: judged after the pass
  const auto count = [&](std::string name) { ++report.operations[std::move(name)]; };
  const auto outcome = [](const std::string& error) {
    return error.empty() || error == "-" ? std::string("failed") : error;
  };
  // denied: `e`, the failure of a `what` invoked at `invoked` within the
  // client's rights, must not be a refusal for want of them.
  const auto denied = [&](const Event& e, const char* what, std::int64_t invoked) {
    if (e.error != kPermissionDenied) return;
    recorder.add(ViolationKind::kDenied, keys_text(e), [&] {
      return "client " + num(e.client) + " op " + num(e.op) + ": " + what + " invoked at " +
             num(invoked) + " within its tenant's rights, answered permission_denied at " +
             num(e.t_ns);
    });
  };

  for (const std::size_t i : order) {
    const Event& e = history[i];
    const std::uint32_t kid = key_id(e.key);  // "" for events without a key
    const bool client_event =
        e.client >= 0 && e.kind != EventKind::kClientPause && e.kind != EventKind::kClientResume;
    if (healed && client_event && e.t_ns >= healed_t) {
      Liveness& live = clients[e.client];
      if (!live.active) live.active = true, live.first_active = e.t_ns;
    }
    const bool after_heal = healed && e.t_ns >= healed_t;
    // An election is a grant of its name, and an observer's report one to
    // the observer (checker.h, Elections).
    const bool asks = e.kind == EventKind::kAcquireInvoke || e.kind == EventKind::kCampaignInvoke;
    const bool grant_event = e.kind == EventKind::kAcquireOk || e.kind == EventKind::kElected;
    const bool refused = e.kind == EventKind::kAcquireFail || e.kind == EventKind::kCampaignFail;
    // A probe outside the tenant's rights wants no grant, and one granted
    // serves no key (isolation reports it).
    if (after_heal && !e.outside && (asks || grant_event || refused)) {
      for (const std::uint32_t id : keys_of_event(e)) {
        KeyLiveness& live = key_liveness[id];
        if (grant_event) {
          live.granted = true;
        } else if (refused) {
          ++live.failures, live.last_failure = i;
        } else if (!live.wanted && e.t_ns <= live_until) {
          live.wanted = true, live.first_invoke = i;
        }
      }
    }
    if (e.kind == EventKind::kElected || e.kind == EventKind::kObserve) served(e);
    switch (e.kind) {
      case EventKind::kAcquireInvoke: {
        Invocation inv{i, e.wait_ms == 0, state(kid).received_before(e.t_ns), {}};
        for (const std::string& key : e.keys) {  // a multi-key acquire
          const std::uint32_t id = key_id(key);
          inv.many.emplace_back(id, state(id).received_before(e.t_ns));
        }
        invocations[OpId{Family::kAcquire, e.client, e.op}] = std::move(inv);
        break;
      }
      case EventKind::kAcquireOk: {
        const std::optional<Invocation> inv = complete(Family::kAcquire, e);
        const Event& asked = inv.has_value() ? history[inv->event] : e;
        count(kind_prefix(asked) +
              (inv.has_value() && inv->try_acquire ? "try-acquire ok" : "acquire ok"));
        ++report.lease_operations;
        if (asked.outside || e.outside) {
          recorder.add(ViolationKind::kIsolation, keys_text(asked), [&] {
            return "client " + num(e.client) + " asked outside its tenant's rights at " +
                   num(asked.t_ns) + " and was granted " + tokens_text(e) + from_node(e) + " at " +
                   num(e.t_ns);
          });
        }

        // What the event grants: a (key, token) per key.
        std::vector<std::pair<std::uint32_t, std::uint64_t>> granted;
        if (e.multi_key()) {
          for (std::size_t n = 0; n < std::min(e.keys.size(), e.tokens.size()); ++n) {
            granted.emplace_back(key_id(e.keys[n]), e.tokens[n]);
          }
        } else {
          granted.emplace_back(kid, e.token);
        }

        if (e.multi_key() || asked.multi_key()) {
          std::vector<std::string_view> wanted = keys_of(asked);
          std::vector<std::string_view> got = keys_of(e);
          std::sort(wanted.begin(), wanted.end());
          std::sort(got.begin(), got.end());
          if (wanted != got || e.tokens.size() != got.size()) {
            recorder.add(ViolationKind::kAllOrNothing, keys_text(asked), [&] {
              return "client " + num(e.client) + " asked for " + key_list(keys_of(asked)) + " at " +
                     num(history[inv.has_value() ? inv->event : i].t_ns) + " and was granted " +
                     key_list(keys_of(e)) + " with " +
                     num(static_cast<std::uint64_t>(e.tokens.size())) + " tokens at " + num(e.t_ns);
            });
          }
        }

        for (const auto& entry : granted) {
          const std::uint32_t id = entry.first;  // named, not bound: see below
          const std::uint64_t token = entry.second;
          const std::string_view key = key_names[id];
          Grant& g = grants[GrantId{e.client, id, token}];
          if (!g.has_start) {
            g.has_start = true, g.start = e.t_ns;
            g.mode = e.mode, g.permits = e.permits, g.node = e.node;
          }
          g.has_end = true, g.end = e.expiry_ns;

          Best max_before;
          if (inv.has_value() && inv->many.empty()) max_before = inv->max_before;
          if (inv.has_value()) {
            for (const auto& [asked_id, best] : inv->many) {
              if (asked_id == id) max_before = best;
            }
          }
          KeyState& k = state(id);
          if (max_before.set && token <= max_before.token) {
            recorder.add(ViolationKind::kTokenOrder, key, [&] {
              const Event& a = history[max_before.event];
              return "client " + num(e.client) + " invoked acquire at " +
                     num(history[inv->event].t_ns) + " and got token " + num(token) + from_node(e) +
                     " at " + num(e.t_ns) + ", but client " + num(a.client) +
                     " had received token " + num(token_of(a, key)) + from_node(a) + " at " +
                     num(a.t_ns);
            });
          }
          if (!k.at_now.set || e.t_ns > k.now) {
            k.before.offer(k.at_now);
            k.at_now = Best{};
            k.now = e.t_ns;
          }
          k.at_now.offer(token, i);

          // Not a structured binding: lambdas cannot capture those before
          // clang 16.
          const auto emplaced = first_grant.try_emplace(GrantId{-1, id, token}, i);
          const auto first = emplaced.first;
          if (!emplaced.second && history[first->second].client != e.client) {
            recorder.add(ViolationKind::kDuplicateToken, key, [&] {
              const Event& a = history[first->second];
              return "token " + num(token) + " granted to client " + num(a.client) + from_node(a) +
                     " at " + num(a.t_ns) + " and to client " + num(e.client) + from_node(e) +
                     " at " + num(e.t_ns);
            });
          }

          // Cluster mode: the node that answered must own the key in the
          // map of the epoch its token carries.
          if (!e.node.empty() && !maps.empty()) {
            const auto map = maps.find(token_epoch(token));
            if (map == maps.end()) {
              recorder.add(ViolationKind::kOwner, key, [&] {
                return "client " + num(e.client) + " got token " + num(token) + from_node(e) +
                       " at " + num(e.t_ns) + ", whose epoch " + num(token_epoch(token)) +
                       " is no published map's";
              });
            } else {
              const Event& m = history[map->second];
              const auto owner =
                  std::find_if(m.owners.begin(), m.owners.end(),
                               [&](const auto& candidate) { return candidate.first == key; });
              // A replaced node's address answers under its first name: a
              // grant the map gives its successor is the successor's (the
              // first one was killed before the successor started).
              const auto alias = aliases.find(std::string_view(e.node));
              const bool successor =
                  alias != aliases.end() && alias->second.contains(owner->second);
              if (owner != m.owners.end() && owner->second != e.node && !successor) {
                recorder.add(ViolationKind::kOwner, key, [&] {
                  return "client " + num(e.client) + " got token " + num(token) + from_node(e) +
                         " at " + num(e.t_ns) + ", but the map of epoch " + num(m.epoch) +
                         " gives the key to node " + owner->second;
                });
              }
            }
          }
        }

        // A node's starts bind the grants it answers; a single node's (no
        // node) bind every grant. Not with replicas: a returning node grants
        // a bucket it took over complete at once (docs/cluster.md, "A node returns"), and the
        // history does not say which buckets it took over. What the lock-delay
        // protects is judged directly there: a grant beside a live lease of
        // the node's earlier run is an overlap.
        const auto node_starts = starts.find(std::string_view(e.node));
        if (options.replicas < 2 && inv.has_value() && node_starts != starts.end()) {
          const std::vector<std::size_t>& node_start = node_starts->second;
          const std::int64_t invoked = history[inv->event].t_ns;
          // The latest start at or before the invocation.
          const auto after =
              std::upper_bound(node_start.begin(), node_start.end(), invoked,
                               [&](std::int64_t t, std::size_t s) { return t < history[s].t_ns; });
          if (after != node_start.begin()) {
            const Event& s = history[*std::prev(after)];
            const std::int64_t delay_end = s.t_ns + s.lock_delay_ms * kNsPerMs;
            if (e.t_ns < delay_end) {
              recorder.add(ViolationKind::kLockDelay, keys_text(e), [&] {
                return "client " + num(e.client) + " invoked acquire at " + num(invoked) +
                       " and got " + tokens_text(e) + from_node(e) + " at " + num(e.t_ns) +
                       ", within the lock delay of incarnation " + num(s.incarnation) +
                       " started at " + num(s.t_ns) + " (delay ends " + num(delay_end) + ")";
              });
            }
          }
        }

        served(e);
        break;
      }
      case EventKind::kAcquireFail: {
        const std::optional<Invocation> inv = complete(Family::kAcquire, e);
        const Event& asked = inv.has_value() ? history[inv->event] : e;
        count(kind_prefix(asked) +
              (inv.has_value() && inv->try_acquire ? "try-acquire " : "acquire ") +
              outcome(e.error));
        ++report.lease_operations;
        if (!asked.outside && !e.outside) denied(e, "acquire", asked.t_ns);
        // A waiting acquire reports a recovering or unreachable node only
        // once its wait is spent: it rides through a lock-delay or a
        // failover until then.
        if (inv.has_value() && !inv->try_acquire &&
            (e.error == "recovering" || e.error == "unreachable")) {
          const std::int64_t waited_ns = e.t_ns - asked.t_ns;
          if (waited_ns < (asked.wait_ms - kWaitSlackMs) * kNsPerMs) {
            recorder.add(ViolationKind::kWait, keys_text(asked), [&] {
              return "client " + num(e.client) + " op " + num(e.op) + " answered " + e.error +
                     " after " + num(waited_ns / kNsPerMs) + " ms of a " + num(asked.wait_ms) +
                     " ms wait";
            });
          }
        }
        break;
      }
      case EventKind::kHold:
      case EventKind::kRenewOk: {
        Grant& g = grant(e, kid);
        g.has_end = true, g.end = e.expiry_ns;
        if (e.kind == EventKind::kHold) {
          count("hold");
        } else {
          (void)complete(Family::kRenew, e);
          count("renew ok");
          ++report.lease_operations;
        }
        break;
      }
      case EventKind::kRenewInvoke:
        invocations[OpId{Family::kRenew, e.client, e.op}] = Invocation{i, false, Best{}, {}};
        break;
      case EventKind::kRenewFail: {
        const std::optional<Invocation> inv = complete(Family::kRenew, e);
        count("renew " + outcome(e.error));
        ++report.lease_operations;
        denied(e, "renew", inv.has_value() ? history[inv->event].t_ns : e.t_ns);
        break;
      }
      case EventKind::kReleaseInvoke:
      case EventKind::kLost: {
        Grant& g = grant(e, kid);
        if (!g.has_cut) g.has_cut = true, g.cut = e.t_ns;
        if (e.kind == EventKind::kLost) {
          count("lost");
          if (options.replicas > 1 && g.has_start) {
            losses.push_back(LostLease{i, key_names[kid], g.start, g.node});
          }
        } else {
          invocations[OpId{Family::kRelease, e.client, e.op}] = Invocation{i, false, Best{}, {}};
        }
        break;
      }
      case EventKind::kReleaseOk:
        (void)complete(Family::kRelease, e);
        count("release ok");
        ++report.lease_operations;
        break;
      case EventKind::kReleaseFail: {
        const std::optional<Invocation> inv = complete(Family::kRelease, e);
        count("release " + outcome(e.error));
        ++report.lease_operations;
        denied(e, "release", inv.has_value() ? history[inv->event].t_ns : e.t_ns);
        // kept: a release refused because the server no longer has a lease
        // the client still held (its expiry after the release's invocation)
        // is a loss too, found at the release instead of at a renewal.
        const Grant& g = grant(e, kid);
        if (options.replicas > 1 && inv.has_value() && g.has_start && g.has_end &&
            g.end > history[inv->event].t_ns && (e.error == "expired" || e.error == "not_owner")) {
          losses.push_back(LostLease{i, key_names[kid], g.start, g.node});
        }
        break;
      }
      case EventKind::kRead:
        count("read");
        break;
      case EventKind::kWriteInvoke:
        break;
      case EventKind::kWriteAccepted: {
        count("write accepted");
        KeyState& k = state(kid);
        if (k.any_write && e.token < k.last_token) {
          recorder.add(ViolationKind::kFencing, e.key, [&] {
            const Event& p = history[k.last_write];
            return "write by client " + num(e.client) + " with token " + num(e.token) +
                   " accepted at " + num(e.t_ns) + " after client " + num(p.client) +
                   "'s write with token " + num(p.token) + " at " + num(p.t_ns);
          });
        }
        if (e.value != k.last_value + 1) {
          recorder.add(ViolationKind::kLostIncrement, e.key, [&] {
            return "write by client " + num(e.client) + " with token " + num(e.token) +
                   " accepted value " + num(e.value) + " at " + num(e.t_ns) + ", expected " +
                   num(k.last_value + 1);
          });
        }
        if (!k.any_write || e.token > k.last_token) k.last_token = e.token;
        k.any_write = true;
        k.last_write = i;
        k.last_value = e.value;
        ++k.accepted;
        break;
      }
      case EventKind::kWriteRejected:
        count(e.value == -1 ? "read refused" : "write rejected");
        break;
      case EventKind::kFinalCounter:
        (void)state(kid);
        finals.push_back(i);
        break;
      case EventKind::kServerKill:
        ++report.faults["server kill -9"];
        break;
      case EventKind::kServerPause:
        ++report.faults["server pause"];
        break;
      case EventKind::kClientPause:
        ++report.faults["client pause"];
        break;
      case EventKind::kNetFaultsOn:
        ++report.faults["network faults"];
        break;
      case EventKind::kNodeJoin:
        ++report.faults["node join"];
        break;
      case EventKind::kNodeLeave:
        ++report.faults["node leave"];
        break;
      case EventKind::kDrainOn:
        ++report.faults["node drain"];
        break;
      case EventKind::kEtcdCutOn:
        ++report.faults["etcd partition"];
        break;
      case EventKind::kClientCutOn:
        ++report.faults["client partition"];
        break;
      case EventKind::kMap:
        ++report.maps;
        break;
      case EventKind::kFault: {
        std::string name = e.fault;
        std::replace(name.begin(), name.end(), '_', ' ');
        ++report.faults[name];
        break;
      }
      case EventKind::kNodeCutOn:
        ++report.faults["node partition"];
        break;
      case EventKind::kNodeReplaced:
        ++report.faults["node replacement"];
        break;
      case EventKind::kDrainOff:
      case EventKind::kEtcdCutOff:
      case EventKind::kClientCutOff:
      case EventKind::kNodeCutOff:
        break;
      case EventKind::kServerStart:
      case EventKind::kServerReady:
      case EventKind::kServerResume:
      case EventKind::kClientResume:
      case EventKind::kNetFaultsOff:
      case EventKind::kHealed:
        break;
      case EventKind::kCampaignFail:  // judge_elections() counts and judges it
        denied(e, "campaign", e.t_ns);
        break;
      case EventKind::kCampaignInvoke:  // judge_elections() counts and judges these
      case EventKind::kElected:
      case EventKind::kLead:
      case EventKind::kResignInvoke:
      case EventKind::kResignOk:
      case EventKind::kResignFail:
      case EventKind::kDeposed:
      case EventKind::kObserve:
        break;
    }
  }

  // Final counters: every accepted write must be in the count.
  for (const std::size_t i : finals) {
    const Event& e = history[i];
    const KeyState& k = keys[key_ids.at(e.key)];
    if (e.value < 0 || static_cast<std::uint64_t>(e.value) != k.accepted) {
      recorder.add(ViolationKind::kLostIncrement, e.key, [&] {
        return "final counter " + num(e.value) + " at " + num(e.t_ns) + ", but " + num(k.accepted) +
               " writes were accepted";
      });
    }
  }

  for (const auto& [id, inv] : invocations) {
    switch (id.family) {
      case Family::kAcquire:
        count(inv.try_acquire ? "try-acquire unfinished" : "acquire unfinished");
        break;
      case Family::kRenew:
        count("renew unfinished");
        break;
      case Family::kRelease:
        count("release unfinished");
        break;
    }
  }

  // Overlap and permit_limit: each grant's validity interval, swept by start
  // time.
  std::vector<Interval> intervals;
  intervals.reserve(grants.size());
  for (const auto& [id, g] : grants) {
    if (!g.has_start || !g.has_end) continue;
    const std::int64_t end = g.has_cut ? std::min(g.end, g.cut) : g.end;
    if (end <= g.start) continue;  // never valid
    intervals.push_back(
        Interval{g.start, end, id.client, id.key, id.token, g.mode, g.permits, g.node});
  }
  std::sort(intervals.begin(), intervals.end(), [](const Interval& a, const Interval& b) {
    return std::tie(a.start, a.end, a.key, a.client, a.token) <
           std::tie(b.start, b.end, b.key, b.client, b.token);
  });
  // Per key and mode, the latest-ending intervals so far: an interval
  // overlaps a conflicting one exactly when it starts before the latest end
  // among that mode's intervals of other clients.
  std::vector<std::array<TopTwo, kModeCount>> tops(key_names.size());
  std::vector<OpenPermits> permits(key_names.size());
  for (const Interval& x : intervals) {
    std::array<TopTwo, kModeCount>& top = tops[x.key];
    for (const AcquireMode mode :
         {AcquireMode::kExclusive, AcquireMode::kShared, AcquireMode::kPermit}) {
      if (!conflicts(x.mode, mode)) continue;
      const Interval* other = top[static_cast<std::size_t>(mode)].other_than(x.client);
      if (other != nullptr && other->end > x.start) {
        recorder.add(ViolationKind::kOverlap, key_names[x.key],
                     [&] { return interval_text(*other) + " overlaps " + interval_text(x); });
        break;  // one violation per interval, as before the kinds
      }
    }
    top[static_cast<std::size_t>(x.mode)].offer(x);

    if (x.mode != AcquireMode::kPermit) continue;
    OpenPermits& open = permits[x.key];
    open.close_until(x.start);
    open.add(x);
    const std::int64_t limit = *open.limits.begin();
    if (static_cast<std::int64_t>(open.open.size()) > limit) {
      recorder.add(ViolationKind::kPermitLimit, key_names[x.key], [&] {
        std::vector<Interval> holders = open.open;
        std::sort(holders.begin(), holders.end(),
                  [](const Interval& a, const Interval& b) { return a.start < b.start; });
        std::string text = num(static_cast<std::uint64_t>(holders.size())) + " permit holders at " +
                           num(x.start) + " (limit " + num(limit) + "):";
        for (std::size_t n = 0; n < holders.size() && n < 8; ++n) {
          text += (n > 0 ? "; " : " ") + interval_text(holders[n]) + " permits " +
                  num(holders[n].permits);
        }
        return text;
      });
    }
  }

  if (healed) {
    for (const auto& entry : clients) {
      const auto client = entry.first;  // named, not bound: see above
      const auto& live = entry.second;
      if (!live.active || live.granted) continue;
      recorder.add(ViolationKind::kLiveness, "", [&] {
        return "client " + num(client) + " active after healed at " + num(healed_t) +
               " (first event at " + num(live.first_active) + ") got no grant by " +
               num(live_until) +
               (live.any_later_grant ? "; first grant after heal at " + num(live.later_grant)
                                     : std::string("; no grant after heal"));
      });
    }
  }

  for (const auto& entry : key_liveness) {
    const std::uint32_t id = entry.first;  // named, not bound: see above
    const KeyLiveness& live = entry.second;
    if (!live.wanted || live.granted) continue;
    recorder.add(ViolationKind::kKeyLiveness, key_names[id], [&] {
      const Event& first = history[live.first_invoke];
      std::string text = "asked for by client " + num(first.client) + " at " + num(first.t_ns) +
                         ", within the liveness bound after healed at " + num(healed_t) +
                         ", and never granted to anyone after the heal (" + num(live.failures) +
                         " failed acquires";
      if (live.failures > 0) {
        const Event& last = history[live.last_failure];
        text += ", the last at " + num(last.t_ns) + ": " + outcome(last.error);
      }
      return text + ")";
    });
  }

  judge_elections(history, order, report,
                  [&](ViolationKind kind, std::string_view name, const DetailText& detail) {
                    recorder.add(kind, name, detail);
                  });

  report.kept_judged =
      judge_kept(history, order, losses, options, [&](const LostLease& loss, std::string detail) {
        recorder.add(ViolationKind::kKept, loss.key, [&] { return std::move(detail); });
      });

  recorder.finish();
  return report;
}

}  // namespace shardlock::torture
