// LeaseServer over loopback, through both I/O back ends.
#include "shardlock/lease/server/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lease/udp_test_peer.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/fencing.h"
#include "shardlock/lease/server/internal/cluster_control.h"
#include "shardlock/lease/server/internal/cluster_gate.h"
#include "shardlock/lease/server/internal/server_clock.h"
#include "shardlock/lease/server/internal/token_store.h"
#include "shardlock/router.h"
#include "support/loopback_server.h"

namespace shardlock::lease {
namespace {

using internal::ClusterControl;
using shardlock::test_support::loopback_options;
using shardlock::test_support::start_loopback_server;
using std::chrono::milliseconds;
using test_support::UdpTestPeer;

class ServerTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  // Starts a loopback server (support/loopback_server.h) with `o` on the
  // parameter's back end, with no lock-delay unless `o` sets one. False when
  // none runs: the test is skipped (no io_uring here) or has failed.
  [[nodiscard]] bool start(LeaseServerOptions o = {}) {
    o.io = GetParam();
    if (!o.lock_delay) o.lock_delay = milliseconds{0};
    server_ = start_loopback_server(std::move(o));
    if (server_ == nullptr) return false;
    EXPECT_NE(server_->port(), 0);
    EXPECT_EQ(server_->backend(), GetParam());
    return server_->port() != 0 && server_->backend() == GetParam();
  }

  std::unique_ptr<LeaseServer> server_;
};

TEST_P(ServerTest, AcquireRenewReleaseQuery) {
  if (!start()) return;
  UdpTestPeer alice(server_->port());
  UdpTestPeer bob(server_->port());

  const Message g = alice.acquire("orders/1", 5000);
  ASSERT_EQ(g.type, MessageType::kGranted);
  EXPECT_EQ(g.key, "orders/1");
  EXPECT_EQ(g.ttl_ms, 5000u);

  const Message busy = bob.acquire("orders/1", 5000);
  ASSERT_EQ(busy.type, MessageType::kBusy);
  EXPECT_GT(busy.ttl_ms, 0u);
  EXPECT_LE(busy.ttl_ms, 5000u);

  EXPECT_EQ(bob.renew("orders/1", g.token, 1000).type, MessageType::kNotOwner);
  const Message r = alice.renew("orders/1", g.token, 9000);
  EXPECT_EQ(r.type, MessageType::kRenewed);
  EXPECT_EQ(r.ttl_ms, 9000u);

  const Message q = bob.query("orders/1");
  ASSERT_EQ(q.type, MessageType::kQueryReply);
  EXPECT_TRUE(q.held);
  EXPECT_EQ(q.token, g.token);

  EXPECT_EQ(alice.release("orders/1", g.token).type, MessageType::kReleased);
  EXPECT_EQ(alice.release("orders/1", g.token + 1).type, MessageType::kExpired);
  const Message g2 = bob.acquire("orders/1", 5000);
  ASSERT_EQ(g2.type, MessageType::kGranted);
  EXPECT_GT(g2.token, g.token);
  EXPECT_FALSE(bob.query("nobody").held);

  const ServerStats s = server_->stats();
  EXPECT_EQ(s.counter(StatCounter::kGrants), 2u);
  EXPECT_EQ(s.counter(StatCounter::kBusy), 1u);
  EXPECT_EQ(s.counter(StatCounter::kNotOwner), 1u);
  EXPECT_EQ(s.shard_tokens.size(), 64u);
}

TEST_P(ServerTest, BatchGetsOneReplyWithEveryRequestId) {
  if (!start()) return;
  UdpTestPeer peer(server_->port());
  Datagram d;
  d.request_id = 777;
  std::vector<std::string> keys;
  for (int i = 0; i < 20; ++i) keys.push_back("batch/" + std::to_string(i));
  for (int i = 0; i < 20; ++i) {
    Message m;
    m.type = MessageType::kAcquire;
    m.request_id = 1000 + static_cast<std::uint64_t>(i);
    m.key = keys[static_cast<std::size_t>(i)];
    m.ttl_ms = 5000;
    ASSERT_TRUE(d.push(m));
  }
  peer.send(d);
  Datagram reply;
  std::vector<std::uint8_t> storage;
  ASSERT_TRUE(peer.receive(reply, storage));
  EXPECT_TRUE(reply.batch);
  EXPECT_EQ(reply.request_id, 777u);
  ASSERT_EQ(reply.count, 20);
  for (std::size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(reply.messages[i].type, MessageType::kGranted);
    EXPECT_EQ(reply.messages[i].request_id, 1000 + i);
    EXPECT_EQ(reply.messages[i].key, keys[i]);
    EXPECT_GT(reply.messages[i].token, 0u);  // tokens are per shard, not global
  }
}

// Items of one datagram that name their own owner are separate owners to the
// server: they exclude each other, and only the holder can release.
TEST_P(ServerTest, BatchItemsActForTheirOwnOwners) {
  if (!start()) return;
  UdpTestPeer peer(server_->port());
  const ClientId other{0x5151, 0x7373};
  const auto item = [](MessageType type, std::uint64_t id, std::optional<ClientId> owner) {
    Message m;
    m.type = type;
    m.request_id = id;
    m.key = "shared";
    m.ttl_ms = 5000;
    m.owner = owner;
    return m;
  };
  Datagram d;
  d.request_id = 900;
  ASSERT_TRUE(d.push(item(MessageType::kAcquire, 901, std::nullopt)));  // the peer's own id
  ASSERT_TRUE(d.push(item(MessageType::kAcquire, 902, other)));
  peer.send(d);
  Datagram reply;
  std::vector<std::uint8_t> storage;
  ASSERT_TRUE(peer.receive(reply, storage));
  ASSERT_EQ(reply.count, 2);
  EXPECT_EQ(reply.messages[0].type, MessageType::kGranted);
  EXPECT_EQ(reply.messages[1].type, MessageType::kBusy);
  const std::uint64_t token = reply.messages[0].token;

  // `other` cannot release the peer's lease with the right token; the peer can.
  Datagram release;
  release.request_id = 910;
  Message by_other = item(MessageType::kRelease, 911, other);
  by_other.token = token;
  Message by_holder = item(MessageType::kRelease, 912, std::nullopt);
  by_holder.token = token;
  ASSERT_TRUE(release.push(by_other));
  ASSERT_TRUE(release.push(by_holder));
  peer.send(release);
  ASSERT_TRUE(peer.receive(reply, storage));
  ASSERT_EQ(reply.count, 2);
  EXPECT_EQ(reply.messages[0].type, MessageType::kNotOwner);
  EXPECT_EQ(reply.messages[1].type, MessageType::kReleased);
}

TEST_P(ServerTest, RetransmittedAcquireGetsTheSameGrant) {
  if (!start()) return;
  UdpTestPeer alice(server_->port());
  UdpTestPeer bob(server_->port());
  Message m;
  m.type = MessageType::kAcquire;
  m.key = "dup";
  m.ttl_ms = 5000;
  m.request_id = 42;
  const Message first = alice.call(m);
  ASSERT_EQ(first.type, MessageType::kGranted);
  ASSERT_EQ(alice.release("dup", first.token).type, MessageType::kReleased);
  ASSERT_EQ(bob.acquire("dup", 5000).type, MessageType::kGranted);
  const Message again = alice.call(m);  // the "lost reply" retransmission
  EXPECT_EQ(again.type, MessageType::kGranted);
  EXPECT_EQ(again.token, first.token);
  EXPECT_EQ(server_->stats().counter(StatCounter::kGrants), 2u);
}

TEST_P(ServerTest, WaitersAreGrantedInFifoOrderOrTimeOut) {
  if (!start()) return;
  UdpTestPeer holder(server_->port());
  UdpTestPeer first(server_->port());
  UdpTestPeer second(server_->port());
  UdpTestPeer impatient(server_->port());
  const Message g = holder.acquire("fifo", 10'000);
  ASSERT_EQ(g.type, MessageType::kGranted);

  auto send_acquire = [](UdpTestPeer& p, std::uint32_t wait) {
    Message m;
    m.type = MessageType::kAcquire;
    m.key = "fifo";
    m.ttl_ms = 10'000;
    m.wait_ms = wait;
    m.request_id = p.next_id();
    Datagram d;
    (void)d.push(m);
    p.allow_replies_up_to(p.send(d).size());
    return m.request_id;
  };
  const auto id1 = send_acquire(first, 10'000);
  // Order the queue: the first waiter must be queued before the second.
  while (holder.query("fifo").waiters < 1) std::this_thread::yield();
  const auto id2 = send_acquire(second, 10'000);
  while (holder.query("fifo").waiters < 2) std::this_thread::yield();
  const auto id3 = send_acquire(impatient, 50);

  const Message timeout = impatient.wait_for(id3);
  EXPECT_EQ(timeout.type, MessageType::kTimeout);
  EXPECT_EQ(timeout.key, "fifo");
  EXPECT_TRUE(second.quiet(milliseconds{20}));

  ASSERT_EQ(holder.release("fifo", g.token).type, MessageType::kReleased);
  const Message g1 = first.wait_for(id1);
  ASSERT_EQ(g1.type, MessageType::kGranted);
  EXPECT_GT(g1.token, g.token);
  EXPECT_TRUE(second.quiet(milliseconds{20}));
  ASSERT_EQ(first.release("fifo", g1.token).type, MessageType::kReleased);
  const Message g2 = second.wait_for(id2);
  ASSERT_EQ(g2.type, MessageType::kGranted);
  EXPECT_GT(g2.token, g1.token);
  const ServerStats s = server_->stats();
  EXPECT_EQ(s.counter(StatCounter::kQueued), 3u);
  EXPECT_EQ(s.counter(StatCounter::kTimeouts), 1u);
}

TEST_P(ServerTest, ExpiryFollowsTheInjectedClock) {
  auto fake_ms = std::make_shared<std::atomic<std::int64_t>>(1'000'000);
  LeaseServerOptions o;
  // Relaxed: the test only needs the I/O thread to see the new time eventually.
  o.clock = [fake_ms] { return milliseconds{fake_ms->load(std::memory_order_relaxed)}; };
  if (!start(o)) return;
  UdpTestPeer alice(server_->port());
  UdpTestPeer bob(server_->port());
  const Message g = alice.acquire("clock", 1000);
  ASSERT_EQ(g.type, MessageType::kGranted);
  // The deadline is rounded up by 1 ms (the clock is truncated to ms).
  fake_ms->fetch_add(1000, std::memory_order_relaxed);
  EXPECT_EQ(bob.acquire("clock", 1000).type, MessageType::kBusy);
  fake_ms->fetch_add(1, std::memory_order_relaxed);
  const Message g2 = bob.acquire("clock", 1000);
  ASSERT_EQ(g2.type, MessageType::kGranted);
  EXPECT_GT(g2.token, g.token);
  EXPECT_EQ(alice.renew("clock", g.token, 1000).type, MessageType::kExpired);
  EXPECT_EQ(server_->stats().counter(StatCounter::kExpirations), 1u);
}

// A lease granted at 5.9 ms (the clock in ns) for 100 ms is
// still held at 105.8 ms: truncating the clock must not make it end early.
TEST_P(ServerTest, SubMillisecondClockNeverEndsALeaseEarly) {
  auto fake_ns = std::make_shared<std::atomic<std::int64_t>>(5'900'000);
  LeaseServerOptions o;
  // Relaxed: the test only needs the I/O thread to see the new time eventually.
  o.clock = [fake_ns] {
    return std::chrono::nanoseconds{fake_ns->load(std::memory_order_relaxed)};
  };
  if (!start(o)) return;
  UdpTestPeer alice(server_->port());
  UdpTestPeer bob(server_->port());
  const Message g = alice.acquire("sub-ms", 100);
  ASSERT_EQ(g.type, MessageType::kGranted);
  fake_ns->store(105'800'000, std::memory_order_relaxed);
  const Message busy = bob.acquire("sub-ms", 100);
  EXPECT_EQ(busy.type, MessageType::kBusy) << "the lease ended before grant + ttl";
  EXPECT_EQ(busy.ttl_ms, 0u);
  fake_ns->store(106'000'000, std::memory_order_relaxed);
  EXPECT_EQ(bob.acquire("sub-ms", 100).type, MessageType::kGranted);
}

TEST_P(ServerTest, LockDelayAnswersRecovering) {
  auto fake_ms = std::make_shared<std::atomic<std::int64_t>>(5'000);
  LeaseServerOptions o;
  o.lock_delay = milliseconds{3000};
  o.clock = [fake_ms] { return milliseconds{fake_ms->load(std::memory_order_relaxed)}; };
  if (!start(o)) return;
  UdpTestPeer peer(server_->port());
  const Message r = peer.acquire("k", 1000);
  ASSERT_EQ(r.type, MessageType::kRecovering);
  EXPECT_EQ(r.retry_after_ms, 3000u);
  fake_ms->fetch_add(3000, std::memory_order_relaxed);
  EXPECT_EQ(peer.acquire("k", 1000).type, MessageType::kGranted);
}

// Time the machine spends suspended counts. The default
// clock is CLOCK_BOOTTIME (CLOCK_MONOTONIC stops during a suspend), and a
// jump of the injected clock, as a resume shows it, ends the leases and the
// lock-delay it covers, and the cluster gate's etcd-lease deadline with them.
TEST(LeaseServerClock, TheDefaultClockIsTheBootClock) {
  static_assert(internal::kServerClockId == CLOCK_BOOTTIME);
  LeaseServerOptions o;
  o.io = IoBackend::kSocket;
  o.lock_delay = milliseconds{0};
  o.log = [](std::string_view) {};
  const auto server = start_loopback_server(o);
  ASSERT_NE(server, nullptr);
  const auto boot = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_BOOTTIME, &ts);
    return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
  };
  const std::chrono::nanoseconds before = boot();
  const std::chrono::nanoseconds now = server->now();
  const std::chrono::nanoseconds after = boot();
  EXPECT_LE(before, now);
  EXPECT_LE(now, after);
}

TEST_P(ServerTest, ASuspendEndsLeasesLockDelayAndTheClusterDeadline) {
  auto fake_ms = std::make_shared<std::atomic<std::int64_t>>(10'000);
  LeaseServerOptions o;
  o.lock_delay = milliseconds{30'000};
  o.max_ttl = milliseconds{30'000};
  // Relaxed: the test only needs the I/O thread to see the new time eventually.
  o.clock = [fake_ms] { return milliseconds{fake_ms->load(std::memory_order_relaxed)}; };
  if (!start(o)) return;
  UdpTestPeer alice(server_->port());
  UdpTestPeer bob(server_->port());
  ASSERT_EQ(alice.acquire("k", 30'000).type, MessageType::kRecovering);
  // Suspended for an hour: the lock-delay is over on waking.
  fake_ms->fetch_add(3'600'000, std::memory_order_relaxed);
  const Message g = alice.acquire("k", 30'000);
  ASSERT_EQ(g.type, MessageType::kGranted);
  // Suspended again: the lease ended meanwhile, for the holder's clock too.
  fake_ms->fetch_add(3'600'000, std::memory_order_relaxed);
  const Message g2 = bob.acquire("k", 30'000);
  ASSERT_EQ(g2.type, MessageType::kGranted);
  EXPECT_EQ(alice.renew("k", g.token, 30'000).type, MessageType::kExpired);
  EXPECT_EQ(server_->stats().lock_delay_left, milliseconds{0});
}

TEST_P(ServerTest, ASuspendPastTheEtcdLeaseDeadlineFailsClosed) {
  auto fake_ms = std::make_shared<std::atomic<std::int64_t>>(10'000);
  LeaseServerOptions o;
  o.clock = [fake_ms] { return milliseconds{fake_ms->load(std::memory_order_relaxed)}; };
  if (!start(o)) return;
  Router router(RouterOptions{.bucket_bits = 8});
  const std::vector<Node> nodes = {Node{"self", 1}};
  ASSERT_EQ(router.assign(nodes), RouterStatus::kOk);
  auto gate = std::make_shared<internal::ClusterGate>();
  gate->epoch = 7;
  gate->routing = router.snapshot();
  gate->buckets.assign(gate->routing->bucket_count(), internal::ClusterGate::kActive);
  // As the cluster node builds it: a deadline on the server's own clock,
  // 10 s after the last keep-alive.
  const std::chrono::nanoseconds deadline = server_->now() + std::chrono::seconds(10);
  gate->lease_deadline = [deadline] { return deadline; };
  ClusterControl(*server_).publish_cluster_gate(gate);
  UdpTestPeer peer(server_->port());
  ASSERT_EQ(peer.acquire("k", 1000).type, MessageType::kGranted);
  fake_ms->fetch_add(3'600'000, std::memory_order_relaxed);  // suspended for an hour
  EXPECT_EQ(peer.acquire("k2", 1000).type, MessageType::kRecovering);
}

TEST_P(ServerTest, StatsPagesShardTokensWithinTheRequestSize) {
  LeaseServerOptions o;
  o.shards = 300;  // more tokens than fit in one datagram
  if (!start(o)) return;
  UdpTestPeer peer(server_->port());
  for (int i = 0; i < 50; ++i) {
    ASSERT_EQ(peer.acquire("s" + std::to_string(i), 5000).type, MessageType::kGranted);
  }
  std::vector<std::uint64_t> tokens;
  std::uint64_t grants = 0;
  while (tokens.size() < 300) {
    Message m;
    m.type = MessageType::kStats;
    m.request_id = peer.next_id();
    m.first_shard = static_cast<std::uint32_t>(tokens.size());
    Datagram d;
    (void)d.push(m);
    peer.send(d, true, kMaxDatagramSize);  // pad: room for ~150 tokens
    const Message reply = peer.wait_for(m.request_id);
    ASSERT_EQ(reply.type, MessageType::kStatsReply);
    EXPECT_EQ(reply.shard_count, 300u);
    ASSERT_GT(reply.shard_token_count(), 0u);
    for (std::size_t i = 0; i < reply.shard_token_count(); ++i)
      tokens.push_back(reply.shard_token(i));
    grants = reply.counter(StatCounter::kGrants);
  }
  EXPECT_EQ(grants, 50u);
  EXPECT_EQ(tokens, server_->stats().shard_tokens);

  // Unpadded STATS: counters only, never a reply larger than the request.
  Message m;
  m.type = MessageType::kStats;
  const Message small = peer.call(m);
  ASSERT_EQ(small.type, MessageType::kStatsReply);
  EXPECT_EQ(small.shard_token_count(), 0u);
}

TEST_P(ServerTest, UnpaddedRequestsGetRequestTooSmall) {
  if (!start()) return;
  UdpTestPeer peer(server_->port());
  Message m;
  m.type = MessageType::kAcquire;
  m.key = "k";
  m.ttl_ms = 1000;
  m.request_id = 9;
  Datagram d;
  (void)d.push(m);
  const auto sent = peer.send(d, /*pad=*/false);
  Datagram reply;
  std::vector<std::uint8_t> storage;
  ASSERT_TRUE(peer.receive(reply, storage));
  EXPECT_LE(storage.size(), sent.size());
  ASSERT_EQ(reply.count, 1);
  EXPECT_EQ(reply.messages[0].type, MessageType::kError);
  EXPECT_EQ(reply.messages[0].error, WireError::kRequestTooSmall);
  EXPECT_EQ(reply.messages[0].request_id, 9u);
}

// Sends `bytes` raw, then a padded QUERY, and returns the datagrams that
// arrived before the QUERY's reply (replies to `bytes`, in order).
std::vector<std::vector<std::uint8_t>> replies_before_a_query(
    UdpTestPeer& peer, const std::vector<std::uint8_t>& bytes) {
  peer.allow_replies_up_to(kMaxDatagramSize);  // this test checks sizes itself
  if (!bytes.empty()) peer.send_raw(bytes);
  Message q;
  q.type = MessageType::kQuery;
  q.key = "fence";
  q.request_id = peer.next_id();
  Datagram d;
  (void)d.push(q);
  peer.send(d);
  std::vector<std::vector<std::uint8_t>> before;
  Datagram reply;
  std::vector<std::uint8_t> storage;
  while (peer.receive(reply, storage)) {
    if (reply.count == 1 && reply.messages[0].request_id == q.request_id &&
        reply.messages[0].type == MessageType::kQueryReply) {
      return before;
    }
    before.push_back(storage);
  }
  ADD_FAILURE() << "no reply to the QUERY";
  return before;
}

// Reply-type items have smaller bodies than the ERROR that would refuse
// them: an unpadded batch of 64 empty RELEASED items is 800 bytes, its
// ERROR batch 928. Such an answer is withheld and counted, never sent.
TEST_P(ServerTest, RefusalsLargerThanTheRequestAreWithheld) {
  if (!start()) return;
  UdpTestPeer peer(server_->port());
  for (const std::size_t items : {std::size_t{64}, std::size_t{1}}) {
    Datagram d;
    d.batch = items > 1;
    d.client_id = peer.id();
    d.request_id = peer.next_id();
    for (std::size_t i = 0; i < items; ++i) {
      Message m;
      m.type = MessageType::kReleased;
      m.request_id = d.request_id + i;
      ASSERT_TRUE(d.push(m));
    }
    std::vector<std::uint8_t> bytes(kMaxDatagramSize);
    std::size_t n = 0;
    ASSERT_EQ(encode(d, bytes, n), ProtocolError::kOk);
    bytes.resize(n);
    EXPECT_EQ(n, items > 1 ? 800u : 32u);
    for (const auto& reply : replies_before_a_query(peer, bytes)) {
      EXPECT_LE(reply.size(), bytes.size()) << items << " item(s)";
    }
  }
  EXPECT_EQ(server_->stats().counter(StatCounter::kAmplificationDrops), 2u);
}

// Queues one ACQUIRE (waiting) per key in `keys` from `peer` in one batch,
// padded to `pad_to`, behind `holder`'s grants; returns the request bytes
// and the batch's request ids.
std::size_t queue_batch(UdpTestPeer& holder, UdpTestPeer& peer,
                        const std::vector<std::string>& keys, std::size_t pad_to,
                        std::vector<std::uint64_t>& ids, std::vector<std::uint64_t>& tokens) {
  for (const std::string& key : keys) {
    const Message g = holder.acquire(key, 60'000);
    EXPECT_EQ(g.type, MessageType::kGranted);
    tokens.push_back(g.token);
  }
  Datagram d;
  d.request_id = peer.next_id();
  for (const std::string& key : keys) {
    Message m;
    m.type = MessageType::kAcquire;
    m.key = key;
    m.ttl_ms = 60'000;
    m.wait_ms = 60'000;
    m.request_id = peer.next_id();
    ids.push_back(m.request_id);
    EXPECT_TRUE(d.push(m));
  }
  d.batch = true;
  const std::size_t sent = peer.send(d, /*pad=*/pad_to == 0, pad_to).size();
  // Everything is queued once the last key shows a waiter.
  EXPECT_EQ(holder.query(keys.back()).waiters, 1u);
  return sent;
}

// `holder` releases `keys`, handing them to `peer`'s waiters; adds up the
// bytes `peer` receives and the request ids granted.
void release_and_collect_grants(UdpTestPeer& holder, UdpTestPeer& peer,
                                const std::vector<std::string>& keys,
                                const std::vector<std::uint64_t>& tokens, std::size_t& total,
                                std::set<std::uint64_t>& granted) {
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(holder.release(keys[i], tokens[i]).type, MessageType::kReleased);
  }
  for (const auto& bytes : replies_before_a_query(peer, {})) {
    total += bytes.size();
    Datagram r;
    ASSERT_EQ(decode(bytes, r), ProtocolError::kOk);
    for (const Message& m : r.items()) {
      if (m.type == MessageType::kGranted) granted.insert(m.request_id);
    }
  }
}

// A batch padded by max_reply_size() has room for every deferred answer its
// waiting ACQUIREs can get, each a datagram of its own: all arrive, and
// their total stays within the request's bytes.
TEST_P(ServerTest, DeferredRepliesOfAPaddedBatchFitItsBytes) {
  if (!start()) return;
  UdpTestPeer holder(server_->port());
  UdpTestPeer peer(server_->port());
  std::vector<std::string> keys;
  for (char c = 'a'; c < 'a' + 25; ++c) keys.emplace_back(1, c);
  std::vector<std::uint64_t> ids;
  std::vector<std::uint64_t> tokens;
  const std::size_t sent = queue_batch(holder, peer, keys, 0, ids, tokens);
  std::size_t total = 0;
  std::set<std::uint64_t> granted;
  release_and_collect_grants(holder, peer, keys, tokens, total, granted);
  EXPECT_LE(total, sent);
  EXPECT_EQ(granted.size(), keys.size());
  EXPECT_EQ(server_->stats().counter(StatCounter::kAmplificationDrops), 0u);
}

// A batch of ~50 waiting ACQUIREs padded only for its immediate answers
// (1382 bytes) used to fan out into 50 GRANTED datagrams (2350 bytes). What
// does not fit the batch's bytes is withheld and counted; a retransmission
// (same request id) learns the grant from the dedup cache.
TEST_P(ServerTest, DeferredRepliesBeyondTheRequestBytesAreWithheld) {
  if (!start()) return;
  UdpTestPeer holder(server_->port());
  UdpTestPeer peer(server_->port());
  std::vector<std::string> keys;
  for (char c = 'A'; c < 'A' + 50; ++c) keys.emplace_back(1, c);
  std::vector<std::uint64_t> ids;
  std::vector<std::uint64_t> tokens;
  // Header + 50 x (item header + GRANTED body of a 1-byte key).
  const std::size_t immediate_bound = kHeaderSize + 50 * (kBatchItemHeaderSize + 2 + 1 + 12);
  const std::size_t sent = queue_batch(holder, peer, keys, immediate_bound, ids, tokens);
  ASSERT_EQ(sent, immediate_bound);
  std::size_t total = 0;
  std::set<std::uint64_t> granted;
  release_and_collect_grants(holder, peer, keys, tokens, total, granted);
  EXPECT_LE(total, sent);
  const std::uint64_t withheld = keys.size() - granted.size();
  EXPECT_GT(withheld, 0u);
  EXPECT_EQ(server_->stats().counter(StatCounter::kAmplificationDrops), withheld);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (granted.contains(ids[i])) continue;
    Message m;
    m.type = MessageType::kAcquire;
    m.key = keys[i];
    m.ttl_ms = 60'000;
    m.wait_ms = 60'000;
    m.request_id = ids[i];
    EXPECT_EQ(peer.call(m).type, MessageType::kGranted) << keys[i];
  }
}

// A LeaseClient's waiting ACQUIREs, batched on its I/O thread, are padded so
// that each hand-off GRANTED is sent at once: none is withheld, and none
// needs a retransmission (the client would not retransmit for a minute).
TEST_P(ServerTest, LeaseClientWaitersGetTheirHandOffWithoutRetransmitting) {
  if (!start()) return;
  UdpTestPeer holder(server_->port());
  std::vector<std::string> keys;
  for (int i = 0; i < 20; ++i) keys.push_back("handoff/" + std::to_string(i));
  std::vector<std::uint64_t> tokens;
  for (const std::string& key : keys) {
    const Message g = holder.acquire(key, 60'000);
    ASSERT_EQ(g.type, MessageType::kGranted);
    tokens.push_back(g.token);
  }
  LeaseClientOptions co;
  co.nodes = {server_->listen_address()};
  co.initial_retransmit = milliseconds{60'000};
  co.max_retransmit = milliseconds{60'000};
  LeaseClient client(co);
  ASSERT_FALSE(client.start()) << client.error_detail();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<CallResult> results;
  client.post([&] {
    for (const std::string& key : keys) {
      client.acquire_async(key, milliseconds{60'000}, milliseconds{30'000},
                           [&](const CallResult& r) {
                             std::scoped_lock lock(mu);
                             results.push_back(r);
                             cv.notify_all();
                           });
    }
  });
  for (const std::string& key : keys) {
    while (holder.query(key).waiters != 1) std::this_thread::yield();
  }
  EXPECT_EQ(client.datagrams_sent(), 1u);  // one batch
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(holder.release(keys[i], tokens[i]).type, MessageType::kReleased);
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return results.size() == keys.size(); });
  for (const CallResult& r : results) EXPECT_EQ(r.reply, MessageType::kGranted);
  EXPECT_EQ(client.retransmissions(), 0u);
  EXPECT_EQ(server_->stats().counter(StatCounter::kAmplificationDrops), 0u);
}

TEST_P(ServerTest, RandomDatagramsAreDroppedAndServingContinues) {
  if (!start()) return;
  UdpTestPeer peer(server_->port());
  std::mt19937_64 rng(2024);
  Message m;
  m.type = MessageType::kAcquire;
  m.key = "fuzzed";
  m.ttl_ms = 1000;
  Datagram valid;
  (void)valid.push(m);
  std::vector<std::uint8_t> base(kMaxDatagramSize);
  std::size_t n = 0;
  ASSERT_EQ(encode_request(valid, base, n), ProtocolError::kOk);
  base.resize(n);
  for (int i = 0; i < 3000; ++i) {
    std::vector<std::uint8_t> bytes;
    if (i % 2 == 0) {
      bytes.resize(rng() % 1600);
      for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
    } else {
      bytes = base;
      bytes[rng() % bytes.size()] = static_cast<std::uint8_t>(rng());
    }
    peer.send_raw(bytes);
  }
  // Drain whatever the mutations produced answers for.
  Datagram junk;
  std::vector<std::uint8_t> storage;
  peer.allow_replies_up_to(kMaxDatagramSize);
  peer.check_client_id(false);
  while (peer.receive(junk, storage, milliseconds{200})) {
  }

  // An unknown version is answered with ERROR(kUnsupportedVersion).
  auto old = base;
  old[4] = 9;
  peer.send_raw(old);
  ASSERT_TRUE(peer.receive(junk, storage));
  ASSERT_EQ(junk.count, 1);
  EXPECT_EQ(junk.messages[0].error, WireError::kUnsupportedVersion);

  UdpTestPeer fresh(server_->port());
  const Message g = fresh.acquire("after-the-storm", 1000);
  EXPECT_EQ(g.type, MessageType::kGranted);
  EXPECT_GT(server_->stats().counter(StatCounter::kMalformed), 1000u);
}

TEST_P(ServerTest, ConcurrentClientsNeverShareALease) {
  LeaseServerOptions o;
  o.io_threads = 2;
  o.shards = 8;
  if (!start(o)) return;
  constexpr int kClients = 4;
  constexpr int kRounds = 150;
  std::mutex mu;
  std::map<std::string, std::uint64_t> holder_token;           // key -> token while held
  std::set<std::pair<std::string, std::uint64_t>> all_tokens;  // tokens are per shard
  std::atomic<int> violations{0};
  std::vector<std::thread> threads;
  const std::uint16_t port = server_->port();
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      UdpTestPeer peer(port, static_cast<std::uint64_t>(c) + 1);
      std::mt19937_64 rng(static_cast<std::uint64_t>(c));
      for (int i = 0; i < kRounds; ++i) {
        const std::string key = "hot" + std::to_string(rng() % 3);
        const Message g = peer.acquire(key, 10'000, 2000);
        if (g.type != MessageType::kGranted) continue;
        {
          std::scoped_lock lock(mu);
          if (holder_token.contains(key) || !all_tokens.insert({key, g.token}).second) ++violations;
          holder_token[key] = g.token;
        }
        {
          std::scoped_lock lock(mu);
          holder_token.erase(key);
        }
        EXPECT_EQ(peer.release(key, g.token).type, MessageType::kReleased);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(all_tokens.size(), server_->stats().counter(StatCounter::kGrants));
}

TEST(LeaseServerStart, BadOptionsAndAddresses) {
  auto try_start = [](LeaseServerOptions o) {
    o.log = [](std::string_view) {};
    LeaseServer s(std::move(o));
    return s.start();
  };
  LeaseServerOptions o;
  o.shards = 0;
  EXPECT_EQ(try_start(o), make_error_code(ServerError::kBadOptions));
  o = {};
  o.max_ttl = milliseconds{0};
  EXPECT_EQ(try_start(o), make_error_code(ServerError::kBadOptions));
  o = {};
  o.busy_poll = std::chrono::microseconds{-1};
  EXPECT_EQ(try_start(o), make_error_code(ServerError::kBadOptions));
  o.busy_poll = std::chrono::microseconds{10'001};
  EXPECT_EQ(try_start(o), make_error_code(ServerError::kBadOptions));
  o = {};
  o.hot_keys_per_shard = LeaseServerOptions::kMaxHotKeysPerShard + 1;
  EXPECT_EQ(try_start(o), make_error_code(ServerError::kBadOptions));
  o = {};
  o.bind_address = "no-port";
  EXPECT_EQ(try_start(o), make_error_code(ServerError::kBadAddress));
  o.bind_address = "127.0.0.1:65536";  // beyond the port range: not read as 0
  EXPECT_EQ(try_start(o), make_error_code(ServerError::kBadAddress));
  o = {};
  o.bind_address = "127.0.0.1:http";
  EXPECT_EQ(try_start(o), make_error_code(ServerError::kBadAddress));
}

// now + lock_delay used to overflow, leaving no lock-delay at all.
TEST(LeaseServerStart, LockDelayBeyondTheWireRangeIsRefused) {
  LeaseServerOptions o;
  o.log = [](std::string_view) {};
  o.lock_delay = milliseconds{std::numeric_limits<std::int64_t>::max()};
  LeaseServer huge(o);
  EXPECT_EQ(huge.start(), make_error_code(ServerError::kBadOptions));
  EXPECT_NE(huge.error_detail().find("lock_delay"), std::string::npos) << huge.error_detail();
  o.lock_delay = milliseconds{UINT32_MAX};  // the largest TTL a lease can have
  LeaseServer longest(o);
  EXPECT_FALSE(longest.start()) << longest.error_detail();
  EXPECT_EQ(longest.lock_delay(), milliseconds{UINT32_MAX});
}

// floor + token_block used to wrap: the durable mark fell below tokens
// already issued, and new tokens were issued without a durable block.
TEST(LeaseServerStart, TokenBlockThatWouldWrapTheFloorIsRefused) {
  char tmpl[] = "/tmp/shardlock-server-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  LeaseServerOptions o;
  o.log = [](std::string_view) {};
  o.io = IoBackend::kSocket;
  o.shards = 1;
  o.data_dir = std::string(tmpl) + "/data";
  {
    const auto first = start_loopback_server(o);
    ASSERT_NE(first, nullptr);  // floor 4096 from now on
  }
  o.token_block = std::numeric_limits<std::uint64_t>::max() - 100;
  {
    LeaseServer wrapping(o);
    EXPECT_EQ(wrapping.start(), make_error_code(ServerError::kBadOptions));
    EXPECT_NE(wrapping.error_detail().find("token_block"), std::string::npos)
        << wrapping.error_detail();
  }
  // A floor at the end of the token space is an error, not a wrap.
  {
    std::unique_ptr<internal::TokenStore> store;
    std::string detail;
    ASSERT_FALSE(internal::TokenStore::open(o.data_dir, store, detail)) << detail;
    ASSERT_FALSE(store->initialize(1, internal::TokenMode::kPlain,
                                   std::numeric_limits<std::uint64_t>::max() - 10,
                                   std::numeric_limits<std::uint64_t>::max() - 10, 0, detail));
  }
  o.token_block = 4096;
  {
    LeaseServer exhausted(o);
    EXPECT_TRUE(exhausted.start());
    EXPECT_NE(exhausted.error_detail().find("exhausted"), std::string::npos)
        << exhausted.error_detail();
  }
  std::filesystem::remove_all(tmpl);
}

TEST(LeaseServerStart, PortInUseIsAnError) {
  LeaseServerOptions o;
  o.log = [](std::string_view) {};
  o.io = IoBackend::kSocket;
  const auto first = start_loopback_server(o);
  ASSERT_NE(first, nullptr);
  o.bind_address = first->listen_address();
  LeaseServer second(o);
  const std::error_code ec = second.start();
  EXPECT_EQ(ec, std::errc::address_in_use);
  EXPECT_NE(second.error_detail().find("bind"), std::string::npos);
}

// A free UDP port on loopback (nothing holds it once this returns).
std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Two servers on one port would split the lease table between them (with
// SO_REUSEPORT the kernel spreads clients over both): the second must fail,
// whatever either's io_threads, and the first must keep serving.
TEST(LeaseServerStart, SecondServerOnAServedPortIsRefused) {
  for (const unsigned first_threads : {1u, 2u}) {
    for (const unsigned second_threads : {1u, 2u}) {
      for (const char* second_host : {"127.0.0.1", "0.0.0.0"}) {
        SCOPED_TRACE(std::to_string(first_threads) + " then " + std::to_string(second_threads) +
                     " thread(s), second on " + second_host);
        LeaseServerOptions o;
        o.log = [](std::string_view) {};
        o.io = IoBackend::kSocket;
        o.lock_delay = milliseconds{0};
        o.io_threads = first_threads;
        const auto first = start_loopback_server(o);
        ASSERT_NE(first, nullptr);
        o.io_threads = second_threads;
        o.bind_address = std::string(second_host) + ":" + std::to_string(first->port());
        LeaseServer second(o);
        const std::error_code ec = second.start();
        EXPECT_EQ(ec, std::errc::address_in_use) << second.error_detail();
        EXPECT_NE(second.error_detail().find(o.bind_address), std::string::npos)
            << second.error_detail();
        EXPECT_EQ(second.port(), 0);
        UdpTestPeer peer(first->port());
        EXPECT_EQ(peer.acquire("still-served", 1000).type, MessageType::kGranted);
      }
    }
  }
}

// Two servers started at the same moment on one free port: exactly one wins.
TEST(LeaseServerStart, SimultaneousStartsOnOnePortLeaveOneServer) {
  for (int round = 0; round < 20; ++round) {
    const std::string address = "127.0.0.1:" + std::to_string(free_port());
    std::vector<std::unique_ptr<LeaseServer>> servers;
    for (int i = 0; i < 2; ++i) {
      LeaseServerOptions o;
      o.log = [](std::string_view) {};
      o.io = IoBackend::kSocket;
      o.io_threads = 2;
      o.bind_address = address;
      servers.push_back(std::make_unique<LeaseServer>(o));
    }
    std::atomic<int> ready{0};
    std::error_code results[2];
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        // Relaxed: only lines the two starts up in time; join() orders the results.
        ready.fetch_add(1, std::memory_order_relaxed);
        while (ready.load(std::memory_order_relaxed) < 2) {
        }
        results[i] = servers[static_cast<std::size_t>(i)]->start();
      });
    }
    for (auto& t : threads) t.join();
    const int started = (results[0] ? 0 : 1) + (results[1] ? 0 : 1);
    EXPECT_EQ(started, 1) << address << ": " << results[0].message() << " / "
                          << results[1].message();
  }
}

// A token is only issued once its block is durable: when the data dir can no
// longer be written, ACQUIRE answers ERROR(kInternal) instead of a token.
TEST(LeaseServerStart, NoTokenWithoutADurableBlock) {
  char tmpl[] = "/tmp/shardlock-server-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/data";
  LeaseServerOptions o;
  o.io = IoBackend::kSocket;
  o.lock_delay = milliseconds{0};
  o.shards = 1;
  o.token_block = 2;
  o.data_dir = dir;
  std::vector<std::string> logs;
  std::mutex logs_mu;
  o.log = [&](std::string_view line) {
    std::scoped_lock lock(logs_mu);
    logs.emplace_back(line);
  };
  const auto server = start_loopback_server(o);
  ASSERT_NE(server, nullptr);
  UdpTestPeer peer(server->port());
  // A fresh dir: the tokens start above its wall-clock floor.
  const std::uint64_t first = server->stats().shard_tokens[0] + 1;
  for (std::uint64_t expected = first; expected <= first + 1; ++expected) {
    const Message g = peer.acquire("k", 1000);
    ASSERT_EQ(g.type, MessageType::kGranted);
    EXPECT_EQ(g.token, expected);
    ASSERT_EQ(peer.release("k", g.token).type, MessageType::kReleased);
  }
  // The block [first, first + 1] is used up; removing the directory makes
  // the next reservation fail.
  std::filesystem::remove_all(tmpl);
  const Message e = peer.acquire("k", 1000);
  ASSERT_EQ(e.type, MessageType::kError);
  EXPECT_EQ(e.error, WireError::kInternal);
  EXPECT_EQ(server->stats().shard_tokens[0], first + 1);
  server->stop();
  std::scoped_lock lock(logs_mu);
  bool logged = false;
  for (const auto& line : logs) logged |= line.find("cannot issue a token") != std::string::npos;
  EXPECT_TRUE(logged);
}

// Two servers place the same keys on different shards (a
// secret seed per start), so colliding keys cannot be prepared offline.
TEST(LeaseServerStart, KeyPlacementIsSecretPerServer) {
  const auto placement = [] {
    LeaseServerOptions o;
    o.io = IoBackend::kSocket;
    o.lock_delay = milliseconds{0};
    o.log = [](std::string_view) {};
    const auto server = start_loopback_server(o);
    std::vector<std::size_t> shards;
    if (server == nullptr) return shards;  // the test has failed
    UdpTestPeer peer(server->port());
    for (int i = 0; i < 16; ++i) {
      const ServerStats before = server->stats();
      const Message g = peer.acquire("placed/" + std::to_string(i), 1000);
      EXPECT_EQ(g.type, MessageType::kGranted);
      const ServerStats after = server->stats();
      for (std::size_t s = 0; s < after.shard_tokens.size(); ++s) {
        if (after.shard_tokens[s] != before.shard_tokens[s]) shards.push_back(s);
      }
    }
    EXPECT_EQ(shards.size(), 16u);
    return shards;
  };
  EXPECT_NE(placement(), placement());
}

// The key -> shard placement is seeded by a secret drawn
// at every start, so keys land on other shards after a restart. Their tokens
// must still rise: every shard of a new run starts above every token issued.
TEST(LeaseServerStart, TokensRiseAcrossRestartsWhateverShardAKeyLandsOn) {
  char tmpl[] = "/tmp/shardlock-server-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  LeaseServerOptions o;
  o.io = IoBackend::kSocket;
  o.lock_delay = milliseconds{0};
  o.shards = 16;
  o.token_block = 8;
  o.data_dir = std::string(tmpl) + "/data";
  o.log = [](std::string_view) {};
  std::map<std::string, std::uint64_t> last;
  for (int run = 0; run < 3; ++run) {
    const auto server = start_loopback_server(o);
    ASSERT_NE(server, nullptr);
    UdpTestPeer peer(server->port());
    for (int k = 0; k < 32; ++k) {
      const std::string key = "key-" + std::to_string(k);
      // Uneven use, so the shards' counters differ a lot.
      for (int i = 0; i <= k % 5; ++i) {
        const Message g = peer.acquire(key, 1000);
        ASSERT_EQ(g.type, MessageType::kGranted);
        EXPECT_GT(g.token, last[key]) << key << " in run " << run;
        last[key] = g.token;
        ASSERT_EQ(peer.release(key, g.token).type, MessageType::kReleased);
      }
    }
    server->stop();
  }
  std::filesystem::remove_all(tmpl);
}

// A data dir under a fresh temporary directory, removed at the end, and
// options for a socket server on it with no lock-delay.
class TempDataDir {
 public:
  TempDataDir() {
    char tmpl[] = "/tmp/shardlock-server-test-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  ~TempDataDir() { std::filesystem::remove_all(root_); }
  TempDataDir(const TempDataDir&) = delete;
  TempDataDir& operator=(const TempDataDir&) = delete;

  [[nodiscard]] LeaseServerOptions options() const {
    LeaseServerOptions o = loopback_options(/*shards=*/4);
    o.io = IoBackend::kSocket;
    o.data_dir = root_ + "/data";
    return o;
  }

 private:
  std::string root_;
};

// A gate for a one-node cluster: every bucket ours and active in `epoch`.
std::shared_ptr<const internal::ClusterGate> one_node_gate(std::uint64_t epoch) {
  Router router(RouterOptions{.bucket_bits = 8});
  const std::vector<Node> nodes = {Node{"self", 1}};
  EXPECT_EQ(router.assign(nodes), RouterStatus::kOk);
  auto gate = std::make_shared<internal::ClusterGate>();
  gate->epoch = epoch;
  gate->routing = router.snapshot();
  gate->buckets.assign(gate->routing->bucket_count(), internal::ClusterGate::kActive);
  gate->lease_deadline = [] { return std::chrono::nanoseconds::max(); };
  return gate;
}

// A data dir that never issued a token grants at once (the
// default lock-delay is 0); restarted on the same dir, the server waits its
// lock-delay out again.
TEST(LeaseServerStart, AFreshDataDirGrantsAtOnceAndARestartWaits) {
  const TempDataDir dir;
  LeaseServerOptions o = dir.options();
  o.lock_delay.reset();  // the default
  o.max_ttl = milliseconds{30'000};
  std::uint64_t token = 0;
  {
    const auto server = start_loopback_server(o);
    ASSERT_NE(server, nullptr);
    EXPECT_TRUE(server->fresh_data_dir());
    EXPECT_EQ(server->lock_delay(), milliseconds{0});
    UdpTestPeer peer(server->port());
    const Message g = peer.acquire("k", 1000);
    ASSERT_EQ(g.type, MessageType::kGranted) << "the first acquire is granted at once";
    token = g.token;
  }  // stopped with the lease held, as a kill -9 leaves it
  {
    const auto server = start_loopback_server(o);
    ASSERT_NE(server, nullptr);
    EXPECT_FALSE(server->fresh_data_dir());
    EXPECT_EQ(server->lock_delay(), milliseconds{30'000});
    UdpTestPeer peer(server->port());
    const Message r = peer.acquire("k", 1000);
    EXPECT_EQ(r.type, MessageType::kRecovering) << "a restart waits its lock-delay out";
  }
  // An explicit lock-delay is applied to a fresh dir too.
  const TempDataDir other;
  LeaseServerOptions asked = other.options();
  asked.lock_delay = milliseconds{5000};
  const auto server = start_loopback_server(asked);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(server->fresh_data_dir());
  EXPECT_EQ(server->lock_delay(), milliseconds{5000});
  EXPECT_GT(token, 0U);
}

// A data dir wiped while a client holds a lease of the old run.
// The new run cannot tell it from a new dir, so it grants at once; its
// tokens start at the wall-clock floor, above every token the old run
// issued (even one that issued many), so a fencing resource rejects the old
// holder once the new one writes. Fails if the floor is removed.
TEST(LeaseServerStart, AWipedDataDirStartsAboveEveryTokenTheOldOneIssued) {
  const TempDataDir dir;
  LeaseServerOptions o = dir.options();
  o.lock_delay.reset();
  o.token_block = 1 << 20;  // one durable block: the old run may issue a million
  std::uint64_t old_token = 0;
  {
    const auto server = start_loopback_server(o);
    ASSERT_NE(server, nullptr);
    UdpTestPeer peer(server->port());
    for (int i = 0; i < 200; ++i) {
      const Message g = peer.acquire("k", 60'000);
      ASSERT_EQ(g.type, MessageType::kGranted);
      old_token = g.token;
      if (i + 1 < 200) {
        ASSERT_EQ(peer.release("k", g.token).type, MessageType::kReleased);
      }
    }
  }  // the last lease is still held by its client when the dir is wiped
  std::filesystem::remove_all(o.data_dir);
  const auto server = start_loopback_server(o);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(server->fresh_data_dir());
  UdpTestPeer peer(server->port());
  const Message g = peer.acquire("k", 1000);
  ASSERT_EQ(g.type, MessageType::kGranted);
  EXPECT_GT(g.token, old_token) << "a wiped dir never reissues an old token";
  FencingValidator fence;
  EXPECT_TRUE(fence.check_and_advance("k", g.token));
  EXPECT_FALSE(fence.check_and_advance("k", old_token))
      << "the old holder's writes are refused once the new holder wrote";
}

// A data dir used in cluster mode (tokens epoch << 32 |
// counter) and then by a plain node must not hand out smaller tokens.
TEST(LeaseServerStart, APlainRunAfterAClusterRunStartsAboveItsTokens) {
  const TempDataDir dir;
  const LeaseServerOptions o = dir.options();
  std::uint64_t cluster_token = 0;
  {
    LeaseServerOptions c = o;
    c.start_closed = true;
    const auto server = start_loopback_server(c);
    ASSERT_NE(server, nullptr);
    EXPECT_EQ(ClusterControl(*server).token_floor(), 0u);
    ClusterControl(*server).publish_cluster_gate(one_node_gate(3));
    UdpTestPeer peer(server->port());
    const Message g = peer.acquire("k", 1000);
    ASSERT_EQ(g.type, MessageType::kGranted);
    cluster_token = g.token;
    EXPECT_EQ(cluster_token >> 32, 3u);
  }
  {
    const auto server = start_loopback_server(o);
    ASSERT_NE(server, nullptr);
    EXPECT_GE(ClusterControl(*server).token_floor(), cluster_token);
    UdpTestPeer peer(server->port());
    const Message g = peer.acquire("k", 1000);
    ASSERT_EQ(g.type, MessageType::kGranted);
    EXPECT_GT(g.token, cluster_token);
  }
}

// The other way round: a plain node whose counter passed 2^32
// joins a cluster whose epochs are small. Composing in such an epoch would go
// below its tokens: refused (RECOVERING) and a new epoch asked for, until one
// above token_floor() >> 32 comes.
TEST(LeaseServerStart, AClusterRunRefusesEpochsAtOrBelowTheTokenFloor) {
  const TempDataDir dir;
  const LeaseServerOptions o = dir.options();
  const std::uint64_t plain_high = (std::uint64_t{5} << 32) + 123;
  {
    std::unique_ptr<internal::TokenStore> store;
    std::string detail;
    ASSERT_FALSE(internal::TokenStore::open(o.data_dir, store, detail)) << detail;
    ASSERT_FALSE(
        store->initialize(4, internal::TokenMode::kPlain, plain_high, plain_high, 0, detail));
  }
  std::uint64_t plain_token = 0;
  {
    const auto server = start_loopback_server(o);
    ASSERT_NE(server, nullptr);
    UdpTestPeer peer(server->port());
    const Message g = peer.acquire("k", 1000);
    ASSERT_EQ(g.type, MessageType::kGranted);
    plain_token = g.token;
    EXPECT_GT(plain_token, plain_high);
  }
  LeaseServerOptions c = o;
  c.start_closed = true;
  const auto server = start_loopback_server(c);
  ASSERT_NE(server, nullptr);
  EXPECT_GE(ClusterControl(*server).token_floor(), plain_token);
  EXPECT_EQ(ClusterControl(*server).token_floor() >> 32, 5u);
  EXPECT_FALSE(ClusterControl(*server).needs_new_epoch());  // closed: no epoch yet
  UdpTestPeer peer(server->port());
  for (const std::uint64_t epoch : {3, 5}) {
    ClusterControl(*server).publish_cluster_gate(one_node_gate(epoch));
    EXPECT_EQ(peer.acquire("k", 1000).type, MessageType::kRecovering) << epoch;
    EXPECT_TRUE(ClusterControl(*server).needs_new_epoch()) << epoch;
  }
  ClusterControl(*server).publish_cluster_gate(one_node_gate(6));
  EXPECT_FALSE(ClusterControl(*server).needs_new_epoch());
  const Message g = peer.acquire("k", 1000);
  ASSERT_EQ(g.type, MessageType::kGranted);
  EXPECT_GT(g.token, plain_token);
  EXPECT_EQ(g.token, (std::uint64_t{6} << 32) | 1);
}

INSTANTIATE_TEST_SUITE_P(Backends, ServerTest,
                         ::testing::Values(IoBackend::kSocket, IoBackend::kUring),
                         [](const auto& param_info) {
                           return std::string(to_string(param_info.param));
                         });

}  // namespace
}  // namespace shardlock::lease
