// See checker.h. Everything here works on history events alone.
#include "checker.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace shardlock::torture {
namespace {

constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

std::string ms(std::int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3fms", static_cast<double>(ns) / 1e6);
  return buf;
}

void escape_json(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

struct OpKey {
  std::int64_t client;
  std::int64_t op;
  friend bool operator<(const OpKey& a, const OpKey& b) noexcept {
    return std::tie(a.client, a.op) < std::tie(b.client, b.op);
  }
};

// One grant as its client saw it.
struct Grant {
  std::int64_t client = -1;
  std::uint64_t token = 0;
  std::int64_t invoked = 0;
  std::int64_t received = 0;
  std::int64_t expiry = 0;   // largest client-side expiry recorded
  std::int64_t cut = kNever;  // release invocation or loss
  [[nodiscard]] std::int64_t end() const noexcept { return std::min(expiry, cut); }
};

class Checker {
 public:
  Checker(const CheckOptions& options, CheckReport& report) : options_(options), report_(report) {}

  void violation(ViolationKind kind, const std::string& key, std::string detail) {
    std::size_t& n = report_.violation_counts[kind];
    if (n++ < options_.max_examples) report_.examples.push_back({kind, key, std::move(detail)});
  }

  void run(std::vector<Event> events) {
    std::stable_sort(events.begin(), events.end(),
                     [](const Event& a, const Event& b) { return a.t_ns < b.t_ns; });
    collect(events);
    check_overlap();
    check_token_order(events);
    check_resource(events);
    check_lock_delay();
    check_liveness(events);
  }

 private:
  using GrantKey = std::tuple<std::int64_t, std::string, std::uint64_t>;  // client, key, token

  void count(const std::string& what) { ++report_.operations[what]; }

  void collect(const std::vector<Event>& events) {
    for (const Event& e : events) {
      switch (e.kind) {
        case EventKind::kAcquireInvoke:
          invokes_[{e.client, e.op}] = &e;
          break;
        case EventKind::kAcquireOk: {
          ++report_.lease_operations;
          const auto it = invokes_.find({e.client, e.op});
          const bool try_only = it != invokes_.end() && it->second->wait_ms == 0;
          count(try_only ? "try-acquire ok" : "acquire ok");
          Grant& g = grants_[{e.client, e.key, e.token}];
          if (g.client < 0) {
            g.client = e.client;
            g.token = e.token;
            g.received = e.t_ns;
            g.invoked = it != invokes_.end() ? it->second->t_ns : e.t_ns;
            grant_order_[e.key].push_back({e.client, e.key, e.token});
          }
          g.expiry = std::max(g.expiry, e.expiry_ns);
          break;
        }
        case EventKind::kAcquireFail: {
          ++report_.lease_operations;
          const auto it = invokes_.find({e.client, e.op});
          const bool try_only = it != invokes_.end() && it->second->wait_ms == 0;
          count(std::string(try_only ? "try-acquire " : "acquire ") + e.error);
          break;
        }
        case EventKind::kRenewOk:
        case EventKind::kHold: {
          if (e.kind == EventKind::kRenewOk) {
            ++report_.lease_operations;
            count("renew ok");
          }
          const auto it = grants_.find({e.client, e.key, e.token});
          if (it != grants_.end()) it->second.expiry = std::max(it->second.expiry, e.expiry_ns);
          break;
        }
        case EventKind::kRenewFail:
          ++report_.lease_operations;
          count("renew " + e.error);
          break;
        case EventKind::kReleaseInvoke:
        case EventKind::kLost: {
          if (e.kind == EventKind::kLost) count("lost (" + e.error + ")");
          const auto it = grants_.find({e.client, e.key, e.token});
          if (it != grants_.end()) it->second.cut = std::min(it->second.cut, e.t_ns);
          break;
        }
        case EventKind::kReleaseOk:
          ++report_.lease_operations;
          count("release ok");
          break;
        case EventKind::kReleaseFail:
          ++report_.lease_operations;
          count("release " + e.error);
          break;
        case EventKind::kRead:
          count("read");
          break;
        case EventKind::kWriteInvoke:
          break;
        case EventKind::kWriteAccepted:
          count("write accepted");
          break;
        case EventKind::kWriteRejected:
          count(e.value == -1 ? "read refused (fenced)" : "write refused (fenced)");
          break;
        case EventKind::kServerStart:
          starts_.push_back(&e);
          break;
        case EventKind::kServerKill:
          ++report_.faults["server kill -9"];
          break;
        case EventKind::kServerPause:
          ++report_.faults["server pause"];
          break;
        case EventKind::kClientPause:
          ++report_.faults["client pause"];
          break;
        case EventKind::kNetFaultsOn:
          ++report_.faults["network faults (periods)"];
          break;
        case EventKind::kHealed:
          healed_ = e.t_ns;
          break;
        default:
          break;
      }
    }
  }

  // Sweep by start, keeping the two latest-ending intervals of distinct
  // clients: any earlier interval that overlaps the next one and belongs to
  // another client is one of them.
  void check_overlap() {
    for (const auto& [key, order] : grant_order_) {
      std::vector<const Grant*> intervals;
      for (const GrantKey& k : order) {
        const Grant& g = grants_.at(k);
        if (g.end() > g.received) intervals.push_back(&g);
      }
      std::sort(intervals.begin(), intervals.end(),
                [](const Grant* a, const Grant* b) { return a->received < b->received; });
      const Grant* first = nullptr;   // latest end
      const Grant* second = nullptr;  // latest end of a client other than first's
      for (const Grant* g : intervals) {
        const Grant* other = first != nullptr && first->client != g->client ? first : second;
        if (other != nullptr && other->client != g->client && other->end() > g->received) {
          violation(ViolationKind::kOverlap, key,
                    "client " + std::to_string(other->client) + " (token " +
                        std::to_string(other->token) + ") valid until " + ms(other->end()) +
                        ", client " + std::to_string(g->client) + " (token " +
                        std::to_string(g->token) + ") granted at " + ms(g->received) +
                        ": overlap " + ms(other->end() - g->received));
        }
        if (first == nullptr || g->end() > first->end()) {
          if (first != nullptr && first->client != g->client) second = first;
          first = g;
        } else if (g->client != first->client && (second == nullptr || g->end() > second->end())) {
          second = g;
        }
      }
    }
  }

  void check_token_order(const std::vector<Event>& events) {
    struct KeyState {
      std::uint64_t max_token = 0;
      std::int64_t max_client = -1;
      std::unordered_map<std::uint64_t, std::int64_t> owner_of_token;
    };
    std::unordered_map<std::string, KeyState> keys;
    std::map<OpKey, std::uint64_t> bar;  // the max token received when the op was invoked
    for (std::size_t i = 0; i < events.size();) {
      // Invokes before grants at one instant: "received before invoked" is strict.
      std::size_t j = i;
      while (j < events.size() && events[j].t_ns == events[i].t_ns) ++j;
      for (std::size_t k = i; k < j; ++k) {
        const Event& e = events[k];
        if (e.kind == EventKind::kAcquireInvoke) bar[{e.client, e.op}] = keys[e.key].max_token;
      }
      for (std::size_t k = i; k < j; ++k) {
        const Event& e = events[k];
        if (e.kind != EventKind::kAcquireOk) continue;
        KeyState& s = keys[e.key];
        const auto b = bar.find({e.client, e.op});
        if (b != bar.end() && e.token <= b->second) {
          violation(ViolationKind::kTokenOrder, e.key,
                    "client " + std::to_string(e.client) + " granted token " +
                        std::to_string(e.token) + " at " + ms(e.t_ns) +
                        ", but token " + std::to_string(b->second) +
                        " had been granted before its ACQUIRE was invoked");
        }
        const auto [it, fresh] = s.owner_of_token.emplace(e.token, e.client);
        if (!fresh && it->second != e.client) {
          violation(ViolationKind::kDuplicateToken, e.key,
                    "token " + std::to_string(e.token) + " granted to client " +
                        std::to_string(it->second) + " and to client " +
                        std::to_string(e.client));
        }
        if (e.token > s.max_token) {
          s.max_token = e.token;
          s.max_client = e.client;
        }
      }
      i = j;
    }
  }

  void check_resource(const std::vector<Event>& events) {
    struct KeyState {
      std::uint64_t max_token = 0;
      std::int64_t value = 0;
      std::uint64_t accepted = 0;
    };
    std::unordered_map<std::string, KeyState> keys;
    for (const Event& e : events) {
      if (e.kind == EventKind::kWriteAccepted) {
        KeyState& s = keys[e.key];
        if (e.token < s.max_token) {
          violation(ViolationKind::kFencing, e.key,
                    "write with token " + std::to_string(e.token) + " accepted at " +
                        ms(e.t_ns) + " after one with token " + std::to_string(s.max_token));
        }
        if (e.value != s.value + 1) {
          violation(ViolationKind::kLostIncrement, e.key,
                    "accepted write of " + std::to_string(e.value) + " (token " +
                        std::to_string(e.token) + ") at " + ms(e.t_ns) + " after " +
                        std::to_string(s.value));
        }
        s.max_token = std::max(s.max_token, e.token);
        s.value = e.value;
        ++s.accepted;
      } else if (e.kind == EventKind::kFinalCounter) {
        const KeyState& s = keys[e.key];
        if (e.value != static_cast<std::int64_t>(s.accepted)) {
          violation(ViolationKind::kLostIncrement, e.key,
                    "final counter " + std::to_string(e.value) + " but " +
                        std::to_string(s.accepted) + " writes were accepted");
        }
      }
    }
  }

  void check_lock_delay() {
    for (const auto& [k, g] : grants_) {
      // The latest start at or before the ACQUIRE's invocation: the old
      // incarnation was dead by then, so only this one can have granted it.
      const Event* start = nullptr;
      for (const Event* s : starts_) {
        if (s->t_ns <= g.invoked) start = s;
      }
      if (start == nullptr) continue;
      const std::int64_t recovered = start->t_ns + start->lock_delay_ms * 1'000'000;
      if (g.received < recovered) {
        violation(ViolationKind::kLockDelay, std::get<1>(k),
                  "client " + std::to_string(g.client) + " granted token " +
                      std::to_string(g.token) + " at " + ms(g.received) +
                      ", inside the lock-delay of incarnation " +
                      std::to_string(start->incarnation) + " (started " + ms(start->t_ns) +
                      ", delay " + std::to_string(start->lock_delay_ms) + " ms)");
      }
    }
  }

  void check_liveness(const std::vector<Event>& events) {
    if (!healed_) return;
    report_.liveness_checked = true;
    const std::int64_t deadline = *healed_ + options_.liveness_bound_ms * 1'000'000;
    std::map<std::int64_t, bool> acquired;  // client -> acquired in time
    for (const Event& e : events) {
      if (e.t_ns < *healed_ || e.client < 0) continue;
      if (e.kind == EventKind::kWriteAccepted || e.kind == EventKind::kWriteRejected) continue;
      bool& ok = acquired[e.client];
      if (e.kind == EventKind::kAcquireOk && e.t_ns <= deadline) ok = true;
    }
    for (const auto& [client, ok] : acquired) {
      if (!ok) {
        violation(ViolationKind::kLiveness, "-",
                  "client " + std::to_string(client) + " ran after the heal at " +
                      ms(*healed_) + " but acquired nothing within " +
                      std::to_string(options_.liveness_bound_ms) + " ms");
      }
    }
  }

  const CheckOptions& options_;
  CheckReport& report_;
  std::map<OpKey, const Event*> invokes_;
  std::map<GrantKey, Grant> grants_;
  std::map<std::string, std::vector<GrantKey>> grant_order_;
  std::vector<const Event*> starts_;
  std::optional<std::int64_t> healed_;
};

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
  }
  return "unknown";
}

std::size_t CheckReport::count(ViolationKind kind) const noexcept {
  const auto it = violation_counts.find(kind);
  return it == violation_counts.end() ? 0 : it->second;
}

std::string CheckReport::text() const {
  std::string out;
  char line[160];
  out += "operations                                    count\n";
  for (const auto& [what, n] : operations) {
    std::snprintf(line, sizeof line, "  %-40s %10llu\n", what.c_str(),
                  static_cast<unsigned long long>(n));
    out += line;
  }
  out += "faults injected                               count\n";
  for (const auto& [what, n] : faults) {
    std::snprintf(line, sizeof line, "  %-40s %10llu\n", what.c_str(),
                  static_cast<unsigned long long>(n));
    out += line;
  }
  out += "violations                                    count\n";
  for (const ViolationKind kind :
       {ViolationKind::kOverlap, ViolationKind::kTokenOrder, ViolationKind::kDuplicateToken,
        ViolationKind::kFencing, ViolationKind::kLostIncrement, ViolationKind::kLockDelay,
        ViolationKind::kLiveness}) {
    std::snprintf(line, sizeof line, "  %-40s %10zu%s\n", std::string(to_string(kind)).c_str(),
                  count(kind),
                  kind == ViolationKind::kLiveness && !liveness_checked ? " (not checked)" : "");
    out += line;
  }
  for (const Violation& v : examples) {
    out += "  ";
    out += to_string(v.kind);
    out += " on " + v.key + ": " + v.detail + "\n";
  }
  out += ok() ? "result: no violations\n" : "result: VIOLATIONS FOUND\n";
  return out;
}

std::string CheckReport::json() const {
  std::string out = "{\"ok\":";
  out += ok() ? "true" : "false";
  out += ",\"lease_operations\":" + std::to_string(lease_operations);
  out += ",\"liveness_checked\":";
  out += liveness_checked ? "true" : "false";
  const auto counts = [&](const char* name, const std::map<std::string, std::uint64_t>& m) {
    out += ",\"";
    out += name;
    out += "\":{";
    bool first = true;
    for (const auto& [what, n] : m) {
      if (!first) out += ',';
      first = false;
      escape_json(out, what);
      out += ':' + std::to_string(n);
    }
    out += '}';
  };
  counts("operations", operations);
  counts("faults", faults);
  out += ",\"violations\":{";
  bool first = true;
  for (const auto& [kind, n] : violation_counts) {
    if (!first) out += ',';
    first = false;
    escape_json(out, to_string(kind));
    out += ":{\"count\":" + std::to_string(n) + ",\"examples\":[";
    bool first_example = true;
    for (const Violation& v : examples) {
      if (v.kind != kind) continue;
      if (!first_example) out += ',';
      first_example = false;
      out += "{\"key\":";
      escape_json(out, v.key);
      out += ",\"detail\":";
      escape_json(out, v.detail);
      out += '}';
    }
    out += "]}";
  }
  out += "}}";
  return out;
}

CheckReport check(const std::vector<Event>& history, const CheckOptions& options) {
  CheckReport report;
  Checker(options, report).run(history);
  return report;
}

}  // namespace shardlock::torture
