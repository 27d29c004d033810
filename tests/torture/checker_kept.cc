// The kept property. See checker.h (kept) and checker_kept.h.
#include "checker_kept.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace shardlock::torture {
namespace {

constexpr std::int64_t kNsPerMs = 1'000'000;
// The end of a disturbance that never ended within the history.
constexpr std::int64_t kOpen = std::numeric_limits<std::int64_t>::max() / 2;
// A node may act on a map a little before the harness's watch records it.
constexpr std::int64_t kMapLagNs = 1000 * kNsPerMs;

// A stretch of the nemesis's doing: a node fault (what kept is about: a kill
// until the restart is ready, a pause until the resume, a node-to-node cut
// until it heals) or another disturbance, one that may lose leases by design.
struct Disturbance {
  std::int64_t start = 0;
  std::int64_t end = kOpen;
  bool node_fault = false;
  std::vector<std::string> nodes;  // a node fault's node(s)
  std::int64_t worker = -1;        // a client pause: the paused worker
  std::string what;                // "kill -9 of n1", "n1 cut off from n2", ...
};

std::string num(std::int64_t v) { return std::to_string(v); }

// The nemesis's events as disturbances, in order of their start.
std::vector<Disturbance> disturbances(const std::vector<Event>& history,
                                      const std::vector<std::size_t>& order) {
  std::vector<Disturbance> out;
  // The open ones, by the name of the event that ends them.
  std::map<std::string, std::size_t> open;
  const auto begin = [&](const std::string& ended_by, const Event& e, bool node_fault,
                         std::string what) {
    open[ended_by] = out.size();
    Disturbance d{e.t_ns, kOpen, node_fault, {}, -1, std::move(what)};
    if (node_fault) d.nodes.push_back(e.node);
    if (node_fault && !e.peer.empty()) d.nodes.push_back(e.peer);
    out.push_back(std::move(d));
  };
  const auto finish = [&](const std::string& ended_by, const Event& e) {
    const auto it = open.find(ended_by);
    if (it == open.end()) return;
    out[it->second].end = e.t_ns;
    open.erase(it);
  };
  for (const std::size_t i : order) {
    const Event& e = history[i];
    const std::string& node = e.node;
    switch (e.kind) {
      case EventKind::kServerKill:
        begin("ready " + node, e, true, "kill -9 of " + node);
        break;
      case EventKind::kServerStart:
        // A start after a kill is the kill's restart; any other (a rolling
        // restart, a joining node) moves buckets by itself.
        if (open.count("ready " + node) == 0) begin("ready " + node, e, false, "start of " + node);
        break;
      case EventKind::kServerReady:
        finish("ready " + node, e);
        break;
      case EventKind::kServerPause:
        begin("resume " + node, e, true, "pause of " + node);
        break;
      case EventKind::kServerResume:
        finish("resume " + node, e);
        break;
      case EventKind::kNodeCutOn:
        begin("cut " + node + " " + e.peer, e, true, node + " cut off from " + e.peer);
        break;
      case EventKind::kNodeCutOff:
        finish("cut " + node + " " + e.peer, e);
        break;
      case EventKind::kEtcdCutOn:
        begin("etcd " + node, e, false, "etcd partition of " + node);
        break;
      case EventKind::kEtcdCutOff:
        finish("etcd " + node, e);
        break;
      case EventKind::kClientCutOn:
        begin("clients " + node, e, false, "client partition of " + node);
        break;
      case EventKind::kClientCutOff:
        finish("clients " + node, e);
        break;
      case EventKind::kDrainOn:
        begin("drain " + node, e, false, "drain of " + node);
        break;
      case EventKind::kDrainOff:
        finish("drain " + node, e);
        break;
      case EventKind::kNodeJoin:
      case EventKind::kNodeLeave:
        out.push_back(
            Disturbance{e.t_ns,
                        e.t_ns,
                        false,
                        {},
                        -1,
                        (e.kind == EventKind::kNodeJoin ? "join of " : "leave of ") + node});
        break;
      case EventKind::kClientPause:
        begin("worker " + num(e.client), e, false, "pause of worker " + num(e.client));
        out.back().worker = e.client;
        break;
      case EventKind::kClientResume:
        finish("worker " + num(e.client), e);
        break;
      default:
        break;
    }
  }
  return out;
}

// The key's replicas in map event `m`: its owner (the primary), then its
// backups.
std::vector<std::string_view> replicas_of(const Event& m, std::string_view key) {
  std::vector<std::string_view> replicas;
  for (const auto& [k, node] : m.owners) {
    if (k == key) replicas.emplace_back(node);
  }
  for (const auto& [k, node] : m.backups) {
    if (k == key) replicas.emplace_back(node);
  }
  return replicas;
}

// The nodes of map event `m`, as its owners and backups of the workload's
// keys show them.
std::set<std::string_view> nodes_of(const Event& m) {
  std::set<std::string_view> nodes;
  for (const auto& owner : m.owners) nodes.insert(owner.second);
  for (const auto& backup : m.backups) nodes.insert(backup.second);
  return nodes;
}

// A map published in (from, to] that handed `key` off: gave it to a node
// outside its replicas in the map before, *because a node came (back)* into
// the map (a restarted or re-registered node taking its buckets back, a
// join). Replication does not carry a hand-off (only a takeover by a backup
// keeps the holders). A map that gave the key to a non-replica while no node
// came in had lost both of its replicas: after one node fault, that is no
// excuse. Described; nullopt if none.
std::optional<std::string> hand_off(const std::vector<const Event*>& maps, std::string_view key,
                                    std::int64_t from, std::int64_t to) {
  const Event* before = nullptr;
  for (const Event* m : maps) {
    if (m->t_ns > to) break;
    if (m->t_ns > from && before != nullptr) {
      const std::vector<std::string_view> was = replicas_of(*before, key);
      const std::vector<std::string_view> now = replicas_of(*m, key);
      const bool moved_out = !now.empty() && !was.empty() &&
                             std::find(was.begin(), was.end(), now.front()) == was.end();
      const std::set<std::string_view> old_nodes = nodes_of(*before);
      const std::set<std::string_view> new_nodes = nodes_of(*m);
      const bool grew = std::any_of(new_nodes.begin(), new_nodes.end(),
                                    [&](std::string_view n) { return old_nodes.count(n) == 0; });
      if (moved_out && grew) {
        return "epoch " + std::to_string(m->epoch) + " handed the key to " +
               std::string(now.front());
      }
    }
    before = m;
  }
  return std::nullopt;
}

}  // namespace

std::size_t judge_kept(const std::vector<Event>& history, const std::vector<std::size_t>& order,
                       const std::vector<LostLease>& losses, const CheckOptions& options,
                       const std::function<void(const LostLease&, std::string)>& violation) {
  if (options.replicas < 2 || losses.empty()) return 0;
  std::size_t judged = 0;
  const std::vector<Disturbance> all = disturbances(history, order);
  std::vector<const Event*> maps;
  for (const std::size_t i : order) {
    if (history[i].kind == EventKind::kMap) maps.push_back(&history[i]);
  }
  const std::int64_t settle = options.settle_ms * kNsPerMs;
  const std::int64_t failover = (options.replica_timeout_ms + options.failover_slack_ms) * kNsPerMs;
  for (const LostLease& loss : losses) {
    const Event& lost = history[loss.lost_event];
    const std::int64_t granted = loss.granted_at;
    // The cause: the last node fault that began before the loss, with the
    // lease granted before it began (a killed or paused node grants nothing;
    // a node cut off from a peer still answers, until its primary lease
    // runs out, so during a cut too).
    const Disturbance* cause = nullptr;
    for (const Disturbance& d : all) {
      const bool cut = d.nodes.size() > 1;
      if (d.node_fault && d.start <= lost.t_ns && granted <= (cut ? d.end : d.start)) cause = &d;
    }
    if (cause == nullptr) continue;  // no node fault: not kept's business
    // Anything else near it leaves the cluster possibly unsettled, and the
    // loss proves nothing: another disturbance (a hand-off by design, an
    // etcd or client partition, the client's own worker paused) from the
    // settle time before the grant on; another node fault on a node of the
    // cause within the settle time (it may be a restarted node younger than
    // the lock-delay, whose backups do not take over), or on any node within
    // a failover (both replicas of a bucket may be hit, or a new backup not
    // be caught up).
    const auto unsettled_by = [&](const Disturbance& d) {
      if (&d == cause || d.start > lost.t_ns) return false;
      if (!d.node_fault) {
        const bool other_worker = d.worker >= 0 && options.clients_per_worker > 0 &&
                                  lost.client / options.clients_per_worker != d.worker;
        return !other_worker && d.end + settle >= granted;
      }
      const bool shared = std::any_of(d.nodes.begin(), d.nodes.end(), [&](const std::string& n) {
        return std::find(cause->nodes.begin(), cause->nodes.end(), n) != cause->nodes.end();
      });
      return d.end + (shared ? settle : failover) >= cause->start;
    };
    if (std::any_of(all.begin(), all.end(), unsettled_by)) continue;
    if (options.kept_excuses_rejoins && hand_off(maps, loss.key, granted, lost.t_ns + kMapLagNs)) {
      continue;
    }
    ++judged;
    // A loss for want of renewals is the failover's only if the client had
    // the time to renew at the new primary.
    const std::int64_t exposed = lost.t_ns - std::max(cause->start, granted);
    if (lost.error == "no_renewal" && exposed < failover) continue;
    const char* how =
        lost.kind == EventKind::kLost ? " lost token " : " had the release refused of token ";
    violation(loss, "client " + num(lost.client) + how + std::to_string(lost.token) +
                        " (granted by " + std::string(loss.node) + " at " + num(granted) + ") at " +
                        num(lost.t_ns) + " (" + lost.error + "), " + num(exposed / kNsPerMs) +
                        " ms into " + cause->what + " (from " + num(cause->start) +
                        (cause->end == kOpen ? std::string(", never healed")
                                             : std::string(" to ") + num(cause->end)) +
                        "), with no other fault within the settle time" +
                        (options.kept_excuses_rejoins ? " and no hand-off of the key" : ""));
  }
  return judged;
}

}  // namespace shardlock::torture
