// Replication end to end: a real etcd, shardlockd nodes
// with --replicas 2 as processes, and cluster clients. kill -9 of a primary
// is client_failover_test's; this file has the rest:
//
// - a primary paused (SIGSTOP) for less than the replica timeout: nothing
//   moves, holders keep their leases at it;
// - a primary paused for longer: its backup takes its buckets over with the
//   leases, and the old primary, woken, grants and renews none of them;
// - a partition between a primary and its backup (NodeRelay below cuts the
//   datagrams between the two): the backup evicts the primary, which grants
//   nothing in those buckets once its primary lease has run out, and no key
//   gets two holders (a grant it decided just before is the disabled test,
//   a server bug);
// - a backup killed while grants are in flight: every grant answered lives
//   on the bucket's new backup, so a later kill of the primary loses none;
// - a join that makes the new node a primary, and a taken-over primary that
//   comes back: each learns as a backup first, then takes its buckets over
//   with their holders;
// - a join that adds a backup: the new backup catches up by a snapshot and
//   inherits the leases when the primary dies;
// - a watch and an election observer through the kill -9 of their key's
//   primary: the kept holder is no change to report, and the
//   release (a resignation) after the failover wakes them.
//
// Every test checks one invariant throughout: no key is granted to another
// owner while its holder's lease is valid (the holder's client-side expiry
// errs early, so a grant while valid() is true afterwards overlaps the
// holder's lease on the server). Waits poll with deadlines; timings are
// generous, for sanitizer builds on two shared cores (replica timeout 2 s,
// not 300 ms; 8 s leases), and nothing bounds how fast a failover is.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "node_processes.h"
#include "poll_until.h"
#include "shardlock/cluster/cluster_map.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/client/election.h"
#include "shardlock/lease/client/watch.h"

namespace shardlock::cluster {
namespace {

using namespace std::chrono_literals;
using lease::LeaseClient;
using lease::LeaseClientOptions;
using lease::LeaseErrc;

// The holders' TTL, and the nodes' --max-ttl and --lock-delay. A watchdog
// renews at a third of it, so a failover has two thirds of a TTL (about 5 s)
// to finish before a holder's lease runs out.
constexpr auto kTtl = 8000ms;
const std::string kMaxTtl = "8s";
// Long enough that a node stalled by a sanitizer run is not taken for dead:
// with 1 s, three ASan nodes on two cores evicted the last one started at
// start-up in most runs under ctest, a lock-delay more before the cluster
// settled.
const std::string kReplicaTimeout = "2s";
// For a node that must never be the one to evict (the flag's maximum).
const std::string kNeverEvicts = "1m";
// Not the 2 s of the other cluster tests: at a load average of 20 on the
// two cores a node's keep-alives missed a 2 s lease, and a node that
// registers again (a new incarnation) is no longer taken over at once, so
// the tests would fail for the machine's sake. It lengthens the cluster's
// lock-delay (max TTL + etcd lease TTL + 0.5 s) that each start waits out.
const std::string kEtcdLeaseTtl = "4s";

// ---------------------------------------------------------------------------
// NodeRelay: node-to-node partitions
// ---------------------------------------------------------------------------

// A UDP relay in front of every node of a test cluster, which can cut the
// datagrams between two nodes while clients still get through. Each node
// advertises its relay port (--advertise). A datagram that reaches node b's
// port from node a's listen address is node a's, and goes on to node b from
// node a's relay port: a node knows its replication peers by their source
// address, which must be the advertised one (Replicator::on_datagram), so
// a relay with one upstream socket per source (torture::UdpProxy) would hide
// them. Any other source is a client and gets its own upstream socket to the
// node, whose answers go back to it from the node's relay port.
//
// One thread; cut() and set_listen_address() may be called from any thread.
class NodeRelay {
 public:
  explicit NodeRelay(std::size_t nodes)
      : nodes_(nodes),
        listen_ports_(new std::atomic<std::uint16_t>[nodes]),
        cut_(new std::atomic<bool>[nodes * nodes]) {
    for (std::size_t i = 0; i < nodes; ++i) {
      listen_ports_[i].store(0, std::memory_order_relaxed);
      const int fd = bound_socket();
      if (fd < 0) return;
      relay_fds_.push_back(fd);
      relay_ports_.push_back(port_of(fd));
    }
    for (std::size_t i = 0; i < nodes * nodes; ++i) cut_[i].store(false, std::memory_order_relaxed);
  }
  ~NodeRelay() {
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
    for (const int fd : relay_fds_) ::close(fd);
    for (const Upstream& u : upstreams_) ::close(u.fd);
  }
  NodeRelay(const NodeRelay&) = delete;
  NodeRelay& operator=(const NodeRelay&) = delete;

  // False when a socket could not be bound.
  [[nodiscard]] bool start() {
    if (relay_fds_.size() != nodes_) return false;
    thread_ = std::thread([this] { run(); });
    return true;
  }
  // What node `node` advertises.
  [[nodiscard]] std::string address(std::size_t node) const {
    return "127.0.0.1:" + std::to_string(relay_ports_[node]);
  }
  // Node `node` listens on `address` ("127.0.0.1:PORT", from its ready line).
  // Until then its datagrams count as a client's.
  void set_listen_address(std::size_t node, const std::string& address) {
    const auto port = std::stoi(address.substr(address.rfind(':') + 1));
    // Relaxed: a port read per datagram; nothing else is published with it.
    listen_ports_[node].store(static_cast<std::uint16_t>(port), std::memory_order_relaxed);
  }
  // Drops (or again forwards) every datagram from node `from` to node `to`,
  // from the next one on.
  void cut_one_way(std::size_t from, std::size_t to, bool cut) {
    // Relaxed: a flag read per datagram; nothing else is published with it.
    cut_[from * nodes_ + to].store(cut, std::memory_order_relaxed);
  }
  // Both ways: a partition between nodes a and b.
  void cut(std::size_t a, std::size_t b, bool cut) {
    cut_one_way(a, b, cut);
    cut_one_way(b, a, cut);
  }
  [[nodiscard]] std::uint64_t dropped() const noexcept {
    return dropped_.load(std::memory_order_relaxed);  // a statistic
  }

 private:
  struct Upstream {
    int fd;
    std::size_t node;    // the node it forwards to
    sockaddr_in client;  // whom the node's answers go back to
  };

  static int bound_socket() {
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }
  static std::uint16_t port_of(int fd) {
    sockaddr_in a{};
    socklen_t length = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length);
    return ntohs(a.sin_port);
  }
  static void send_to(int fd, const std::uint8_t* data, std::size_t size, const sockaddr_in& to) {
    // A full socket buffer drops the datagram, as a network would.
    (void)::sendto(fd, data, size, MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&to), sizeof to);
  }
  void send_to_node(int fd, std::size_t node, const std::uint8_t* data, std::size_t size) {
    const std::uint16_t port = listen_ports_[node].load(std::memory_order_relaxed);
    if (port == 0) return;  // not started yet: lost
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(port);
    send_to(fd, data, size, to);
  }

  // A datagram that reached node `to`'s relay port.
  void on_relay(std::size_t to, const sockaddr_in& from, const std::uint8_t* data,
                std::size_t size) {
    const std::uint16_t from_port = ntohs(from.sin_port);
    for (std::size_t node = 0; node < nodes_; ++node) {
      if (listen_ports_[node].load(std::memory_order_relaxed) != from_port) continue;
      if (cut_[node * nodes_ + to].load(std::memory_order_relaxed)) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
      } else {
        send_to_node(relay_fds_[node], to, data, size);
      }
      return;
    }
    auto it = std::find_if(upstreams_.begin(), upstreams_.end(), [&](const Upstream& u) {
      return u.node == to && u.client.sin_port == from.sin_port &&
             u.client.sin_addr.s_addr == from.sin_addr.s_addr;
    });
    if (it == upstreams_.end()) {
      const int fd = bound_socket();
      if (fd < 0) return;
      upstreams_.push_back(Upstream{fd, to, from});
      it = upstreams_.end() - 1;
    }
    send_to_node(it->fd, to, data, size);
  }

  void run() {
    std::vector<pollfd> polled;
    std::vector<std::uint8_t> buffer(65536);
    while (!stop_.load(std::memory_order_relaxed)) {  // only ends the loop
      polled.clear();
      for (const int fd : relay_fds_) polled.push_back(pollfd{fd, POLLIN, 0});
      for (const Upstream& u : upstreams_) polled.push_back(pollfd{u.fd, POLLIN, 0});
      if (::poll(polled.data(), polled.size(), 20) <= 0) continue;
      for (std::size_t i = 0; i < polled.size(); ++i) {
        if ((polled[i].revents & POLLIN) == 0) continue;
        for (int batch = 0; batch < 64; ++batch) {
          sockaddr_in from{};
          socklen_t length = sizeof from;
          const ssize_t got = ::recvfrom(polled[i].fd, buffer.data(), buffer.size(), 0,
                                         reinterpret_cast<sockaddr*>(&from), &length);
          if (got < 0) break;
          const auto size = static_cast<std::size_t>(got);
          if (i < nodes_) {
            on_relay(i, from, buffer.data(), size);
          } else {
            // A node's answer to a client. upstreams_ only grows, so the
            // index still names the socket polled.
            const Upstream& u = upstreams_[i - nodes_];
            send_to(relay_fds_[u.node], buffer.data(), size, u.client);
          }
        }
      }
    }
  }

  const std::size_t nodes_;
  std::vector<int> relay_fds_;
  std::vector<std::uint16_t> relay_ports_;
  std::unique_ptr<std::atomic<std::uint16_t>[]> listen_ports_;
  std::unique_ptr<std::atomic<bool>[]> cut_;  // [from * nodes_ + to]
  std::vector<Upstream> upstreams_;           // the relay thread's
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---------------------------------------------------------------------------
// Keys by replica set
// ---------------------------------------------------------------------------

// A map of `ids` (weight 1 each), to rank keys the way the nodes will once
// their map has these members.
std::unique_ptr<ClusterRouting> routing_of(std::vector<std::string> ids) {
  std::sort(ids.begin(), ids.end());
  ClusterMap map;
  map.epoch = 1;
  for (const std::string& id : ids) map.members.push_back(ClusterMember{id, "127.0.0.1:1", 1});
  std::unique_ptr<ClusterRouting> routing;
  EXPECT_EQ(ClusterRouting::build(map, routing), RouterStatus::kOk);
  return routing;
}

// `count` keys whose replica ranking over `ids` starts with `ranking` (the
// primary, then the backups, then the next to be promoted).
std::vector<std::string> keys_ranked(const std::vector<std::string>& ids,
                                     const std::vector<std::string>& ranking, std::size_t count,
                                     const std::string& prefix = "key-") {
  const auto routing = routing_of(ids);
  std::vector<std::string> keys;
  for (int i = 0; keys.size() < count && i < 100000; ++i) {
    const std::string key = prefix + std::to_string(i);
    if (routing->snapshot().owners(key, ranking.size()) == ranking) keys.push_back(key);
  }
  EXPECT_EQ(keys.size(), count);
  return keys;
}

// Another key in the bucket of `key` (a bucket's replica set and primary
// lease are what a grant there proves something about).
std::string key_in_bucket_of(const std::string& key) {
  const auto routing = routing_of({"any"});
  const std::size_t bucket = routing->bucket_of(key);
  for (int i = 0; i < 10'000'000; ++i) {
    std::string probe = "probe-" + std::to_string(i);
    if (routing->bucket_of(probe) == bucket) return probe;
  }
  ADD_FAILURE() << "no other key in the bucket of " << key;
  return key;
}

// ---------------------------------------------------------------------------
// Holders and rivals
// ---------------------------------------------------------------------------

// Tries the holders' keys from another owner, over and over, until stop():
// a grant while the key's holder is valid() is a second holder.
class Rival {
 public:
  Rival(LeaseClientOptions options, const std::vector<lease::Lease>& held)
      : client_(std::move(options)), held_(held) {}
  ~Rival() { stop(); }
  Rival(const Rival&) = delete;
  Rival& operator=(const Rival&) = delete;

  [[nodiscard]] std::error_code start() {
    if (const std::error_code ec = client_.start()) return ec;
    thread_ = std::thread([this] {
      while (!stop_.load(std::memory_order_relaxed)) {  // only ends the loop
        for (const lease::Lease& holder : held_) {
          auto r = client_.try_acquire(holder.key(), kTtl);
          // Read after the answer: valid now means valid when granted.
          const bool holder_valid = holder.valid();
          tried_.fetch_add(1, std::memory_order_relaxed);  // counts, read after join
          if (r.error == LeaseErrc::kBusy) busy_.fetch_add(1, std::memory_order_relaxed);
          if (!r.error) {
            granted_.fetch_add(1, std::memory_order_relaxed);
            if (holder_valid) second_holders_.fetch_add(1, std::memory_order_relaxed);
            (void)r.lease.release();
          }
        }
        std::this_thread::sleep_for(20ms);
      }
    });
    return {};
  }
  void stop() {
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
  }
  // Read after stop() (or any time, as a snapshot).
  [[nodiscard]] int second_holders() const {
    return second_holders_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::string summary() const {
    return "tries " + std::to_string(tried_.load(std::memory_order_relaxed)) + ", busy " +
           std::to_string(busy_.load(std::memory_order_relaxed)) + ", granted " +
           std::to_string(granted_.load(std::memory_order_relaxed)) + ", second holders " +
           std::to_string(second_holders());
  }

 private:
  LeaseClient client_;
  const std::vector<lease::Lease>& held_;
  std::atomic<bool> stop_{false};
  std::atomic<int> tried_{0};
  std::atomic<int> busy_{0};
  std::atomic<int> granted_{0};
  std::atomic<int> second_holders_{0};
  std::thread thread_;
};

// ---------------------------------------------------------------------------
// Watchers
// ---------------------------------------------------------------------------

// Runs `next` (a KeyWatch's or a LeaderObserver's, a second at a time) on a
// thread of its own until stop(), and keeps what it reports, in order: the
// states or changes, and apart from them the reads that failed for a whole
// second (the watch retries them itself; they are kept for the messages).
template <typename Event>
class Recorder {
 public:
  // `next` returns an event, or nullopt after a quiet second or a cancel;
  // it sets its argument when the read failed. `cancel` wakes it.
  Recorder(std::function<std::optional<Event>(std::error_code&)> next, std::function<void()> cancel)
      : next_(std::move(next)), cancel_(std::move(cancel)) {
    thread_ = std::thread([this] {
      while (!stop_.load(std::memory_order_relaxed)) {  // only ends the loop
        std::error_code error;
        std::optional<Event> event = next_(error);
        std::lock_guard lock(mutex_);
        if (event) events_.push_back(std::move(*event));
        if (error) errors_.push_back(error.message());
      }
    });
  }
  ~Recorder() { stop(); }
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  void stop() {
    // Relaxed: it only ends the loop, and cancel_() wakes the next() in it.
    stop_.store(true, std::memory_order_relaxed);
    cancel_();
    if (thread_.joinable()) thread_.join();
  }
  [[nodiscard]] std::vector<Event> events() const {
    std::lock_guard lock(mutex_);
    return events_;
  }
  [[nodiscard]] std::size_t count() const {
    std::lock_guard lock(mutex_);
    return events_.size();
  }
  [[nodiscard]] std::string errors() const {
    std::lock_guard lock(mutex_);
    return ::testing::PrintToString(errors_);
  }

 private:
  std::function<std::optional<Event>(std::error_code&)> next_;
  std::function<void()> cancel_;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
  std::vector<std::string> errors_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Longer than the bounded waits of the tests below add up to after a kill
// (under 100 s), and under the nodes' max_wait (300 s): a round stranded at
// a dead node cannot end, and re-arm at the key's new owner, by itself
// before the test gives up.
constexpr auto kWatchRound = 120s;

class ReplicationE2eTest : public test_support::NodeProcessTest {
 protected:
  // The return of n2 to a cluster of three (defined below its tests' note).
  void return_of_n2(bool clean);
  void TearDown() override {
    for (lease::Lease& l : leases_) l.detach();
    leases_.clear();
    NodeProcessTest::TearDown();
  }

  // A node with --replicas 2, advertising `advertise` when given.
  void start_replicated(const std::string& id, const std::string& replica_timeout = kReplicaTimeout,
                        const std::string& advertise = "") {
    std::vector<std::string> flags = {"--replicas", "2", "--replica-timeout", replica_timeout};
    if (!advertise.empty()) {
      flags.push_back("--advertise");
      flags.push_back(advertise);
    }
    start_node(id, flags, kMaxTtl, kEtcdLeaseTtl);
  }

  // Starts `ids` behind `relay`, node i advertising relay.address(i), with
  // the usual replica timeout except for `never_evicts`.
  void start_relayed(NodeRelay& relay, const std::vector<std::string>& ids,
                     const std::string& never_evicts) {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      start_replicated(ids[i], ids[i] == never_evicts ? kNeverEvicts : kReplicaTimeout,
                       relay.address(i));
      relay.set_listen_address(i, addresses_.at(ids[i]));
    }
  }

  // A client whose map has exactly `ids`, once each of them grants its own
  // keys (its start's lock-delay is over), so that a test's faults come
  // after the start-up and not during it.
  std::unique_ptr<LeaseClient> settled_client(const std::set<std::string>& ids) {
    auto c = client_with_members(ids);
    for (const std::string& id : ids) {
      for (const std::string& key : keys_of(*c, id, 1)) {
        auto r = c->acquire(key, kTtl, 40s);
        EXPECT_TRUE(r) << id << " does not grant: " << r.error.message();
        if (r) {
          EXPECT_FALSE(r.lease.release()) << key;
        }
      }
    }
    return c;
  }

  [[nodiscard]] LeaseClientOptions cluster_options() const {
    LeaseClientOptions options;
    for (const auto& [id, address] : addresses_) options.nodes.push_back(address);
    options.discover_cluster = true;
    return options;
  }
  // A client of node `id` alone, outside cluster mode: it asks that node
  // whatever the map says.
  [[nodiscard]] LeaseClientOptions direct_options(const std::string& id) const {
    LeaseClientOptions options;
    options.nodes = {addresses_.at(id)};
    return options;
  }

  // Acquires `keys` (waiting out the nodes' lock-delay) and keeps them with
  // watchdogs, counting losses in lost_.
  void hold(LeaseClient& client, const std::vector<std::string>& keys) {
    lease::LeaseOptions watch;
    watch.watchdog = true;
    watch.on_lost = [this](const lease::LeaseLost& lost) { note_lost(lost); };
    for (const std::string& key : keys) {
      auto r = client.acquire(key, kTtl, 40s, watch);
      ASSERT_TRUE(r) << key << ": " << r.error.message();
      leases_.push_back(std::move(r.lease));
    }
  }
  // Whether every lease renews after `t` (its expiry moves past what any
  // renewal sent before `t` gave), waiting up to 40 s; false as soon as
  // one is lost.
  [[nodiscard]] bool all_renewed_after(lease::LeaseClock::time_point t) const {
    bool renewed = false;
    (void)test_support::poll_until(
        [&] {
          renewed = std::all_of(leases_.begin(), leases_.end(),
                                [&](const lease::Lease& l) { return l.expiry() > t + kTtl; });
          return renewed || lost_.load() > 0;
        },
        40s, 50ms);
    return renewed;
  }
  // Starts n1 and n2, holds `keys` there, then starts n3 and returns a
  // client once n3 is a member (a learner first, then promoted).
  std::unique_ptr<LeaseClient> hold_then_join_n3(const std::vector<std::string>& keys) {
    start_replicated("n1");
    start_replicated("n2");
    auto holder = settled_client({"n1", "n2"});
    hold(*holder, keys);
    holders_.push_back(std::move(holder));
    start_replicated("n3");
    return client_with_members({"n1", "n2", "n3"});
  }
  // Another owner is refused every held key: BUSY, once the key's owner is
  // past its start's lock-delay (until then it answers RECOVERING, which
  // grants nothing either).
  void expect_busy_for_another_owner() {
    LeaseClient rival(cluster_options());
    ASSERT_FALSE(rival.start()) << rival.error_detail();
    for (const lease::Lease& l : leases_) {
      lease::AcquireResult r;
      (void)test_support::poll_until(
          [&] {
            r = rival.try_acquire(l.key(), kTtl);
            return r.error != LeaseErrc::kRecovering;
          },
          30s, 200ms);
      EXPECT_EQ(r.error, LeaseErrc::kBusy)
          << l.key() << " (held with token " << l.token() << "): "
          << (r ? "granted with token " + std::to_string(r.lease.token()) : r.error.message());
    }
  }
  // A grant in the bucket of each key, by a client of the current map
  // (whose epoch the node must have to answer): the bucket's primary holds
  // a primary lease from every backup of that map, and they have acked the
  // grant, so they have the bucket's snapshot (streams apply in order).
  void expect_buckets_replicated(LeaseClient& client, const std::vector<std::string>& keys) {
    for (const std::string& key : keys) {
      auto r = client.acquire(key_in_bucket_of(key), kTtl, 30s);
      EXPECT_TRUE(r) << "the bucket of " << key << ": " << r.error.message();
      if (r) {
        EXPECT_FALSE(r.lease.release()) << key;
      }
    }
  }
  // The ids in the map of a fresh client seeded with `seeds` (node ids).
  std::set<std::string> map_now(const std::vector<std::string>& seeds,
                                std::uint64_t* epoch = nullptr) const {
    LeaseClientOptions options;
    for (const std::string& id : seeds) options.nodes.push_back(addresses_.at(id));
    options.discover_cluster = true;
    options.request_timeout = 500ms;
    LeaseClient c(options);
    std::set<std::string> ids;
    if (c.start()) return ids;
    for (const auto& member : c.map_members()) ids.insert(member.id);
    if (epoch != nullptr) *epoch = c.map_epoch();
    return ids;
  }
  // The lines of node `id`'s log that contain `text`.
  std::string log_lines(const std::string& id, const std::string& text) const {
    std::ifstream in(log_of(id));
    std::string line;
    std::string found;
    while (std::getline(in, line)) {
      if (line.find(text) != std::string::npos) found += id + ": " + line + "\n";
    }
    return found;
  }

  // When node `id`'s newest run ends its lock-delay, by its own log ("lock-
  // delay ends at 2026-12-03T05:50:43.101Z"), on the system clock; nothing
  // while that run has not logged it (`runs_before`: the lines of earlier
  // runs).
  std::optional<std::chrono::system_clock::time_point> lock_delay_end(
      const std::string& id, std::size_t runs_before) const {
    const std::string marker = "lock-delay ends at ";
    const std::string lines = log_lines(id, marker);
    if (static_cast<std::size_t>(std::count(lines.begin(), lines.end(), '\n')) <= runs_before) {
      return std::nullopt;
    }
    std::tm tm{};
    int ms = 0;
    if (std::sscanf(lines.c_str() + lines.rfind(marker) + marker.size(), "%d-%d-%dT%d:%d:%d.%dZ",
                    &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec,
                    &ms) != 7) {
      return std::nullopt;
    }
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return std::chrono::system_clock::from_time_t(::timegm(&tm)) + std::chrono::milliseconds(ms);
  }

  // SIGSTOPs node `id`, the primary of every held key, and waits until the
  // `others` have evicted it and every lease has renewed since the pause
  // began, which only the backups that took them over can do.
  void pause_until_taken_over(const std::string& id, const std::vector<std::string>& others) {
    nodes_.at(id)->signal(SIGSTOP);
    const lease::LeaseClock::time_point stopped = lease::LeaseClock::now();
    EXPECT_TRUE(
        test_support::poll_until([&] { return !map_now(others).contains(id); }, 30s, 100ms));
    EXPECT_TRUE(all_renewed_after(stopped));
    EXPECT_EQ(lost_.load(), 0) << lost_detail();
  }

  // A holder's lost callback (on its client's watchdog thread).
  void note_lost(const lease::LeaseLost& lost) {
    std::lock_guard lock(lost_mutex_);
    lost_detail_ +=
        lost.key + " (token " + std::to_string(lost.token) + "): " + lost.reason.message() + "; ";
    lost_.fetch_add(1);
  }
  [[nodiscard]] std::string lost_detail() {
    std::lock_guard lock(lost_mutex_);
    return "lost: " + lost_detail_;
  }

  std::atomic<int> lost_{0};
  std::mutex lost_mutex_;
  std::string lost_detail_;
  // Clients whose leases are in leases_ (those go first).
  std::vector<std::unique_ptr<LeaseClient>> holders_;
  std::vector<lease::Lease> leases_;
};

// A primary paused for less than the replica timeout (the docs' table: "P
// paused shorter than 300 ms: nothing, the stream resumes"; here 500 ms
// against a 5 s timeout, for slack) keeps its buckets: no eviction, no new
// map, and its holders renew at it again after it resumes. Meanwhile no
// other owner is granted a held key: answers may be late or RECOVERING
// (its primary lease ran out while it slept) but never GRANTED.
TEST_F(ReplicationE2eTest, APrimaryPausedShorterThanTheReplicaTimeoutKeepsItsBuckets) {
  for (const char* id : {"n1", "n2", "n3"}) start_replicated(id, "5s");
  auto holder = settled_client({"n1", "n2", "n3"});
  hold(*holder, keys_of(*holder, "n2", 3));
  std::uint64_t epoch_before = 0;
  const auto members_before = map_now({"n1", "n3"}, &epoch_before);
  ASSERT_EQ(members_before.size(), 3u);
  Rival rival(cluster_options(), leases_);
  ASSERT_FALSE(rival.start());

  const std::map<std::string, std::string> took_over_before = {
      {"n1", log_lines("n1", "took over")}, {"n3", log_lines("n3", "took over")}};
  nodes_.at("n2")->signal(SIGSTOP);
  std::this_thread::sleep_for(500ms);  // the pause itself, not a wait for anything
  nodes_.at("n2")->signal(SIGCONT);
  const lease::LeaseClock::time_point resumed = lease::LeaseClock::now();

  // Every holder renews after the pause: at n2 again, since nothing moved.
  EXPECT_TRUE(all_renewed_after(resumed));
  rival.stop();
  EXPECT_EQ(rival.second_holders(), 0) << rival.summary();
  EXPECT_EQ(lost_.load(), 0) << lost_detail();
  std::uint64_t epoch_after = 0;
  EXPECT_EQ(map_now({"n1", "n3"}, &epoch_after), members_before);
  EXPECT_EQ(epoch_after, epoch_before) << "a map was published: n2 was evicted";
  // No takeover since the pause (learners promoted at the start take
  // buckets over too, before it).
  for (const char* id : {"n1", "n3"}) {
    EXPECT_EQ(log_lines(id, "took over"), took_over_before.at(id)) << id;
    EXPECT_EQ(log_lines(id, "evicting"), "");
  }
  expect_busy_for_another_owner();
  for (lease::Lease& l : leases_) EXPECT_FALSE(l.release()) << l.key();
}

// A primary paused for longer than the replica timeout (the docs' table: "P
// paused longer: B evicts P and takes over after its promise. P wakes with
// its lease from B expired, so it grants and renews nothing; its member key
// is gone and it starts over"). The holders renew at the backups that took
// the keys over, another owner is refused them, and once the old primary
// runs again nothing it answers makes a second holder: not an ACQUIRE of a
// held key from another owner, not a RENEW by the holder's own id (it has
// no primary lease any more, so it must not extend a lease it no longer
// owns).
TEST_F(ReplicationE2eTest, APrimaryPausedLongerIsTakenOverAndGrantsNothingWhenItWakes) {
  for (const char* id : {"n1", "n2", "n3"}) start_replicated(id);
  auto holder = settled_client({"n1", "n2", "n3"});
  const auto keys = keys_of(*holder, "n2", 4);
  hold(*holder, {keys.begin(), keys.end() - 1});
  Rival rival(cluster_options(), leases_);
  ASSERT_FALSE(rival.start());

  pause_until_taken_over("n2", {"n1", "n3"});
  expect_busy_for_another_owner();
  {
    LeaseClient other(cluster_options());
    ASSERT_FALSE(other.start()) << other.error_detail();
    auto free_key = other.acquire(keys.back(), kTtl, 30s);
    EXPECT_TRUE(free_key) << free_key.error.message();
    if (free_key) {
      EXPECT_FALSE(free_key.lease.release());
    }
  }

  // n2 wakes. Ask it directly (it may not know yet that it was evicted),
  // as another owner and as the holder itself, until it is back in the map.
  nodes_.at("n2")->signal(SIGCONT);
  LeaseClient direct(direct_options("n2"));
  ASSERT_FALSE(direct.start()) << direct.error_detail();
  int granted_while_held = 0;
  int renewed = 0;
  int asked = 0;
  const auto until = std::chrono::steady_clock::now() + 20s;
  bool back = false;
  while (!back && std::chrono::steady_clock::now() < until) {
    for (const lease::Lease& l : leases_) {
      auto r = direct.try_acquire(l.key(), kTtl);
      if (!r.error) {
        if (l.valid()) ++granted_while_held;
        (void)r.lease.release();
      }
      // As the holder itself: the lease's own owner.
      const auto renewal = direct.renew(l.key(), l.token(), kTtl, l.owner());
      if (!renewal.error) ++renewed;
      ++asked;
    }
    back = map_now({"n1", "n3"}).contains("n2");
  }
  EXPECT_TRUE(back) << "n2 did not join again";
  EXPECT_GT(asked, 0);
  EXPECT_EQ(granted_while_held, 0);
  EXPECT_EQ(renewed, 0) << "the old primary renewed a lease its backup took over";
  rival.stop();
  EXPECT_EQ(rival.second_holders(), 0) << rival.summary();
  // Whether the holders keep their leases once n2 is back:
  // HoldersKeepTheirLeasesWhenATakenOverPrimaryComesBack.
}

// A taken-over primary that comes back: woken, n2 registers again, under a
// new etcd lease, so it joins as a learner (docs/cluster.md, "Repair"): it
// backs its old keys up for n1 and n3, which took them over, until it has
// caught up, and only then becomes a member and takes them back, holders
// and all. Before the rule it was at once their primary again in the next
// map, with none of their leases, and the holders lost them.
TEST_F(ReplicationE2eTest, HoldersKeepTheirLeasesWhenATakenOverPrimaryComesBack) {
  for (const char* id : {"n1", "n2", "n3"}) start_replicated(id);
  auto holder = settled_client({"n1", "n2", "n3"});
  hold(*holder, keys_of(*holder, "n2", 3));
  pause_until_taken_over("n2", {"n1", "n3"});

  nodes_.at("n2")->signal(SIGCONT);
  EXPECT_TRUE(test_support::poll_until(
      [&] {
        return map_now({"n1", "n3"}).contains("n2");
      },
      30s, 100ms));
  const lease::LeaseClock::time_point back = lease::LeaseClock::now();
  EXPECT_TRUE(all_renewed_after(back));
  EXPECT_EQ(lost_.load(), 0) << lost_detail();
  EXPECT_NE(log_lines("n2", "learner: caught up"), "");
  expect_busy_for_another_owner();
}

// A partition between a primary and its backup, both still reaching etcd
// (docs/cluster.md, the replication table: "P and B cut off from each other,
// both reach etcd: both suspect, both try to evict ... If P is evicted, B
// takes over after its promise, and P cannot serve without B's lease"). n1
// is the keys' primary, n2 their backup, and only n2 can evict (n1's replica
// timeout is a minute), so the outcome is that one. Asserted:
// - n2 evicts n1;
// - n1's primary lease from n2 runs out within 250 ms of the cut, and every
//   map that gives n1 those buckets names n2 as their backup, so from then
//   until n1 is a member again n1 grants nothing there, neither a held key
//   nor a free one (it answers RECOVERING, or REDIRECT once out of the map);
// - no key ever has two holders;
// - once the cut heals, all three are members again and the buckets grant.
// Printed, not asserted: whether n2 took the buckets over, and how many
// holders lost their leases. n1 registers again within about a second of
// its eviction, and n2 skips the takeover when it sees that registration
// before it adopts the map without n1 (a young incarnation); and the
// holders renew where their map says, at n1, which answers RECOVERING,
// never REDIRECT, and soon owns their keys again in a map where it cannot
// renew before n2 hands them back. Either way they usually lose them.
class PartitionTest : public ReplicationE2eTest {
 protected:
  // `ask_from_the_cut`: ask n1 for free keys from the moment of the cut,
  // inside its last primary lease, and not only once n2 has evicted it (by
  // then that lease has run out: n2 evicts after 2 s without n1's
  // datagrams, n1's lease ends 250 ms after the last of n2's acks, and the
  // cut stopped both at once).
  void run(bool ask_from_the_cut) {
    NodeRelay relay(3);
    ASSERT_TRUE(relay.start());
    const std::vector<std::string> ids = {"n1", "n2", "n3"};
    start_relayed(relay, ids, "n1");
    auto holder = settled_client({"n1", "n2", "n3"});
    // Primary n1, backup n2; n3 is the third, the next backup if one leaves.
    const auto keys = keys_ranked(ids, ids, 6);
    hold(*holder, {keys.begin(), keys.begin() + 3});
    const std::vector<std::string> free_keys(keys.begin() + 3, keys.end());
    Rival rival(cluster_options(), leases_);
    ASSERT_FALSE(rival.start());
    // Patient: a grant n1 holds back for an acknowledgement must reach the
    // client whenever n1 lets it out, not be dropped after 2 s.
    LeaseClientOptions n1_options = direct_options("n1");
    n1_options.request_timeout = 10s;
    LeaseClient at_n1(n1_options);
    ASSERT_FALSE(at_n1.start()) << at_n1.error_detail();
    // What n1 answers while cut off; its grants are kept (no watchdog), to
    // see whether the node that takes their keys over knows them.
    std::vector<lease::Lease> granted_by_n1;
    std::set<std::string> answers;
    auto ask_n1 = [&](const std::string& key) {
      auto r = at_n1.try_acquire(key, kTtl);
      answers.insert(r.error ? r.error.message() : "granted");
      if (!r.error) granted_by_n1.push_back(std::move(r.lease));
    };
    auto ask_n1_all = [&] {
      for (const lease::Lease& l : leases_) ask_n1(l.key());
      for (const std::string& key : free_keys) ask_n1(key);
    };

    std::uint64_t epoch_before = 0;
    (void)map_now({"n2", "n3"}, &epoch_before);
    LeaseClient second(cluster_options());
    ASSERT_FALSE(second.start()) << second.error_detail();
    // Another owner must not get a key n1 granted while that grant lasts.
    int second_holders = 0;
    auto try_n1s_grants = [&] {
      for (const lease::Lease& l : granted_by_n1) {
        auto r = second.try_acquire(l.key(), kTtl);
        if (r.error) continue;
        if (l.valid()) ++second_holders;
        (void)r.lease.release();
      }
    };

    // The eviction below must be the cut's, not one of a node the loaded
    // machine stalled for a second before it.
    const std::string n2_evictions_before = log_lines("n2", "evicting");
    EXPECT_EQ(log_lines("n1", "evicting") + n2_evictions_before + log_lines("n3", "evicting"), "")
        << "too loaded for a 2 s replica timeout";
    relay.cut(0, 1, true);
    const lease::LeaseClock::time_point cut = lease::LeaseClock::now();
    auto evicted = [&] { return log_lines("n2", "evicting") != n2_evictions_before; };
    if (!ask_from_the_cut) {
      EXPECT_TRUE(test_support::poll_until(evicted, 30s, 20ms));
    }
    // Until n1 is a member again (evicted, registered again, in a later map)
    // it grants nothing in those buckets.
    EXPECT_TRUE(test_support::poll_until(
        [&] {
          ask_n1_all();
          try_n1s_grants();
          std::uint64_t epoch = 0;
          const auto members = map_now({"n2", "n3"}, &epoch);
          return evicted() && epoch > epoch_before && members.contains("n1");
        },
        30s, 50ms))
        << "n1 was not evicted, or did not come back";
    ask_n1_all();
    // Asked from the cut, n1 may answer a grant whose entry and
    // acknowledgement crossed just before it (n2 has that one); the
    // second-holder check below is what must hold then. Asked only once n2
    // has evicted it, n1 must answer none: it granted some here, in the
    // moment between installing the layout of the map without it (no
    // backups, which lease_until() read as a lease forever) and that map's
    // gate, and n2 had taken their keys over (two holders).
    std::cout << "n1 answered " << granted_by_n1.size()
              << " grants; its answers: " << ::testing::PrintToString(answers) << "\n";
    if (!ask_from_the_cut) {
      EXPECT_TRUE(granted_by_n1.empty())
          << "n1, evicted, answered " << granted_by_n1.size() << " grants";
    }
    EXPECT_TRUE(test_support::poll_until(
        [&] {
          try_n1s_grants();
          return std::none_of(granted_by_n1.begin(), granted_by_n1.end(),
                              [](const lease::Lease& l) { return l.valid(); });
        },
        30s, 20ms));
    EXPECT_EQ(second_holders, 0) << "keys n1 granted while cut off from n2 were granted again "
                                 << "while those grants lasted";
    // The holders renew at n2, or their leases end (see above).
    EXPECT_TRUE(test_support::poll_until(
        [&] {
          return std::all_of(leases_.begin(), leases_.end(), [&](const lease::Lease& l) {
            return l.expiry() > cut + kTtl || !l.valid();
          });
        },
        30s, 50ms));
    EXPECT_GT(relay.dropped(), 0u);

    relay.cut(0, 1, false);
    // Healed: n1 is a member again, and each bucket grants a free key
    // (after the hand-offs or lock-delays the moves back to n1 wait for).
    EXPECT_TRUE(test_support::poll_until(
        [&] {
          return map_now({"n2", "n3", "n1"}) == std::set<std::string>{"n1", "n2", "n3"};
        },
        30s, 100ms));
    {
      LeaseClient other(cluster_options());
      ASSERT_FALSE(other.start()) << other.error_detail();
      for (const std::string& key : free_keys) {
        auto r = other.acquire(key, kTtl, 30s);
        EXPECT_TRUE(r) << key << ": " << r.error.message();
      }
    }
    rival.stop();
    EXPECT_EQ(rival.second_holders(), 0) << rival.summary();
    for (lease::Lease& l : granted_by_n1) l.detach();
    std::cout << "n2 took over: " << (log_lines("n2", "took over").empty() ? "no" : "yes")
              << "; holders' leases lost: " << lost_.load() << " of " << leases_.size() << "\n";
  }
};

TEST_F(PartitionTest, APartitionedPrimaryGrantsNothingAndNoKeyHasTwoHolders) { run(false); }

// A grant n1 decides inside its last primary lease is held for n2's
// acknowledgement. It used to be answered when n1 adopted the map that
// evicted it (the layout dropped its stream to n2, and every reply held on a
// dropped stream was let out), while n2 took the bucket over without it and
// granted the key again: two holders. Held replies are now dropped on a
// layout change, and a retransmission is answered only while n1 may grant
// the key (Replicator::set_layout(), Shard::handle()).
TEST_F(PartitionTest, AGrantThePartitionedPrimaryDecidedIsNeverAnswered) { run(true); }

// A backup killed while grants are in flight (the docs' table: "Backup B
// killed: P's lease from B runs out within 250 ms: P stops granting and
// renewing B's buckets. P evicts B; the new map gives them a new backup C;
// P snapshots them to C and resumes once C acknowledges"). Each grant is
// answered only once a backup that is still in the map has it, or refused:
// so once the primary grants again with the new backup (proving C caught
// up), a kill of the primary too loses no holder. With three nodes that is
// one failure at a time, which replication is built to survive.
TEST_F(ReplicationE2eTest, ABackupKilledDuringGrantsLosesNoHolderToALaterFailover) {
  const std::vector<std::string> ids = {"n1", "n2", "n3"};
  for (const std::string& id : ids) start_replicated(id);
  auto holder = settled_client({"n1", "n2", "n3"});
  // Primary n1, backup n2, then n3.
  const auto keys = keys_ranked(ids, ids, 16);

  // A stream of acquires, one at a time, through the kill of n2.
  lease::LeaseOptions watch;
  watch.watchdog = true;
  watch.on_lost = [this](const lease::LeaseLost& lost) { note_lost(lost); };
  std::atomic<int> granted{0};
  std::vector<lease::Lease> granted_leases;
  std::vector<std::string> refused;
  std::thread acquirer([&] {
    for (const std::string& key : keys) {
      auto r = holder->acquire(key, kTtl, 20s, watch);
      if (r) {
        granted_leases.push_back(std::move(r.lease));
        granted.fetch_add(1, std::memory_order_release);  // pairs with the poll below
      } else {
        refused.push_back(key + ": " + r.error.message());
      }
    }
  });
  EXPECT_TRUE(test_support::poll_until([&] { return granted.load(std::memory_order_acquire) >= 3; },
                                       40s, 5ms));
  nodes_.at("n2")->kill();
  acquirer.join();
  leases_ = std::move(granted_leases);
  // Grants resumed after the kill: more than the three before it.
  EXPECT_GT(leases_.size(), 3u) << "refused: " << ::testing::PrintToString(refused);

  // The new backup n3 has every bucket of the held keys.
  auto after = client_with_members({"n1", "n3"});
  std::vector<std::string> held_keys;
  for (const lease::Lease& l : leases_) held_keys.push_back(l.key());
  expect_buckets_replicated(*after, held_keys);

  // Now the primary: n3 inherits every holder.
  nodes_.at("n1")->kill();
  const lease::LeaseClock::time_point killed = lease::LeaseClock::now();
  EXPECT_TRUE(all_renewed_after(killed));
  EXPECT_EQ(lost_.load(), 0) << lost_detail();
  for (const lease::Lease& l : leases_) EXPECT_TRUE(l.valid()) << l.key();
  expect_busy_for_another_owner();
  for (lease::Lease& l : leases_) EXPECT_FALSE(l.release()) << l.key();
}

// The same window on a backup's death. n2, the backup of a key's bucket, is
// killed while n1 holds a grant back for n2's acknowledgement, and n3, the
// next backup, is cut off from n1 (NodeRelay) so that it never gets the
// bucket's snapshot. n1 must not answer that grant: no live replica has it,
// and a kill of n1 would lose it (n3 cannot take over a bucket it never
// caught up on). It used to be answered as soon as n1 dropped n2's stream.
TEST_F(ReplicationE2eTest, AGrantHeldForAKilledBackupWaitsForTheNextBackup) {
  NodeRelay relay(3);
  ASSERT_TRUE(relay.start());
  const std::vector<std::string> ids = {"n1", "n2", "n3"};
  start_relayed(relay, ids, "n3");  // n3 stops hearing n1 below
  auto holder = settled_client({"n1", "n2", "n3"});
  // Primary n1, backup n2, then n3.
  const auto keys = keys_ranked(ids, ids, 2);
  hold(*holder, {keys[0]});  // n1 grants, with n2's acknowledgements
  LeaseClientOptions patient = direct_options("n1");
  patient.request_timeout = 10s;  // whenever n1 lets an answer out
  LeaseClient at_n1(patient);
  ASSERT_FALSE(at_n1.start()) << at_n1.error_detail();

  // Nothing n1 sends reaches n3 from now on, so n3 never acknowledges a
  // snapshot; n1 still hears n3 (as the primary of other buckets), so it
  // does not evict it.
  relay.cut_one_way(0, 2, true);
  nodes_.at("n2")->kill();
  // Within n1's last primary lease from n2 (250 ms): decided, then held.
  auto r = at_n1.try_acquire(keys[1], kTtl);
  EXPECT_TRUE(r.error) << keys[1] << " granted by n1 with its backup dead and the next one "
                       << "never caught up";
  EXPECT_TRUE(
      test_support::poll_until([&] { return log_lines("n1", "evicting") != ""; }, 30s, 50ms))
      << "n1 did not evict the killed n2";
}

// An owner acquiring a key it holds again (a contender, never a
// second grant) is refused, and the one grant it has goes through a
// failover. Before the owner contract it got a new token; the stream then had to
// carry the old token's end first, or the backup's takeover could install
// the stale holder and refuse the live one.
TEST_F(ReplicationE2eTest, AHolderThatAcquiresItsKeyAgainKeepsItsGrantThroughAFailover) {
  for (const char* id : {"n1", "n2", "n3"}) start_replicated(id);
  auto holder = settled_client({"n1", "n2", "n3"});
  lease::LeaseOptions watch;
  watch.watchdog = true;
  watch.on_lost = [this](const lease::LeaseLost& lost) { note_lost(lost); };
  for (const std::string& key : keys_of(*holder, "n2", 4)) {
    auto first = holder->acquire(key, kTtl, 40s, watch);
    ASSERT_TRUE(first) << key << ": " << first.error.message();
    lease::LeaseOptions same_owner;
    same_owner.owner = first.lease.owner();
    auto again = holder->try_acquire(key, kTtl, same_owner);
    EXPECT_EQ(again.error, lease::LeaseErrc::kBusy) << key << ": " << again.error.message();
    leases_.push_back(std::move(first.lease));
  }

  nodes_.at("n2")->kill();
  const lease::LeaseClock::time_point killed = lease::LeaseClock::now();
  EXPECT_TRUE(all_renewed_after(killed));
  EXPECT_EQ(lost_.load(), 0) << lost_detail();
  EXPECT_EQ(log_lines("n1", "could not be installed") + log_lines("n3", "could not be installed"),
            "");
}

// A join that adds a backup: n3 joins a two-node cluster (--replicas 2) and
// becomes the backup of buckets whose primary n1 keeps; it catches up by a
// snapshot of their leases (docs: "Repair"). Then n1 dies, and n3, not the
// old backup n2, is the one that takes the buckets over, with the holders.
TEST_F(ReplicationE2eTest, ABackupAddedByAJoinCatchesUpAndTakesOver) {
  // n1 primary, n2 backup now; once n3 joins, n3 is the backup and n2 the
  // third; once n1 leaves, n3 is the primary.
  const auto keys = keys_ranked({"n1", "n2", "n3"}, {"n1", "n3", "n2"}, 3);
  auto joined = hold_then_join_n3(keys);
  // n3 has the buckets (the grants there wait for its acks), and is past
  // its start's lock-delay (it grants one of its own keys).
  expect_buckets_replicated(*joined, keys);
  {
    auto own = joined->acquire(keys_of(*joined, "n3", 1).front(), kTtl, 30s);
    EXPECT_TRUE(own) << own.error.message();
    if (own) {
      EXPECT_FALSE(own.lease.release());
    }
  }
  EXPECT_EQ(lost_.load(), 0) << lost_detail();

  nodes_.at("n1")->kill();
  const lease::LeaseClock::time_point killed = lease::LeaseClock::now();
  EXPECT_TRUE(all_renewed_after(killed));
  EXPECT_EQ(lost_.load(), 0) << lost_detail();
  EXPECT_NE(log_lines("n3", "took over"), "");
  expect_busy_for_another_owner();
  for (lease::Lease& l : leases_) EXPECT_FALSE(l.release()) << l.key();
}

// A node that returns (restarted on its data dir under its
// id) comes back as a learner, catches up and takes its buckets back from
// their primaries with every holder: those buckets grant at once. Asserted:
// a free key of n2's is granted by n2 before its lock-delay is over (no
// speed is asserted beyond that: the margin is 20 s against the few seconds
// a return takes on two loaded cores), the held keys are kept and stay busy.
// `clean`: n2 is stopped with SIGTERM (a clean leave, its etcd lease
// revoked, as a rolling restart does), else killed with -9.
void ReplicationE2eTest::return_of_n2(bool clean) {
  const std::string long_ttl = "20s";
  const std::vector<std::string> flags = {"--replicas", "2", "--replica-timeout", kReplicaTimeout};
  for (const char* id : {"n1", "n2", "n3"}) start_node(id, flags, long_ttl, kEtcdLeaseTtl);
  auto holder = settled_client({"n1", "n2", "n3"});
  hold(*holder, keys_of(*holder, "n2", 2));
  const std::vector<std::string> free_keys = keys_of(*holder, "n2", 5);
  // Its first run may have taken buckets over at its start (same log).
  const std::string first_run = log_lines("n2", "took over");
  const std::string first_delay = log_lines("n2", "lock-delay ends at ");
  const auto runs_before =
      static_cast<std::size_t>(std::count(first_delay.begin(), first_delay.end(), '\n'));
  if (clean) {
    nodes_.at("n2")->signal(SIGTERM);
    ASSERT_TRUE(nodes_.at("n2")->wait_for(10s)) << "n2 did not stop on SIGTERM";
  }
  start_node("n2", flags, long_ttl, kEtcdLeaseTtl);  // kills -9 a running n2 first
  const auto restarted = std::chrono::steady_clock::now();
  // It joins as a learner, catches up, and takes its buckets back.
  ASSERT_TRUE(test_support::poll_until(
      [&] { return log_lines("n2", "took over").size() > first_run.size(); }, 40s, 100ms))
      << "n2 took nothing back";
  std::optional<std::chrono::system_clock::time_point> delay_end;
  ASSERT_TRUE(test_support::poll_until(
      [&] { return (delay_end = lock_delay_end("n2", runs_before)).has_value(); }, 10s, 50ms))
      << "n2 logged no lock-delay end";
  // Asked directly (no map, no redirect: n2 answers for itself), n2 grants a
  // free key of a bucket it took back, while its lock-delay still runs. Its
  // buckets come back from two primaries (n1 and n3), each once its stream
  // has caught up, so the key's bucket may come back after the first
  // takeover logged: asked again while it answers RECOVERING, never past
  // the lock-delay. Each ask may wait 5 s (a grant waits for n2's backups;
  // a try that gave up on it first would leave the key held by itself).
  LeaseClient at_n2(direct_options("n2"));
  ASSERT_FALSE(at_n2.start()) << at_n2.error_detail();
  const std::string& key = free_keys.back();
  lease::AcquireResult r;
  std::string answers;  // each ask's outcome, for a failure's message
  (void)test_support::poll_until(
      [&] {
        r = at_n2.acquire(key, kTtl, 5s);
        answers += (answers.empty() ? "" : ", ") + (r ? std::string("granted") : r.error.message());
        return r.error != LeaseErrc::kRecovering;
      },
      std::chrono::duration_cast<std::chrono::milliseconds>(*delay_end -
                                                            std::chrono::system_clock::now()),
      50ms);
  if (!r) {
    // Who n2 says holds the key (a TIMEOUT: the ask waited behind them).
    const lease::HoldersReply held = at_n2.holders(key);
    std::string who = held.error ? "(holders: " + held.error.message() + ")" : "holders:";
    for (const lease::HolderInfo& h : held.holders) {
      who += " " + lease::to_hex(h.owner) + " token " + std::to_string(h.token) + " ttl " +
             std::to_string(h.ttl_left.count()) + " ms" + (h.pending ? " pending" : "");
    }
    ADD_FAILURE() << key << " at n2: " << r.error.message() << "; asked as "
                  << lease::to_hex(at_n2.client_id()) << "; " << who << "; asks: " << answers
                  << " (RECOVERING: granted only once n2's lock-delay was over, or never)";
    return;
  }
  // Granted within the lock-delay n2 itself announced.
  EXPECT_LT(std::chrono::system_clock::now(), *delay_end)
      << key << " was granted only after n2's lock-delay ended";
  std::cout << "n2 granted " << key << " "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - restarted)
                   .count()
            << " ms after its restart (lock-delay 20 s)\n";
  EXPECT_FALSE(r.lease.release());
  EXPECT_TRUE(all_renewed_after(lease::LeaseClock::now()));
  EXPECT_EQ(lost_.load(), 0) << lost_detail();
  expect_busy_for_another_owner();
}

// Before the fix the returning node answered RECOVERING to every new
// acquire for its whole start lock-delay (20 s here, 60 s at the defaults),
// a third of the key space refused while the old owners could have served it.
TEST_F(ReplicationE2eTest, ANodeThatReturnsGrantsTheBucketsItTakesBackBeforeItsLockDelayEnds) {
  return_of_n2(/*clean=*/false);
}

// A rolling restart's step. Before the fix the map that listed the returning
// node as a learner dropped its old buckets' takeovers at their new
// primaries, and it was promoted on snapshots of buckets nobody had
// activated: those buckets answered RECOVERING for its whole lock-delay and
// their holders lost their leases (bench/failover_numbers.sh, rolling: 18
// of 20 holders lost, a key refused 19.7 s and counting).
TEST_F(ReplicationE2eTest, ANodeRestartedAfterACleanLeaveKeepsItsHoldersAndGrantsAtOnce) {
  return_of_n2(/*clean=*/true);
}

// A join that makes the new node a primary: n3 joins as a learner, backs up
// the buckets it will own for their primary n1 until it has caught up, and
// only then becomes a member and takes them over from n1, with their
// holders (docs/cluster.md, "Repair"). Before the rule the map made n3 their
// primary at once, with none of their leases.
TEST_F(ReplicationE2eTest, AJoinThatMakesTheNewNodeAPrimaryKeepsTheHolders) {
  // n1 primary, n2 backup now; once n3 is a member, n3 is the primary and n1
  // its backup.
  const auto keys = keys_ranked({"n1", "n2", "n3"}, {"n3", "n1", "n2"}, 3);
  auto joined = hold_then_join_n3(keys);
  const lease::LeaseClock::time_point member = lease::LeaseClock::now();
  EXPECT_TRUE(all_renewed_after(member));
  EXPECT_EQ(lost_.load(), 0) << lost_detail();
  EXPECT_NE(log_lines("n3", "learner: caught up"), "");
  EXPECT_NE(log_lines("n3", "took over"), "");
  expect_busy_for_another_owner();
  for (lease::Lease& l : leases_) EXPECT_FALSE(l.release()) << l.key();
}

// A watcher through the kill -9 of its key's primary (a watcher
// is woken within one round trip of a release or expiry, and after a
// failover). Its round is parked at n2 when n2 dies; the backup takes the
// key over with its holder (and the holder's value), so the round re-armed
// at the new owner sees the version it was sent with and reports nothing.
// The holder's release after the failover wakes it with the key free. The
// 20 s bound is generous (no speed is asserted); a round still stranded at
// n2 could not end by itself within it (kWatchRound).
TEST_F(ReplicationE2eTest, AWatchRidesThroughAFailoverAndIsWokenByTheRelease) {
  for (const char* id : {"n1", "n2", "n3"}) start_replicated(id);
  auto holder = settled_client({"n1", "n2", "n3"});
  const std::string key = keys_of(*holder, "n2", 1).front();
  lease::LeaseOptions options;
  options.watchdog = true;
  options.on_lost = [this](const lease::LeaseLost& lost) { note_lost(lost); };
  options.value = "holder-a:7";
  auto granted = holder->acquire(key, kTtl, 40s, options);
  ASSERT_TRUE(granted) << key << ": " << granted.error.message();
  const lease::KeyVersion held{granted.lease.token(), 1};
  leases_.push_back(std::move(granted.lease));

  LeaseClient watching(cluster_options());
  ASSERT_FALSE(watching.start()) << watching.error_detail();
  lease::KeyWatch watch(watching, key, lease::KeyWatchOptions{.round = kWatchRound});
  Recorder<lease::WatchEvent> seen(
      [&](std::error_code& error) {
        auto event = watch.next(1s);
        if (event && event->error) {
          error = event->error;
          event.reset();
        }
        return event;
      },
      [&] { watch.cancel(); });
  ASSERT_TRUE(test_support::poll_until([&] { return seen.count() >= 1; }, 20s, 10ms))
      << seen.errors();
  const lease::WatchEvent first = seen.events().front();
  EXPECT_EQ(first.version, held);
  ASSERT_EQ(first.holders.size(), 1u);
  EXPECT_EQ(first.holders.back().value, "holder-a:7");
  EXPECT_EQ(first.holders.back().owner, leases_.back().owner());
  // The next round is sent as soon as the first answer is recorded; this
  // lets it reach n2 and park there before the kill (sent later, it would
  // ride the failover too, as a fresh request rather than a parked one).
  std::this_thread::sleep_for(500ms);

  nodes_.at("n2")->kill();
  const lease::LeaseClock::time_point killed = lease::LeaseClock::now();
  EXPECT_TRUE(all_renewed_after(killed));
  EXPECT_EQ(lost_.load(), 0) << lost_detail();
  // The watcher's round moved once its client's map lost n2 (its own
  // silent retransmissions refresh it); a false change would follow then.
  EXPECT_TRUE(test_support::poll_until(
      [&] {
        const auto members = watching.map_members();
        return std::none_of(members.begin(), members.end(),
                            [](const auto& m) { return m.id == "n2"; });
      },
      30s, 50ms));
  const lease::HoldersReply kept = watching.holders(key);
  ASSERT_FALSE(kept.error) << kept.error.message();
  ASSERT_EQ(kept.holders.size(), 1u);
  EXPECT_EQ(kept.holders.back().token, held.token);
  EXPECT_EQ(kept.holders.back().value, "holder-a:7") << "the value was not replicated";
  std::this_thread::sleep_for(3s);  // a window for a false change, not a wait for one
  EXPECT_EQ(seen.count(), 1u) << "a change reported while the holder was kept; failed reads: "
                              << seen.errors();

  ASSERT_FALSE(leases_.front().release());
  EXPECT_TRUE(test_support::poll_until([&] { return seen.count() >= 2; }, 20s, 10ms))
      << "the release did not wake the watcher; failed reads: " << seen.errors();
  seen.stop();
  const auto events = seen.events();
  ASSERT_EQ(events.size(), 2u) << seen.errors();
  EXPECT_EQ(events[1].version, (lease::KeyVersion{0, 0}));
  EXPECT_FALSE(events[1].held());
  std::cout << "failed reads through the failover: " << seen.errors() << "\n";
}

// An election whose key's primary is killed under its leader (two
// campaigners and an observer see one leader at a time and every
// change in order, here through a failover). The leader keeps leadership
// (the backup takes its lease over and renews it), the campaigner waiting
// at n2 waits on at the new owner and is not elected meanwhile, and the
// observer reports no change; the leader's resignation then elects the
// campaigner, and the observer reports it, with a higher term.
TEST_F(ReplicationE2eTest, AnElectionKeepsItsLeaderThroughAFailoverAndHandsOffAfterIt) {
  for (const char* id : {"n1", "n2", "n3"}) start_replicated(id);
  auto settled = settled_client({"n1", "n2", "n3"});
  const std::string name = keys_of(*settled, "n2", 1).front();
  LeaseClient client_a(cluster_options());
  LeaseClient client_b(cluster_options());
  LeaseClient client_o(cluster_options());
  for (LeaseClient* c : {&client_a, &client_b, &client_o}) {
    ASSERT_FALSE(c->start()) << c->error_detail();
  }
  const lease::ElectionOptions options{.ttl = kTtl};  // the nodes' --max-ttl
  lease::Election a(client_a, name, options);
  lease::Election b(client_b, name, options);
  a.on_lost([this](const lease::LeaseLost& lost) { note_lost(lost); });
  b.on_lost([this](const lease::LeaseLost& lost) { note_lost(lost); });
  ASSERT_FALSE(a.campaign("host-a:1", 40s));
  const std::uint64_t a_term = a.term();
  ASSERT_NE(a_term, 0u);

  lease::LeaderObserver observer(client_o, name, lease::KeyWatchOptions{.round = kWatchRound});
  Recorder<lease::LeaderChange> seen(
      [&](std::error_code& error) { return observer.next(1s, &error); },
      [&] { observer.cancel(); });
  ASSERT_TRUE(test_support::poll_until([&] { return seen.count() >= 1; }, 20s, 10ms))
      << seen.errors();
  {
    const auto first = seen.events().front();
    ASSERT_TRUE(first.leader);
    EXPECT_EQ(first.leader->value, "host-a:1");
    EXPECT_EQ(first.leader->term, a_term);
    EXPECT_EQ(first.leader->owner, a.owner());
  }

  std::atomic<bool> b_elected{false};
  std::thread campaigner([&] {
    EXPECT_FALSE(b.campaign("host-b:2", 120s));
    b_elected.store(true, std::memory_order_release);  // pairs with the loads below
  });
  // B waits at n2, as does the observer's round.
  EXPECT_TRUE(
      test_support::poll_until([&] { return client_o.query(name).waiters == 1; }, 20s, 50ms));

  nodes_.at("n2")->kill();
  const auto killed = std::chrono::steady_clock::now();
  // A leads throughout a lease's length after the kill, which only
  // renewals at the new owner allow (leading() checks the client-side
  // expiry), and B is not elected meanwhile.
  bool kept = true;
  while (kept && std::chrono::steady_clock::now() < killed + kTtl + 2s) {
    kept = a.leading() && a.term() == a_term && !b_elected.load(std::memory_order_acquire);
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(kept) << "leading " << a.leading() << ", B elected "
                    << b_elected.load(std::memory_order_acquire) << "; " << lost_detail();
  EXPECT_FALSE(map_now({"n1", "n3"}).contains("n2"));
  // B's campaign waits on at the key's new owner.
  EXPECT_TRUE(
      test_support::poll_until([&] { return client_o.query(name).waiters == 1; }, 30s, 100ms))
      << "B's campaign is not waiting at the new owner";
  // (No ASSERT until the campaigner is joined.)
  const auto leader = b.leader();
  EXPECT_TRUE(leader);
  if (leader) {
    EXPECT_EQ(leader->value, "host-a:1");
    EXPECT_EQ(leader->term, a_term);
  }
  EXPECT_EQ(seen.count(), 1u) << "a change of leader reported while A kept leading; failed reads: "
                              << seen.errors();

  EXPECT_FALSE(a.resign());
  EXPECT_TRUE(test_support::poll_until([&] { return b_elected.load(std::memory_order_acquire); },
                                       20s, 10ms))
      << "the waiting campaigner was not elected";
  campaigner.join();
  EXPECT_TRUE(b.leading());
  EXPECT_GT(b.term(), a_term);
  // The observer's last change is B; a "none" may come between, if its
  // round was answered by the release before the waiter's grant.
  EXPECT_TRUE(test_support::poll_until(
      [&] {
        const auto events = seen.events();
        return events.back().leader && events.back().leader->term == b.term();
      },
      20s, 10ms))
      << "the observer did not report B; failed reads: " << seen.errors();
  seen.stop();
  const auto changes = seen.events();
  ASSERT_GE(changes.size(), 2u);
  ASSERT_LE(changes.size(), 3u);
  if (changes.size() == 3) {
    EXPECT_FALSE(changes[1].leader) << "term " << changes[1].leader->term;
  }
  EXPECT_EQ(changes.back().leader->value, "host-b:2");
  EXPECT_EQ(changes.back().leader->owner, b.owner());
  EXPECT_EQ(lost_.load(), 0) << lost_detail();
  EXPECT_FALSE(b.resign());
  std::cout << "changes of leader reported: " << changes.size()
            << "; failed reads through the failover: " << seen.errors() << "\n";
}

}  // namespace
}  // namespace shardlock::cluster
