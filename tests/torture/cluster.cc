// See cluster.h.
#include "cluster.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "etcd_client.h"
#include "etcd_server.h"
#include "server_process.h"
#include "shardlock/cluster/cluster_map.h"
#include "tcp_proxy.h"

namespace shardlock::torture {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct Node {
  std::string id;
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
        prefix_("/shardlock/" + name_ + "/") {}

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

    const int count = options_.cluster_nodes + (options_.joins > 0 ? 1 : 0);
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
    }
    return sum;
  }

  std::int64_t longest_fault_ms() const override {
    return std::max({pause_for(), etcd_cut_for(), client_cut_for(), membership_change_for(),
                     restart_for()})
        .count();
  }

  // A bucket's new owner waits out the lock-delay (max TTL + etcd lease TTL
  // + margin) after the old owner's etcd lease ends, and a map change takes
  // up to an etcd lease TTL to notice; then the clients' retries.
  std::int64_t liveness_bound_ms() const override {
    return 6LL * options_.max_ttl_ms + 3LL * etcd_ttl_ms() + 4000;
  }

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
      case Fault::kDrain: {
        const std::string key = prefix_ + "drain/" + victim.id;
        record(EventKind::kDrainOn, victim.id);
        if (const auto put = etcd_client_->put(key, "shardlock-torture"); !put.ok()) {
          error = "cannot put " + key + ": " + put.detail;
          return false;
        }
        std::this_thread::sleep_for(membership_change_for());
        if (const auto deleted = etcd_client_->delete_key(key); !deleted.ok()) {
          error = "cannot delete " + key + ": " + deleted.detail;
          return false;
        }
        record(EventKind::kDrainOff, victim.id);
        return true;
      }
      case Fault::kEtcdPartition:
        record(EventKind::kEtcdCutOn, victim.id);
        victim.etcd_proxy.set_cut(true);
        std::this_thread::sleep_for(etcd_cut_for());
        victim.etcd_proxy.set_cut(false);
        record(EventKind::kEtcdCutOff, victim.id);
        return true;
      case Fault::kClientPartition: {
        ProxyFaults cut = network_;
        cut.loss = 1.0;
        record(EventKind::kClientCutOn, victim.id);
        victim.proxy.set_faults(cut);
        std::this_thread::sleep_for(client_cut_for());
        victim.proxy.set_faults(network_);
        record(EventKind::kClientCutOff, victim.id);
        return true;
      }
      case Fault::kClientPause:
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
  // Long enough for the buckets to move and be served elsewhere.
  std::chrono::milliseconds membership_change_for() const {
    return std::chrono::milliseconds(2 * etcd_ttl_ms() + 2LL * options_.max_ttl_ms);
  }
  // A restarted node first waits out its previous run's etcd lease.
  std::chrono::milliseconds restart_for() const {
    return std::chrono::milliseconds(3 * etcd_ttl_ms() + 1000);
  }

  // Starts (or restarts) a node, and points its proxy at its port.
  static bool start_node(Node& node, std::string& error) {
    if (!node.server->start(error)) return false;
    node.proxy.set_server_port(node.server->port());
    return true;
  }

  ServerConfig config(const Node& node) const {
    ServerConfig c;
    c.shardlockd = options_.shardlockd;
    c.node = node.id;
    c.lock_delay_ms = options_.max_ttl_ms;
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
                   std::to_string(options_.max_ttl_ms) + "ms",
                   "--max-wait",
                   std::to_string(options_.max_wait_ms) + "ms",
                   "--lock-delay",
                   std::to_string(options_.unsafe_no_lock_delay ? 0 : c.lock_delay_ms) + "ms",
                   "--shards",
                   "8"};
    return c;
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
      // The epoch as every node reads it (in the value; v1: the revision).
      std::optional<cluster::ClusterMap> decoded =
          cluster::decode_map(event.kv.value, static_cast<std::uint64_t>(event.kv.mod_revision));
      if (!decoded) continue;
      const cluster::ClusterMap& map = *decoded;
      std::unique_ptr<cluster::ClusterRouting> routing;
      // With the options every node and client uses.
      if (cluster::ClusterRouting::build(map, routing) != RouterStatus::kOk) {
        continue;
      }
      Event e;
      e.kind = EventKind::kMap;
      e.epoch = map.epoch;
      const auto add_owner = [&](const std::string& key) {
        const cluster::ClusterMember* owner = routing->owner_of(key);
        if (owner != nullptr) e.owners.emplace_back(key, owner->id);
      };
      for (int k = 0; k < options_.keys; ++k) add_owner("key-" + std::to_string(k));
      for (int k = 0; k < options_.permit_keys; ++k) add_owner("sem-" + std::to_string(k));
      nemesis_.record(e);
      std::lock_guard lock(mutex_);
      members_.clear();
      for (const cluster::ClusterMember& m : map.members) members_.insert(m.id);
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
  bool stopped_ = false;
  std::mutex mutex_;  // guards what the watch thread publishes below
  std::condition_variable map_changed_;
  std::set<std::string> members_;  // the latest map's
  int maps_seen_ = 0;
  std::string watch_error_;  // why the map watch ended, if it did
};

}  // namespace

std::unique_ptr<SystemUnderTest> make_cluster(const TortureOptions& options,
                                              const fs::path& scratch, const Recorder& nemesis) {
  return std::make_unique<ClusterUnderTest>(options, scratch, nemesis);
}

}  // namespace shardlock::torture
