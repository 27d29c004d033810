// LeaseClient in cluster mode (discover_cluster) against a fake cluster: a
// few fake nodes on loopback UDP, each a thread that decodes with the real
// codec, answers MAP from the map it knows, grants the keys that map gives
// it (owner computed with the Router as the nodes configure it) and answers
// REDIRECT for the others, and records what it received. The real nodes'
// side of cluster mode is tested with them; this tests the client's:
// discovery with paging, routing, the epoch in every request, following
// REDIRECTs, and a lease renewing at its key's owner.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/call_engine.h"
#include "poll_until.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/wire/protocol.h"
#include "shardlock/router.h"

namespace shardlock::lease {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using test_support::poll_until;

// What one fake node received: a request's type, key and the datagram's
// epoch (kFlagEpoch).
struct Received {
  MessageType type;
  std::uint64_t request_id = 0;
  std::string key;
  std::optional<std::uint64_t> epoch;
  std::uint32_t first_member = 0;  // MAP
};

// The maps the fake cluster has published, by epoch; every fake node knows
// one of them (nodes may be behind).
class FakeCluster {
 public:
  // Publishes map `epoch`. The owner of each key is computed as the nodes
  // compute it (ClusterRouting::build(): a Node per member id and weight,
  // the default seed, 2^16 buckets).
  void publish(std::uint64_t epoch, std::vector<MapMember> members) {
    std::vector<Node> nodes;
    for (const MapMember& m : members) nodes.push_back(Node{m.id, m.weight});
    Router router(RouterOptions{kDefaultRouterSeed, 16});
    EXPECT_EQ(router.assign(nodes), RouterStatus::kOk);
    std::lock_guard lock(mutex_);
    maps_[epoch] = Published{std::move(members), router.snapshot()};
  }
  [[nodiscard]] std::vector<MapMember> map(std::uint64_t epoch) const {
    std::lock_guard lock(mutex_);
    const auto it = maps_.find(epoch);
    return it == maps_.end() ? std::vector<MapMember>{} : it->second.members;
  }
  // The address of the member that owns `key` in map `epoch`; empty when
  // there is no such map.
  [[nodiscard]] std::string owner_address(std::uint64_t epoch, std::string_view key) const {
    std::lock_guard lock(mutex_);
    const auto it = maps_.find(epoch);
    if (it == maps_.end()) return {};
    const NodeId& owner = it->second.router->owner(key);
    for (const MapMember& m : it->second.members) {
      if (m.id == owner) return m.address;
    }
    return {};
  }

 private:
  struct Published {
    std::vector<MapMember> members;
    std::shared_ptr<const RouterSnapshot> router;
  };
  mutable std::mutex mutex_;
  std::map<std::uint64_t, Published> maps_;
};

class FakeNode {
 public:
  explicit FakeNode(const FakeCluster& cluster) : cluster_(cluster) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t length = sizeof addr;
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &length), 0);
    address_ = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    thread_ = std::thread([this] { run(); });
  }
  ~FakeNode() {
    stop_.store(true, std::memory_order_relaxed);  // polled every 10 ms
    thread_.join();
    ::close(fd_);
  }
  FakeNode(const FakeNode&) = delete;
  FakeNode& operator=(const FakeNode&) = delete;

  [[nodiscard]] const std::string& address() const { return address_; }

  // The map this node knows (0: none, it is no cluster node).
  void know(std::uint64_t epoch) {
    std::lock_guard lock(mutex_);
    epoch_ = epoch;
  }
  // After answering this many REDIRECTs it learns map `epoch`.
  void catch_up_after(int redirects, std::uint64_t epoch) {
    std::lock_guard lock(mutex_);
    catch_up_after_ = redirects;
    catch_up_to_ = epoch;
  }
  // Every keyed request is answered REDIRECT with the node's epoch plus
  // `ahead` (a node that claims a newer map than it serves, or a
  // misconfigured one with ahead 0).
  void always_redirect(std::uint64_t ahead) {
    std::lock_guard lock(mutex_);
    always_redirect_ = ahead;
  }
  void redirect_renewals(bool on) {
    std::lock_guard lock(mutex_);
    redirect_renewals_ = on;
  }
  // While set, every ACQUIRE* and RENEW of a key it owns is answered
  // RECOVERING with this retry_after_ms (a lock-delay, or a node that failed
  // closed).
  void recovering(std::optional<std::uint32_t> retry_after_ms) {
    std::lock_guard lock(mutex_);
    recovering_ = retry_after_ms;
  }
  // While set, nothing is answered (a node killed with -9); requests are
  // still recorded.
  void silent(bool on) {
    std::lock_guard lock(mutex_);
    silent_ = on;
  }

  [[nodiscard]] std::vector<Received> received() const {
    std::lock_guard lock(mutex_);
    return received_;
  }
  [[nodiscard]] std::size_t count(MessageType type) const {
    std::lock_guard lock(mutex_);
    return static_cast<std::size_t>(std::count_if(
        received_.begin(), received_.end(), [&](const Received& r) { return r.type == type; }));
  }
  // Distinct requests (by request id) of `type`: a client's retransmission
  // of one is not another.
  [[nodiscard]] std::size_t distinct(MessageType type) const {
    std::lock_guard lock(mutex_);
    std::set<std::uint64_t> ids;
    for (const Received& r : received_) {
      if (r.type == type) ids.insert(r.request_id);
    }
    return ids.size();
  }
  // Distinct requests answered REDIRECT.
  [[nodiscard]] std::size_t redirects_sent() const {
    std::lock_guard lock(mutex_);
    return redirected_.size();
  }
  [[nodiscard]] std::vector<std::string> granted() const {
    std::lock_guard lock(mutex_);
    return granted_;
  }

 private:
  void run() {
    std::vector<std::uint8_t> in(2048);
    std::vector<std::uint8_t> out(kMaxDatagramSize);
    Datagram request;
    Datagram reply;
    std::vector<std::uint8_t> members;
    std::vector<std::uint8_t> tokens;
    while (!stop_.load(std::memory_order_relaxed)) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      sockaddr_storage from{};
      socklen_t from_length = sizeof from;
      const ssize_t n = ::recvfrom(fd_, in.data(), in.size(), 0, reinterpret_cast<sockaddr*>(&from),
                                   &from_length);
      if (n <= 0) continue;
      const std::span<const std::uint8_t> bytes(in.data(), static_cast<std::size_t>(n));
      if (decode(bytes, request) != ProtocolError::kOk) {
        ADD_FAILURE() << "the client sent a datagram that does not decode";
        continue;
      }
      reply = Datagram{};
      reply.batch = request.batch;
      reply.client_id = request.client_id;
      reply.request_id = request.request_id;
      bool silent = false;
      {
        std::lock_guard lock(mutex_);
        silent = silent_;
      }
      // The reply may use what the request's padding paid for.
      const std::size_t budget = bytes.size() - max_immediate_reply_size(request);
      for (const Message& m : request.items()) {
        (void)reply.push(answer(request, m, budget, members, tokens));
      }
      if (silent) continue;
      std::size_t written = 0;
      if (encode(reply, out, written) != ProtocolError::kOk || written > bytes.size()) {
        ADD_FAILURE() << "a fake reply that does not encode or outgrows its request";
        continue;
      }
      (void)::sendto(fd_, out.data(), written, 0, reinterpret_cast<sockaddr*>(&from), from_length);
    }
  }

  Message answer(const Datagram& request, const Message& m, std::size_t budget,
                 std::vector<std::uint8_t>& members, std::vector<std::uint8_t>& tokens) {
    std::lock_guard lock(mutex_);
    received_.push_back({m.type, m.request_id, std::string(m.key), request.epoch, m.first_member});
    Message r;
    r.request_id = m.request_id;
    r.key = m.key;
    if (m.type == MessageType::kMap) {
      r.type = MessageType::kMapReply;
      r.epoch = epoch_;
      r.first_member = m.first_member;
      const std::vector<MapMember> map = cluster_.map(epoch_);
      r.member_count = static_cast<std::uint32_t>(map.size());
      std::vector<MemberEntry> page;
      std::size_t size = 0;
      for (std::size_t i = m.first_member; i < map.size() && page.size() < 255; ++i) {
        const MemberEntry e{map[i].id, map[i].address, map[i].weight};
        if (size + member_entry_size(e) > budget) break;
        size += member_entry_size(e);
        page.push_back(e);
      }
      EXPECT_TRUE(encode_member_list(page, members));
      r.member_list_count = static_cast<std::uint8_t>(page.size());
      r.member_list = members;
      return r;
    }
    const bool renew = m.type == MessageType::kRenew;
    if (renew && redirect_renewals_) return redirect(r, epoch_);
    if (m.type == MessageType::kRelease) {
      r.type = MessageType::kReleased;
      return r;
    }
    if (always_redirect_ && is_request(m.type)) {
      return redirect(r, epoch_ + *always_redirect_);
    }
    if (is_acquire(m.type) || m.type == MessageType::kQuery) {
      std::string key(m.key);
      if (m.type == MessageType::kAcquireMany) key = std::string(*KeyList(m).begin());
      if (cluster_.owner_address(epoch_, key) != address_) return redirect(r, epoch_);
    }
    if (recovering_ && (is_acquire(m.type) || renew)) {
      r.type = MessageType::kRecovering;
      r.retry_after_ms = *recovering_;
      return r;
    }
    switch (m.type) {
      case MessageType::kAcquire:
      case MessageType::kAcquireShared:
      case MessageType::kAcquirePermit:
        r.type = MessageType::kGranted;
        r.token = ++token_;
        r.ttl_ms = m.ttl_ms;
        granted_.emplace_back(m.key);
        break;
      case MessageType::kAcquireMany:
        r.type = MessageType::kGrantedMany;
        r.ttl_ms = m.ttl_ms;
        tokens.clear();
        for (const std::string_view key : KeyList(m)) {
          granted_.emplace_back(key);
          const std::uint64_t token = ++token_;
          for (int b = 0; b < 8; ++b) tokens.push_back(static_cast<std::uint8_t>(token >> (8 * b)));
        }
        r.tokens_le = tokens;
        break;
      case MessageType::kRenew:
        r.type = MessageType::kRenewed;
        r.ttl_ms = m.ttl_ms;
        break;
      case MessageType::kRelease:
        r.type = MessageType::kReleased;
        break;
      case MessageType::kQuery:
        r.type = MessageType::kQueryReply;
        break;
      default:
        r.type = MessageType::kError;
        r.error = WireError::kNotARequest;
        break;
    }
    return r;
  }

  Message redirect(Message& r, std::uint64_t epoch) {
    r.type = MessageType::kRedirect;
    r.epoch = epoch;
    redirected_.insert(r.request_id);
    if (catch_up_after_ > 0 && --catch_up_after_ == 0) epoch_ = catch_up_to_;
    return r;
  }

  const FakeCluster& cluster_;
  int fd_ = -1;
  std::string address_;
  std::atomic<bool> stop_{false};  // relaxed: a flag polled with a timeout, guarding no data
  std::thread thread_;

  mutable std::mutex mutex_;
  std::uint64_t epoch_ = 0;
  int catch_up_after_ = 0;
  std::uint64_t catch_up_to_ = 0;
  std::optional<std::uint64_t> always_redirect_;
  bool redirect_renewals_ = false;
  std::optional<std::uint32_t> recovering_;
  bool silent_ = false;
  std::uint64_t token_ = 0;
  std::set<std::uint64_t> redirected_;
  std::vector<Received> received_;
  std::vector<std::string> granted_;
};

// Members with ids long enough (120 bytes) that a MAP_REPLY holds only a
// few (nine) of them, spread over the nodes' addresses round-robin.
std::vector<MapMember> long_members(const std::vector<FakeNode*>& nodes, std::size_t count) {
  std::vector<MapMember> members;
  for (std::size_t i = 0; i < count; ++i) {
    std::string id = "member-" + std::to_string(100 + i) + "-";
    id.resize(120, 'x');
    members.push_back(MapMember{id, nodes[i % nodes.size()]->address(), 1});
  }
  return members;
}

std::vector<MapMember> one_member_each(const std::vector<FakeNode*>& nodes) {
  std::vector<MapMember> members;
  for (std::size_t i = 0; i < nodes.size(); ++i)
    members.push_back(MapMember{"node-" + std::to_string(i), nodes[i]->address(), 1});
  return members;
}

LeaseClientOptions cluster_options(std::vector<std::string> seeds) {
  LeaseClientOptions options;
  options.nodes = std::move(seeds);
  options.discover_cluster = true;
  options.request_timeout = 3s;
  options.initial_retransmit = 10ms;
  options.max_retransmit = 80ms;
  return options;
}

std::unique_ptr<LeaseClient> start_cluster_client(std::vector<std::string> seeds) {
  auto client = std::make_unique<LeaseClient>(cluster_options(std::move(seeds)));
  const std::error_code ec = client->start();
  EXPECT_FALSE(ec) << ec.message() << ": " << client->error_detail();
  return client;
}

// A key that map `epoch` gives to `node`, and one it does not.
std::string key_of(const FakeCluster& cluster, std::uint64_t epoch, const FakeNode& node,
                   bool owned = true, int skip = 0) {
  for (int i = 0; i < 100000; ++i) {
    std::string key = "key-" + std::to_string(i);
    if ((cluster.owner_address(epoch, key) == node.address()) == owned && skip-- <= 0) {
      return key;
    }
  }
  ADD_FAILURE() << "no such key";
  return {};
}

// ---------------------------------------------------------------------------

TEST(ClusterClientTest, DiscoversAMapLargerThanOnePage) {
  FakeCluster cluster;
  FakeNode a(cluster), b(cluster), c(cluster);
  const auto members = long_members({&a, &b, &c}, 20);
  cluster.publish(5, members);
  for (FakeNode* n : {&a, &b, &c}) n->know(5);

  auto client = start_cluster_client({a.address()});
  EXPECT_EQ(client->map_epoch(), 5u);
  auto sorted = members;
  std::sort(sorted.begin(), sorted.end(),
            [](const MapMember& x, const MapMember& y) { return x.id < y.id; });
  EXPECT_EQ(client->map_members(), sorted);
  // Paged with first_member: a padded MAP holds nine members of 143 bytes,
  // so 20 take three pages.
  std::set<std::uint32_t> firsts;
  for (const Received& r : a.received()) {
    if (r.type != MessageType::kMap) continue;
    firsts.insert(r.first_member);
    EXPECT_FALSE(r.epoch.has_value()) << "no map yet, so no epoch";
  }
  EXPECT_EQ(firsts, (std::set<std::uint32_t>{0, 9, 18}));
  EXPECT_EQ(b.count(MessageType::kMap) + c.count(MessageType::kMap), 0u);
}

TEST(ClusterClientTest, RoutesEveryKeyToItsOwnerWithTheMapEpoch) {
  FakeCluster cluster;
  FakeNode a(cluster), b(cluster), c(cluster);
  cluster.publish(5, long_members({&a, &b, &c}, 12));
  for (FakeNode* n : {&a, &b, &c}) n->know(5);
  auto client = start_cluster_client({b.address()});

  std::vector<Lease> leases;
  for (int i = 0; i < 60; ++i) {
    const std::string key = "orders/" + std::to_string(i);
    AcquireResult r = client->try_acquire(key, 10s);
    ASSERT_TRUE(r) << key << ": " << r.error.message();
    EXPECT_EQ(client->address_for(key), cluster.owner_address(5, key));
    leases.push_back(std::move(r.lease));
  }
  EXPECT_FALSE(client->query("orders/7").error);
  for (Lease& lease : leases) EXPECT_FALSE(lease.release());
  std::size_t granted = 0;
  for (const FakeNode* n : {&a, &b, &c}) {
    EXPECT_EQ(n->redirects_sent(), 0u) << "every key went straight to its owner";
    for (const std::string& key : n->granted())
      EXPECT_EQ(cluster.owner_address(5, key), n->address());
    granted += n->granted().size();
    for (const Received& r : n->received()) {
      if (r.type == MessageType::kMap) continue;
      EXPECT_EQ(r.epoch, 5u) << to_string(r.type) << " " << r.key;
    }
    // Each lease was released at the node that granted it.
    EXPECT_EQ(n->distinct(MessageType::kRelease), n->granted().size());
  }
  EXPECT_EQ(granted, 60u);
}

TEST(ClusterClientTest, RedirectFromANewerMapRefreshesAndGoesToTheNewOwner) {
  FakeCluster cluster;
  FakeNode a(cluster), b(cluster), c(cluster);
  cluster.publish(5, one_member_each({&a, &b}));
  cluster.publish(9, one_member_each({&c}));  // every key moves to c
  for (FakeNode* n : {&a, &b, &c}) n->know(5);
  auto client = start_cluster_client({a.address(), b.address()});
  ASSERT_EQ(client->map_epoch(), 5u);

  const std::string key = key_of(cluster, 5, a);
  for (FakeNode* n : {&a, &b, &c}) n->know(9);  // the cluster moves on
  AcquireResult r = client->acquire(key, 10s, 0ms);
  ASSERT_TRUE(r) << r.error.message();
  EXPECT_EQ(client->map_epoch(), 9u);
  EXPECT_EQ(a.redirects_sent(), 1u);
  EXPECT_EQ(c.granted(), std::vector<std::string>{key});
  // The refresh asked the node that redirected, once (one page).
  EXPECT_EQ(a.distinct(MessageType::kMap), 2u);  // discovery, then the refresh
  EXPECT_EQ(b.distinct(MessageType::kMap) + c.distinct(MessageType::kMap), 0u);
  const auto at_c = c.received();
  ASSERT_FALSE(at_c.empty());
  EXPECT_EQ(at_c.back().epoch, 9u);
  // Later keys go straight to c.
  AcquireResult again = client->try_acquire(key + "/2", 10s);
  ASSERT_TRUE(again) << again.error.message();
  EXPECT_EQ(a.redirects_sent() + b.redirects_sent(), 1u);
}

TEST(ClusterClientTest, RedirectFromANodeBehindIsRetriedWithoutARefresh) {
  FakeCluster cluster;
  FakeNode a(cluster), b(cluster), c(cluster);
  cluster.publish(5, one_member_each({&a, &b}));
  cluster.publish(7, one_member_each({&a, &b, &c}));
  a.know(7);
  b.know(7);
  c.know(5);  // not a member in 5: it redirects every key
  c.catch_up_after(2, 7);
  auto client = start_cluster_client({a.address()});
  ASSERT_EQ(client->map_epoch(), 7u);

  const std::string key = key_of(cluster, 7, c);
  AcquireResult r = client->acquire(key, 10s, 0ms);
  ASSERT_TRUE(r) << r.error.message();
  // Two answers make it catch up; a retransmission may be one of them.
  EXPECT_GE(c.redirects_sent(), 1u);
  EXPECT_LE(c.redirects_sent(), 2u);
  EXPECT_EQ(c.granted(), std::vector<std::string>{key});
  EXPECT_EQ(a.distinct(MessageType::kMap), 1u) << "a node behind needs no refresh";
  EXPECT_EQ(client->map_epoch(), 7u);
}

TEST(ClusterClientTest, EndlessRedirectsEndWithAClearError) {
  FakeCluster cluster;
  FakeNode a(cluster), b(cluster);
  cluster.publish(5, one_member_each({&a, &b}));
  a.know(5);
  b.know(5);
  // a claims a newer map than the one it serves: every redirect makes the
  // client refresh, find nothing newer, and come back.
  a.always_redirect(1);
  // b redirects with the client's own epoch: the same map, another owner.
  b.always_redirect(0);
  auto client = start_cluster_client({a.address()});

  AcquireResult r = client->acquire(key_of(cluster, 5, a), 10s, 0ms);
  EXPECT_EQ(r.error, LeaseErrc::kRedirected);
  EXPECT_EQ(a.redirects_sent(), kMaxRedirects + 1);
  CallResult q = client->query(key_of(cluster, 5, b));
  EXPECT_EQ(q.error, LeaseErrc::kRedirected);
  EXPECT_EQ(b.redirects_sent(), kMaxRedirects + 1);
  EXPECT_NE(to_string(LeaseErrc::kRedirected), "unknown");
}

TEST(ClusterClientTest, LeaseRenewsAtItsKeysOwnerAndIsLostOnceWhenNoOwnerRenewsIt) {
  FakeCluster cluster;
  FakeNode a(cluster), b(cluster);
  cluster.publish(5, one_member_each({&a, &b}));
  cluster.publish(6, one_member_each({&b}));
  a.know(5);
  b.know(5);
  auto client = start_cluster_client({a.address()});
  const std::string key = key_of(cluster, 5, a);

  std::atomic<int> lost{0};
  std::mutex mutex;
  LeaseLost last;
  LeaseOptions watch;
  watch.watchdog = true;
  watch.on_lost = [&](const LeaseLost& l) {
    std::lock_guard lock(mutex);
    last = l;
    lost.fetch_add(1);
  };
  // Renewed every 400 ms: slack for loaded sanitizer runs.
  AcquireResult r = client->acquire(key, 1200ms, 0ms, watch);
  ASSERT_TRUE(r) << r.error.message();

  ASSERT_TRUE(poll_until([&] { return a.count(MessageType::kRenew) >= 1; }));
  // The client learns map 6 (which gives the key to b) through another
  // key's redirect; the lease renews at the key's owner now, as at a
  // backup that took the lease over (docs/cluster.md, "Replication"; this
  // fake b renews whatever it is asked to).
  b.know(6);
  a.know(6);
  ASSERT_TRUE(client->try_acquire(key_of(cluster, 5, a, true, 1), 10s));
  ASSERT_EQ(client->map_epoch(), 6u);
  const std::size_t at_a = a.count(MessageType::kRenew);
  ASSERT_TRUE(poll_until([&] { return b.count(MessageType::kRenew) >= 2; }));
  EXPECT_LE(a.count(MessageType::kRenew), at_a + 1);  // one may have been on its way
  EXPECT_EQ(lost.load(), 0);
  EXPECT_TRUE(r.lease.valid());

  // No node renews it any more (b sends every RENEW elsewhere, in the map
  // the client has): the lease is lost by its client-side expiry, once.
  b.redirect_renewals(true);
  ASSERT_TRUE(poll_until([&] { return lost.load() > 0; }));
  // A lost lease is reported once: nothing more comes, renewal or expiry.
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(lost.load(), 1);
  {
    std::lock_guard lock(mutex);
    EXPECT_EQ(last.key, key);
    EXPECT_EQ(last.reason, LeaseErrc::kExpired);
  }
  EXPECT_FALSE(r.lease.valid());
}

// Riding through a failover: a wait covers a lock-delay. The waiting acquire is
// asked again after each RECOVERING and granted once the node grants; a try
// answers RECOVERING at once.
TEST(ClusterClientTest, WaitingAcquireRidesThroughRecovering) {
  FakeCluster cluster;
  FakeNode a(cluster);
  cluster.publish(3, one_member_each({&a}));
  a.know(3);
  a.recovering(40);
  auto client = start_cluster_client({a.address()});

  const AcquireResult tried = client->try_acquire("k-try", 5s);
  EXPECT_EQ(tried.error, LeaseErrc::kRecovering);
  EXPECT_EQ(tried.retry_after_ms, 40u);
  EXPECT_EQ(a.distinct(MessageType::kAcquire), 1u);

  AcquireResult waited;
  std::thread waiter([&] { waited = client->acquire("k-wait", 5s, 20s); });
  // It keeps asking (fresh request ids) while the node recovers ...
  ASSERT_TRUE(poll_until([&] { return a.distinct(MessageType::kAcquire) >= 4; }));
  a.recovering(std::nullopt);
  waiter.join();
  // ... and is granted once the node grants, long before its wait is over.
  ASSERT_TRUE(waited) << waited.error.message();
  EXPECT_EQ(waited.lease.key(), "k-wait");
}

// When the wait is spent the caller learns why: RECOVERING, not a timeout
// or unreachable.
TEST(ClusterClientTest, WaitingAcquireReportsRecoveringOnceItsWaitIsSpent) {
  FakeCluster cluster;
  FakeNode a(cluster);
  cluster.publish(3, one_member_each({&a}));
  a.know(3);
  a.recovering(30);
  auto client = start_cluster_client({a.address()});
  const AcquireResult r = client->acquire("k", 5s, 300ms);
  EXPECT_EQ(r.error, LeaseErrc::kRecovering);
  EXPECT_GE(a.distinct(MessageType::kAcquire), 2u);
}

// A hint longer than the wait left does not end the wait early: the client
// tries once more just before its wait ends (the node may be ready sooner
// than it said) and reports RECOVERING only then.
TEST(ClusterClientTest, AHintPastTheWaitStillWaitsItOut) {
  FakeCluster cluster;
  FakeNode a(cluster);
  cluster.publish(3, one_member_each({&a}));
  a.know(3);
  a.recovering(60'000);
  auto client = start_cluster_client({a.address()});
  const auto started = std::chrono::steady_clock::now();
  const AcquireResult r = client->acquire("k", 5s, 300ms);
  EXPECT_EQ(r.error, LeaseErrc::kRecovering);
  EXPECT_GE(std::chrono::steady_clock::now() - started, 290ms - internal::kLastTryMargin);
  EXPECT_GE(a.distinct(MessageType::kAcquire), 2u);
}

// A watched lease whose node answers RENEW with
// RECOVERING asks again after retry_after_ms, not at once. Over a window of
// W ms with retry_after R ms it sends at most about W / R RENEWs (no
// retransmissions: each is answered); without the backoff it was thousands.
TEST(ClusterClientTest, RenewAnsweredRecoveringBacksOff) {
  FakeCluster cluster;
  FakeNode a(cluster);
  cluster.publish(3, one_member_each({&a}));
  a.know(3);
  auto client = start_cluster_client({a.address()});
  std::atomic<int> lost{0};
  LeaseOptions watch;
  watch.watchdog = true;
  watch.renew_fraction = 0.05;  // first renewal 150 ms after the grant
  watch.on_lost = [&](const LeaseLost&) { lost.fetch_add(1); };
  AcquireResult r = client->acquire("k", 3s, 0ms, watch);
  ASSERT_TRUE(r) << r.error.message();
  a.recovering(100);
  const std::size_t before = a.count(MessageType::kRenew);
  // The window: until the lease is lost at its expiry (about 3 s), or 1 s.
  std::this_thread::sleep_for(1s);
  const std::size_t renewals = a.count(MessageType::kRenew) - before;
  EXPECT_GE(renewals, 1u);
  // 1000 ms / 100 ms = 10, with slack for one RENEW in flight when it began.
  EXPECT_LE(renewals, 12u);
}

// Riding through a failover: a waiting acquire whose node died (no answer at all)
// refreshes the map until the cluster has moved the key, goes to the new
// owner, rides through its lock-delay and is granted there.
TEST(ClusterClientTest, WaitingAcquireFollowsTheKeyWhenItsNodeDies) {
  FakeCluster cluster;
  FakeNode a(cluster), b(cluster);
  cluster.publish(5, one_member_each({&a, &b}));
  cluster.publish(6, one_member_each({&b}));
  a.know(5);
  b.know(5);
  auto client = start_cluster_client({a.address(), b.address()});
  const std::string key = key_of(cluster, 5, a);
  a.silent(true);

  AcquireResult r;
  std::thread waiter([&] { r = client->acquire(key, 5s, 30s); });
  // Several map refreshes go by while the map still names the dead node (its
  // member key outlives it by up to the etcd lease) ...
  ASSERT_TRUE(poll_until([&] { return b.count(MessageType::kMap) >= 2; }));
  EXPECT_EQ(b.count(MessageType::kAcquire), 0u);
  // ... then the cluster moves the key to b, which is in its lock-delay.
  b.recovering(40);
  b.know(6);
  ASSERT_TRUE(poll_until([&] { return b.distinct(MessageType::kAcquire) >= 2; }));
  b.recovering(std::nullopt);
  waiter.join();
  ASSERT_TRUE(r) << r.error.message();
  EXPECT_EQ(client->map_epoch(), 6u);
  EXPECT_EQ(b.granted(), std::vector<std::string>{key});
}

// A backup takes a dead node's buckets over within a few hundred ms: a call
// to a silent node asks for the map again on every send from the second on,
// not every third, so it finds the new owner soon after the map moves.
TEST(ClusterClientTest, ASilentNodesCallRefreshesTheMapOnEverySendFromTheSecond) {
  FakeCluster cluster;
  FakeNode a(cluster), b(cluster);
  cluster.publish(5, one_member_each({&a, &b}));
  a.know(5);
  b.know(5);
  auto client = start_cluster_client({a.address(), b.address()});
  const std::string key = key_of(cluster, 5, a);
  const std::uint64_t discovery = b.count(MessageType::kMap);
  a.silent(true);
  AcquireResult r;
  std::thread waiter([&] { r = client->acquire(key, 5s, 30s); });
  // Refreshes after sends 2, 3 and 4 (every third would need 9 sends).
  ASSERT_TRUE(poll_until([&] { return b.count(MessageType::kMap) >= discovery + 3; }));
  EXPECT_LE(a.count(MessageType::kAcquire), 5u);
  // The map moves the key to b: the call follows it.
  cluster.publish(6, one_member_each({&b}));
  b.know(6);
  waiter.join();
  ASSERT_TRUE(r) << r.error.message();
  // One request reached b (the fake grants a retransmission of it again,
  // where a server answers it from its dedup cache), for that key.
  EXPECT_EQ(b.distinct(MessageType::kAcquire), 1u);
  const std::vector<std::string> granted = b.granted();
  ASSERT_FALSE(granted.empty());
  for (const std::string& g : granted) EXPECT_EQ(g, key);
}

TEST(ClusterClientTest, AcquireManyNeedsOneOwnerUnderTheMap) {
  FakeCluster cluster;
  FakeNode a(cluster), b(cluster);
  cluster.publish(5, one_member_each({&a, &b}));
  a.know(5);
  b.know(5);
  auto client = start_cluster_client({b.address()});
  const std::string a1 = key_of(cluster, 5, a), a2 = key_of(cluster, 5, a, true, 1);
  const std::string b1 = key_of(cluster, 5, b);
  const std::string_view same[] = {a1, a2};
  MultiAcquireResult r = client->acquire_many(same, 10s, 0ms);
  ASSERT_TRUE(r) << r.error.message();
  EXPECT_EQ(a.granted(), (std::vector<std::string>{a1, a2}));
  const std::string_view mixed[] = {a1, b1};
  EXPECT_EQ(client->acquire_many(mixed, 10s, 0ms).error, LeaseErrc::kCrossNode);
}

TEST(ClusterClientTest, StartFailsWhenNoSeedIsAClusterNode) {
  FakeCluster cluster;
  FakeNode plain(cluster);  // knows no map: answers MAP with epoch 0
  LeaseClient client(cluster_options({plain.address()}));
  const std::error_code ec = client.start();
  EXPECT_TRUE(ec);
  EXPECT_NE(client.error_detail().find("not a cluster node"), std::string::npos)
      << client.error_detail();
  EXPECT_EQ(client.try_acquire("k", 1s).error, LeaseErrc::kNotStarted);
}

TEST(ClusterClientTest, WithoutClusterModeARedirectIsAnError) {
  FakeCluster cluster;
  FakeNode a(cluster), b(cluster);
  cluster.publish(5, one_member_each({&a, &b}));
  a.know(5);
  LeaseClientOptions options;
  options.nodes = {a.address()};
  LeaseClient client(options);
  ASSERT_FALSE(client.start()) << client.error_detail();
  AcquireResult r = client.try_acquire(key_of(cluster, 5, b), 1s);
  EXPECT_EQ(r.error, LeaseErrc::kRedirected);
  for (const Received& got : a.received()) EXPECT_FALSE(got.epoch.has_value());
}

}  // namespace
}  // namespace shardlock::lease
