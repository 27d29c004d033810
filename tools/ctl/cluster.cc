// shardlockctl members and drain ID: the cluster's members as etcd has
// them, and a node asked to drain (or to come back), read and written in
// etcd directly; a build without the cluster layer says so and fails.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <memory>
#include <optional>
#include <thread>

#include "ctl/commands.h"
#if defined(SHARDLOCK_HAVE_CLUSTER)
#include <map>

#include "common/etcd_flags.h"
#include "membership.h"  // src/cluster/etcd: the etcd client and the cluster's keys
#include "shardlock/cluster/cluster_map.h"
#endif

namespace shardlock::ctl {

namespace {

// The flags of members and drain.
struct ClusterArgs {
  std::string url;  // --cluster etcd://HOST:PORT[,HOST:PORT...] (etcds:// for TLS)
#if defined(SHARDLOCK_HAVE_CLUSTER)
  shardlock::tools::EtcdFlags etcd;  // --etcd-cacert, --etcd-user, ...
#endif
  std::string name = "default";
  bool json = false;    // the output switch (-w json)
  std::string node_id;  // drain
  bool cancel = false;  // drain
  bool force = false;   // drain
  DurationArg wait;     // drain: empty when not given
};

#if defined(SHARDLOCK_HAVE_CLUSTER)

namespace cluster = shardlock::cluster;

// One line of `members`: a live member, a member of the map whose key is
// gone, or an id with only a drain key.
struct MemberRow {
  std::string id;
  std::string address = "-";
  std::uint32_t weight = 0;
  std::string state = "gone";  // active, draining, or gone (no member key)
  std::size_t buckets = 0;     // in the current map
  std::optional<std::uint64_t> handoff;
  bool drain_requested = false;
};

struct ClusterTable {
  std::uint64_t epoch = 0;  // 0: no map
  std::size_t live_members = 0;
  std::size_t map_members = 0;
  std::size_t bucket_count = 0;
  std::vector<MemberRow> rows;  // by id
};

// The rows of `view`: every id with a member key, in the map, or with a
// drain key.
ClusterTable table_of(const cluster::ClusterView& view) {
  ClusterTable table;
  std::map<std::string, MemberRow> rows;
  const auto row = [&rows](const std::string& id) -> MemberRow& {
    MemberRow& r = rows[id];
    r.id = id;
    return r;
  };
  if (view.map) {
    table.epoch = view.map->epoch;
    table.map_members = view.map->members.size();
    std::unique_ptr<cluster::ClusterRouting> routing;
    // A map that decoded always routes (cluster_map.h).
    if (cluster::ClusterRouting::build(*view.map, routing) == shardlock::RouterStatus::kOk) {
      table.bucket_count = routing->bucket_count();
      const std::vector<std::size_t> counts = routing->buckets_per_member();
      for (std::size_t i = 0; i < routing->map().members.size(); ++i) {
        const cluster::ClusterMember& member = routing->map().members[i];
        MemberRow& r = row(member.id);
        r.address = member.address;
        r.weight = member.weight;
        r.buckets = counts[i];
      }
    }
  }
  for (const cluster::ClusterView::Member& member : view.members) {
    MemberRow& r = row(member.id);
    r.address = member.record.address;
    r.weight = member.record.weight;
    r.state = std::string(cluster::to_string(member.record.state));
  }
  table.live_members = view.members.size();
  for (const cluster::ClusterView::Handoff& handoff : view.handoffs) {
    row(handoff.id).handoff = handoff.epoch;
  }
  for (const std::string& id : view.drains) row(id).drain_requested = true;
  for (auto& [id, r] : rows) table.rows.push_back(std::move(r));
  return table;
}

void print_table(const ClusterTable& table, const std::string& name, bool json) {
  if (json) {
    Json out;
    out["cluster"] = name;
    out["epoch"] = table.epoch;
    out["members"] = table.live_members;
    out["map_members"] = table.map_members;
    out["bucket_count"] = table.bucket_count;
    out["nodes"] = Json::array();
    for (const MemberRow& r : table.rows) {
      Json node;
      node["id"] = r.id;
      node["address"] = r.address;
      node["weight"] = r.weight;
      node["state"] = r.state;
      node["buckets"] = r.buckets;
      node["handoff"] = r.handoff ? Json(*r.handoff) : Json(nullptr);
      node["drain"] = r.drain_requested;
      out["nodes"].push_back(std::move(node));
    }
    print_json(out);
    return;
  }
  std::printf("cluster=%s epoch=%" PRIu64 " members=%zu map_members=%zu buckets=%zu\n",
              name.c_str(), table.epoch, table.live_members, table.map_members, table.bucket_count);
  for (const MemberRow& r : table.rows) {
    const std::string handoff = r.handoff ? std::to_string(*r.handoff) : "-";
    std::printf("%s address=%s weight=%u state=%s buckets=%zu handoff=%s drain=%s\n", r.id.c_str(),
                r.address.c_str(), r.weight, r.state.c_str(), r.buckets, handoff.c_str(),
                r.drain_requested ? "yes" : "no");
  }
}

// One line of drain's progress: `text` for people, or {"id":..} + `fields`.
void say(const ClusterArgs& args, const Json& fields, const std::string& text) {
  if (!args.json) {
    std::printf("%s %s\n", args.node_id.c_str(), text.c_str());
    return;
  }
  Json out;
  out["id"] = args.node_id;
  out.update(fields);
  print_json(out);
}

int exit_code_for_etcd(const std::error_code& ec) {
  if (ec == cluster::EtcdErrc::kUnavailable || ec == cluster::EtcdErrc::kDeadlineExceeded) {
    return kExitUnreachable;
  }
  if (ec == cluster::EtcdErrc::kBadEndpoint) return kExitUsage;
  return kExitError;
}

// Prints "shardlockctl: <what>: <detail>" (and which flag to look at) and
// returns the exit code.
int etcd_failure(const std::string& what, const std::error_code& ec, const std::string& detail,
                 const shardlock::tools::EtcdFlags& flags) {
  std::fprintf(stderr, "shardlockctl: %s: %s (%s)%s\n", what.c_str(), ec.message().c_str(),
               detail.c_str(), shardlock::tools::etcd_flag_hint(ec, detail, flags).c_str());
  return exit_code_for_etcd(ec);
}

// The buckets `id` owns in `view`'s map (0 without a map).
std::size_t buckets_of(const cluster::ClusterView& view, const std::string& id) {
  for (const MemberRow& r : table_of(view).rows) {
    if (r.id == id) return r.buckets;
  }
  return 0;
}

// Whether `id` has a member key in `view` (alive, or its etcd lease not yet
// expired).
bool is_member(const cluster::ClusterView& view, const std::string& id) {
  return std::any_of(view.members.begin(), view.members.end(),
                     [&](const cluster::ClusterView::Member& m) { return m.id == id; });
}

// The map epoch `id`'s handoff/<id> key acknowledges (0 without one).
std::uint64_t handoff_epoch(const cluster::ClusterView& view, const std::string& id) {
  for (const cluster::ClusterView::Handoff& h : view.handoffs) {
    if (h.id == id) return h.epoch;
  }
  return 0;
}

// Cancel: until the map gives the node buckets again. Drain: until the map
// gives it none AND it has handed them off (handoff/ID acknowledges that
// map's epoch), since its heirs grant its keys only then; returning at the
// map alone sent operators to stop a node mid hand-off, which costs a
// whole lock-delay. A node whose member key is gone hands nothing off: its
// heirs grant once the lock-delay since it vanished has passed.
int wait_for_drain(cluster::EtcdClient& client, const std::string& prefix,
                   const ClusterArgs& args) {
  const auto deadline = std::chrono::steady_clock::now() + args.wait.value;
  std::string waiting_for;
  for (;;) {
    const auto polled = cluster::Membership::read_view(client, prefix);
    if (polled.ok()) {
      const cluster::ClusterView& view = polled.value;
      const std::size_t buckets = buckets_of(view, args.node_id);
      const std::uint64_t epoch = view.map ? view.map->epoch : 0;
      if (args.cancel) {
        if (buckets > 0) {
          say(args, {{"buckets", buckets}, {"epoch", epoch}},
              "owns " + std::to_string(buckets) + " buckets in epoch " + std::to_string(epoch));
          return kExitOk;
        }
        waiting_for = "owns 0 buckets";
      } else if (buckets > 0) {
        waiting_for = "still owns " + std::to_string(buckets) + " buckets";
      } else if (!is_member(view, args.node_id)) {
        say(args, {{"buckets", 0}, {"epoch", epoch}, {"gone", true}},
            "owns 0 buckets in epoch " + std::to_string(epoch) +
                "; it is gone (no member key), so it handed nothing off: its buckets' new "
                "owners grant once the lock-delay since it left has passed");
        return kExitOk;
      } else if (const std::uint64_t acked = handoff_epoch(view, args.node_id); acked >= epoch) {
        say(args, {{"buckets", 0}, {"epoch", epoch}, {"handoff", acked}},
            "owns 0 buckets in epoch " + std::to_string(epoch) +
                " and has handed them off (handoff " + std::to_string(acked) + ")");
        return kExitOk;
      } else {
        waiting_for = "owns 0 buckets in epoch " + std::to_string(epoch) +
                      " but has not handed them off (handoff " + std::to_string(acked) + ")";
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::fprintf(stderr, "shardlockctl: drain: %s %s after %s%s%s\n", args.node_id.c_str(),
                   polled.ok() ? waiting_for.c_str() : "(unknown)", args.wait.text.c_str(),
                   polled.ok() ? "" : "; etcd: ", polled.ok() ? "" : polled.detail.c_str());
      return kExitRefused;
    }
    std::this_thread::sleep_for(milliseconds(200));
  }
}

int run_cluster(ClusterArgs& args, bool members, milliseconds timeout) {
  auto etcd = shardlock::tools::resolve_etcd_flags(args.url, args.etcd);
  if (!etcd.error.empty()) return shardlock::tools::usage_error(kTool, etcd.error);
  for (const std::string& warning : etcd.warnings) {
    std::fprintf(stderr, "shardlockctl: warning: %s\n", warning.c_str());
  }
  const std::string prefix = cluster::cluster_prefix(args.name);
  if (prefix.empty()) {
    return shardlock::tools::usage_error(
        kTool, "--cluster-name: '" + args.name + "' is not 1..128 bytes of [A-Za-z0-9._-]");
  }
  if (!members && !cluster::valid_node_id(args.node_id)) {
    return shardlock::tools::usage_error(
        kTool, "drain: node id '" + args.node_id + "' is not 1..128 bytes of [A-Za-z0-9._-]");
  }
  cluster::EtcdClientOptions options;
  options.endpoints = etcd.endpoints;
  options.tls = std::move(etcd.tls);
  options.credentials = std::move(etcd.credentials);
  options.call_timeout = timeout;
  auto connected = cluster::EtcdClient::connect(options);
  if (!connected.ok()) {
    return etcd_failure("etcd " + etcd.endpoints, connected.error, connected.detail, args.etcd);
  }
  cluster::EtcdClient& client = *connected.value;
  std::uint64_t bad_values = 0;
  const auto read = cluster::Membership::read_view(client, prefix, &bad_values);
  if (!read.ok())
    return etcd_failure("cannot read " + prefix + " at " + etcd.endpoints, read.error, read.detail,
                        args.etcd);
  if (bad_values != 0) {
    std::fprintf(stderr, "shardlockctl: %" PRIu64 " value(s) under %s did not decode (ignored)\n",
                 bad_values, prefix.c_str());
  }
  if (members) {
    print_table(table_of(read.value), args.name, args.json);
    return kExitOk;
  }

  // drain: refuse an id the cluster does not know, unless forced (a node
  // that is down and should come back drained) or cancelling.
  const ClusterTable table = table_of(read.value);
  const bool known = std::any_of(table.rows.begin(), table.rows.end(), [&](const MemberRow& r) {
    return r.id == args.node_id && r.state != "gone";
  });
  if (!known && !args.cancel && !args.force) {
    std::string ids;
    for (const cluster::ClusterView::Member& member : read.value.members) {
      ids += ids.empty() ? "" : ", ";
      ids += member.id;
    }
    std::fprintf(stderr,
                 "shardlockctl: drain: '%s' is not a member of cluster %s (members: %s); "
                 "--force drains it when it registers\n",
                 args.node_id.c_str(), args.name.c_str(), ids.empty() ? "none" : ids.c_str());
    return kExitRefused;
  }
  const cluster::EtcdStatus written =
      args.cancel ? cluster::Membership::cancel_drain(client, prefix, args.node_id)
                  : cluster::Membership::request_drain(client, prefix, args.node_id);
  if (!written.ok()) {
    return etcd_failure(std::string(args.cancel ? "cannot delete " : "cannot put ") + prefix +
                            "drain/" + args.node_id,
                        written.error, written.detail, args.etcd);
  }
  say(args, {{"drain", args.cancel ? "cancelled" : "requested"}},
      args.cancel ? "drain cancelled" : "drain requested");
  if (args.wait.text.empty()) return kExitOk;
  return wait_for_drain(client, prefix, args);
}
#else

int run_cluster(ClusterArgs&, bool, milliseconds) {
  std::fprintf(stderr,
               "shardlockctl: this build has no cluster support (configure with "
               "-DSHARDLOCK_BUILD_CLUSTER=ON)\n");
  return kExitError;
}

#endif

int members_or_drain(Session& session, ClusterArgs& args, bool members) {
  if (!parse_arg(session.timeout, "--timeout", ZeroDuration::kRejected) ||
      !parse_arg(args.wait, "--wait", ZeroDuration::kAllowed)) {
    return kExitUsage;
  }
  args.json = session.out.json;
  return run_cluster(args, members, session.timeout.value);
}

// The flags members and drain share.
void add_cluster_flags(CLI::App& sub, ClusterArgs& args) {
  auto* cluster_flag =
      sub.add_option("--cluster", args.url,
                     "etcd://HOST:PORT[,HOST:PORT...] of the cluster (or http://); over TLS "
                     "etcds://HOST:PORT[,...] (or https://)")
          ->envname("SHARDLOCK_CLUSTER")
          ->required();
#if defined(SHARDLOCK_HAVE_CLUSTER)
  shardlock::tools::add_etcd_flags(sub, args.etcd, cluster_flag);
#else
  (void)cluster_flag;
#endif
  sub.add_option("--cluster-name", args.name,
                 "The cluster's name: its keys are under /shardlock/NAME/ in etcd")
      ->capture_default_str();
}

}  // namespace

void add_members_command(CLI::App& app, Session& session) {
  auto args = std::make_shared<ClusterArgs>();
  CLI::App* sub = app.add_subcommand(
      "members",
      "List the cluster's members from etcd: a header line (map epoch, member count), then one "
      "line per member: id, address, weight, state (active, draining, or gone from etcd but still "
      "in the map), buckets owned in the current map, hand-off epoch, drain requested");
  add_cluster_flags(*sub, *args);
  on_parsed(*sub, session, /*short_w=*/true,
            [&session, args] { return members_or_drain(session, *args, /*members=*/true); });
}

void add_drain_command(CLI::App& app, Session& session) {
  auto args = std::make_shared<ClusterArgs>();
  CLI::App* sub = app.add_subcommand(
      "drain",
      "Ask node ID to drain (it leaves the next map, hands its buckets off, and stays up), or "
      "with --cancel to come back; puts or deletes drain/ID in etcd");
  sub->add_option("id", args->node_id, "The node id")->required();
  add_cluster_flags(*sub, *args);
  sub->add_flag("--cancel", args->cancel, "Cancel a drain the key asked for");
  sub->add_flag("--force", args->force,
                "Drain an id that is not a member now (it drains when it registers)");
  sub->add_option("--wait", args->wait.text,
                  "Wait up to this long until the map gives ID no buckets and ID has handed "
                  "them off (handoff/ID at the map's epoch), or ID is gone (with --cancel: until "
                  "it owns some again); exit 1 if it does not");
  on_parsed(*sub, session, /*short_w=*/true,
            [&session, args] { return members_or_drain(session, *args, /*members=*/false); });
}

}  // namespace shardlock::ctl
