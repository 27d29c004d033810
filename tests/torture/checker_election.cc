// The election properties. See checker.h (Elections) and checker_election.h.
//
// One pass in time order files every event under its campaign (client, op)
// or its observer (client, name), and judges what needs only the past:
// term_order against the elections won before a campaign was invoked, and
// observer_order. Then the leadership intervals, sorted by start, are swept
// per name (one_leader, and term_order against the intervals that ended
// before each began), and every observer's report is judged against the
// whole history of campaigns (observed_leader: an observer may see a win
// before the campaigner's campaign() returns it).
#include "checker_election.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

namespace shardlock::torture {
namespace {

constexpr std::size_t kNoEvent = std::numeric_limits<std::size_t>::max();

std::string num(std::int64_t v) { return std::to_string(v); }
std::string num(std::uint64_t v) { return std::to_string(v); }

// A campaign: one campaign() call, named by its client and op.
using CampaignKey = std::pair<std::int64_t, std::int64_t>;

std::string campaign_text(const CampaignKey& c) {
  return "client " + num(c.first) + "'s campaign op " + num(c.second);
}

struct Campaign {
  std::size_t invoke = kNoEvent;
  std::size_t elected = kNoEvent;
  std::uint64_t term = 0;  // 0: not won, or won with the term unread
  bool finished = false;   // elected or failed
  // The largest term won on the name before this campaign was invoked.
  std::uint64_t max_before = 0;
  std::size_t max_before_event = kNoEvent;
  // The client's view of its leadership: the last lead, and the first
  // resign_invoke or deposed.
  bool has_lead = false;
  std::int64_t last_lead = 0;
  bool has_cut = false;
  std::int64_t cut = 0;
};

struct NameState {
  std::uint64_t max_term = 0;  // the largest term won so far, and its elected event
  std::size_t max_event = kNoEvent;
  std::map<std::uint64_t, CampaignKey> winners;  // term -> the campaign that won it
};

// A leadership interval, as its client saw it.
struct Leadership {
  std::int64_t start;
  std::int64_t end;
  std::string_view name;
  std::uint64_t term;
  CampaignKey campaign;
};

std::string leadership_text(const Leadership& x) {
  return campaign_text(x.campaign) + " term " + num(x.term) + " [" + num(x.start) + ", " +
         num(x.end) + ")";
}

// "<client>.<op>", the value a campaign attaches; nullopt for anything else.
std::optional<CampaignKey> parse_campaign(std::string_view value) {
  const std::size_t dot = value.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  CampaignKey key;
  const auto whole = [](std::string_view text, std::int64_t& out) {
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    return ec == std::errc() && end == text.data() + text.size();
  };
  if (!whole(value.substr(0, dot), key.first) || !whole(value.substr(dot + 1), key.second)) {
    return std::nullopt;
  }
  return key;
}

}  // namespace

void judge_elections(
    const std::vector<Event>& history, const std::vector<std::size_t>& order, CheckReport& report,
    const std::function<void(ViolationKind, std::string_view, const DetailText&)>& violation) {
  std::map<CampaignKey, Campaign> campaigns;
  std::map<std::string_view, NameState> names;
  // (client, name, term) -> the campaign that won it, for lead, resign and
  // deposed events, which name their term, not their op.
  std::map<std::tuple<std::int64_t, std::string_view, std::uint64_t>, CampaignKey> by_term;
  // Per observer and name: the newest term reported, and where.
  std::map<std::pair<std::int64_t, std::string_view>, std::pair<std::uint64_t, std::size_t>>
      observed;
  std::vector<std::size_t> reports;    // observe events naming a leader
  std::set<CampaignKey> term_flagged;  // one term_order violation per campaign
  const auto count = [&](std::string name) {
    ++report.operations[std::move(name)];
    ++report.election_operations;
  };
  const auto outcome = [](const std::string& error) {
    return error.empty() || error == "-" ? std::string("failed") : error;
  };
  const auto cut = [&](const Event& e) {
    const auto it = by_term.find({e.client, e.key, e.token});
    if (it == by_term.end()) return;
    Campaign& c = campaigns[it->second];
    if (!c.has_cut || e.t_ns < c.cut) c.has_cut = true, c.cut = e.t_ns;
  };

  for (const std::size_t i : order) {
    const Event& e = history[i];
    switch (e.kind) {
      case EventKind::kCampaignInvoke: {
        Campaign& c = campaigns[{e.client, e.op}];
        const NameState& name = names[e.key];
        c.invoke = i, c.max_before = name.max_term, c.max_before_event = name.max_event;
        break;
      }
      case EventKind::kElected: {
        count("campaign elected");
        const CampaignKey key{e.client, e.op};
        Campaign& c = campaigns[key];
        c.finished = true, c.elected = i, c.term = e.token;
        if (e.token == 0) break;  // won, but the term was unread: nothing to order
        by_term[{e.client, e.key, e.token}] = key;
        NameState& name = names[e.key];
        const auto [winner, first] = name.winners.try_emplace(e.token, key);
        if (!first && winner->second != key) {
          term_flagged.insert(key);
          const CampaignKey other = winner->second;
          violation(ViolationKind::kTermOrder, e.key, [&, other] {
            return campaign_text(key) + " won term " + num(e.token) + " at " + num(e.t_ns) +
                   ", which " + campaign_text(other) + " had won at " +
                   num(history[campaigns[other].elected].t_ns);
          });
        } else if (c.max_before_event != kNoEvent && e.token <= c.max_before) {
          term_flagged.insert(key);
          violation(ViolationKind::kTermOrder, e.key, [&] {
            const Event& earlier = history[c.max_before_event];
            return campaign_text(key) + " invoked at " + num(history[c.invoke].t_ns) +
                   " won term " + num(e.token) + " at " + num(e.t_ns) + ", but client " +
                   num(earlier.client) + " had won term " + num(earlier.token) + " at " +
                   num(earlier.t_ns);
          });
        }
        if (name.max_event == kNoEvent || e.token > name.max_term) {
          name.max_term = e.token, name.max_event = i;
        }
        break;
      }
      case EventKind::kCampaignFail: {
        count("campaign " + outcome(e.error));
        campaigns[{e.client, e.op}].finished = true;
        break;
      }
      case EventKind::kLead: {
        ++report.operations["lead"];
        const auto it = by_term.find({e.client, e.key, e.token});
        if (it == by_term.end()) break;
        Campaign& c = campaigns[it->second];
        c.has_lead = true, c.last_lead = std::max(c.last_lead, e.t_ns);
        break;
      }
      case EventKind::kResignInvoke:
        cut(e);
        break;
      case EventKind::kResignOk:
        count("resign ok");
        break;
      case EventKind::kResignFail:
        count("resign " + outcome(e.error));
        break;
      case EventKind::kDeposed:
        ++report.operations["deposed"];
        cut(e);
        break;
      case EventKind::kObserve: {
        if (e.token == 0) {
          count("observe no leader");
          break;
        }
        count("observe leader");
        reports.push_back(i);
        auto& [last_term, last_event] = observed[{e.client, e.key}];
        if (last_term != 0 && e.token <= last_term) {
          const std::size_t before = last_event;
          violation(ViolationKind::kObserverOrder, e.key, [&, before] {
            const Event& b = history[before];
            return "observer client " + num(e.client) + " reported term " + num(e.token) + " (" +
                   e.leader + ") at " + num(e.t_ns) + " after term " + num(b.token) + " (" +
                   b.leader + ") at " + num(b.t_ns) +
                   (e.token == b.token ? ": the same leader twice" : ": an older leader");
          });
        }
        if (e.token > last_term) last_term = e.token, last_event = i;
        break;
      }
      default:
        break;
    }
  }

  for (const auto& entry : campaigns) {
    if (entry.second.invoke != kNoEvent && !entry.second.finished) {
      ++report.operations["campaign unfinished"];
    }
  }

  // Leadership intervals: from the win to the last lead, cut at the resign
  // or the loss. A win never confirmed by a lead is no interval.
  std::vector<Leadership> intervals;
  for (const auto& [key, c] : campaigns) {
    if (c.elected == kNoEvent || c.term == 0 || !c.has_lead) continue;
    const Event& won = history[c.elected];
    const std::int64_t end = c.has_cut ? std::min(c.last_lead, c.cut) : c.last_lead;
    if (end <= won.t_ns) continue;
    intervals.push_back(Leadership{won.t_ns, end, won.key, c.term, key});
  }
  std::sort(intervals.begin(), intervals.end(), [](const Leadership& a, const Leadership& b) {
    return std::tie(a.name, a.start, a.end, a.campaign) <
           std::tie(b.name, b.start, b.end, b.campaign);
  });
  const auto later_end = [](const Leadership& a, const Leadership& b) { return a.end > b.end; };
  std::vector<Leadership> open;      // a min-heap by end: begun, not yet known to have ended
  std::optional<Leadership> latest;  // the latest-ending so far
  std::optional<Leadership> ended;   // the largest term among those ended
  for (std::size_t n = 0; n < intervals.size(); ++n) {
    const Leadership& x = intervals[n];
    if (n == 0 || intervals[n - 1].name != x.name) open.clear(), latest.reset(), ended.reset();
    while (!open.empty() && open.front().end <= x.start) {
      if (!ended || open.front().term > ended->term) ended = open.front();
      std::pop_heap(open.begin(), open.end(), later_end);
      open.pop_back();
    }
    if (ended && x.term <= ended->term && term_flagged.insert(x.campaign).second) {
      violation(ViolationKind::kTermOrder, x.name, [&, before = *ended] {
        return leadership_text(x) + " began after " + leadership_text(before) +
               " ended, with a term no larger";
      });
    }
    if (latest && latest->end > x.start) {
      violation(ViolationKind::kOneLeader, x.name, [&, other = *latest] {
        return leadership_text(other) + " overlaps " + leadership_text(x);
      });
    }
    if (!latest || x.end > latest->end) latest = x;
    open.push_back(x);
    std::push_heap(open.begin(), open.end(), later_end);
  }

  // Every reported leader must be a campaign's win.
  for (const std::size_t i : reports) {
    const Event& e = history[i];
    const std::optional<CampaignKey> key = parse_campaign(e.leader);
    const auto c = key ? campaigns.find(*key) : campaigns.end();
    const std::string seen = "observer client " + num(e.client) + " reported term " + num(e.token) +
                             " (" + e.leader + ") at " + num(e.t_ns);
    if (c == campaigns.end() || c->second.invoke == kNoEvent ||
        history[c->second.invoke].key != e.key || history[c->second.invoke].t_ns > e.t_ns) {
      violation(ViolationKind::kObservedLeader, e.key,
                [&] { return seen + ", a value naming no campaign of this name invoked before"; });
      continue;
    }
    if (c->second.term != 0) {
      if (c->second.term != e.token) {
        violation(ViolationKind::kObservedLeader, e.key, [&] {
          return seen + ", but " + campaign_text(*key) + " won term " + num(c->second.term) +
                 " at " + num(history[c->second.elected].t_ns);
        });
      }
      continue;
    }
    const NameState& name = names[e.key];
    const auto winner = name.winners.find(e.token);
    if (winner != name.winners.end() && winner->second != *key) {
      violation(ViolationKind::kObservedLeader, e.key, [&] {
        return seen + " for " + campaign_text(*key) + ", which never returned a win, but " +
               campaign_text(winner->second) + " won that term";
      });
    }
  }
}

}  // namespace shardlock::torture
