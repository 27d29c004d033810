// Forged, replayed and stale replication datagrams against real nodes: two
// LeaseServers with replication on, "a" the primary of a bucket and "b" its
// backup, on loopback, with a UDP relay between them (StreamRelay). Each
// node's layout gives the relay's address as the other's, so every
// node-to-node datagram passes through it, and what the relay sends to "b"
// comes from the address "b" knows as "a"'s: an attacker on the path, or
// one that spoofs a's source address. The relay records what "a" sends,
// holds datagrams back on request, and injects datagrams of its own.
//
// What each forgery would do is only visible once "b" owns the bucket: the
// tests stop or evict "a", let "b" take the bucket over (what the cluster
// layer does; replicated_server_test.cc shows the honest case), and ask "b"
// who holds what; restart_b() replaces b's process with a new one on the
// same port. Every test fails when the check it is named for is taken out
// of the server (docs/security.md, "Threat model").
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "lease/server/replicated_servers.h"
#include "poll_until.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/server/internal/cluster_control.h"
#include "shardlock/lease/server/internal/replication.h"
#include "shardlock/lease/server/server.h"
#include "shardlock/lease/wire/auth.h"
#include "shardlock/router.h"
#include "support/loopback_server.h"

namespace shardlock::lease {
namespace {

using namespace std::chrono_literals;
using internal::ClusterControl;
using internal::replication::Entry;
using internal::replication::EntryKind;
using internal::replication::ReplicateHeader;
using test_support::gate_for;
using test_support::loopback_address;
using test_support::poll_until;
using test_support::routing_of;
using test_support::start_loopback_server;

sockaddr_in loopback_port(std::uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// A UDP socket on 127.0.0.1, ephemeral port.
int bound_socket(std::uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr = loopback_port(0);
  EXPECT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
  socklen_t length = sizeof addr;
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length), 0);
  port = ntohs(addr.sin_port);
  return fd;
}

void send_to(int fd, std::uint16_t port, std::span<const std::uint8_t> bytes) {
  const sockaddr_in to = loopback_port(port);
  EXPECT_EQ(::sendto(fd, bytes.data(), bytes.size(), 0, reinterpret_cast<const sockaddr*>(&to),
                     sizeof to),
            static_cast<ssize_t>(bytes.size()));
}

using Datagram = std::vector<std::uint8_t>;

// See the file comment. Datagrams from anyone but the two nodes are dropped.
class StreamRelay {
 public:
  StreamRelay() : fd_(bound_socket(port_)) {}
  ~StreamRelay() {
    thread_ = {};  // requests stop, joins
    ::close(fd_);
  }
  StreamRelay(const StreamRelay&) = delete;
  StreamRelay& operator=(const StreamRelay&) = delete;

  void start(std::uint16_t a_port, std::uint16_t b_port) {
    a_port_ = a_port;
    b_port_ = b_port;
    thread_ = std::jthread([this](const std::stop_token& stop) { run(stop); });
  }
  [[nodiscard]] std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // Everything "a" has sent "b" so far, in order.
  [[nodiscard]] std::vector<Datagram> recorded() const {
    const std::lock_guard lock(mu_);
    return recorded_;
  }
  // From now on, datagrams from "a" that `hold` is true for are kept back.
  void hold(std::function<bool(std::span<const std::uint8_t>)> hold) {
    const std::lock_guard lock(mu_);
    hold_ = std::move(hold);
  }
  [[nodiscard]] std::size_t held() const {
    const std::lock_guard lock(mu_);
    return held_.size();
  }
  // Sends the held datagrams on to "b", in order, and holds nothing more.
  void release_held() {
    const std::lock_guard lock(mu_);
    for (const Datagram& d : held_) send_to(fd_, b_port_, d);
    held_.clear();
    hold_ = nullptr;
  }
  // Nothing passes between the nodes while set (a partition); injected
  // datagrams still go.
  void cut(bool cut) { cut_.store(cut, std::memory_order_relaxed); }
  // Sends `bytes` to "b" from the relay: from a's address, as "b" sees it.
  void inject(std::span<const std::uint8_t> bytes) { send_to(fd_, b_port_, bytes); }

 private:
  void run(const std::stop_token& stop) {
    Datagram buffer(65536);
    while (!stop.stop_requested()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 5) <= 0) continue;
      sockaddr_in from{};
      socklen_t length = sizeof from;
      const ssize_t n = ::recvfrom(fd_, buffer.data(), buffer.size(), 0,
                                   reinterpret_cast<sockaddr*>(&from), &length);
      if (n <= 0) continue;
      const std::span<const std::uint8_t> bytes(buffer.data(), static_cast<std::size_t>(n));
      // Relaxed: a test switch, read again on every datagram.
      const bool cut = cut_.load(std::memory_order_relaxed);
      const std::uint16_t port = ntohs(from.sin_port);
      if (port == b_port_) {
        if (!cut) send_to(fd_, a_port_, bytes);
        continue;
      }
      if (port != a_port_) continue;
      const std::lock_guard lock(mu_);
      recorded_.emplace_back(bytes.begin(), bytes.end());
      if (cut) continue;
      if (hold_ && hold_(bytes)) {
        held_.emplace_back(bytes.begin(), bytes.end());
      } else {
        send_to(fd_, b_port_, bytes);
      }
    }
  }

  std::uint16_t port_ = 0;
  int fd_;
  std::uint16_t a_port_ = 0;
  std::uint16_t b_port_ = 0;
  std::atomic<bool> cut_{false};
  mutable std::mutex mu_;
  std::vector<Datagram> recorded_;
  std::function<bool(std::span<const std::uint8_t>)> hold_;
  std::vector<Datagram> held_;
  std::jthread thread_;  // last: stopped before the rest goes
};

// A stream datagram's header and entries, if it is a REPLICATE sealed with
// `key`.
bool open_replicate(std::span<const std::uint8_t> datagram, const AuthKey& key,
                    ReplicateHeader& header, std::vector<Entry>& entries) {
  const std::span<const std::uint8_t> body = open_datagram(datagram, key);
  if (body.empty()) return false;
  std::vector<internal::replication::Relay> relays;
  std::optional<internal::replication::Ack> carried;
  return internal::replication::decode_replicate(body, header, entries, &relays, &carried);
}

bool carries_grant(std::span<const std::uint8_t> datagram, const AuthKey& key,
                   const std::string& lease_key) {
  ReplicateHeader header;
  std::vector<Entry> entries;
  if (!open_replicate(datagram, key, header, entries)) return false;
  for (const Entry& e : entries) {
    if (e.kind == EntryKind::kGrant && e.key == lease_key) return true;
  }
  return false;
}

Datagram encode(const ReplicateHeader& header, const std::vector<Entry>& entries) {
  Datagram out;
  EXPECT_EQ(internal::replication::encode_replicate(header, entries, out), entries.size());
  return out;
}

Datagram sealed(Datagram d, const AuthKey& key) {
  const std::size_t length = d.size();
  d.resize(length + kAuthTagSize);
  EXPECT_EQ(seal_datagram(d, length, key), length + kAuthTagSize);
  return d;
}

struct Holder {
  std::string key;
  std::uint64_t token = 0;
  ClientId owner;
};

LeaseServerOptions keyed_options(const AuthKey& client_key, const AuthKey& cluster_key) {
  LeaseServerOptions o = test_support::replicated_options();
  // As shardlockd outside loopback: clients hold auth_key, only nodes the
  // cluster key.
  o.auth_key = client_key;
  o.cluster_key = cluster_key;
  return o;
}

class ReplicationForgeryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = start_loopback_server(keyed_options(client_key_, cluster_key_));
    b_ = start_loopback_server(keyed_options(client_key_, cluster_key_));
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    relay_.start(a_->port(), b_->port());
    // Epoch 1: "a" and "b", each the other's backup, each reaching the
    // other at the relay.
    ASSERT_FALSE(ClusterControl(*a_).set_replica_layout(1, *routing_, {}, 0, 2,
                                                        {loopback_address(*a_), relay_.address()}))
        << a_->error_detail();
    ASSERT_FALSE(ClusterControl(*b_).set_replica_layout(1, *routing_, {}, 1, 2,
                                                        {relay_.address(), loopback_address(*b_)}))
        << b_->error_detail();
    ClusterControl(*a_).publish_cluster_gate(gate_for(*a_, 1, routing_, 0, true));
    ClusterControl(*b_).publish_cluster_gate(gate_for(*b_, 1, routing_, 1, true));
    // Every key of the tests in one bucket of a's, so one takeover decides.
    for (int i = 0; bucket_ == kNoBucket; ++i) {
      const std::string k = "held/" + std::to_string(i);
      if (routing_->owner(k) == "a") bucket_ = bucket_of(k);
    }
    held_key_ = key_in_bucket("held/");
    forged_key_ = key_in_bucket("forged/");
    control_key_ = key_in_bucket("control/");
    at_a_ = client_of(*a_);
  }

  void TearDown() override {
    at_a_.reset();
    if (b_) b_->stop();
    if (a_) a_->stop();
  }

  [[nodiscard]] std::uint32_t bucket_of(const std::string& key) const {
    return static_cast<std::uint32_t>(routing_->bucket_of_hash(routing_->hash(key)));
  }
  [[nodiscard]] std::string key_in_bucket(const std::string& prefix) const {
    for (int i = 0;; ++i) {
      std::string k = prefix + std::to_string(i);
      if (bucket_of(k) == bucket_) return k;
    }
  }

  [[nodiscard]] std::unique_ptr<LeaseClient> client_of(const LeaseServer& server,
                                                       LeaseClientOptions options) const {
    options.auth_key = client_key_;
    return test_support::start_loopback_client(server, std::move(options));
  }
  [[nodiscard]] std::unique_ptr<LeaseClient> client_of(const LeaseServer& server) const {
    LeaseClientOptions options;
    options.request_timeout = 5s;
    return client_of(server, options);
  }

  // Granted by "a" (so "b" has it: the answer waits for b's ack), then left
  // to its TTL: no watchdog renews or releases it behind the test's back.
  Holder hold(const std::string& key) {
    // A wait: "a" answers RECOVERING until b has first acknowledged its
    // stream (it holds no primary lease before).
    AcquireResult r = at_a_->acquire(key, 10s, 5s);
    EXPECT_TRUE(r) << r.error.message();
    Holder h{key, r.lease.token(), r.lease.owner()};
    r.lease.detach();
    return h;
  }

  // The header of a's stream to "b" as the relay last saw it, and the next
  // entry number: what a forger needs for "b" to apply its entries.
  ReplicateHeader stream_of_a() const {
    ReplicateHeader newest;
    std::uint64_t next = 0;
    std::vector<Entry> entries;
    for (const Datagram& d : relay_.recorded()) {
      ReplicateHeader header;
      if (!open_replicate(d, cluster_key_, header, entries) || header.stream < newest.stream) {
        continue;
      }
      if (header.stream > newest.stream) next = 0;
      newest = header;
      next = std::max(next, header.first_seq + entries.size());
    }
    EXPECT_NE(newest.stream, 0U) << "the relay saw no REPLICATE from a";
    newest.first_seq = next;
    newest.sent_ns = 0;
    newest.ack_later = false;
    return newest;
  }

  [[nodiscard]] Entry grant_of(const std::string& key, std::uint64_t token) const {
    Entry e;
    e.kind = EntryKind::kGrant;
    e.bucket = bucket_;
    e.key = key;
    e.owner = ClientId{0xF0F0, 0xF0F0};
    e.token = token;
    e.request_id = 7;
    e.ttl_ms = 10'000;
    return e;
  }
  [[nodiscard]] Entry release_of(const Holder& h) const {
    Entry e;
    e.kind = EntryKind::kRelease;
    e.bucket = bucket_;
    e.key = h.key;
    e.owner = h.owner;
    e.token = h.token;
    return e;
  }
  // What a forger wants "b" to believe: `h` released, and forged_key_
  // granted to the forger.
  [[nodiscard]] std::vector<Entry> forgery(const Holder& h) const {
    return {release_of(h), grant_of(forged_key_, h.token + 1)};
  }

  // Returns once "b" has read every datagram sent to it before the call: a
  // STATS round trip through its one socket and I/O thread.
  void sync_with_b() const {
    const ServerStatsReply stats = client_of(*b_)->ping();
    ASSERT_FALSE(stats.error) << stats.error.message();
  }
  [[nodiscard]] std::uint64_t auth_failures_at_b() const {
    return b_->stats().counters[static_cast<std::size_t>(StatCounter::kAuthFailures)];
  }

  // The map of `epoch` has "b" alone ("a" evicted; stopped first when
  // `stop_a`). Once b's last promise to "a" has run out it takes the bucket
  // over (what the cluster layer does, and only then activates it). The
  // number of holders installed, or nullopt when "b" would not take over.
  std::optional<std::size_t> evict_a(bool stop_a, std::uint64_t epoch = 2,
                                     std::chrono::milliseconds patience = 5s) {
    if (stop_a) a_->stop();
    const auto alone = routing_of({"b"});
    EXPECT_FALSE(
        ClusterControl(*b_).set_replica_layout(epoch, *alone, {}, 0, 2, {loopback_address(*b_)}))
        << b_->error_detail();
    std::optional<std::size_t> installed;
    if (!poll_until(
            [&] {
              installed = ClusterControl(*b_).take_over("a", bucket_, 10s);
              return installed.has_value();
            },
            patience, 5ms)) {
      return std::nullopt;
    }
    ClusterControl(*b_).publish_cluster_gate(gate_for(*b_, epoch, alone, 0, false));
    return installed;
  }

  // After forgery(): "b" takes the bucket over with h's holder alone, and
  // forged_key_ is free.
  void expect_forgery_refused() {
    const std::optional<std::size_t> installed = evict_a(/*stop_a=*/true);
    ASSERT_TRUE(installed.has_value());
    EXPECT_EQ(*installed, 1U);
    EXPECT_EQ(acquire_at_b(held_key_).error, LeaseErrc::kBusy);
    EXPECT_TRUE(acquire_at_b(forged_key_));
  }

  // Once "b" has caught up on every bucket it backs up for "a": what "a"
  // sent it so far (the stream's opening, no holder yet) into `opening`;
  // then a holder h of held_key_ granted at "a" (so "b" has it), and the two
  // cut off from each other from then on.
  void record_opening_then_cut(std::vector<Datagram>& opening) {
    ASSERT_TRUE(poll_until(
        [&] {
          const ReplicaProgress p = ClusterControl(*b_).replica_progress();
          return p.backed > 0 && p.caught_up == p.backed;
        },
        5s, 1ms));
    opening = relay_.recorded();
    (void)hold(held_key_);
    relay_.cut(true);
  }
  // After a replay of a's stream opening, with "a" and "b" cut off from
  // each other: the map of `epoch` evicts "a", silent to "b", which must not
  // take the bucket over from the stale snapshot (and grant held_key_,
  // which h still holds at "a").
  void expect_no_takeover_from_stale_snapshot(std::uint64_t epoch) {
    const std::optional<std::size_t> installed = evict_a(/*stop_a=*/false, epoch, 1500ms);
    if (installed.has_value()) {
      const AcquireResult second = acquire_at_b(held_key_);
      ADD_FAILURE() << "took the bucket over with " << *installed
                    << " holders from a stale snapshot"
                    << (second ? "; granted " + held_key_ + " while h holds it at a" : "");
    }
  }

  // "b" restarts: its process stops, and a new one (another incarnation)
  // starts on the same port with the same id, map and gate, as a node
  // restarted on its data dir that adopts the current map.
  void restart_b() {
    const std::uint16_t port = b_->port();
    b_->stop();
    b_.reset();
    LeaseServerOptions o = keyed_options(client_key_, cluster_key_);
    o.bind_address = "127.0.0.1:" + std::to_string(port);
    b_ = start_loopback_server(o);
    ASSERT_NE(b_, nullptr);
    ASSERT_FALSE(ClusterControl(*b_).set_replica_layout(1, *routing_, {}, 1, 2,
                                                        {relay_.address(), loopback_address(*b_)}))
        << b_->error_detail();
    ClusterControl(*b_).publish_cluster_gate(gate_for(*b_, 1, routing_, 1, true));
  }

  // A fresh client's try at `key` on "b".
  AcquireResult acquire_at_b(const std::string& key) const {
    return client_of(*b_)->acquire(key, 5s, 0ms);
  }

  static constexpr std::uint32_t kNoBucket = ~std::uint32_t{0};
  const AuthKey client_key_ = generate_auth_key();
  const AuthKey cluster_key_ = generate_auth_key();
  StreamRelay relay_;
  std::unique_ptr<LeaseServer> a_;
  std::unique_ptr<LeaseServer> b_;
  std::shared_ptr<const RouterSnapshot> routing_ = routing_of({"a", "b"});
  std::uint32_t bucket_ = kNoBucket;
  std::string held_key_;
  std::string forged_key_;
  std::string control_key_;
  std::unique_ptr<LeaseClient> at_a_;
};

// The seal (Replicator::on_datagram): a REPLICATE that is not sealed with
// the cluster key is dropped and counted, whatever it says and wherever it
// comes from.
TEST_F(ReplicationForgeryTest, AStreamDatagramNotSealedWithTheClusterKeyChangesNothing) {
  const Holder h = hold(held_key_);
  const Datagram forged = encode(stream_of_a(), forgery(h));
  const std::uint64_t failures = auth_failures_at_b();
  relay_.inject(forged);                       // unsealed
  relay_.inject(sealed(forged, client_key_));  // sealed with the clients' key
  Datagram tampered = sealed(forged, cluster_key_);
  tampered.back() ^= 0x01;  // the cluster key's seal, one bit off
  relay_.inject(tampered);
  sync_with_b();
  // Counted, and "b" still answers.
  EXPECT_EQ(auth_failures_at_b(), failures + 3);
  // The control: the same datagram with a grant of its own, sealed with the
  // cluster key, is taken (so the forgeries above were refused for their
  // seal alone).
  relay_.inject(sealed(encode(stream_of_a(), {grant_of(control_key_, h.token + 2)}), cluster_key_));
  sync_with_b();

  const std::optional<std::size_t> installed = evict_a(/*stop_a=*/true);
  ASSERT_TRUE(installed.has_value());
  EXPECT_EQ(*installed, 2U);  // h's holder and the control's
  EXPECT_EQ(acquire_at_b(held_key_).error, LeaseErrc::kBusy);
  EXPECT_EQ(acquire_at_b(control_key_).error, LeaseErrc::kBusy);
  const AcquireResult free = acquire_at_b(forged_key_);
  ASSERT_TRUE(free) << free.error.message();
  EXPECT_GT(free.lease.token(), h.token);
  const CallResult renewed = client_of(*b_)->renew(held_key_, h.token, 5s, h.owner);
  EXPECT_EQ(renewed.reply, MessageType::kRenewed) << renewed.error.message();
}

// Entry numbers (BackupStream::on_replicate): a genuine datagram of the
// stream, recorded and sent again after the lease it granted was released,
// is a duplicate and applies nothing.
TEST_F(ReplicationForgeryTest, AReplayedGrantDoesNotResurrectAReleasedHolder) {
  const Holder h = hold(held_key_);
  const std::vector<Datagram> recorded = relay_.recorded();  // the grant among them
  std::size_t grants = 0;
  for (const Datagram& d : recorded) grants += carries_grant(d, cluster_key_, held_key_) ? 1 : 0;
  ASSERT_GE(grants, 1U);
  // RELEASED comes once "b" has the release too.
  const CallResult released = at_a_->release(held_key_, h.token, h.owner);
  ASSERT_EQ(released.reply, MessageType::kReleased) << released.error.message();

  // Everything "a" had sent up to the grant, again and again.
  for (int round = 0; round < 3; ++round) {
    for (const Datagram& d : recorded) relay_.inject(d);
  }
  sync_with_b();

  const std::optional<std::size_t> installed = evict_a(/*stop_a=*/true);
  ASSERT_TRUE(installed.has_value());
  EXPECT_EQ(*installed, 0U);
  const AcquireResult next = acquire_at_b(held_key_);
  ASSERT_TRUE(next) << next.error.message();
  EXPECT_GT(next.lease.token(), h.token);  // fencing tokens still rise
}

// Stream ids (BackupStream::on_replicate): a datagram of an older stream of
// a's (its earlier run, sealed and addressed as that run would have) is
// refused, even when its entry numbers follow on from the current stream's.
TEST_F(ReplicationForgeryTest, ADatagramOfAnOlderStreamChangesNothing) {
  const Holder h = hold(held_key_);
  ReplicateHeader older = stream_of_a();
  ASSERT_GT(older.stream >> 32, 0U);
  older.stream = 1;  // map epoch 0, the first stream: below every later one
  older.epoch = 0;
  older.addressing.incarnation -= 1;
  relay_.inject(sealed(encode(older, forgery(h)), cluster_key_));
  sync_with_b();

  expect_forgery_refused();
}

// Addressing (Replicator::on_replicate): a datagram is taken only into the
// stream of the primary it names, from the address b's map gives that
// primary, and only when "b" is its receiver. Each of these is sealed with
// the cluster key and carries the next entry number of a's stream.
TEST_F(ReplicationForgeryTest, ADatagramFromTheWrongSenderChangesNothing) {
  const Holder h = hold(held_key_);
  const ReplicateHeader current = stream_of_a();
  // Named "a", for "b", but from an address that is not a's in b's map (a
  // node that moved, or a stranger holding the key).
  std::uint16_t port = 0;
  const int stranger = bound_socket(port);
  send_to(stranger, b_->port(), sealed(encode(current, forgery(h)), cluster_key_));
  ::close(stranger);
  // From a's address, naming a sender b's map does not have.
  ReplicateHeader unknown = current;
  unknown.addressing.sender = internal::replication::node_tag("c");
  relay_.inject(sealed(encode(unknown, forgery(h)), cluster_key_));
  // From a's address, naming "a", but for another node.
  ReplicateHeader elsewhere = current;
  elsewhere.addressing.receiver = internal::replication::node_tag("c");
  relay_.inject(sealed(encode(elsewhere, forgery(h)), cluster_key_));
  sync_with_b();

  expect_forgery_refused();
}

// The frozen stream (BackupStream::on_replicate, promise_expired()): "a" is
// evicted but still running, and grants a key under the primary lease it
// still had; its REPLICATE reaches "b" only after "b" took the bucket over
// without it. "b" neither applies nor acknowledges it, so "a" never answers
// that grant, and the key is b's to grant: one holder. Acknowledged, a's
// client would hold the key while b's does (hole 1, docs/cluster.md).
TEST_F(ReplicationForgeryTest, AnEvictedPrimarysLateGrantIsNeverAcknowledged) {
  const Holder h = hold(held_key_);
  const std::string late_key = forged_key_;
  relay_.hold([this, late_key](std::span<const std::uint8_t> d) {
    return carries_grant(d, cluster_key_, late_key);
  });
  // One transmission, no retransmission within the test: the answer can
  // only come from what "b" does with the held grant.
  std::atomic<int> late_reply{-1};
  LeaseClientOptions once;
  once.initial_retransmit = 30s;
  once.max_retransmit = 30s;
  once.request_timeout = 60s;
  auto late = client_of(*a_, once);
  late->acquire_async(late_key, 5s, 0ms, [&late_reply](const CallResult& r) {
    late_reply.store(r.error ? -2 : static_cast<int>(r.reply), std::memory_order_release);
  });
  ASSERT_TRUE(poll_until([&] { return relay_.held() > 0; }, 5s, 1ms));  // "a" granted it

  // Epoch 2 has "b" alone; "a" never hears of it (cut off from etcd).
  const std::optional<std::size_t> installed = evict_a(/*stop_a=*/false);
  ASSERT_TRUE(installed.has_value());
  EXPECT_EQ(*installed, 1U);  // h's holder, not the late grant

  // The late grant, and a's retransmissions of it, reach "b" now.
  relay_.release_held();
  sync_with_b();
  const AcquireResult at_b = acquire_at_b(late_key);
  ASSERT_TRUE(at_b) << at_b.error.message();
  // Had "b" acknowledged the late grant, its answer would come now: relayed
  // by "b" as it applied it, or from "a" on the ack. Acquire: pairs with the
  // completion's release store. Long enough for a's retransmissions too
  // (every 20..160 ms).
  EXPECT_FALSE(poll_until(
      [&] {
        return late_reply.load(std::memory_order_acquire) ==
               static_cast<int>(MessageType::kGranted);
      },
      1s, 5ms))
      << "two holders of " << late_key;
  EXPECT_EQ(acquire_at_b(held_key_).error, LeaseErrc::kBusy);
}

// A backup whose stream from a primary starts over (it skipped a map, and
// every stream from a primary starts afresh then) while cut off from that
// primary: a replay of the old stream's opening, recorded when it was new
// (a's snapshot, before h was granted), must not count the bucket caught up.
// Taken, "b" took the bucket over from that stale snapshot and granted
// h's key while h still held it at "a".
TEST_F(ReplicationForgeryTest, AReplayedStreamOpeningDoesNotCatchUpAFreshStream) {
  std::vector<Datagram> opening;
  record_opening_then_cut(opening);
  if (HasFatalFailure()) return;
  // "b" missed epoch 2 and is given epoch 3, with the same owners.
  ASSERT_FALSE(ClusterControl(*b_).set_replica_layout(3, *routing_, {}, 1, 2,
                                                      {relay_.address(), loopback_address(*b_)}))
      << b_->error_detail();
  for (const Datagram& d : opening) relay_.inject(d);
  sync_with_b();

  // Epoch 4 evicts "a": "b" has nothing of a's stream since it started over.
  expect_no_takeover_from_stale_snapshot(4);
}

// The same replay against a backup *process* that has just restarted: it
// remembers no stream it followed, so the refusal above cannot help it.
// Every REPLICATE names the backup process it is for (Addressing::
// receiver_incarnation), and the recorded opening names the process before
// the restart (or none, sent before "a" had heard from "b"): the new process
// refuses it untouched. Taken, "b" counted the bucket caught up on that
// stale snapshot, took it over once "a" was evicted, and granted h's key
// while h still held it at "a" (docs/security.md, "Threat model").
TEST_F(ReplicationForgeryTest, AReplayedStreamOpeningDoesNotCatchUpARestartedBackup) {
  std::vector<Datagram> opening;
  record_opening_then_cut(opening);
  if (HasFatalFailure()) return;
  restart_b();
  if (HasFatalFailure()) return;
  for (const Datagram& d : opening) relay_.inject(d);
  sync_with_b();
  const ReplicaProgress progress = ClusterControl(*b_).replica_progress();
  EXPECT_GT(progress.backed, 0U);
  EXPECT_EQ(progress.caught_up, 0U) << "a recorded opening caught the restarted backup up";

  // Epoch 2 evicts "a": "b" has nothing of a's stream since it restarted.
  expect_no_takeover_from_stale_snapshot(2);
}

}  // namespace
}  // namespace shardlock::lease
