// See cluster.h.
#include "cluster.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "etcd_client.h"
#include "server_process.h"
#include "shardlock/cluster/cluster_map.h"
#include "support/etcd.h"
#include "tcp_proxy.h"

namespace shardlock::torture {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test_support::EtcdProcess;
using Clock = std::chrono::steady_clock;

// A published map and its epoch, as every node reads them (the epoch in the
// value; a v1 value's is the key's mod_revision): the owner property compares
// it with a token's (token >> 32).
std::optional<cluster::ClusterMap> map_of_event(const cluster::WatchEvent& event) {
  return cluster::decode_map(event.kv.value, static_cast<std::uint64_t>(event.kv.mod_revision));
}

// A seeded duration between `low` and `high` times `base`.
std::chrono::milliseconds seeded_share(std::mt19937_64& random, std::int64_t base_ms, double low,
                                       double high) {
  const double share = low + (high - low) * std::uniform_real_distribution<double>(0, 1)(random);
  return std::chrono::milliseconds(static_cast<std::int64_t>(share * static_cast<double>(base_ms)));
}

struct Node {
  std::string id;
  // A replaced node's first id, which the workers name its address by, and
  // how many times it was replaced (Fault::kReplaceNode).
  std::string first_id;
  int replacements = 0;
  UdpProxy proxy;       // the clients' way in; its address is the advertised one
  TcpProxy etcd_proxy;  // the node's way to etcd
  std::unique_ptr<ServerUnderTest> server;
  [[nodiscard]] std::string address() const { return "127.0.0.1:" + std::to_string(proxy.port()); }
};

class ClusterUnderTest final : public SystemUnderTest {
 public:
  ClusterUnderTest(const TortureOptions& o, fs::path scratch, const Recorder& nemesis)
      : options_(o),
        scratch_(std::move(scratch)),
        nemesis_(nemesis),
        name_("torture-" + std::to_string(::getpid())),
        prefix_("/shardlock/" + name_ + "/"),
        node_max_ttl_ms_(o.max_ttl_ms) {}

  ~ClusterUnderTest() override { stop(); }

  bool start(std::string& error) override {
    if (!EtcdProcess::available()) {
      error = EtcdProcess::kMissingMessage;
      return false;
    }
    if (!etcd_.start()) {
      error = "etcd: " + etcd_.error();
      return false;
    }
    cluster::EtcdClientOptions client_options;
    client_options.endpoints = etcd_.endpoint();
    auto connected = cluster::EtcdClient::connect(client_options);
    if (!connected.ok()) {
      error = "etcd client: " + connected.detail;
      return false;
    }
    etcd_client_ = std::move(connected.value);
    // From revision 1: every map ever published, the first one included.
    watch_ = etcd_client_->watch_prefix(prefix_ + "map", 1,
                                        [this](const cluster::WatchUpdate& u) { on_map(u); });

    const int count =
        options_.cluster_nodes + (options_.joins + options_.joins_during_drains > 0 ? 1 : 0);
    for (int i = 1; i <= count; ++i) {
      auto node = std::make_unique<Node>();
      node->id = "n" + std::to_string(i);
      // The node's port is its first incarnation's (set once it is ready).
      if (!node->proxy.start(0, options_.seed + static_cast<std::uint64_t>(i))) {
        error = "proxy of " + node->id + ": " + node->proxy.error();
        return false;
      }
      if (!node->etcd_proxy.start(etcd_.client_port())) {
        error = "etcd proxy of " + node->id + ": " + node->etcd_proxy.error();
        return false;
      }
      node->server = std::make_unique<ServerUnderTest>(
          config(*node), (scratch_ / (node->id + ".log")).string(), nemesis_);
      nodes_.push_back(std::move(node));
    }
    for (int i = 0; i < options_.cluster_nodes; ++i) {
      if (!start_node(*nodes_[static_cast<std::size_t>(i)], error)) return false;
    }
    // Serve only once every node is in the map.
    std::set<std::string> all;
    for (int i = 0; i < options_.cluster_nodes; ++i) all.insert(nodes_[i]->id);
    std::unique_lock lock(mutex_);
    if (!map_changed_.wait_for(lock, 30s, [&] { return members_ == all; })) {
      error = "no map with all " + std::to_string(options_.cluster_nodes) +
              " nodes was published within 30 s (" + std::to_string(maps_seen_) + " maps seen)";
      return false;
    }
    settled_from_ = Clock::now();
    return true;
  }

  std::vector<std::string> worker_arguments() const override {
    std::string seeds;
    std::string names;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (static_cast<int>(i) < options_.cluster_nodes) {
        seeds += (seeds.empty() ? "" : ",") + nodes_[i]->address();
      }
      names += (names.empty() ? "" : ",") + nodes_[i]->id + "=" + nodes_[i]->address();
    }
    return {"--server", seeds, "--cluster", "--node-names", names};
  }

  void set_network_faults(const ProxyFaults& faults) override {
    network_ = faults;
    for (const auto& node : nodes_) node->proxy.set_faults(faults);
  }

  ProxyCounters counters() const override {
    ProxyCounters sum;
    for (const auto& node : nodes_) {
      const ProxyCounters c = node->proxy.counters();
      sum.forwarded += c.forwarded;
      sum.dropped += c.dropped;
      sum.duplicated += c.duplicated;
      sum.reordered += c.reordered;
      sum.delayed += c.delayed;
      sum.cut += c.cut;
    }
    return sum;
  }

  std::int64_t longest_fault_ms() const override {
    const std::chrono::milliseconds etcd_ttl(etcd_ttl_ms());
    std::chrono::milliseconds longest = std::max(
        {pause_for(), etcd_cut_for(), client_cut_for(), membership_change_for(), restart_for()});
    // The new faults only when planned: a rolling restart is long.
    const auto planned = [&](int count, std::chrono::milliseconds length) {
      if (count > 0) longest = std::max(longest, length);
    };
    // Each compound fault ends with an undrain, which waits for the map to
    // be whole again (2 x map_move_bound()).
    const std::chrono::milliseconds undrain = 2 * map_move_bound();
    planned(options_.short_pauses + options_.short_etcd_partitions,
            etcd_ttl + hold_for() + undrain);
    planned(options_.stalled_double_drains, lock_delay() + etcd_ttl + hold_for() + undrain);
    planned(options_.double_drains, 2 * map_move_bound() + hold_for() + undrain);
    planned(options_.joins_during_drains,
            map_move_bound() + restart_for() + hold_for() + 5s + undrain);
    planned(options_.kills_during_handoffs,
            map_move_bound() + restart_for() + etcd_ttl + hold_for() + undrain);
    planned(options_.rolling_restarts, options_.cluster_nodes * rolling_step_for());
    planned(options_.slow_watches, 2 * map_move_bound() + hold_for() + undrain + etcd_ttl);
    planned(options_.node_partitions, node_cut_for() + restart_for());
    planned(options_.kills_mid_replication, restart_for());
    planned(options_.one_way_node_cuts + options_.slow_etcd_links, node_cut_for() + restart_for());
    planned(options_.node_replacements, restart_for() + std::chrono::milliseconds(lock_delay()));
    return longest.count();
  }

  std::int64_t liveness_bound_ms() const override { return default_liveness_bound_ms(options_); }

  bool inject(Fault fault, std::mt19937_64& random, std::string& error) override {
    Node& victim = *nodes_[random() % static_cast<std::size_t>(options_.cluster_nodes)];
    switch (fault) {
      case Fault::kKill:
        victim.server->kill();
        return start_node(victim, error);
      case Fault::kServerPause:
        victim.server->pause(pause_for());
        return true;
      case Fault::kJoin: {
        Node& extra = *nodes_.back();
        record(EventKind::kNodeJoin, extra.id);
        if (!start_node(extra, error)) return false;
        std::this_thread::sleep_for(membership_change_for());
        record(EventKind::kNodeLeave, extra.id);
        extra.server->stop();
        return true;
      }
      case Fault::kDrain:
        if (!set_drain(victim, true, error)) return false;
        std::this_thread::sleep_for(membership_change_for());
        return set_drain(victim, false, error);
      case Fault::kEtcdPartition:
        record(EventKind::kEtcdCutOn, victim.id);
        victim.etcd_proxy.set_cut(true);
        std::this_thread::sleep_for(etcd_cut_for());
        victim.etcd_proxy.set_cut(false);
        record(EventKind::kEtcdCutOff, victim.id);
        return true;
      case Fault::kClientPartition:
        // Every source but the nodes: their replication streams go on.
        record(EventKind::kClientCutOn, victim.id);
        victim.proxy.set_cut(node_ports(), CutSources::kAllButListed);
        std::this_thread::sleep_for(client_cut_for());
        victim.proxy.set_cut({}, CutSources::kListed);
        record(EventKind::kClientCutOff, victim.id);
        return true;
      case Fault::kNodePartition:
        node_partition(victim, random);
        return true;
      case Fault::kKillMidReplication:
        record_fault(fault);
        return kill_mid_replication(victim, error);
      case Fault::kShortPause:
      case Fault::kShortEtcdPartition:
        record_fault(fault);
        return short_stall(fault, victim, random, error);
      case Fault::kStalledDoubleDrain:
        record_fault(fault);
        return stalled_double_drain(victim, random, error);
      case Fault::kDoubleDrain:
        record_fault(fault);
        return double_drain(victim, random, error);
      case Fault::kJoinDuringDrain:
        record_fault(fault);
        return join_during_drain(victim, error);
      case Fault::kKillDuringHandoff:
        record_fault(fault);
        return kill_during_handoff(victim, random, error);
      case Fault::kRollingRestart:
        record_fault(fault);
        return rolling_restart(random, error);
      case Fault::kSlowWatch:
        record_fault(fault);
        return slow_watch(victim, random, error);
      case Fault::kOneWayNodeCut:
        one_way_node_cut(victim, random, std::chrono::milliseconds(0));
        return true;
      case Fault::kSlowEtcdLink:
        record_fault(fault);
        one_way_node_cut(victim, random, seeded_share(random, etcd_ttl_ms(), 0.1, 0.3));
        return true;
      case Fault::kReplaceNode:
        return replace_node(victim, error);
      case Fault::kClientPause:
      case Fault::kTenantReload:  // tenants are single-node only
        break;
    }
    error = std::string(fault_name(fault)) + " is not the cluster's to inject";
    return false;
  }

  void stop() override {
    if (stopped_) return;
    stopped_ = true;
    for (const auto& node : nodes_) node->server->stop();
    if (watch_) watch_->cancel();
    for (const auto& node : nodes_) {
      node->proxy.stop();
      node->etcd_proxy.stop();
    }
    etcd_.kill();
  }

  std::string crashes() override {
    std::string all;
    {
      std::lock_guard lock(mutex_);
      if (!watch_error_.empty()) {
        all += "the harness's watch on the map key ended (" + watch_error_ +
               "), so the history may miss maps\n";
      }
    }
    for (const auto& node : nodes_) {
      node->server->note_if_dead();
      all += node->server->crashes();
    }
    return all;
  }

 private:
  std::int64_t etcd_ttl_ms() const { return options_.etcd_lease_ttl_s * 1000LL; }
  // Longer than the etcd lease: the node's member key expires meanwhile.
  std::chrono::milliseconds pause_for() const {
    return std::chrono::milliseconds(
        std::max<std::int64_t>(options_.max_ttl_ms * 3 / 2, etcd_ttl_ms() + 1000));
  }
  // Long enough for etcd to expire the cut-off node's lease.
  std::chrono::milliseconds etcd_cut_for() const {
    return std::chrono::milliseconds(2 * etcd_ttl_ms() + 1000);
  }
  // Longer than any lease the clients hold there.
  std::chrono::milliseconds client_cut_for() const {
    return std::chrono::milliseconds(2LL * options_.max_ttl_ms);
  }
  // Past the replica timeout (so one node of the two evicts the other and
  // its buckets fail over), and long enough for the evicted node to try to
  // come back while still cut off.
  std::chrono::milliseconds node_cut_for() const {
    return std::chrono::milliseconds(3LL * options_.replica_timeout_ms + 1000);
  }
  // Every node's server port: the source of its datagrams to its peers'
  // proxies (a restart keeps the port).
  std::vector<std::uint16_t> node_ports() const {
    std::vector<std::uint16_t> ports;
    for (const auto& node : nodes_) ports.push_back(node->server->port());
    return ports;
  }
  // Long enough for the buckets to move and be served elsewhere.
  std::chrono::milliseconds membership_change_for() const {
    return std::chrono::milliseconds(2 * etcd_ttl_ms() + 2LL * options_.max_ttl_ms);
  }
  // A restarted node first waits out its previous run's etcd lease.
  std::chrono::milliseconds restart_for() const {
    return std::chrono::milliseconds(3 * etcd_ttl_ms() + 1000);
  }
  // The longest wait for a map to move after a drain key is put: a node
  // notices it at once through its watch, or within a lease TTL through
  // its retries.
  std::chrono::milliseconds map_move_bound() const {
    return std::chrono::milliseconds(etcd_ttl_ms());
  }
  // One node of a rolling restart: SIGTERM and a start (a clean stop
  // revokes its etcd lease, so the start need not wait it out; both within
  // a lease TTL), the map taking it back, and a max TTL of serving.
  std::chrono::milliseconds rolling_step_for() const {
    return std::chrono::milliseconds(etcd_ttl_ms()) + map_move_bound() +
           std::chrono::milliseconds(options_.max_ttl_ms);
  }
  // How long a compound fault keeps its drains: a lock-delay, by which the
  // moved buckets are served by their new owners (after a kill, the heirs
  // first see the old owner gone, within a lease TTL).
  std::chrono::milliseconds hold_for() const { return lock_delay(); }

  // Starts (or restarts) a node, points its proxy at its port, and tells
  // every other node's proxy that datagrams from that port are the node's
  // (proxy.h: they reach the peer from the node's advertised address).
  bool start_node(Node& node, std::string& error) {
    if (!node.server->start(error)) return false;
    node.proxy.set_server_port(node.server->port());
    for (const auto& other : nodes_) {
      if (other.get() != &node) other->proxy.add_node(node.server->port(), node.proxy);
    }
    return true;
  }

  ServerConfig config(const Node& node) const {
    ServerConfig c;
    c.shardlockd = options_.shardlockd;
    c.node = node.id;
    c.lock_delay_ms = node_max_ttl_ms_;
    const fs::path data = scratch_ / ("data-" + node.id);
    std::error_code ignored;
    fs::create_directories(data, ignored);
    c.arguments = {"--data-dir",
                   data.string(),
                   "--cluster",
                   "etcd://127.0.0.1:" + std::to_string(node.etcd_proxy.port()),
                   "--node-id",
                   node.id,
                   "--advertise",
                   node.address(),
                   "--cluster-name",
                   name_,
                   "--etcd-lease-ttl",
                   std::to_string(options_.etcd_lease_ttl_s) + "s",
                   "--max-ttl",
                   std::to_string(node_max_ttl_ms_) + "ms",
                   "--max-wait",
                   std::to_string(options_.max_wait_ms) + "ms",
                   "--lock-delay",
                   std::to_string(options_.unsafe_no_lock_delay ? 0 : c.lock_delay_ms) + "ms",
                   "--shards",
                   "8"};
    if (options_.replicas > 1) {
      c.arguments.insert(c.arguments.end(),
                         {"--replicas", std::to_string(options_.replicas), "--replica-timeout",
                          std::to_string(options_.replica_timeout_ms) + "ms"});
    }
    return c;
  }

  void record_fault(Fault fault) const {
    Event e;
    e.kind = EventKind::kFault;
    e.fault = fault_name(fault);
    std::replace(e.fault.begin(), e.fault.end(), ' ', '_');
    nemesis_.record(e);
  }

  // `count` distinct nodes of n1..nN, `first` first, the rest seeded.
  std::vector<Node*> pick(Node& first, std::size_t count, std::mt19937_64& random) {
    std::vector<Node*> others;
    for (int i = 0; i < options_.cluster_nodes; ++i) {
      if (nodes_[static_cast<std::size_t>(i)].get() != &first) {
        others.push_back(nodes_[static_cast<std::size_t>(i)].get());
      }
    }
    std::shuffle(others.begin(), others.end(), random);
    others.insert(others.begin(), &first);
    others.resize(std::min(count, others.size()));
    return others;
  }

  // Puts or deletes drain/<id>, recorded.
  bool set_drain(const Node& node, bool on, std::string& error) {
    const std::string key = prefix_ + "drain/" + node.id;
    if (on) {
      record(EventKind::kDrainOn, node.id);
      if (const auto put = etcd_client_->put(key, "shardlock-torture"); !put.ok()) {
        error = "cannot put " + key + ": " + put.detail;
        return false;
      }
      return true;
    }
    if (const auto deleted = etcd_client_->delete_key(key); !deleted.ok()) {
      error = "cannot delete " + key + ": " + deleted.detail;
      return false;
    }
    record(EventKind::kDrainOff, node.id);
    return true;
  }

  // The latest map's epoch.
  std::uint64_t latest_epoch() {
    std::lock_guard lock(mutex_);
    return latest_epoch_;
  }
  // Waits until a map published after `after` leaves `node` out, or
  // `deadline`. The latest map's epoch then (whether or not it left the
  // node out).
  std::uint64_t wait_for_map_without(const Node& node, std::uint64_t after,
                                     Clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    map_changed_.wait_until(lock, deadline,
                            [&] { return latest_epoch_ > after && members_.count(node.id) == 0; });
    return latest_epoch_;
  }
  // Puts drain/<id> and waits until a map without the node is out, or
  // `bound` has passed. The latest map's epoch then.
  bool drain_and_wait(const Node& node, std::chrono::milliseconds bound, std::uint64_t& epoch,
                      std::string& error) {
    const std::uint64_t before = latest_epoch();
    if (!set_drain(node, true, error)) return false;
    epoch = wait_for_map_without(node, before, Clock::now() + bound);
    return true;
  }
  // Deletes the drain keys of `nodes`, and waits until a map holds every
  // one of n1..nN again (or a bound passed), so the next fault starts from
  // the whole cluster.
  bool undrain(const std::vector<const Node*>& nodes, std::string& error) {
    for (const Node* node : nodes) {
      if (!set_drain(*node, false, error)) return false;
    }
    wait_for_full_map(Clock::now() + 2 * map_move_bound());
    settled_from_ = Clock::now();
    return true;
  }
  // The nodes' lock-delay: a node activates nothing of its first map, nor
  // of a bucket whose old owner is gone, for that long.
  std::chrono::milliseconds lock_delay() const {
    return std::chrono::milliseconds(node_max_ttl_ms_ + etcd_ttl_ms() + 500);
  }
  // Waits until the cluster may be granting every key again: a lock-delay
  // after it was last whole again (its start, an undrain). A fault that
  // needs grants in the middle of it (a stalled double drain) starts then.
  void wait_until_settled() const { sleep_until(settled_from_ + lock_delay()); }
  // Waits until a published map holds every one of n1..nN, or `deadline`.
  void wait_for_full_map(Clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    map_changed_.wait_until(lock, deadline, [&] {
      for (int i = 0; i < options_.cluster_nodes; ++i) {
        if (members_.count(nodes_[static_cast<std::size_t>(i)]->id) == 0) return false;
      }
      return true;
    });
  }
  // Waits until `node` acknowledged (handoff/<id>) `epoch` or a later one,
  // or `deadline`: it let go of what that map took from it.
  void wait_for_ack(const Node& node, std::uint64_t epoch, Clock::time_point deadline) {
    const std::string key = prefix_ + "handoff/" + node.id;
    while (Clock::now() < deadline) {
      const auto got = etcd_client_->get(key);
      if (got.ok() && !got.value.kvs.empty()) {
        std::uint64_t acked = 0;
        const std::string& value = got.value.kvs.front().value;
        const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), acked);
        if (ec == std::errc() && acked >= epoch) return;
      }
      std::this_thread::sleep_for(20ms);
    }
  }
  static void sleep_until(Clock::time_point when) { std::this_thread::sleep_until(when); }

  // A node stopped (SIGSTOP) or cut off from etcd for a seeded 0.2..0.6 x
  // its etcd lease TTL: it keeps its lease and its registration, and must
  // come back to a map that may have moved meanwhile, as it does (another
  // node drained meanwhile) on a seeded half of them.
  bool short_stall(Fault fault, Node& victim, std::mt19937_64& random, std::string& error) {
    const std::chrono::milliseconds stall = seeded_share(random, etcd_ttl_ms(), 0.2, 0.6);
    const bool move_map = random() % 2 == 0;
    const Node& drained = *pick(victim, 2, random).back();
    const Clock::time_point end = Clock::now() + stall;
    if (fault == Fault::kShortPause) {
      victim.server->suspend();
    } else {
      record(EventKind::kEtcdCutOn, victim.id);
      victim.etcd_proxy.set_cut(true);
    }
    const bool ok = !move_map || set_drain(drained, true, error);
    sleep_until(end);
    if (fault == Fault::kShortPause) {
      victim.server->resume();
    } else {
      victim.etcd_proxy.set_cut(false);
      record(EventKind::kEtcdCutOff, victim.id);
    }
    if (!ok || !move_map) return ok;
    std::this_thread::sleep_for(hold_for());
    return undrain({&drained}, error);
  }

  // A skipped map's shape: node V's map thread stalls while drain/A
  // moves A's buckets to B (and V), A lets go (acks), B grants them until
  // shortly before V's stall ends, and drain/B moves everything to V; the
  // stall ends as soon as B's map is out. V then reads the last map only,
  // and must still wait for B's leases. The stall, seeded, at most:
  //   * V stopped (SIGSTOP) for 0.55..0.7 x its etcd lease TTL, far too
  //     short for its lease to end;
  //   * or V's etcd answers held back 0.3 x the TTL (below a call's
  //     timeout, a third of it) from A's map on: V serves clients all along,
  //     its watch and reads a step behind, then gets what was held at once.
  // It starts a lock-delay after the cluster was last whole, so B can
  // grant at all. Both drains are undone later.
  bool stalled_double_drain(Node& victim, std::mt19937_64& random, std::string& error) {
    const std::vector<Node*> three = pick(victim, 3, random);
    if (three.size() < 3) {
      error = "a stalled double drain needs 3 nodes";
      return false;
    }
    const Node& first = *three[1];
    const Node& second = *three[2];
    const bool pause = random() % 2 == 0;
    const std::chrono::milliseconds stall = pause ? seeded_share(random, etcd_ttl_ms(), 0.55, 0.7)
                                                  : seeded_share(random, etcd_ttl_ms(), 0.3, 0.3);
    wait_until_settled();
    Clock::time_point wake = Clock::now() + stall;
    if (pause) {
      victim.server->suspend();
    } else {
      victim.etcd_proxy.set_delay(0ms, stall);
    }
    std::uint64_t moved = 0;
    bool ok = drain_and_wait(first, stall, moved, error);
    if (ok) {
      // Held back: V's proxy holds A's map until `stall` after it is out.
      if (!pause) wake = Clock::now() + stall - 30ms;
      // B grants from A's ack until its own drain, which leaves room for
      // B's map to come out before V wakes (a map moves in ~0.1 s).
      const Clock::time_point last_drain = wake - std::min(stall / 4, 200ms);
      wait_for_ack(first, moved, last_drain);
      sleep_until(last_drain);
      const std::uint64_t before = latest_epoch();
      ok = set_drain(second, true, error);
      if (ok) (void)wait_for_map_without(second, before, wake);
    }
    if (pause) {
      victim.server->resume();
    } else {
      victim.etcd_proxy.set_delay(0ms, 0ms);
    }
    if (!ok) return false;
    std::this_thread::sleep_for(hold_for());
    return undrain({&first, &second}, error);
  }

  // Scale-down by two: drain/A, and drain/B as soon as the map without A
  // is out (A's hand-off still running); both undone later.
  bool double_drain(Node& first, std::mt19937_64& random, std::string& error) {
    const std::vector<Node*> two = pick(first, 2, random);
    if (options_.cluster_nodes < 3) {
      error = "a double drain needs 3 nodes";
      return false;
    }
    const Node& second = *two[1];
    std::uint64_t epoch = 0;
    if (!drain_and_wait(first, map_move_bound(), epoch, error) ||
        !drain_and_wait(second, map_move_bound(), epoch, error)) {
      return false;
    }
    std::this_thread::sleep_for(hold_for());
    return undrain({&first, &second}, error);
  }

  // The extra node joins as soon as drain/A's map is out; later A is
  // undrained and the extra node leaves.
  bool join_during_drain(Node& drained, std::string& error) {
    if (nodes_.size() <= static_cast<std::size_t>(options_.cluster_nodes)) {
      error = "no extra node to join";
      return false;
    }
    Node& extra = *nodes_.back();
    std::uint64_t epoch = 0;
    if (!drain_and_wait(drained, map_move_bound(), epoch, error)) return false;
    record(EventKind::kNodeJoin, extra.id);
    if (!start_node(extra, error)) return false;
    std::this_thread::sleep_for(hold_for());
    record(EventKind::kNodeLeave, extra.id);
    extra.server->stop();
    return undrain({&drained}, error);
  }

  // kill -9, as soon as drain/A's map is out, of A (the old owner, mid
  // hand-off) or of a seeded heir; a restart, and later A is undrained.
  bool kill_during_handoff(Node& drained, std::mt19937_64& random, std::string& error) {
    Node& heir = *pick(drained, 2, random).back();
    Node& killed = random() % 2 == 0 ? drained : heir;
    std::uint64_t epoch = 0;
    if (!drain_and_wait(drained, map_move_bound(), epoch, error)) return false;
    killed.server->kill();
    if (!start_node(killed, error)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(etcd_ttl_ms()) + hold_for());
    return undrain({&drained}, error);
  }

  // Every node in a seeded order: SIGTERM, a start with --max-ttl (and the
  // lock-delay the history expects) raised by half the run's max TTL, and
  // the map taking it back. Later restarts (kill -9) keep the raised value.
  bool rolling_restart(std::mt19937_64& random, std::string& error) {
    node_max_ttl_ms_ += options_.max_ttl_ms / 2;
    std::vector<Node*> order;
    for (int i = 0; i < options_.cluster_nodes; ++i) {
      order.push_back(nodes_[static_cast<std::size_t>(i)].get());
    }
    std::shuffle(order.begin(), order.end(), random);
    for (Node* node : order) {
      node->server->stop();
      const ServerConfig next = config(*node);
      node->server->reconfigure(next.arguments, next.lock_delay_ms);
      if (!start_node(*node, error)) return false;
      wait_for_full_map(Clock::now() + map_move_bound());
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.max_ttl_ms));
    }
    return true;
  }

  // A node's etcd answers delayed a seeded 0.1..0.3 x the etcd lease TTL
  // (below a call's timeout, a third of it) while drain/A and, on a seeded
  // half with 3+ nodes, drain/B move the map: its watch and reads lag the
  // others'.
  bool slow_watch(Node& slowed, std::mt19937_64& random, std::string& error) {
    const std::chrono::milliseconds delay = seeded_share(random, etcd_ttl_ms(), 0.1, 0.3);
    const std::vector<Node*> three = pick(slowed, 3, random);
    std::vector<const Node*> drained(three.begin() + 1, three.end());
    const bool two = drained.size() > 1 && random() % 2 == 0;
    drained.resize(two ? 2 : 1);
    slowed.etcd_proxy.set_delay(0ms, delay);
    bool ok = true;
    std::uint64_t epoch = 0;
    for (const Node* node : drained) {
      ok = ok && drain_and_wait(*node, map_move_bound(), epoch, error);
    }
    if (ok) std::this_thread::sleep_for(hold_for());
    ok = ok && undrain(drained, error);
    std::this_thread::sleep_for(std::chrono::milliseconds(etcd_ttl_ms()));
    slowed.etcd_proxy.set_delay(0ms, 0ms);
    return ok;
  }

  // Replication: every datagram between `victim` and a seeded other node
  // dropped, both ways, at both nodes' proxies (a node's peers reach it
  // from their server ports), for node_cut_for(); both still reach etcd
  // and the clients. Then healed, and the next fault waits until the map
  // holds every node again (the evicted one registers anew).
  void node_partition(Node& victim, std::mt19937_64& random) {
    Node& other = *pick(victim, 2, random).back();
    Event e;
    e.kind = EventKind::kNodeCutOn;
    e.node = victim.id;
    e.peer = other.id;
    nemesis_.record(e);
    victim.proxy.set_cut({other.server->port()}, CutSources::kListed);
    other.proxy.set_cut({victim.server->port()}, CutSources::kListed);
    std::this_thread::sleep_for(node_cut_for());
    victim.proxy.set_cut({}, CutSources::kListed);
    other.proxy.set_cut({}, CutSources::kListed);
    e.kind = EventKind::kNodeCutOff;
    nemesis_.record(e);
    wait_for_full_map(Clock::now() + restart_for());
    settled_from_ = Clock::now();
  }

  // The shape of a one-way cut from a primary to its backup: `victim`'s datagrams to a seeded other
  // node dropped at that node's proxy, one way only (the other's datagrams still reach the victim),
  // for node_cut_for(): the other hears nothing from the victim, evicts it and takes over the
  // buckets it backs up for it, while the victim still holds leases it was granted before. With
  // `etcd_delay`, the victim's etcd answers are delayed that long meanwhile, so it learns of its
  // eviction late. Recorded as a node cut (the kept property excuses what a cut costs); healed,
  // then the map is waited for as after a partition.
  void one_way_node_cut(Node& victim, std::mt19937_64& random,
                        std::chrono::milliseconds etcd_delay) {
    Node& other = *pick(victim, 2, random).back();
    Event e;
    e.kind = EventKind::kNodeCutOn;
    e.node = victim.id;
    e.peer = other.id;
    nemesis_.record(e);
    if (etcd_delay.count() > 0) victim.etcd_proxy.set_delay(0ms, etcd_delay);
    other.proxy.set_cut({victim.server->port()}, CutSources::kListed);
    std::this_thread::sleep_for(node_cut_for());
    other.proxy.set_cut({}, CutSources::kListed);
    victim.etcd_proxy.set_delay(0ms, 0ms);
    e.kind = EventKind::kNodeCutOff;
    nemesis_.record(e);
    wait_for_full_map(Clock::now() + restart_for());
    settled_from_ = Clock::now();
  }

  // A lost disk, replaced as the runbook says: kill -9, the data dir wiped,
  // and a start at the same address and server port under a new id
  // (<first id>r<n>). Recorded as node_replaced (node = the first id, which
  // the workers still call the address by); the next fault waits until the
  // map holds every node, the new id included.
  bool replace_node(Node& victim, std::string& error) {
    const std::string first = victim.first_id.empty() ? victim.id : victim.first_id;
    victim.server->kill();
    std::error_code ignored;
    fs::remove_all(scratch_ / ("data-" + victim.id), ignored);
    victim.first_id = first;
    victim.id = first + "r" + std::to_string(++victim.replacements);
    Event e;
    e.kind = EventKind::kNodeReplaced;
    e.node = first;
    e.peer = victim.id;
    nemesis_.record(e);
    victim.server->rename(victim.id);
    const ServerConfig next = config(victim);
    victim.server->reconfigure(next.arguments, next.lock_delay_ms);
    if (!start_node(victim, error)) return false;
    wait_for_full_map(Clock::now() + restart_for() + std::chrono::milliseconds(lock_delay()));
    settled_from_ = Clock::now();
    return true;
  }

  // Replication's weak spot, for a server that answers GRANTED before its
  // backups acknowledge (CMake SHARDLOCK_FAULT_EARLY_GRANT): the victim's
  // peers' proxies drop its datagrams (its REPLICATE never arrives; theirs
  // reach it) for half the replica timeout, short of an eviction, and then
  // it is killed -9 and restarted. A correct primary answered none of the
  // grants it made meanwhile; a backup takes over without them.
  bool kill_mid_replication(Node& victim, std::string& error) {
    for (const auto& other : nodes_) {
      if (other.get() != &victim)
        other->proxy.set_cut({victim.server->port()}, CutSources::kListed);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.replica_timeout_ms / 2));
    victim.server->kill();
    for (const auto& other : nodes_) other->proxy.set_cut({}, CutSources::kListed);
    return start_node(victim, error);
  }

  void record(EventKind kind, const std::string& node) const {
    Event e;
    e.kind = kind;
    e.node = node;
    nemesis_.record(e);
  }

  // The watch's callback: records every map put, with each workload key's
  // owner in it.
  void on_map(const cluster::WatchUpdate& update) {
    if (update.error) {
      // The watch ended (etcd cancelled it): maps published after it would
      // be missing, and the owner property would misjudge their grants.
      std::lock_guard lock(mutex_);
      watch_error_ = update.error.message() + ": " + update.detail;
      return;
    }
    for (const cluster::WatchEvent& event : update.events) {
      if (event.type != cluster::WatchEventType::kPut || event.kv.key != prefix_ + "map") continue;
      std::optional<cluster::ClusterMap> decoded = map_of_event(event);
      if (!decoded) continue;
      const cluster::ClusterMap& map = *decoded;
      std::unique_ptr<cluster::ClusterRouting> routing;
      // With the options every node and client uses.
      if (cluster::ClusterRouting::build(map, routing) != RouterStatus::kOk) {
        continue;
      }
      std::unique_ptr<cluster::ReplicaRouting> replicas;
      if (options_.replicas >= 2 &&
          cluster::ReplicaRouting::build(map, replicas) != RouterStatus::kOk) {
        replicas.reset();
      }
      Event e;
      e.kind = EventKind::kMap;
      e.epoch = map.epoch;
      const auto add_owner = [&](const std::string& key) {
        const cluster::ClusterMember* owner = routing->owner_of(key);
        if (owner != nullptr) e.owners.emplace_back(key, owner->id);
        if (options_.replicas < 2) return;
        // The key's backups, as every node's replica layout reads them
        // (replica_layout()), in promotion order; learners back it up too but
        // take nothing over, so they are left out.
        if (!replicas) return;
        const std::vector<std::uint16_t> set = replicas->replicas_of(
            routing->bucket_of(key), static_cast<std::size_t>(options_.replicas));
        for (std::size_t r = 1; r < set.size(); ++r) {
          if (replicas->learners()[set[r]]) continue;
          e.backups.emplace_back(key, replicas->nodes()[set[r]].id);
        }
      };
      for (int k = 0; k < options_.keys; ++k) add_owner("key-" + std::to_string(k));
      for (int k = 0; k < options_.permit_keys; ++k) add_owner("sem-" + std::to_string(k));
      nemesis_.record(e);
      std::lock_guard lock(mutex_);
      members_.clear();
      for (const cluster::ClusterMember& m : map.members) members_.insert(m.id);
      latest_epoch_ = map.epoch;
      ++maps_seen_;
      map_changed_.notify_all();
    }
  }

  const TortureOptions& options_;
  const fs::path scratch_;
  const Recorder& nemesis_;
  const std::string name_;
  const std::string prefix_;
  EtcdProcess etcd_;
  std::unique_ptr<cluster::EtcdClient> etcd_client_;
  std::unique_ptr<cluster::EtcdWatch> watch_;
  std::vector<std::unique_ptr<Node>> nodes_;
  ProxyFaults network_;
  Clock::time_point settled_from_;    // when the cluster was last whole (wait_until_settled)
  std::int64_t node_max_ttl_ms_ = 0;  // the nodes' --max-ttl: the run's, raised by rolling restarts
  bool stopped_ = false;
  std::mutex mutex_;  // guards what the watch thread publishes below
  std::condition_variable map_changed_;
  std::set<std::string> members_;   // the latest map's
  std::uint64_t latest_epoch_ = 0;  // the latest map's
  int maps_seen_ = 0;
  std::string watch_error_;  // why the map watch ended, if it did
};

}  // namespace

std::unique_ptr<SystemUnderTest> make_cluster(const TortureOptions& options,
                                              const fs::path& scratch, const Recorder& nemesis) {
  return std::make_unique<ClusterUnderTest>(options, scratch, nemesis);
}

}  // namespace shardlock::torture
