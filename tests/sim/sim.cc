// The cluster simulation. See sim.h and docs/simulation.md.
//
// One scheduler: a priority queue of (simulated time, seeded tie-break,
// sequence) events; nothing else advances time and nothing runs on another
// thread, so a seed replays exactly. Parts, each a struct below:
//   * Etcd: keys with create/mod revisions and leases, leases that expire on
//     the global clock, a CAS on the map key, and views of the prefix sent to
//     each node over its own (cuttable, delayable) link;
//   * Membership: the node's registration, keep-alives (the lease deadline
//     from the send time, as membership.cc), map adoption, and the "which
//     map to publish" rule of Membership::reconcile() (next_map.h, the real
//     one);
//   * Node: the real Shards (tokens in a real TokenStore), Dispatcher,
//     Replicator, EpochFile and NodeDriver, on a clock of its own whose rate
//     drifts within the replication's allowance;
//   * Network: loss, duplication, delay and reordering, one-way cuts;
//   * Client: ACQUIRE and RELEASE in the real wire codec, retransmitted at a
//     per-client rate, recording the torture history.
#include "sim.h"

#include <arpa/inet.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "epoch_file.h"
#include "map_history.h"
#include "next_map.h"
#include "node_driver.h"
#include "server/dispatcher.h"
#include "server/replicator.h"
#include "shardlock/cluster/cluster_map.h"
#include "shardlock/lease/server/internal/shard.h"
#include "shardlock/lease/server/internal/token_store.h"
#include "shardlock/lease/wire/epoch_token.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::sim {

namespace {

using cluster::ClusterMap;
using cluster::ClusterMember;
using cluster::ClusterView;
using cluster::HostResult;
using cluster::MapDecision;
using cluster::MemberRecord;
using cluster::MemberState;
using cluster::next_map;
using lease::ClientId;
using lease::Datagram;
using lease::Message;
using lease::MessageType;
using lease::internal::OutDatagram;
using lease::internal::Peer;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using torture::Event;
using torture::EventKind;

using Time = std::int64_t;  // simulated ns
constexpr Time kMs = 1'000'000;
constexpr Time kSec = 1'000 * kMs;

// The simulation's timings: short, so a seed covers many faults.
constexpr std::chrono::seconds kEtcdTtl{2};
constexpr milliseconds kDriftMargin{200};
constexpr milliseconds kMaxTtl{1000};
constexpr milliseconds kEvictAfter{300};
constexpr std::size_t kReplicas = 2;
constexpr std::uint32_t kShards = 4;
constexpr int kBucketBits = 8;  // 256 buckets: a driver pass stays cheap

RouterOptions router_options() {
  RouterOptions o = cluster::cluster_router_options();
  o.bucket_bits = kBucketBits;
  return o;
}

// xoshiro256**, seeded by splitmix64: the same numbers on every platform.
class Random {
 public:
  explicit Random(std::uint64_t seed) {
    for (auto& s : s_) {
      seed += 0x9E3779B97F4A7C15ULL;
      std::uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
      s = z ^ (z >> 31);
    }
  }
  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // In [lo, hi].
  std::int64_t between(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4]{};
};

// ---------------------------------------------------------------------------
// The scheduler
// ---------------------------------------------------------------------------

class Scheduler {
 public:
  explicit Scheduler(Random& random) : random_(random) {}
  void at(Time t, std::function<void()> f) {
    queue_.push(Item{std::max(t, now_), random_.next(), seq_++, std::move(f)});
  }
  void after(Time d, std::function<void()> f) { at(now_ + d, std::move(f)); }
  Time now() const { return now_; }
  std::uint64_t run_until(Time end) {
    std::uint64_t ran = 0;
    while (!queue_.empty() && queue_.top().t <= end) {
      Item item = queue_.top();
      queue_.pop();
      now_ = item.t;
      item.f();
      ++ran;
    }
    now_ = end;
    return ran;
  }

 private:
  struct Item {
    Time t;
    std::uint64_t tie;
    std::uint64_t seq;
    std::function<void()> f;
    bool operator<(const Item& o) const {  // a max-heap: the earliest on top
      if (t != o.t) return t > o.t;
      if (tie != o.tie) return tie > o.tie;
      return seq > o.seq;
    }
  };
  Random& random_;
  std::priority_queue<Item> queue_;
  Time now_ = 0;
  std::uint64_t seq_ = 0;
};

// Endpoints: 0..kMaxNodes-1 nodes, kClientBase + c clients.
constexpr int kMaxNodes = 8;
constexpr int kClientBase = 100;

Peer peer_of(int endpoint) {
  Peer p;
  p.addr.v4.sin_family = AF_INET;
  p.addr.v4.sin_port = htons(static_cast<std::uint16_t>(7700 + endpoint));
  p.addr.v4.sin_addr.s_addr = htonl(0x0A000001u + static_cast<std::uint32_t>(endpoint));
  p.len = sizeof(sockaddr_in);
  return p;
}
int endpoint_of(const Peer& p) {
  return static_cast<int>(ntohl(p.addr.v4.sin_addr.s_addr) - 0x0A000001u);
}
std::string address_of(int endpoint) {
  return "10.0." + std::to_string((1 + endpoint) / 256) + "." +
         std::to_string((1 + endpoint) % 256) + ":" + std::to_string(7700 + endpoint);
}
std::string node_name(int n) { return "n" + std::to_string(n + 1); }

struct World;

// ---------------------------------------------------------------------------
// The network
// ---------------------------------------------------------------------------

struct Network {
  explicit Network(World& w) : world(w) {}
  World& world;
  double loss = 0.02;
  double duplicate = 0.01;
  double reorder = 0.05;              // a datagram delayed far more than the rest
  std::set<std::pair<int, int>> cut;  // (from, to): dropped
  void send(int from, int to, std::vector<std::uint8_t> bytes);
};

// ---------------------------------------------------------------------------
// etcd
// ---------------------------------------------------------------------------

struct KeyValue {
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t lease = 0;
};

struct Etcd {
  explicit Etcd(World& w) : world(w) {}
  World& world;
  std::int64_t revision = 1;
  std::map<std::string, KeyValue> keys;
  // Every put of the map key (revision -> value): etcd's MVCC history of it,
  // never compacted here.
  std::map<std::int64_t, std::string> map_puts;
  std::map<std::int64_t, Time> leases;  // id -> expiry (global time)
  std::int64_t next_lease = 1000;
  static constexpr const char* kPrefix = "/shardlock/sim/";

  std::int64_t grant(Time ttl);
  bool keep_alive(std::int64_t lease, Time ttl) {
    auto it = leases.find(lease);
    if (it == leases.end()) return false;
    it->second = now() + ttl;
    return true;
  }
  void put(const std::string& key, std::string value, std::int64_t lease) {
    KeyValue& kv = keys[key];
    ++revision;
    if (kv.create_revision == 0) kv.create_revision = revision;
    kv.mod_revision = revision;
    kv.value = std::move(value);
    kv.lease = lease;
    if (key == std::string(kPrefix) + "map") map_puts.emplace(revision, kv.value);
    changed();
  }
  void erase(const std::string& key) {
    if (keys.erase(key) != 0) {
      ++revision;
      changed();
    }
  }
  void revoke(std::int64_t lease) {
    if (leases.erase(lease) == 0) return;
    bool any = false;
    for (auto it = keys.begin(); it != keys.end();) {
      if (it->second.lease == lease) {
        it = keys.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    if (any) {
      ++revision;
      changed();
    }
  }
  void expire(std::int64_t lease) {
    auto it = leases.find(lease);
    if (it != leases.end() && it->second <= now()) revoke(lease);
  }
  Time now() const;
  void changed();  // a watch event for every node
};

// ---------------------------------------------------------------------------
// A node
// ---------------------------------------------------------------------------

struct Node;

// The driver's host over the simulated node (the same calls LeaseServer
// makes on its Dispatcher and Replicator, and Membership's).
class SimHost final : public cluster::NodeHost {
 public:
  explicit SimHost(Node& node) : node_(node) {}
  void publish_gate(std::shared_ptr<const lease::internal::ClusterGate> gate) override;
  std::error_code set_replica_layout(std::uint64_t epoch, const RouterSnapshot& routing,
                                     const std::vector<bool>& learners, std::uint16_t self,
                                     std::size_t replicas,
                                     const std::vector<std::string>& addresses,
                                     std::string& detail) override;
  bool replica_primary_settled(const std::string& primary, std::uint32_t bucket) const override;
  std::optional<std::size_t> take_over(const std::string& primary, std::uint32_t bucket,
                                       milliseconds hold, bool* owner_active) override;
  lease::ReplicaProgress replica_progress() const override;
  nanoseconds replica_lease_until(std::size_t bucket) const noexcept override;
  std::vector<std::string> silent_replicas(milliseconds silence) const override;
  std::size_t count_leases(const std::function<bool(std::string_view)>& pred) const override;
  bool needs_new_epoch() const override;
  nanoseconds lease_deadline_of(std::uint64_t registration) const noexcept override;
  bool learning() const override;
  HostResult caught_up() override;
  HostResult put_handoff(std::uint64_t epoch) override;
  HostResult evict(std::string_view id, std::int64_t lease) override;
  void request_new_epoch() override;
  void log(std::string_view line) override;

 private:
  Node& node_;
};

struct Node {
  World& world;
  int index;
  std::string id;
  std::string data_dir;
  double rate;  // local clock rate
  Time offset;  // local clock at global 0 of this incarnation
  std::int64_t incarnation = 0;
  bool paused = false;
  std::vector<std::pair<int, std::vector<std::uint8_t>>> paused_inbox;
  std::vector<ClusterView> pending_views;
  std::vector<cluster::RevisedMap> watched_maps;  // delivered by the watch since the last pass
  Time etcd_delay = 2 * kMs;                      // this node's etcd link: one way

  // Membership, modelled.
  std::int64_t lease = 0;
  std::uint64_t registration = 0;
  Time deadline_local = 0;  // the lease deadline on the local clock
  MemberState state = MemberState::kActive;
  bool learning_ = true;
  bool epoch_wanted = true;
  std::int64_t wanted_after_revision = 0;
  std::uint64_t min_epoch = 0;
  std::shared_ptr<const ClusterMap> map;  // adopted
  std::uint64_t map_revision = 0;

  std::unique_ptr<lease::internal::TokenStore> store;
  std::unique_ptr<cluster::EpochFile> epoch_file;
  std::unique_ptr<lease::internal::Replicator> replicator;
  std::unique_ptr<lease::internal::Dispatcher> dispatcher;
  std::unique_ptr<SimHost> host;
  std::unique_ptr<cluster::NodeDriver> driver;
  bool alive = false;

  Node(World& w, int i);
  Time local() const;
  nanoseconds clock() const { return nanoseconds(local()); }
  void start();
  void kill();
  void on_datagram(int from, std::vector<std::uint8_t> bytes);
  void send_out(std::vector<OutDatagram>& out);
  void tick();
  void drive();
  void keep_alive();
  void reconcile();
  bool etcd_reachable() const;
  void log(std::string_view line);
};

// ---------------------------------------------------------------------------
// A client
// ---------------------------------------------------------------------------

struct Client {
  Client(World& w, int i, ClientId c, Time r) : world(w), index(i), id(c), retransmit(r) {}
  World& world;
  int index;
  ClientId id;
  Time retransmit;  // this client's retransmission interval
  std::int64_t op = 0;
  std::uint64_t next_request = 1;
  // The operation in flight.
  enum class Phase : std::uint8_t { kIdle, kAcquiring, kHolding, kReleasing } phase = Phase::kIdle;
  std::string key;
  std::uint64_t request_id = 0;
  int target = -1;
  int tries = 0;
  Time first_sent = 0;
  std::uint64_t token = 0;
  std::uint32_t ttl_ms = 0;
  std::uint64_t attempt = 0;   // invalidates stale timers
  std::uint32_t lease_op = 0;  // the acquire's operation: its owner id
  std::optional<ClusterMap> known_map;
  Time known_at = 0;
  Time refresh = 0;  // this client's map refresh interval
  bool redirected = false;

  void begin();
  void send_request();
  void on_reply(int from, std::span<const std::uint8_t> bytes);
  void retry_later(Time d);
};

// ---------------------------------------------------------------------------
// The world
// ---------------------------------------------------------------------------

struct World {
  explicit World(const SimOptions& o)
      : options(o), random(o.seed), scheduler(random), network(*this), etcd(*this) {}
  const SimOptions& options;
  Random random;
  Scheduler scheduler;
  Network network;
  Etcd etcd;
  std::uint64_t maps_missed = 0;  // summed over the nodes' drivers, killed ones included
  std::vector<std::unique_ptr<Node>> nodes;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<Event> history;
  std::vector<std::string> trace;
  std::vector<std::string> workload_keys;
  std::uint64_t last_map_epoch = 0;

  Time now() const { return scheduler.now(); }
  void record(Event e) {
    e.t_ns = now();
    if (options.keep_trace) trace.push_back(torture::format_event(e));
    history.push_back(std::move(e));
  }
  void note(const std::string& who, std::string_view line) {
    if (options.keep_trace) {
      trace.push_back(std::to_string(now()) + " # " + who + ": " + std::string(line));
    }
  }
  void deliver(int from, int to, std::vector<std::uint8_t> bytes) {
    if (to >= kClientBase) {
      clients[static_cast<std::size_t>(to - kClientBase)]->on_reply(from, bytes);
    } else if (to < static_cast<int>(nodes.size())) {
      nodes[static_cast<std::size_t>(to)]->on_datagram(from, std::move(bytes));
    }
  }
  // The newest published map, as a client learns it (MAP from any node).
  std::optional<ClusterMap> published_map() const {
    const auto it = etcd.keys.find(std::string(Etcd::kPrefix) + "map");
    if (it == etcd.keys.end()) return std::nullopt;
    return cluster::decode_map(it->second.value,
                               static_cast<std::uint64_t>(it->second.mod_revision));
  }
  void record_map(const ClusterMap& map);
};

void Network::send(int from, int to, std::vector<std::uint8_t> bytes) {
  if (cut.contains({from, to})) return;
  Random& r = world.random;
  if (r.chance(loss)) return;
  const int copies = r.chance(duplicate) ? 2 : 1;
  for (int i = 0; i < copies; ++i) {
    Time delay = r.between(50'000, 1'500'000);
    if (r.chance(reorder)) delay += r.between(1 * kMs, 40 * kMs);
    world.scheduler.after(delay, [w = &world, from, to, b = bytes] { w->deliver(from, to, b); });
  }
}

Time Etcd::now() const { return world.now(); }

std::int64_t Etcd::grant(Time ttl) {
  const std::int64_t id = next_lease++;
  leases[id] = now() + ttl;
  return id;
}

void Etcd::changed() {
  // A watch event to every live node, over its link. It carries the map
  // key as it is now, as etcd's watch does: Membership adopts the maps its
  // watch delivered below the one it reads (adopt_watched_maps_before).
  std::optional<cluster::RevisedMap> watched;
  if (const auto it = keys.find(std::string(kPrefix) + "map"); it != keys.end()) {
    if (auto map = cluster::decode_map(it->second.value,
                                       static_cast<std::uint64_t>(it->second.mod_revision))) {
      watched = cluster::RevisedMap{std::move(*map), it->second.mod_revision};
    }
  }
  for (auto& node : world.nodes) {
    if (!node->alive || !node->etcd_reachable()) continue;
    world.scheduler.after(node->etcd_delay, [n = node.get(), inc = node->incarnation, watched] {
      if (!n->alive || n->incarnation != inc) return;
      if (watched) n->watched_maps.push_back(*watched);
      n->reconcile();
    });
  }
}

void World::record_map(const ClusterMap& map) {
  std::unique_ptr<cluster::ClusterRouting> routing;
  std::unique_ptr<cluster::ReplicaRouting> replicas;
  if (cluster::ClusterRouting::build(map, router_options(), routing) != RouterStatus::kOk ||
      cluster::ReplicaRouting::build(map, router_options(), replicas) != RouterStatus::kOk) {
    return;
  }
  Event e;
  e.kind = EventKind::kMap;
  e.epoch = map.epoch;
  for (const std::string& key : workload_keys) {
    const ClusterMember* owner = routing->owner_of(key);
    e.owners.emplace_back(key, owner ? owner->id : "-");
    const auto set = replicas->replicas_of(routing->bucket_of(key), kReplicas);
    for (std::size_t i = 1; i < set.size(); ++i) {
      e.backups.emplace_back(key, replicas->nodes()[set[i]].id);
    }
  }
  record(std::move(e));
}

// ---- Node ----

Node::Node(World& w, int i) : world(w), index(i), id(node_name(i)) {
  data_dir = w.options.scratch_dir + "/n" + std::to_string(i + 1);
  std::filesystem::create_directories(data_dir);
  // Within the replication's drift allowance (1%): at most 0.2% apart.
  rate = 1.0 + static_cast<double>(w.random.between(-1000, 1000)) * 1e-6;
  offset = w.random.between(1, 1000) * kSec;
}

Time Node::local() const {
  return offset + static_cast<Time>(static_cast<double>(world.now()) * rate);
}

bool Node::etcd_reachable() const { return !world.network.cut.contains({index, -1}) && !paused; }

void Node::log(std::string_view line) { world.note(id, line); }

void Node::start() {
  ++incarnation;
  std::string detail;
  // Tokens and epochs through the real files (on a tmpfs), as a restart
  // after kill -9 finds them.
  if (lease::internal::TokenStore::open(data_dir, store, detail) ||
      cluster::EpochFile::open(data_dir, epoch_file, detail)) {
    log("cannot open the data dir: " + detail);
    return;
  }
  const std::uint64_t token_floor = store->token_floor();
  const std::uint64_t floor = store->floor();
  const auto previous_bound =
      milliseconds(std::min<std::uint64_t>(store->previous_lease_bound_ms(), UINT32_MAX));
  const std::uint64_t block = 1 << 16;
  if (store->initialize(kShards, lease::internal::TokenMode::kCluster, floor + block, token_floor,
                        static_cast<std::uint64_t>(std::max(previous_bound, kMaxTtl).count()),
                        detail)) {
    log("cannot initialize the token store: " + detail);
    return;
  }
  const milliseconds lock_delay = std::max(kMaxTtl, previous_bound);
  const auto now_ms = local() / kMs;
  lease::internal::ShardLimits limits;
  limits.max_ttl_ms = static_cast<std::uint32_t>(kMaxTtl.count());
  limits.max_wait_ms = 2000;
  // In cluster mode the driver enforces the lock-delay per bucket
  // (NodeDriverOptions::server_recovered_at), as
  // LeaseServer does: the shards do not refuse by it.
  limits.recovering_until_ms = now_ms;
  limits.hash_seed = 0x5EED0000u + static_cast<std::uint64_t>(index);
  limits.token_floor = token_floor;
  std::vector<std::unique_ptr<lease::internal::Shard>> shards;
  for (std::uint32_t s = 0; s < kShards; ++s) {
    shards.push_back(std::make_unique<lease::internal::Shard>(
        s, limits,
        lease::internal::ShardTokens(store.get(), s, floor, floor, block,
                                     lease::internal::TokenMode::kCluster),
        now_ms));
  }
  lease::internal::ReplicatorOptions r;
  r.incarnation = static_cast<std::uint64_t>(incarnation);
  r.settled_at_ns = local() + nanoseconds(std::max(lock_delay, kMaxTtl)).count();
  r.relay_replies = world.options.relay_replies.value_or(world.options.seed % 4 != 0);
  r.carry_acks = world.options.carry_acks.value_or(world.options.seed % 3 != 0);
  replicator = std::make_unique<lease::internal::Replicator>(r, local());
  lease::internal::DispatcherOptions d;
  d.clock = [this] { return clock(); };
  d.log = [this](std::string_view line) { log(line); };
  d.key_seed = limits.hash_seed;
  d.replicator = replicator.get();
  dispatcher = std::make_unique<lease::internal::Dispatcher>(std::move(d), std::move(shards));
  dispatcher->publish_gate(lease::internal::ClusterGate::closed());

  // The membership's start: the highest epoch of earlier runs, a
  // registration as a learner, a fresh epoch wanted.
  min_epoch = std::max(epoch_file->highest(), cluster::token_epoch(token_floor)) + 1;
  lease = world.etcd.grant(std::chrono::duration_cast<nanoseconds>(kEtcdTtl).count());
  world.scheduler.at(world.etcd.leases[lease], [w = &world, l = lease] { w->etcd.expire(l); });
  ++registration;
  learning_ = true;
  deadline_local = local() + nanoseconds(kEtcdTtl - kDriftMargin).count();
  map.reset();
  map_revision = 0;
  epoch_wanted = true;
  alive = true;
  host = std::make_unique<SimHost>(*this);
  driver = std::make_unique<cluster::NodeDriver>(
      cluster::NodeDriverOptions{
          .node_id = id,
          .lease_ttl = kEtcdTtl,
          .drift_margin = kDriftMargin,
          .max_ttl = kMaxTtl,
          .retry_after = milliseconds(20),
          .replicas = kReplicas,
          .evict_after = kEvictAfter,
          .min_grant_epoch = min_epoch,
          .server_recovered_at = clock() + nanoseconds(std::max(lock_delay, kMaxTtl)),
          .router_options = router_options()},
      *host);
  if (etcd_reachable()) {
    world.etcd.put(std::string(Etcd::kPrefix) + "members/" + id,
                   cluster::encode_member(MemberRecord{address_of(index), 1, MemberState::kJoining,
                                                       static_cast<std::uint64_t>(kMaxTtl.count()),
                                                       static_cast<std::uint32_t>(kReplicas)}),
                   lease);
    wanted_after_revision = world.etcd.revision;
  }
  Event e;
  e.kind = EventKind::kServerStart;
  e.node = id;
  e.incarnation = incarnation;
  e.lock_delay_ms = lock_delay.count();
  world.record(e);
  e.kind = EventKind::kServerReady;
  world.record(e);
  const std::int64_t inc = incarnation;
  world.scheduler.after(1 * kMs, [this, inc] {
    if (alive && incarnation == inc) tick();
  });
  world.scheduler.after(2 * kMs, [this, inc] {
    if (alive && incarnation == inc) drive();
  });
  world.scheduler.after(3 * kMs, [this, inc] {
    if (alive && incarnation == inc) keep_alive();
  });
  world.scheduler.after(etcd_delay, [this, inc] {
    if (alive && incarnation == inc) reconcile();
  });
}

void Node::kill() {
  if (!alive) return;
  alive = false;
  Event e;
  e.kind = EventKind::kServerKill;
  e.node = id;
  e.incarnation = incarnation;
  world.record(e);
  if (driver) world.maps_missed += driver->stats().maps_missed;
  driver.reset();
  host.reset();
  dispatcher.reset();
  replicator.reset();
  store.reset();
  epoch_file.reset();
  paused = false;
  paused_inbox.clear();
  pending_views.clear();
  ++incarnation;  // stale timers and watch events are ignored
}

void Node::on_datagram(int from, std::vector<std::uint8_t> bytes) {
  if (!alive) return;
  if (paused) {
    paused_inbox.emplace_back(from, std::move(bytes));
    return;
  }
  std::vector<OutDatagram> out;
  if (!replicator->on_datagram(bytes, peer_of(from), local(), out)) {
    dispatcher->handle(0, bytes, peer_of(from), out);
  }
  dispatcher->end_batch(out);
  send_out(out);
}

void Node::send_out(std::vector<OutDatagram>& out) {
  for (OutDatagram& d : out) {
    const int to = endpoint_of(d.peer);
    world.network.send(index, to,
                       std::vector<std::uint8_t>(d.bytes.begin(), d.bytes.begin() + d.length));
  }
  out.clear();
}

void Node::tick() {
  const std::int64_t inc = incarnation;
  world.scheduler.after(5 * kMs, [this, inc] {
    if (alive && incarnation == inc) tick();
  });
  if (paused) return;
  std::vector<OutDatagram> out;
  dispatcher->tick(0, out);
  replicator->loop_ran(local());
  if (replicator->restart_pending()) dispatcher->replicate_buckets(replicator->restart_streams());
  replicator->poll(local(), out);
  send_out(out);
}

void Node::drive() {
  const std::int64_t inc = incarnation;
  world.scheduler.after(20 * kMs, [this, inc] {
    if (alive && incarnation == inc) drive();
  });
  if (paused) return;
  std::vector<ClusterView> views;
  views.swap(pending_views);
  driver->step(views, clock(), registration);
}

void Node::keep_alive() {
  const std::int64_t inc = incarnation;
  world.scheduler.after(nanoseconds(kEtcdTtl).count() / 3, [this, inc] {
    if (alive && incarnation == inc) keep_alive();
  });
  if (paused || !etcd_reachable()) return;
  const Time sent = local();
  if (lease != 0 && world.etcd.keep_alive(lease, nanoseconds(kEtcdTtl).count())) {
    world.scheduler.at(world.etcd.leases[lease], [w = &world, l = lease] { w->etcd.expire(l); });
    // The answer comes back over the link; the deadline counts from the send.
    world.scheduler.after(2 * etcd_delay, [this, inc, sent] {
      if (alive && incarnation == inc && !paused) {
        deadline_local =
            std::max(deadline_local, sent + nanoseconds(kEtcdTtl - kDriftMargin).count());
      }
    });
    return;
  }
  // The lease is gone: fail closed, register again.
  deadline_local = 0;
  lease = world.etcd.grant(nanoseconds(kEtcdTtl).count());
  world.scheduler.at(world.etcd.leases[lease], [w = &world, l = lease] { w->etcd.expire(l); });
  ++registration;
  learning_ = true;  // every registration joins as a learner (join_as_learner)
  deadline_local = sent + nanoseconds(kEtcdTtl - kDriftMargin).count();
  log("registered again under lease " + std::to_string(lease));
  world.etcd.put(
      std::string(Etcd::kPrefix) + "members/" + id,
      cluster::encode_member(MemberRecord{
          address_of(index), 1, learning_ ? MemberState::kJoining : state,
          static_cast<std::uint64_t>(kMaxTtl.count()), static_cast<std::uint32_t>(kReplicas)}),
      lease);
}

void Node::reconcile() {
  if (paused) {
    world.scheduler.after(5 * kMs, [this, inc = incarnation] {
      if (alive && incarnation == inc) reconcile();
    });
    return;
  }
  if (!etcd_reachable()) return;
  Etcd& etcd = world.etcd;
  const std::string prefix = Etcd::kPrefix;
  ClusterView view;
  view.revision = etcd.revision;
  std::optional<ClusterMap> published;
  std::int64_t published_revision = 0;
  for (const auto& [key, kv] : etcd.keys) {
    if (key == prefix + "map") {
      published = cluster::decode_map(kv.value, static_cast<std::uint64_t>(kv.mod_revision));
      published_revision = kv.mod_revision;
    } else if (key.starts_with(prefix + "members/")) {
      auto record = cluster::decode_member(kv.value);
      view.members.push_back({key.substr(prefix.size() + 8), record.value_or(MemberRecord{}),
                              kv.create_revision, kv.lease, record.has_value()});
    } else if (key.starts_with(prefix + "handoff/")) {
      view.handoffs.push_back({key.substr(prefix.size() + 8), std::stoull(kv.value)});
    }
  }
  std::vector<std::shared_ptr<const ClusterMap>> adopted;
  auto adopt = [&](ClusterMap m, std::int64_t revision) {
    if (map && m.epoch <= map->epoch) return;
    if (m.epoch < epoch_file->highest()) return;  // refused
    std::string detail;
    if (epoch_file->record(m.epoch, detail)) return;
    map = std::make_shared<const ClusterMap>(std::move(m));
    map_revision = static_cast<std::uint64_t>(revision);
    adopted.push_back(map);
  };
  if (published) {
    // Membership::adopt_maps_through()'s rule, the real one (map_history.h):
    // the maps the watch missed are read back from the map key's history.
    const cluster::ReadMapBefore read_before =
        [&etcd](std::int64_t revision) -> std::optional<cluster::RevisedMap> {
      auto it = etcd.map_puts.lower_bound(revision);
      if (it == etcd.map_puts.begin()) return std::nullopt;
      --it;
      auto m = cluster::decode_map(it->second, static_cast<std::uint64_t>(it->first));
      if (!m) return std::nullopt;
      return cluster::RevisedMap{std::move(*m), it->first};
    };
    for (cluster::RevisedMap& m : cluster::maps_to_adopt(
             map ? map->epoch : 0, std::move(watched_maps), {*published, published_revision},
             cluster::kMaxMapHistoryReads, read_before)) {
      adopt(std::move(m.map), m.mod_revision);
    }
  }
  watched_maps.clear();
  // Membership::reconcile()'s rule, the real one (next_map.h).
  if (epoch_wanted && static_cast<std::int64_t>(map_revision) > wanted_after_revision) {
    epoch_wanted = false;
  }
  MapDecision decision = next_map({.view = view,
                                   .published = published,
                                   .self_id = id,
                                   .self_lease = lease,
                                   .highest_epoch_seen = epoch_file->highest(),
                                   .epoch_wanted = epoch_wanted,
                                   .epoch_floor = min_epoch});
  if (decision.next) {
    ClusterMap next = std::move(*decision.next);
    // The CAS on the map key's mod revision: this read is the current state.
    etcd.put(prefix + "map", cluster::encode_map(next), 0);
    epoch_wanted = false;
    world.record_map(next);
    adopt(next, etcd.revision);
  }
  view.map = map;
  view.adopted = std::move(adopted);
  pending_views.push_back(std::move(view));
}

// ---- SimHost ----

void SimHost::publish_gate(std::shared_ptr<const lease::internal::ClusterGate> gate) {
  node_.dispatcher->publish_gate(std::move(gate));
}
std::error_code SimHost::set_replica_layout(std::uint64_t epoch, const RouterSnapshot& routing,
                                            const std::vector<bool>& learners, std::uint16_t self,
                                            std::size_t replicas,
                                            const std::vector<std::string>& addresses,
                                            std::string& /*detail*/) {
  std::vector<Peer> peers;
  for (const std::string& a : addresses) {
    // "10.0.X.Y:PORT" -> the endpoint PORT - 7700.
    peers.push_back(peer_of(std::stoi(a.substr(a.rfind(':') + 1)) - 7700));
  }
  const auto layout =
      lease::internal::replica_layout(epoch, routing, learners, self, replicas, peers);
  node_.dispatcher->replicate_buckets(node_.replicator->set_layout(layout, node_.local()));
  return {};
}
bool SimHost::replica_primary_settled(const std::string& primary, std::uint32_t bucket) const {
  return node_.replicator->primary_settled(primary, bucket);
}
std::optional<std::size_t> SimHost::take_over(const std::string& primary, std::uint32_t bucket,
                                              milliseconds hold, bool* owner_active) {
  std::vector<std::pair<std::string, lease::internal::replication::ReplicaHolder>> holders;
  const Time now = node_.local();
  if (!node_.replicator->takeover(primary, bucket, now, holders, owner_active)) return std::nullopt;
  return node_.dispatcher->inherit(holders, now / kMs + hold.count() + 1);
}
lease::ReplicaProgress SimHost::replica_progress() const { return node_.replicator->progress(); }
nanoseconds SimHost::replica_lease_until(std::size_t bucket) const noexcept {
  return node_.replicator->lease_until(bucket);
}
std::vector<std::string> SimHost::silent_replicas(milliseconds silence) const {
  return node_.replicator->silent_peers(node_.local(), nanoseconds(silence).count());
}
std::size_t SimHost::count_leases(const std::function<bool(std::string_view)>& pred) const {
  return node_.dispatcher->count_leases(pred);
}
bool SimHost::needs_new_epoch() const { return node_.dispatcher->needs_new_epoch(); }
nanoseconds SimHost::lease_deadline_of(std::uint64_t registration) const noexcept {
  return nanoseconds(registration == node_.registration ? node_.deadline_local : 0);
}
bool SimHost::learning() const { return node_.learning_; }
HostResult SimHost::caught_up() {
  if (!node_.learning_) return {};
  if (!node_.etcd_reachable()) return {HostResult::Status::kFailed, "etcd cut"};
  node_.learning_ = false;
  node_.world.etcd.put(
      std::string(Etcd::kPrefix) + "members/" + node_.id,
      cluster::encode_member(MemberRecord{address_of(node_.index), 1, node_.state,
                                          static_cast<std::uint64_t>(kMaxTtl.count()),
                                          static_cast<std::uint32_t>(kReplicas)}),
      node_.lease);
  return {};
}
HostResult SimHost::put_handoff(std::uint64_t epoch) {
  if (!node_.etcd_reachable()) return {HostResult::Status::kFailed, "etcd cut"};
  if (!node_.world.etcd.leases.contains(node_.lease))
    return {HostResult::Status::kRefused, "no lease"};
  node_.world.etcd.put(std::string(Etcd::kPrefix) + "handoff/" + node_.id, std::to_string(epoch),
                       node_.lease);
  return {};
}
HostResult SimHost::evict(std::string_view id, std::int64_t lease) {
  if (!node_.etcd_reachable()) return {HostResult::Status::kFailed, "etcd cut"};
  Etcd& etcd = node_.world.etcd;
  const std::string prefix = Etcd::kPrefix;
  const auto victim = etcd.keys.find(prefix + "members/" + std::string(id));
  const auto own = etcd.keys.find(prefix + "members/" + node_.id);
  if (victim == etcd.keys.end() || victim->second.lease != lease || own == etcd.keys.end() ||
      own->second.lease != node_.lease) {
    return {HostResult::Status::kRefused, "comparison failed"};
  }
  etcd.revoke(lease);
  return {};
}
void SimHost::request_new_epoch() { node_.epoch_wanted = true; }
void SimHost::log(std::string_view line) { node_.log(line); }

// ---- Client ----

std::vector<std::uint8_t> encode_request(const Datagram& d) {
  std::vector<std::uint8_t> out(lease::kMaxDatagramSize);
  std::size_t written = 0;
  if (lease::encode(d, out, written, lease::max_reply_size(d)) != lease::ProtocolError::kOk) {
    return {};
  }
  out.resize(written);
  return out;
}

void Client::begin() {
  ++attempt;
  ++op;
  phase = Phase::kAcquiring;
  key = world.workload_keys[static_cast<std::size_t>(
      world.random.between(0, static_cast<std::int64_t>(world.workload_keys.size()) - 1))];
  ttl_ms = static_cast<std::uint32_t>(world.random.between(200, 1000));
  request_id = next_request++;
  lease_op = static_cast<std::uint32_t>(op);
  tries = 0;
  first_sent = world.now();
  target = -1;
  Event e;
  e.kind = EventKind::kAcquireInvoke;
  e.client = index;
  e.op = op;
  e.key = key;
  e.ttl_ms = ttl_ms;
  world.record(e);
  send_request();
}

void Client::send_request() {
  // The client's own map: refreshed (a MAP from any node) when a node
  // redirected it or every refresh interval, so it may route by an older
  // map than the newest, as real clients do between refreshes.
  if (!known_map || (target < 0 && redirected) || world.now() - known_at > refresh) {
    known_map = world.published_map();
    known_at = world.now();
    redirected = false;
  }
  const std::optional<ClusterMap>& map = known_map;
  std::unique_ptr<cluster::ClusterRouting> routing;
  if (map && target < 0 &&
      cluster::ClusterRouting::build(*map, router_options(), routing) == RouterStatus::kOk) {
    const ClusterMember* owner = routing->owner_of(key);
    if (owner) target = std::stoi(owner->id.substr(1)) - 1;
  }
  const std::uint64_t this_attempt = attempt;
  if (target >= 0) {
    Datagram d;
    d.request_id = request_id;
    // Each lease its own owner, as a LeaseClient's handles (the client's
    // upper 96 bits, the operation in the low 32).
    d.client_id = ClientId{(id.lo & ~std::uint64_t{0xFFFF'FFFF}) | lease_op, id.hi};
    if (map) d.epoch = map->epoch;
    Message m;
    m.request_id = request_id;
    m.key = key;
    if (phase == Phase::kAcquiring) {
      m.type = MessageType::kAcquire;
      m.ttl_ms = ttl_ms;
    } else {
      m.type = MessageType::kRelease;
      m.token = token;
    }
    (void)d.push(m);
    world.network.send(kClientBase + index, target, encode_request(d));
  }
  ++tries;
  world.scheduler.after(retransmit, [this, this_attempt] {
    if (attempt != this_attempt) return;
    if (tries >= 6) {
      // Given up: an acquire fails unknown (it may have been granted: the
      // checker treats it as possibly held), a release is abandoned.
      Event e;
      e.client = index;
      e.op = op;
      e.key = key;
      if (phase == Phase::kAcquiring) {
        e.kind = EventKind::kAcquireFail;
        e.error = "timeout";
      } else {
        e.kind = EventKind::kReleaseFail;
        e.token = token;
        e.error = "timeout";
      }
      world.record(e);
      retry_later(world.random.between(5, 50) * kMs);
      return;
    }
    send_request();
  });
}

void Client::retry_later(Time d) {
  ++attempt;
  phase = Phase::kIdle;
  world.scheduler.after(d, [this, a = attempt] {
    if (attempt == a) begin();
  });
}

void Client::on_reply(int from, std::span<const std::uint8_t> bytes) {
  Datagram d;
  if (lease::decode(bytes, d) != lease::ProtocolError::kOk || d.count == 0) return;
  const Message& m = d.messages[0];
  // By request id alone, as the real clients match answers: with replies
  // relayed, a grant's answer comes from the backup, not the node asked.
  if (m.request_id != request_id) return;
  if (phase == Phase::kAcquiring) {
    Event e;
    e.client = index;
    e.op = op;
    e.key = key;
    if (m.type == MessageType::kGranted) {
      token = m.token;
      e.kind = EventKind::kAcquireOk;
      e.token = token;
      // The client's own expiry: from the first send, as LeaseClient counts.
      e.expiry_ns = first_sent + static_cast<Time>(m.ttl_ms) * kMs;
      // The node that granted it is the one asked under this request id
      // (a fresh id on every re-route); `from` may be its backup, relaying.
      e.node = node_name(target >= 0 ? target : from);
      world.record(e);
      ++attempt;
      phase = Phase::kHolding;
      const Time hold = world.random.between(0, static_cast<Time>(m.ttl_ms) * kMs * 3 / 2);
      world.scheduler.after(hold, [this, a = attempt] {
        if (attempt != a) return;
        Event r;
        r.kind = EventKind::kReleaseInvoke;
        r.client = index;
        r.op = ++op;
        r.key = key;
        r.token = token;
        world.record(r);
        phase = Phase::kReleasing;
        request_id = next_request++;
        tries = 0;
        ++attempt;
        send_request();
      });
      return;
    }
    if (m.type == MessageType::kRedirect) {
      // Route again by the newest map, under a fresh request id (as the C++
      // client resends a re-routed call).
      target = -1;
      redirected = true;
      request_id = next_request++;
      return;
    }
    e.kind = EventKind::kAcquireFail;
    e.error = m.type == MessageType::kBusy         ? "busy"
              : m.type == MessageType::kRecovering ? "recovering"
                                                   : "error";
    world.record(e);
    retry_later(world.random.between(5, 80) * kMs);
    return;
  }
  if (phase == Phase::kReleasing) {
    Event e;
    e.client = index;
    e.op = op;
    e.key = key;
    e.token = token;
    if (m.type == MessageType::kReleased) {
      e.kind = EventKind::kReleaseOk;
    } else {
      e.kind = EventKind::kReleaseFail;
      e.error = m.type == MessageType::kExpired ? "expired" : "not_owner";
    }
    world.record(e);
    retry_later(world.random.between(1, 30) * kMs);
  }
}

// ---------------------------------------------------------------------------
// The nemesis
// ---------------------------------------------------------------------------

void schedule_faults(World& w) {
  const Time end = static_cast<Time>(w.options.fault_seconds * kSec);
  Time t = w.random.between(1, 3) * kSec;
  while (t < end) {
    const auto n =
        static_cast<int>(w.random.between(0, static_cast<std::int64_t>(w.nodes.size()) - 1));
    const auto kind = w.random.between(0, 5);
    const Time length = w.random.between(100, 2500) * kMs;
    Node* node = w.nodes[static_cast<std::size_t>(n)].get();
    switch (kind) {
      case 0:  // kill -9, restart from the data dir
        w.scheduler.at(t, [node] { node->kill(); });
        w.scheduler.at(t + length, [node] {
          if (!node->alive) node->start();
        });
        break;
      case 1:  // pause (SIGSTOP)
        w.scheduler.at(t, [&w, node] {
          if (!node->alive || node->paused) return;
          node->paused = true;
          Event e;
          e.kind = EventKind::kServerPause;
          e.node = node->id;
          e.incarnation = node->incarnation;
          w.record(e);
        });
        w.scheduler.at(t + length, [&w, node] {
          if (!node->alive || !node->paused) return;
          node->paused = false;
          Event e;
          e.kind = EventKind::kServerResume;
          e.node = node->id;
          e.incarnation = node->incarnation;
          w.record(e);
          auto inbox = std::move(node->paused_inbox);
          node->paused_inbox.clear();
          for (auto& [from, bytes] : inbox) node->on_datagram(from, std::move(bytes));
        });
        break;
      case 2: {  // a one-way cut between two nodes
        const auto peer =
            static_cast<int>(w.random.between(0, static_cast<std::int64_t>(w.nodes.size()) - 1));
        if (peer == n) break;
        w.scheduler.at(t, [&w, n, peer] {
          w.network.cut.insert({n, peer});
          Event e;
          e.kind = EventKind::kNodeCutOn;
          e.node = node_name(n);
          e.peer = node_name(peer);
          w.record(e);
        });
        w.scheduler.at(t + length, [&w, n, peer] {
          w.network.cut.erase({n, peer});
          Event e;
          e.kind = EventKind::kNodeCutOff;
          e.node = node_name(n);
          e.peer = node_name(peer);
          w.record(e);
        });
        break;
      }
      case 3:  // the node's etcd link cut
        w.scheduler.at(t, [&w, n] {
          w.network.cut.insert({n, -1});
          Event e;
          e.kind = EventKind::kEtcdCutOn;
          e.node = node_name(n);
          w.record(e);
        });
        w.scheduler.at(t + length, [&w, n, node] {
          w.network.cut.erase({n, -1});
          Event e;
          e.kind = EventKind::kEtcdCutOff;
          e.node = node_name(n);
          w.record(e);
          if (node->alive) node->reconcile();
        });
        break;
      case 4:  // a slow etcd link (watch events and answers late)
        w.scheduler.at(t, [node, d = w.random.between(200, 700) * kMs] { node->etcd_delay = d; });
        w.scheduler.at(t + length, [node] { node->etcd_delay = 2 * kMs; });
        break;
      default: {  // a drain, and back
        w.scheduler.at(t, [&w, node] {
          if (!node->alive || !node->etcd_reachable()) return;
          node->state = MemberState::kDraining;
          Event e;
          e.kind = EventKind::kDrainOn;
          e.node = node->id;
          w.record(e);
          w.etcd.put(std::string(Etcd::kPrefix) + "members/" + node->id,
                     cluster::encode_member(
                         MemberRecord{address_of(node->index), 1, MemberState::kDraining,
                                      static_cast<std::uint64_t>(kMaxTtl.count()),
                                      static_cast<std::uint32_t>(kReplicas)}),
                     node->lease);
        });
        w.scheduler.at(t + 2 * length, [&w, node] {
          node->state = MemberState::kActive;
          Event e;
          e.kind = EventKind::kDrainOff;
          e.node = node->id;
          w.record(e);
          if (!node->alive || !node->etcd_reachable()) return;
          w.etcd.put(std::string(Etcd::kPrefix) + "members/" + node->id,
                     cluster::encode_member(MemberRecord{
                         address_of(node->index), 1,
                         node->learning_ ? MemberState::kJoining : MemberState::kActive,
                         static_cast<std::uint64_t>(kMaxTtl.count()),
                         static_cast<std::uint32_t>(kReplicas)}),
                     node->lease);
        });
        break;
      }
    }
    t += length + w.random.between(100, 1500) * kMs;
  }
}

}  // namespace

std::size_t SimResult::safety_violations() const {
  std::size_t n = 0;
  for (const auto kind :
       {torture::ViolationKind::kOverlap, torture::ViolationKind::kTokenOrder,
        torture::ViolationKind::kDuplicateToken, torture::ViolationKind::kOwner,
        torture::ViolationKind::kPermitLimit, torture::ViolationKind::kAllOrNothing,
        torture::ViolationKind::kFencing}) {
    const auto it = report.violation_counts.find(kind);
    if (it != report.violation_counts.end()) n += it->second;
  }
  return n;
}

SimResult run_simulation(const SimOptions& options) {
  SimOptions o = options;
  o.scratch_dir = options.scratch_dir + "/shardlock-sim-" + std::to_string(::getpid()) + "-" +
                  std::to_string(options.seed);
  std::filesystem::remove_all(o.scratch_dir);
  World w(o);
  for (int k = 0; k < o.keys; ++k) w.workload_keys.push_back("key-" + std::to_string(k));
  for (int n = 0; n < o.nodes; ++n) w.nodes.push_back(std::make_unique<Node>(w, n));
  // Bootstrapping node by node: n1 alone first, then the others join.
  Time start = 0;
  for (auto& node : w.nodes) {
    w.scheduler.at(start, [n = node.get()] { n->start(); });
    start += w.random.between(200, 6000) * kMs;
  }
  for (int c = 0; c < o.clients; ++c) {
    // One draw per statement: argument order is unspecified.
    const ClientId id{w.random.next(), w.random.next()};
    const Time retransmit = w.random.between(5, 700) * kMs;
    auto client = std::make_unique<Client>(w, c, id, retransmit);
    client->refresh = w.random.between(100, 3000) * kMs;
    w.scheduler.at(w.random.between(100, 1000) * kMs, [cl = client.get()] { cl->begin(); });
    w.clients.push_back(std::move(client));
  }
  // On a seeded half, the first node's etcd link is slow while the others
  // join (a lone member that sees the maps late).
  if (w.random.chance(0.5)) {
    Node* first = w.nodes.front().get();
    first->etcd_delay = w.random.between(300, 900) * kMs;
    w.scheduler.at(start + 3 * kSec, [first] { first->etcd_delay = 2 * kMs; });
  }
  schedule_faults(w);
  const Time fault_end = static_cast<Time>(o.fault_seconds * kSec);
  const Time end = fault_end + static_cast<Time>(o.tail_seconds * kSec);
  w.scheduler.at(fault_end + 3 * kSec, [&w] {
    Event e;
    e.kind = EventKind::kHealed;
    w.record(e);
  });
  SimResult result;
  result.seed = o.seed;
  result.events = w.scheduler.run_until(end);
  result.simulated_seconds = static_cast<double>(end) / 1e9;
  result.maps_missed = w.maps_missed;
  for (const auto& node : w.nodes) {
    if (node->driver) result.maps_missed += node->driver->stats().maps_missed;
  }
  torture::CheckOptions check;
  check.liveness_bound_ms = 8000;
  check.replicas = 1;  // kept: not judged (docs/simulation.md)
  result.report = torture::check(w.history, check);
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const Event& e : w.history) {
    const std::string line = torture::format_event(e);
    XXH3_64bits_update(state, line.data(), line.size());
    XXH3_64bits_update(state, "\n", 1);
  }
  result.history_hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  result.history = std::move(w.history);
  result.trace = std::move(w.trace);
  w.nodes.clear();
  std::filesystem::remove_all(o.scratch_dir);
  return result;
}

}  // namespace shardlock::sim
