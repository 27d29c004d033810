// The request path without sockets: datagram bytes in, reply datagrams out,
// time a number the test moves.
#include "server/dispatcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "lease/server/test_peer.h"
#include "shardlock/cluster/cluster_map.h"
#include "shardlock/lease/server/internal/cluster_gate.h"
#include "shardlock/lease/wire/auth.h"
#include "shardlock/lease/wire/internal/string_key.h"
#include "shardlock/router.h"
#include "support/shard_driver.h"

namespace shardlock::lease::internal {
namespace {

constexpr ClientId kAlice{1, 1};
constexpr ClientId kBob{2, 2};
constexpr ClientId kCarol{3, 3};

using test_support::peer_on_port;

std::uint16_t port_of(const Peer& p) { return ntohs(p.addr.v4.sin_port); }

class DispatcherTest : public ::testing::Test {
 protected:
  DispatcherTest() { make(4, std::nullopt); }

  void make(std::uint32_t shard_count, std::optional<AuthKey> key) {
    ShardLimits limits;
    limits.hash_seed = 0x1234'5678'9abcULL;
    DispatcherOptions o;
    if (key) o.tenants = std::make_shared<TenantGate>(TenantTable::single(*key), false);
    // Each reading moves the clock on by clock_step_ms_ (0: it stands
    // still), as the time a request waits between reads would.
    o.clock = [this] {
      const std::int64_t t = now_ms_;
      now_ms_ += clock_step_ms_;
      return std::chrono::milliseconds(t);
    };
    o.log = [this](std::string_view line) { log_.emplace_back(line); };
    o.key_seed = limits.hash_seed;
    o.workers = 2;
    o.replicator = replicator_;
    dispatcher_ = std::make_unique<Dispatcher>(
        std::move(o), shardlock::test_support::make_shards(shard_count, limits, now_ms_));
  }

  // Messages view their key: keys made here live as long as the test.
  Message request(MessageType type, std::string key, std::uint64_t request_id) {
    Message m;
    m.type = type;
    m.key = keys_.emplace_back(std::move(key));
    m.request_id = request_id;
    m.ttl_ms = 1000;
    return m;
  }

  // The datagram of `items` from `client`, padded for their answers unless
  // told otherwise, sealed under key_ if asked.
  std::vector<std::uint8_t> encoded(const ClientId& client, const std::vector<Message>& items,
                                    bool pad = true, bool seal = false) {
    Datagram d;
    d.client_id = client;
    d.request_id = items.front().request_id;
    for (const Message& m : items) EXPECT_TRUE(d.push(m));
    std::vector<std::uint8_t> buffer(kMaxDatagramSize);
    std::size_t n = 0;
    const auto out = std::span(buffer).first(buffer.size() - (seal ? kAuthTagSize : 0));
    EXPECT_EQ(pad ? encode_request(d, out, n) : encode(d, out, n), ProtocolError::kOk);
    if (seal) n = seal_datagram(buffer, n, key_);
    buffer.resize(n);
    return buffer;
  }

  // Hands the datagram of `items` to the dispatcher; returns what it sent.
  std::vector<OutDatagram> send(const ClientId& client, const std::vector<Message>& items,
                                const Peer& from, bool pad = true, bool seal = false) {
    const std::vector<std::uint8_t> bytes = encoded(client, items, pad, seal);
    last_sent_ = bytes.size();
    return handle(bytes, from);
  }

  std::vector<OutDatagram> handle(std::span<const std::uint8_t> bytes, const Peer& from) {
    std::vector<OutDatagram> replies;
    dispatcher_->handle(0, bytes, from, replies);
    return replies;
  }

  static Datagram decoded(const OutDatagram& o) {
    Datagram d;
    EXPECT_EQ(decode({o.bytes.data(), o.length}, d), ProtocolError::kOk);
    return d;
  }

  // `out` is one reply datagram holding one ERROR(`error`).
  static void expect_one_error(const std::vector<OutDatagram>& out, WireError error) {
    ASSERT_EQ(out.size(), 1u);
    const Datagram r = decoded(out[0]);
    ASSERT_EQ(r.count, 1);
    EXPECT_EQ(r.messages[0].type, MessageType::kError);
    EXPECT_EQ(r.messages[0].error, error);
  }

  // The STATS_REPLY datagram a STATS from carol gets (empty if none came).
  // Its views stay valid for the rest of the test.
  Datagram stats_reply(std::uint64_t request_id) {
    Message stats;
    stats.type = MessageType::kStats;
    stats.request_id = request_id;
    const auto out = send(kCarol, {stats}, carol_);
    EXPECT_EQ(out.size(), 1u);
    return out.size() == 1 ? decoded(kept_.emplace_back(out[0])) : Datagram{};
  }

  std::uint64_t counter(StatCounter c) const {
    return dispatcher_->stats().counters[static_cast<std::size_t>(c)];
  }

  // ACQUIRE_MANY of `keys`; the list's bytes live as long as the test.
  Message many(const std::vector<std::string>& keys, std::uint64_t request_id,
               std::uint32_t wait_ms = 0, LeaseMode mode = LeaseMode::kExclusive) {
    std::vector<std::string_view> views;
    for (const std::string& k : keys) views.push_back(keys_.emplace_back(k));
    std::vector<std::uint8_t>& list = lists_.emplace_back();
    EXPECT_TRUE(encode_key_list(views, list));
    Message m;
    m.type = MessageType::kAcquireMany;
    m.request_id = request_id;
    m.mode = mode;
    m.ttl_ms = 1000;
    m.wait_ms = wait_ms;
    m.key_count = static_cast<std::uint8_t>(keys.size());
    m.key_list = list;
    return m;
  }
  // The one message of the one reply in `out` sent to `to`.
  // Its views stay valid for the rest of the test.
  Message only_reply_to(const std::vector<OutDatagram>& out, const Peer& to) {
    Message found;
    int n = 0;
    for (const OutDatagram& o : out) {
      if (port_of(o.peer) != port_of(to)) continue;
      const Datagram d = decoded(kept_.emplace_back(o));
      EXPECT_EQ(d.count, 1);
      found = d.messages[0];
      ++n;
    }
    EXPECT_EQ(n, 1) << "replies to port " << port_of(to);
    return found;
  }
  // Single ACQUIREs of `key` by `client` (no wait): the reply type.
  MessageType try_single(const ClientId& client, const std::string& key, std::uint64_t id) {
    const auto out = send(client, {request(MessageType::kAcquire, key, id)}, carol_);
    return out.size() == 1 ? decoded(out[0]).messages[0].type : MessageType::kStats;
  }
  bool held(const std::string& key) {
    const auto out = send(kBob, {request(MessageType::kQuery, key, ++query_id_)}, carol_);
    return out.size() == 1 && decoded(out[0]).messages[0].held;
  }
  std::uint64_t single_token(const ClientId& client, const std::string& key, std::uint64_t id,
                             const Peer& from) {
    const auto out = send(client, {request(MessageType::kAcquire, key, id)}, from);
    EXPECT_EQ(out.size(), 1u);
    EXPECT_EQ(decoded(out[0]).messages[0].type, MessageType::kGranted);
    return decoded(out[0]).messages[0].token;
  }
  std::vector<OutDatagram> release_key(const ClientId& client, const std::string& key,
                                       std::uint64_t token, std::uint64_t id, const Peer& from) {
    Message m = request(MessageType::kRelease, key, id);
    m.token = token;
    return send(client, {m}, from);
  }
  // QUERY_HOLDERS of `key` from `first`, padded to `pad_to` bytes (at
  // least its bound); the reply's views stay valid for the test.
  Message holders_page(const std::string& key, std::uint32_t first,
                       std::size_t pad_to = kMaxDatagramSize) {
    Message m = request(MessageType::kQueryHolders, key, ++query_id_);
    m.first_holder = first;
    Datagram d;
    d.client_id = kCarol;
    d.request_id = m.request_id;
    EXPECT_TRUE(d.push(m));
    std::vector<std::uint8_t> bytes(kMaxDatagramSize);
    std::size_t n = 0;
    EXPECT_EQ(encode(d, bytes, n, std::max(pad_to, max_reply_size(d))), ProtocolError::kOk);
    bytes.resize(n);
    const auto out = handle(bytes, carol_);
    for (const OutDatagram& o : out) EXPECT_LE(o.length, n);  // never amplified
    return only_reply_to(out, carol_);
  }
  // Keys that land on at least two shards.
  std::vector<std::string> spread_keys(std::size_t n) {
    std::vector<std::string> keys;
    std::set<std::size_t> shards;
    for (int i = 0; keys.size() < n || shards.size() < 2; ++i) {
      keys.push_back("key-" + std::to_string(i));
      shards.insert(dispatcher_->shard_of(keys.back()));
      if (keys.size() > n) keys.erase(keys.begin());
    }
    return keys;
  }

  std::int64_t now_ms_ = 1'000'000;
  std::int64_t clock_step_ms_ = 0;
  std::size_t last_sent_ = 0;  // bytes of the last datagram send() handed over
  AuthKey key_ = generate_auth_key();
  std::vector<std::string> log_;
  std::deque<std::string> keys_;
  std::deque<std::vector<std::uint8_t>> lists_;
  std::deque<OutDatagram> kept_;  // replies whose messages a test still views
  std::uint64_t query_id_ = 9000;
  Replicator* replicator_ = nullptr;  // make()'s, when a test sets one
  std::unique_ptr<Dispatcher> dispatcher_;
  const Peer alice_ = peer_on_port(1001);
  const Peer bob_ = peer_on_port(1002);
  const Peer carol_ = peer_on_port(1003);
};

TEST_F(DispatcherTest, GrantsAndRefusesWithRepliesToTheSender) {
  auto out = send(kAlice, {request(MessageType::kAcquire, "k", 1)}, alice_);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(port_of(out[0].peer), 1001);
  Datagram r = decoded(out[0]);
  ASSERT_EQ(r.count, 1);
  EXPECT_EQ(r.client_id, kAlice);
  EXPECT_EQ(r.messages[0].type, MessageType::kGranted);
  EXPECT_EQ(r.messages[0].request_id, 1u);
  EXPECT_GT(r.messages[0].token, 0u);

  out = send(kBob, {request(MessageType::kAcquire, "k", 7)}, bob_);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(port_of(out[0].peer), 1002);
  EXPECT_EQ(decoded(out[0]).messages[0].type, MessageType::kBusy);
  EXPECT_EQ(counter(StatCounter::kGrants), 1u);
  EXPECT_EQ(counter(StatCounter::kBusy), 1u);
}

TEST_F(DispatcherTest, AReleaseHandsTheKeyToTheWaiterInItsOwnDatagram) {
  const auto granted = send(kAlice, {request(MessageType::kAcquire, "k", 1)}, alice_);
  const std::uint64_t token = decoded(granted[0]).messages[0].token;
  Message wait = request(MessageType::kAcquire, "k", 5);
  wait.wait_ms = 5000;
  EXPECT_TRUE(send(kBob, {wait}, bob_).empty());  // queued: no answer yet

  Message release = request(MessageType::kRelease, "k", 2);
  release.token = token;
  const auto out = send(kAlice, {release}, alice_);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(port_of(out[0].peer), 1001);
  EXPECT_EQ(decoded(out[0]).messages[0].type, MessageType::kReleased);
  EXPECT_EQ(port_of(out[1].peer), 1002);
  const Datagram handed = decoded(out[1]);
  EXPECT_EQ(handed.client_id, kBob);
  EXPECT_EQ(handed.messages[0].type, MessageType::kGranted);
  EXPECT_EQ(handed.messages[0].request_id, 5u);
  EXPECT_GT(handed.messages[0].token, token);
}

TEST_F(DispatcherTest, TickExpiresLeasesOnTheShardsTheWorkerOwns) {
  Message a = request(MessageType::kAcquire, "k", 1);
  a.ttl_ms = 100;
  (void)send(kAlice, {a}, alice_);
  Message wait = request(MessageType::kAcquire, "k", 5);
  wait.wait_ms = 5000;
  EXPECT_TRUE(send(kBob, {wait}, bob_).empty());

  now_ms_ += 200;
  std::vector<OutDatagram> out;
  for (unsigned worker = 0; worker < 2; ++worker) dispatcher_->tick(worker, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(port_of(out[0].peer), 1002);
  EXPECT_EQ(decoded(out[0]).messages[0].type, MessageType::kGranted);
  EXPECT_EQ(counter(StatCounter::kExpirations), 1u);
}

TEST_F(DispatcherTest, MalformedDatagramsAreCountedAndNotAnswered) {
  const std::vector<std::uint8_t> junk = {'n', 'o', 't', ' ', 'a', ' ', 'd', 'a', 't', 'a'};
  EXPECT_TRUE(handle(junk, alice_).empty());
  EXPECT_TRUE(handle({}, alice_).empty());
  dispatcher_->count_oversized();
  EXPECT_EQ(counter(StatCounter::kMalformed), 3u);
}

TEST_F(DispatcherTest, AnotherVersionGetsAnErrorInOurs) {
  std::vector<std::uint8_t> bytes = encoded(kAlice, {request(MessageType::kQuery, "k", 3)});
  bytes[4] = kProtocolVersion + 1;  // header byte 4: the version
  const auto out = handle(bytes, alice_);
  expect_one_error(out, WireError::kUnsupportedVersion);
  EXPECT_EQ(counter(StatCounter::kErrors), 1u);
}

TEST_F(DispatcherTest, UnpaddedRequestsAreRefusedAndCounted) {
  const auto out = send(kAlice, {request(MessageType::kAcquire, "k", 9)}, alice_, /*pad=*/false);
  expect_one_error(out, WireError::kRequestTooSmall);
  EXPECT_EQ(counter(StatCounter::kErrors), 1u);
  EXPECT_EQ(counter(StatCounter::kGrants), 0u);
}

TEST_F(DispatcherTest, NoSourceGetsMoreReplyBytesThanItSent) {
  // A holder, then a padded batch of waiting ACQUIREs: its immediate reply
  // and the later hand-off answers together stay within its bytes.
  const auto granted = send(kAlice, {request(MessageType::kAcquire, "k", 1)}, alice_);
  std::vector<Message> batch;
  for (std::uint64_t i = 0; i < 6; ++i) {
    Message m = request(MessageType::kAcquire, i == 0 ? "k" : "k" + std::to_string(i), 10 + i);
    m.wait_ms = 5000;
    batch.push_back(m);
  }
  std::size_t replied = 0;
  for (const OutDatagram& o : send(kBob, batch, bob_)) replied += o.length;
  const std::size_t request_bytes = last_sent_;
  Message release = request(MessageType::kRelease, "k", 2);
  release.token = decoded(granted[0]).messages[0].token;
  for (const OutDatagram& o : send(kAlice, {release}, alice_)) {
    if (port_of(o.peer) == 1002) replied += o.length;
  }
  EXPECT_GT(replied, 0u);
  EXPECT_LE(replied, request_bytes);
  EXPECT_EQ(counter(StatCounter::kAmplificationDrops), 0u);
}

TEST_F(DispatcherTest, ReplyTypesSentToTheServerAreNotRequests) {
  const auto out = send(kAlice, {request(MessageType::kGranted, "k", 4)}, alice_);
  expect_one_error(out, WireError::kNotARequest);
  EXPECT_EQ(counter(StatCounter::kErrors), 1u);
}

TEST_F(DispatcherTest, StatsCarryTheDispatchersOwnCounters) {
  dispatcher_->count_send_drop();
  dispatcher_->count_send_drop();
  const Datagram r = stats_reply(11);
  ASSERT_EQ(r.messages[0].type, MessageType::kStatsReply);
  EXPECT_EQ(r.messages[0].shard_count, 4u);
  EXPECT_EQ(r.messages[0].counter(StatCounter::kSendDrops), 2u);
  EXPECT_EQ(to_string(StatCounter::kSendDrops), "send_drops");
}

// STATS' gauges: what is held and queued now, the time since the
// dispatcher was made, the lock-delay left and the version.
TEST_F(DispatcherTest, StatsCarryTheGauges) {
  now_ms_ += 1500;
  (void)send(kAlice, {request(MessageType::kAcquire, "g/a", 1)}, alice_);
  (void)send(kAlice, {request(MessageType::kAcquireShared, "g/b", 2)}, alice_);
  (void)send(kBob, {request(MessageType::kAcquireShared, "g/b", 3)}, bob_);
  Message waits = request(MessageType::kAcquire, "g/a", 4);
  waits.wait_ms = 5000;
  EXPECT_TRUE(send(kBob, {waits}, bob_).empty());  // queued
  const Datagram r = stats_reply(12);
  const Message& m = r.messages[0];
  ASSERT_EQ(m.type, MessageType::kStatsReply);
  EXPECT_EQ(m.counters_le.size(), 8 * kStatCounterCount);
  EXPECT_EQ(m.counter(StatCounter::kLeases), 3u);
  EXPECT_EQ(m.counter(StatCounter::kKeys), 2u);
  EXPECT_EQ(m.counter(StatCounter::kWaiters), 1u);
  EXPECT_EQ(m.counter(StatCounter::kUptimeMs), 1500u);
  EXPECT_EQ(m.counter(StatCounter::kLockDelayLeftMs), 0u);
  EXPECT_NE(version_text(m.counter(StatCounter::kVersion)), "");
  const ServerStats s = dispatcher_->stats();
  EXPECT_EQ(s.leases, 3u);
  EXPECT_EQ(s.keys, 2u);
  EXPECT_EQ(s.waiters, 1u);
  EXPECT_EQ(s.counter(StatCounter::kUptimeMs), 1500u);
}

// HOT_KEYS: every shard's busiest keys, most requests first, with BUSY
// answers, holders and waiters now, as many as the request's padding pays
// for; the window is the time since the dispatcher started.
TEST_F(DispatcherTest, HotKeysListTheBusiestKeysOfEveryShard) {
  std::uint64_t id = 100;
  for (int i = 0; i < 6; ++i)
    (void)send(kAlice, {request(MessageType::kAcquire, "hot/a", ++id)}, alice_);
  for (int i = 0; i < 3; ++i)
    (void)send(kBob, {request(MessageType::kAcquire, "hot/a", ++id)}, bob_);
  Message waits = request(MessageType::kAcquire, "hot/a", ++id);
  waits.wait_ms = 5000;
  EXPECT_TRUE(send(kCarol, {waits}, carol_).empty());  // queued
  for (int i = 0; i < 4; ++i) (void)send(kBob, {request(MessageType::kQuery, "hot/b", ++id)}, bob_);
  (void)send(kBob, {request(MessageType::kRelease, "hot/c", ++id)}, bob_);
  now_ms_ += 2000;

  Message hot;
  hot.type = MessageType::kHotKeys;
  hot.request_id = 7;
  Datagram d;
  d.client_id = kCarol;
  d.request_id = 7;
  ASSERT_TRUE(d.push(hot));
  std::vector<std::uint8_t> padded(kMaxDatagramSize);
  std::size_t n = 0;
  ASSERT_EQ(encode(d, padded, n, kMaxDatagramSize), ProtocolError::kOk);
  const auto out = handle(padded, carol_);
  ASSERT_EQ(out.size(), 1u);
  const Datagram r = decoded(out[0]);
  const Message& m = r.messages[0];
  ASSERT_EQ(m.type, MessageType::kHotKeysReply);
  EXPECT_EQ(m.window_ms, 2000u);  // no half-life boundary passed since it started
  const std::vector<HotKeyEntry> keys(HotKeyList(m).begin(), HotKeyList(m).end());
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(keys[0].key, "hot/a");
  EXPECT_EQ(keys[0].requests, 10u);
  EXPECT_EQ(keys[0].error, 0u);
  // Every acquire but alice's first: bob's, and alice's own later ones (an
  // owner's new request for a key it holds is a contender).
  EXPECT_EQ(keys[0].busy, 8u);
  EXPECT_EQ(keys[0].holders, 1u);
  EXPECT_EQ(keys[0].waiters, 1u);
  EXPECT_EQ(keys[1].key, "hot/b");
  EXPECT_EQ(keys[1].requests, 4u);
  EXPECT_EQ(keys[1].holders, 0u);
  EXPECT_EQ(keys[2].key, "hot/c");

  // ACQUIRE_MANY's keys count too, the one BUSY_MANY names as busy.
  (void)send(kBob, {many({"hot/c", "hot/a"}, ++id)}, bob_);
  const auto again = handle(padded, carol_);
  ASSERT_EQ(again.size(), 1u);
  const Datagram r2 = decoded(again[0]);
  const std::vector<HotKeyEntry> after(HotKeyList(r2.messages[0]).begin(),
                                       HotKeyList(r2.messages[0]).end());
  ASSERT_EQ(after.size(), 3u);
  EXPECT_EQ(after[0].key, "hot/a");
  EXPECT_EQ(after[0].requests, 11u);
  EXPECT_EQ(after[0].busy, 9u);
  EXPECT_EQ(after[2].key, "hot/c");
  EXPECT_EQ(after[2].requests, 2u);
  EXPECT_EQ(after[2].busy, 0u);

  // Padded only to the bound, the reply carries no keys.
  const auto bare = send(kCarol, {hot}, carol_);
  ASSERT_EQ(bare.size(), 1u);
  EXPECT_EQ(decoded(bare[0]).messages[0].hot_key_count, 0);
}

TEST_F(DispatcherTest, KeysSpreadOverShardsAndStayOnTheirShard) {
  std::set<std::size_t> used;
  for (int i = 0; i < 200; ++i) {
    const std::string key = "key-" + std::to_string(i);
    const std::size_t s = dispatcher_->shard_of(key);
    ASSERT_LT(s, dispatcher_->shard_count());
    EXPECT_EQ(dispatcher_->shard_of(key), s);
    used.insert(s);
  }
  EXPECT_EQ(used.size(), 4u);
  // Every grant landed on the key's shard: its counter moved, no other.
  for (int i = 0; i < 8; ++i) {
    (void)send(kAlice, {request(MessageType::kAcquire, "key-" + std::to_string(i), 100 + i)},
               alice_);
  }
  const ServerStats s = dispatcher_->stats();
  std::uint64_t tokens = 0;
  for (const std::uint64_t t : s.shard_tokens) tokens += t;
  EXPECT_EQ(tokens, 8u);  // each shard issued one token per key it holds
}

TEST_F(DispatcherTest, SealedTrafficOnlyWithTheKey) {
  make(2, key_);
  // Unsealed: dropped and counted.
  EXPECT_TRUE(send(kAlice, {request(MessageType::kAcquire, "k", 1)}, alice_).empty());
  EXPECT_EQ(counter(StatCounter::kAuthFailures), 1u);
  // Sealed: answered, and the answer is sealed.
  const auto out =
      send(kAlice, {request(MessageType::kAcquire, "k", 2)}, alice_, /*pad=*/true, /*seal=*/true);
  ASSERT_EQ(out.size(), 1u);
  const auto opened = open_datagram({out[0].bytes.data(), out[0].length}, key_);
  ASSERT_FALSE(opened.empty());
  Datagram r;
  ASSERT_EQ(decode(opened, r), ProtocolError::kOk);
  EXPECT_EQ(r.messages[0].type, MessageType::kGranted);
}

TEST_F(DispatcherTest, ASealedDatagramToAServerWithoutAKeyIsRejected) {
  const auto bytes = encoded(kAlice, {request(MessageType::kAcquire, "k", 1)}, true, true);
  EXPECT_TRUE(handle(bytes, alice_).empty());
  EXPECT_EQ(counter(StatCounter::kAuthFailures), 1u);
}

// ---- ACQUIRE_MANY ------------------------------------------------------------

TEST_F(DispatcherTest, QueryHoldersListsEverySharedHolderOldestFirst) {
  const ClientId owners[] = {kAlice, kBob, ClientId{7, 8}};
  std::vector<std::uint64_t> tokens;
  for (std::size_t i = 0; i < std::size(owners); ++i) {
    Message m = request(MessageType::kAcquireShared, "k", 10 + i);
    m.ttl_ms = 1000 + 100 * static_cast<std::uint32_t>(i);
    const Message granted = only_reply_to(send(owners[i], {m}, alice_), alice_);
    ASSERT_EQ(granted.type, MessageType::kGranted);
    tokens.push_back(granted.token);
  }
  Message waiting = request(MessageType::kAcquire, "k", 20);
  waiting.wait_ms = 5000;
  EXPECT_TRUE(send(kCarol, {waiting}, bob_).empty());  // queued behind the readers
  now_ms_ += 250;

  const Message r = holders_page("k", 0);
  ASSERT_EQ(r.type, MessageType::kHoldersReply);
  EXPECT_EQ(r.key, "k");
  EXPECT_EQ(r.mode, LeaseMode::kShared);
  EXPECT_EQ(r.holders, 3u);
  EXPECT_EQ(r.waiters, 1u);
  EXPECT_EQ(r.permits, 0u);
  EXPECT_EQ(r.first_holder, 0u);
  ASSERT_EQ(r.holder_list_count, 3u);
  std::size_t i = 0;
  for (const HolderEntry& h : HolderList(r)) {
    EXPECT_EQ(h.owner, owners[i]);
    EXPECT_EQ(h.token, tokens[i]);
    EXPECT_EQ(h.ttl_left_ms, 1000 + 100 * i - 250);
    EXPECT_EQ(h.flags, 0);
    EXPECT_TRUE(h.value.empty());
    ++i;
  }
  EXPECT_EQ(i, 3u);
  // From the second holder on.
  const Message rest = holders_page("k", 1);
  ASSERT_EQ(rest.holder_list_count, 2u);
  EXPECT_EQ(HolderList(rest).begin()->owner, kBob);
}

// An ACQUIRE's value stays with its holder: listed by
// QUERY_HOLDERS, kept by renewals, and a queued ACQUIRE's comes with the
// key when it is handed over.
TEST_F(DispatcherTest, AHolderValueIsListedKeptByRenewalsAndHandedOver) {
  Message first = request(MessageType::kAcquire, "v", 1);
  first.value = "alice:7420 pid 1";
  const Message granted = only_reply_to(send(kAlice, {first}, alice_), alice_);
  ASSERT_EQ(granted.type, MessageType::kGranted);
  Message queued = request(MessageType::kAcquire, "v", 2);
  queued.wait_ms = 5000;
  queued.value = "bob:7420 pid 2";
  EXPECT_TRUE(send(kBob, {queued}, bob_).empty());

  const auto value_of_first = [&] {
    const Message r = holders_page("v", 0);
    return r.holder_list_count == 1 ? std::string(HolderList(r).begin()->value) : std::string();
  };
  EXPECT_EQ(value_of_first(), "alice:7420 pid 1");
  Message renew = request(MessageType::kRenew, "v", 3);
  renew.token = granted.token;
  ASSERT_EQ(only_reply_to(send(kAlice, {renew}, alice_), alice_).type, MessageType::kRenewed);
  EXPECT_EQ(value_of_first(), "alice:7420 pid 1");

  const auto out = release_key(kAlice, "v", granted.token, 4, alice_);
  EXPECT_EQ(only_reply_to(out, bob_).type, MessageType::kGranted);
  const Message r = holders_page("v", 0);
  ASSERT_EQ(r.holder_list_count, 1u);
  EXPECT_EQ(HolderList(r).begin()->owner, kBob);
  EXPECT_EQ(HolderList(r).begin()->value, "bob:7420 pid 2");
  // A holder without a value lists an empty one.
  (void)single_token(kCarol, "plain", 5, carol_);
  EXPECT_TRUE(HolderList(holders_page("plain", 0)).begin()->value.empty());
}

TEST_F(DispatcherTest, QueryHoldersOfAFreeKeyListsNobody) {
  const Message r = holders_page("free", 0);
  ASSERT_EQ(r.type, MessageType::kHoldersReply);
  EXPECT_EQ(r.holders, 0u);
  EXPECT_EQ(r.waiters, 0u);
  EXPECT_EQ(r.holder_list_count, 0u);
  // A key released is free again.
  const std::uint64_t token = single_token(kAlice, "free", 1, alice_);
  EXPECT_EQ(holders_page("free", 0).holders, 1u);
  release_key(kAlice, "free", token, 2, alice_);
  EXPECT_EQ(holders_page("free", 0).holders, 0u);
}

// A semaphore with more holders than a datagram holds: pages of whole
// entries, each within the request's bytes, that together list every holder
// once in grant order; a page past the end is empty with the totals.
TEST_F(DispatcherTest, QueryHoldersPagesManyHolders) {
  constexpr std::uint32_t kHolders = 150;
  std::vector<std::uint64_t> tokens;
  for (std::uint32_t i = 0; i < kHolders; ++i) {
    Message m = request(MessageType::kAcquirePermit, "sem", 1);
    m.permits = kHolders;
    const Message granted = only_reply_to(send(ClientId{100 + i, 1}, {m}, alice_), alice_);
    ASSERT_EQ(granted.type, MessageType::kGranted);
    tokens.push_back(granted.token);
  }
  std::vector<std::uint64_t> listed;
  std::size_t pages = 0;
  while (listed.size() < kHolders && pages < kHolders) {
    const Message r = holders_page("sem", static_cast<std::uint32_t>(listed.size()));
    ASSERT_EQ(r.type, MessageType::kHoldersReply);
    EXPECT_EQ(r.mode, LeaseMode::kPermit);
    EXPECT_EQ(r.permits, kHolders);
    EXPECT_EQ(r.holders, kHolders);
    ASSERT_GT(r.holder_list_count, 0u);
    for (const HolderEntry& h : HolderList(r)) {
      EXPECT_EQ(h.owner, (ClientId{100 + listed.size(), 1}));
      listed.push_back(h.token);
    }
    ++pages;
  }
  EXPECT_EQ(listed, tokens);
  EXPECT_GT(pages, 2u);  // it did page
  const Message past = holders_page("sem", kHolders);
  EXPECT_EQ(past.holders, kHolders);
  EXPECT_EQ(past.first_holder, kHolders);
  EXPECT_EQ(past.holder_list_count, 0u);
  const Message far = holders_page("sem", 0xFFFFFFFF);
  EXPECT_EQ(far.holder_list_count, 0u);
  // Padded only to its bound: the totals, and no holder it did not pay for.
  const Message unpaid = holders_page("sem", 0, 0);
  EXPECT_EQ(unpaid.holders, kHolders);
  EXPECT_EQ(unpaid.holder_list_count, 0u);
}

// Two QUERY_HOLDERS in one datagram: the padding pays one page, so the
// second gets the totals alone, and both answers fit the request.
TEST_F(DispatcherTest, OneHolderPagePerDatagram) {
  (void)single_token(kAlice, "a", 1, alice_);
  (void)single_token(kAlice, "b", 2, alice_);
  Datagram d;
  d.client_id = kCarol;
  d.request_id = 77;
  d.batch = true;
  for (const char* key : {"a", "b"}) {
    Message m = request(MessageType::kQueryHolders, key, ++query_id_);
    EXPECT_TRUE(d.push(m));
  }
  std::vector<std::uint8_t> bytes(kMaxDatagramSize);
  std::size_t n = 0;
  ASSERT_EQ(encode(d, bytes, n, kMaxDatagramSize), ProtocolError::kOk);
  bytes.resize(n);
  const auto out = handle(bytes, carol_);
  ASSERT_EQ(out.size(), 1u);
  const Datagram r = decoded(out[0]);
  ASSERT_EQ(r.count, 2);
  EXPECT_EQ(r.messages[0].holder_list_count, 1u);
  EXPECT_EQ(HolderList(r.messages[0]).begin()->owner, kAlice);
  EXPECT_EQ(r.messages[1].holders, 1u);
  EXPECT_EQ(r.messages[1].holder_list_count, 0u);
}

TEST_F(DispatcherTest, AcquireManyGrantsEveryKeyWithItsOwnToken) {
  const std::vector<std::string> keys = spread_keys(6);
  const Message granted = only_reply_to(send(kAlice, {many(keys, 1)}, alice_), alice_);
  ASSERT_EQ(granted.type, MessageType::kGrantedMany);
  ASSERT_EQ(granted.listed_token_count(), keys.size());
  // Tokens count per shard: distinct among the keys of one shard.
  std::set<std::pair<std::size_t, std::uint64_t>> tokens;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_GT(granted.listed_token(i), 0u);
    tokens.emplace(dispatcher_->shard_of(keys[i]), granted.listed_token(i));
  }
  EXPECT_EQ(tokens.size(), keys.size());
  // Each key is held, by Alice, with the token in its place of the list.
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(try_single(kBob, keys[i], 100 + i), MessageType::kBusy) << keys[i];
    const Message released = only_reply_to(
        release_key(kAlice, keys[i], granted.listed_token(i), 200 + i, alice_), alice_);
    EXPECT_EQ(released.type, MessageType::kReleased) << keys[i];
  }
  EXPECT_EQ(counter(StatCounter::kGrants), keys.size());
}

TEST_F(DispatcherTest, AcquireManyIsAllOrNothingAndNamesTheBusyKey) {
  const std::vector<std::string> keys = spread_keys(4);
  (void)single_token(kBob, keys[2], 1, bob_);
  const Message busy = only_reply_to(send(kAlice, {many(keys, 2)}, alice_), alice_);
  ASSERT_EQ(busy.type, MessageType::kBusyMany);
  EXPECT_EQ(busy.index, 2);
  EXPECT_GT(busy.ttl_ms, 0u);
  // Alice holds none of the others: Carol takes each at once.
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i == 2) continue;
    EXPECT_FALSE(held(keys[i])) << keys[i];
    EXPECT_EQ(try_single(kCarol, keys[i], 10 + i), MessageType::kGranted) << keys[i];
  }
}

TEST_F(DispatcherTest, AWaitingAcquireManyIsGrantedWhenTheLastBusyKeyIsReleased) {
  const std::vector<std::string> keys = spread_keys(3);
  const std::uint64_t bob_token = single_token(kBob, keys[1], 1, bob_);
  EXPECT_TRUE(send(kAlice, {many(keys, 2, 5000)}, alice_).empty());  // queued
  EXPECT_TRUE(held(keys[1]));
  // A retransmission while it waits is not taken twice, nor answered.
  EXPECT_TRUE(send(kAlice, {many(keys, 2, 5000)}, alice_).empty());

  const auto out = release_key(kBob, keys[1], bob_token, 3, bob_);
  EXPECT_EQ(only_reply_to(out, bob_).type, MessageType::kReleased);
  const Message granted = only_reply_to(out, alice_);
  ASSERT_EQ(granted.type, MessageType::kGrantedMany);
  ASSERT_EQ(granted.listed_token_count(), 3u);
  EXPECT_GT(granted.listed_token(1), bob_token);
  for (const std::string& k : keys) EXPECT_EQ(try_single(kCarol, k, 50), MessageType::kBusy);

  // A retransmission after the grant gets the same tokens.
  const Message again = only_reply_to(send(kAlice, {many(keys, 2, 5000)}, alice_), alice_);
  ASSERT_EQ(again.type, MessageType::kGrantedMany);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(again.listed_token(i), granted.listed_token(i));
  // The same request id for other keys is refused.
  const Message reused =
      only_reply_to(send(kAlice, {many({keys[0], "other"}, 2, 5000)}, alice_), alice_);
  EXPECT_EQ(reused.type, MessageType::kError);
  EXPECT_EQ(reused.error, WireError::kRequestIdReused);
}

TEST_F(DispatcherTest, AnAcquireManyThatTimesOutHoldsNothing) {
  const std::vector<std::string> keys = spread_keys(5);
  (void)single_token(kBob, keys[3], 1, bob_);
  EXPECT_TRUE(send(kAlice, {many(keys, 2, 100)}, alice_).empty());
  now_ms_ += 150;
  std::vector<OutDatagram> out;
  for (unsigned worker = 0; worker < 2; ++worker) dispatcher_->tick(worker, out);
  const Message timeout = only_reply_to(out, alice_);
  EXPECT_EQ(timeout.type, MessageType::kTimeout);
  EXPECT_TRUE(timeout.key.empty());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(held(keys[i]), i == 3) << keys[i];
  }
}

// Alice asks for {x, y} and Bob for {y, x} while Carol holds both. Taken in
// the order each request lists them, Alice could hold x waiting for y while
// Bob holds y waiting for x, forever; in the global order both are granted,
// one after the other. (Without it this test ends with a request that is
// never answered.)
TEST_F(DispatcherTest, OverlappingAcquireManysInOppositeOrdersDoNotDeadlock) {
  const std::vector<std::string> keys = spread_keys(2);
  const std::uint64_t cx = single_token(kCarol, keys[0], 1, carol_);
  const std::uint64_t cy = single_token(kCarol, keys[1], 2, carol_);
  EXPECT_TRUE(send(kAlice, {many({keys[0], keys[1]}, 3, 60'000)}, alice_).empty());
  EXPECT_TRUE(send(kBob, {many({keys[1], keys[0]}, 4, 60'000)}, bob_).empty());

  std::vector<OutDatagram> out = release_key(kCarol, keys[1], cy, 5, carol_);
  const auto more = release_key(kCarol, keys[0], cx, 6, carol_);
  out.insert(out.end(), more.begin(), more.end());
  // Exactly one of them now holds both keys; the other still waits.
  std::size_t granted_to_alice = 0;
  std::size_t granted_to_bob = 0;
  Message first;
  for (const OutDatagram& o : out) {
    const Message m = decoded(kept_.emplace_back(o)).messages[0];
    if (m.type != MessageType::kGrantedMany) continue;
    (port_of(o.peer) == 1001 ? granted_to_alice : granted_to_bob) += 1;
    first = m;
    ASSERT_EQ(m.listed_token_count(), 2u);
  }
  ASSERT_EQ(granted_to_alice + granted_to_bob, 1u);
  const bool alice_first = granted_to_alice == 1;
  const ClientId winner = alice_first ? kAlice : kBob;
  const Peer& winner_peer = alice_first ? alice_ : bob_;
  const Peer& loser_peer = alice_first ? bob_ : alice_;
  // Alice listed {x, y}, Bob {y, x}: map the tokens back to keys.
  const std::uint64_t tx = alice_first ? first.listed_token(0) : first.listed_token(1);
  const std::uint64_t ty = alice_first ? first.listed_token(1) : first.listed_token(0);
  out = release_key(winner, keys[0], tx, 7, winner_peer);
  const auto rest = release_key(winner, keys[1], ty, 8, winner_peer);
  out.insert(out.end(), rest.begin(), rest.end());
  std::size_t second = 0;
  for (const OutDatagram& o : out) {
    if (port_of(o.peer) == port_of(loser_peer) &&
        decoded(o).messages[0].type == MessageType::kGrantedMany) {
      ++second;
    }
  }
  EXPECT_EQ(second, 1u);
}

TEST_F(DispatcherTest, SharedAcquireManysShareAndExcludeWriters) {
  const std::vector<std::string> keys = spread_keys(2);
  EXPECT_EQ(
      only_reply_to(send(kAlice, {many(keys, 1, 0, LeaseMode::kShared)}, alice_), alice_).type,
      MessageType::kGrantedMany);
  EXPECT_EQ(only_reply_to(send(kBob, {many(keys, 2, 0, LeaseMode::kShared)}, bob_), bob_).type,
            MessageType::kGrantedMany);
  const Message busy = only_reply_to(send(kCarol, {many(keys, 3)}, carol_), carol_);
  EXPECT_EQ(busy.type, MessageType::kBusyMany);
  EXPECT_EQ(try_single(kCarol, keys[0], 4), MessageType::kBusy);
}

TEST_F(DispatcherTest, BadAcquireManysAreRefusedWithTheReason) {
  const auto refused = [&](const Message& m) {
    const Message r = only_reply_to(send(kAlice, {m}, alice_), alice_);
    EXPECT_EQ(r.type, MessageType::kError);
    return r.error;
  };
  EXPECT_EQ(refused(many({"a", "b", "a"}, 1)), WireError::kBadKeyList);
  std::vector<std::string> seventeen;
  for (int i = 0; i < 17; ++i) seventeen.push_back("k" + std::to_string(i));
  EXPECT_EQ(refused(many(seventeen, 2)), WireError::kBadKeyList);
  EXPECT_EQ(refused(many({"a", ""}, 3)), WireError::kBadKey);
  EXPECT_EQ(refused(many({"a", std::string(kMaxKeyLength + 1, 'x')}, 4)), WireError::kKeyTooLong);
  EXPECT_EQ(refused(many({"a"}, 5, 0, LeaseMode::kPermit)), WireError::kBadMode);
  Message zero_ttl = many({"a"}, 6);
  zero_ttl.ttl_ms = 0;
  EXPECT_EQ(refused(zero_ttl), WireError::kTtlOutOfRange);
  // A semaphore key cannot be part of a lock request.
  Message permit = request(MessageType::kAcquirePermit, "sem", 7);
  permit.permits = 2;
  EXPECT_EQ(only_reply_to(send(kBob, {permit}, bob_), bob_).type, MessageType::kGranted);
  EXPECT_EQ(refused(many({"a", "sem"}, 8)), WireError::kLeaseKindMismatch);
  EXPECT_FALSE(held("a"));
}

// The table of multi-key answers is bounded (4096 for the
// whole dispatcher). Past it, a retransmitted ACQUIRE_MANY must not take a
// second set of leases: like a single key's holder, the leases it took say
// which request took them.
TEST_F(DispatcherTest, ARetransmittedAcquireManyPastTheAnswerTableTakesNothingNew) {
  const std::vector<std::string> keys = spread_keys(3);
  const Message granted =
      only_reply_to(send(kAlice, {many(keys, 7, 0, LeaseMode::kShared)}, alice_), alice_);
  ASSERT_EQ(granted.type, MessageType::kGrantedMany);
  // More than the table holds: Bob's shared requests of another key.
  for (std::uint64_t id = 1; id <= 4200; ++id) {
    const auto out = send(kBob, {many({"other"}, id, 0, LeaseMode::kShared)}, bob_);
    ASSERT_EQ(only_reply_to(out, bob_).type, MessageType::kGrantedMany);
  }
  const Message again =
      only_reply_to(send(kAlice, {many(keys, 7, 0, LeaseMode::kShared)}, alice_), alice_);
  ASSERT_EQ(again.type, MessageType::kGrantedMany);
  ASSERT_EQ(again.listed_token_count(), keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(again.listed_token(i), granted.listed_token(i)) << keys[i];
    const auto out = send(kBob, {request(MessageType::kQuery, keys[i], ++query_id_)}, carol_);
    EXPECT_EQ(decoded(out.at(0)).messages[0].holders, 1u) << keys[i];
  }
  // A request older than one the holder applied since is stale: nothing taken.
  Message renew = request(MessageType::kRenew, keys[0], 9);
  renew.token = granted.listed_token(0);
  ASSERT_EQ(only_reply_to(send(kAlice, {renew}, alice_), alice_).type, MessageType::kRenewed);
  const Message stale =
      only_reply_to(send(kAlice, {many(keys, 8, 0, LeaseMode::kShared)}, alice_), alice_);
  EXPECT_EQ(stale.type, MessageType::kBusyMany);
  const auto out = send(kBob, {request(MessageType::kQuery, keys[0], ++query_id_)}, carol_);
  EXPECT_EQ(decoded(out.at(0)).messages[0].holders, 1u);
}

// ---- Cluster mode: the gate, MAP, and clients ahead of the node ------------

class DispatcherGateTest : public DispatcherTest {
 protected:
  // A gate of `epoch` over members "a" (this node), "b" and "c"; buckets of
  // "a" are active unless `active` is false.
  // Members' addresses are `host:port` with a host of `host_length` bytes
  // (0: 127.0.0.1).
  void publish(std::uint64_t epoch, bool active = true, std::size_t id_length = 1,
               std::size_t host_length = 0) {
    Router router(RouterOptions{.bucket_bits = 8});
    std::vector<Node> nodes;
    auto gate = std::make_shared<ClusterGate>();
    for (const char c : std::string("abc")) {
      const std::string id = std::string(id_length, c);
      nodes.push_back({id, 1});
      const std::string port = std::to_string(7000 + c);
      const std::string host =
          host_length == 0 ? "127.0.0.1" : std::string(host_length - port.size() - 1, c);
      gate->members.push_back({id, host + ":" + port, 1});
    }
    EXPECT_EQ(router.assign(nodes), RouterStatus::kOk);
    gate->epoch = epoch;
    gate->routing = router.snapshot();
    gate->buckets.assign(gate->routing->bucket_count(), ClusterGate::kForeign);
    for (std::size_t b = 0; b < gate->routing->bucket_count(); ++b) {
      if (gate->routing->table()[b] == 0) {
        gate->buckets[b] = active ? ClusterGate::kActive : ClusterGate::kOwned;
      }
    }
    gate->lease_deadline = [] { return std::chrono::hours(1); };
    routing_ = gate->routing;
    gate_ = gate;
    dispatcher_->publish_gate(std::move(gate));
  }
  // The last gate again in `epoch`, with `key`'s bucket given to another
  // node (a hand-off of that bucket).
  void move_away(std::uint64_t epoch, const std::string& key) {
    auto gate = std::make_shared<ClusterGate>(*gate_);
    gate->epoch = epoch;
    gate->buckets[gate->bucket_of(key)] = ClusterGate::kForeign;
    gate_ = gate;
    dispatcher_->publish_gate(std::move(gate));
  }
  // Own keys, `n` of them, in the global order an ACQUIRE_MANY takes them.
  std::vector<std::string> own_keys_in_order(std::size_t n) {
    std::vector<std::string> keys;
    for (int i = 0; keys.size() < n; ++i) {
      std::string key = "own-" + std::to_string(i);
      if (routing_->owner_index(key) == 0) keys.push_back(std::move(key));
    }
    const auto order = [this](const std::string& k) {
      return std::tuple(dispatcher_->shard_of(k), hash_key(k, 0x1234'5678'9abcULL), k);
    };
    std::sort(keys.begin(), keys.end(),
              [&](const std::string& a, const std::string& b) { return order(a) < order(b); });
    return keys;
  }
  // A key this node ("a...") owns, and one it does not.
  std::string key_of(bool mine) {
    for (int i = 0;; ++i) {
      std::string key = "key-" + std::to_string(i);
      if ((routing_->owner_index(key) == 0) == mine) return key;
    }
  }
  // MAP from `first`, padded `slack` bytes past its bound (at most to a
  // whole datagram).
  Message map_page(std::uint32_t first, std::size_t slack) {
    Datagram d;
    d.client_id = kAlice;
    Message m;
    m.type = MessageType::kMap;
    m.request_id = ++query_id_;
    m.first_member = first;
    d.request_id = m.request_id;
    EXPECT_TRUE(d.push(m));
    std::vector<std::uint8_t> bytes(kMaxDatagramSize);
    std::size_t n = 0;
    const std::size_t pad_to = std::min(max_reply_size(d) + slack, kMaxDatagramSize);
    EXPECT_EQ(encode(d, bytes, n, pad_to), ProtocolError::kOk);
    bytes.resize(n);
    return only_reply_to(handle(bytes, alice_), alice_);
  }
  std::shared_ptr<const RouterSnapshot> routing_;
  std::shared_ptr<const ClusterGate> gate_;
};

TEST_F(DispatcherGateTest, MapOfASingleNodeIsEpochZero) {
  const Message r = map_page(0, 600);
  EXPECT_EQ(r.type, MessageType::kMapReply);
  EXPECT_EQ(r.epoch, 0u);
  EXPECT_EQ(r.member_count, 0u);
}

TEST_F(DispatcherGateTest, MapPagesTheMembersThePaddingPaysFor) {
  publish(12, true, /*id_length=*/100);
  std::vector<std::string> ids;
  std::uint32_t first = 0;
  for (int pages = 0; pages < 10 && ids.size() < 3; ++pages) {
    // Room for one 100-byte id with its address, never two.
    const Message r = map_page(first, 150);
    ASSERT_EQ(r.type, MessageType::kMapReply);
    EXPECT_EQ(r.epoch, 12u);
    EXPECT_EQ(r.member_count, 3u);
    EXPECT_EQ(r.first_member, first);
    ASSERT_EQ(r.member_list_count, 1u);
    for (const MemberEntry& e : MemberList(r)) {
      ids.emplace_back(e.id);
      EXPECT_EQ(e.weight, 1u);
    }
    ++first;
  }
  EXPECT_EQ(ids, (std::vector<std::string>{std::string(100, 'a'), std::string(100, 'b'),
                                           std::string(100, 'c')}));
  EXPECT_EQ(map_page(0, 0).member_list_count, 0u);  // no padding, no members
}

// Membership accepts advertise addresses of up to 300
// bytes (a Kubernetes pod FQDN is often over 64); MAP must serve them, with
// the longest ids too, in pages that fit a datagram, and the codec a client
// decodes with must take them.
TEST_F(DispatcherGateTest, MapServesTheLongestAddressesMembershipAccepts) {
  // The longest address membership accepts.
  const std::size_t longest = 300;
  ASSERT_TRUE(cluster::valid_member_address(std::string(longest - 5, 'h') + ":7000"));
  ASSERT_FALSE(cluster::valid_member_address(std::string(longest - 4, 'h') + ":7000"));
  publish(9, true, /*id_length=*/kMaxMemberIdLength, /*host_length=*/longest);
  std::vector<std::string> addresses;
  std::uint32_t first = 0;
  for (int pages = 0; pages < 10 && addresses.size() < 3; ++pages) {
    // A client pads MAP to a whole datagram.
    const Message r = map_page(first, kMaxDatagramSize);
    ASSERT_EQ(r.type, MessageType::kMapReply);
    EXPECT_EQ(r.member_count, 3u);
    ASSERT_GE(r.member_list_count, 1u) << "a page with no member: the map is unreadable";
    for (const MemberEntry& e : MemberList(r)) {
      EXPECT_EQ(e.id.size(), kMaxMemberIdLength);
      addresses.emplace_back(e.address);
    }
    first += r.member_list_count;
  }
  ASSERT_EQ(addresses.size(), 3u);
  for (const std::string& a : addresses) EXPECT_EQ(a.size(), longest);
}

TEST_F(DispatcherGateTest, KeysOfOtherNodesAreRedirectedAndOwnKeysGranted) {
  publish(5);
  const Message redirected = only_reply_to(
      send(kAlice, {request(MessageType::kAcquire, key_of(false), 1)}, alice_), alice_);
  EXPECT_EQ(redirected.type, MessageType::kRedirect);
  EXPECT_EQ(redirected.epoch, 5u);
  const std::uint64_t token = single_token(kAlice, key_of(true), 2, alice_);
  EXPECT_EQ(token >> 32, 5u);
  EXPECT_EQ(counter(StatCounter::kRedirects), 1u);
  // QUERY_HOLDERS is routed as QUERY is.
  const Message elsewhere = holders_page(key_of(false), 0);
  EXPECT_EQ(elsewhere.type, MessageType::kRedirect);
  EXPECT_EQ(elsewhere.epoch, 5u);
  const Message here = holders_page(key_of(true), 0);
  ASSERT_EQ(here.type, MessageType::kHoldersReply);
  ASSERT_EQ(here.holder_list_count, 1u);
  EXPECT_EQ(HolderList(here).begin()->token, token);
}

TEST_F(DispatcherGateTest, AClientWithANewerMapIsToldToRetryNotGranted) {
  publish(5);
  Datagram d;
  d.client_id = kAlice;
  d.epoch = 6;  // the client saw a map this node has not
  Message m = request(MessageType::kAcquire, key_of(true), 1);
  d.request_id = 1;
  ASSERT_TRUE(d.push(m));
  std::vector<std::uint8_t> bytes(kMaxDatagramSize);
  std::size_t n = 0;
  ASSERT_EQ(encode_request(d, bytes, n), ProtocolError::kOk);
  bytes.resize(n);
  EXPECT_EQ(only_reply_to(handle(bytes, alice_), alice_).type, MessageType::kRecovering);
  EXPECT_FALSE(held(key_of(true)));
  // The same epoch as the node's is served.
  d.epoch = 5;
  d.messages[0].request_id = d.request_id = 2;
  bytes.assign(kMaxDatagramSize, 0);
  ASSERT_EQ(encode_request(d, bytes, n), ProtocolError::kOk);
  bytes.resize(n);
  EXPECT_EQ(only_reply_to(handle(bytes, alice_), alice_).type, MessageType::kGranted);
}

// The refusal is remembered: the client asks again under a fresh request
// id, and a late copy of the refused one granted once the keys are
// grantable would hold them with no call left to take the grant (the
// single-key case: ShardGateTest's late copy of a refused ACQUIRE).
TEST_F(DispatcherGateTest, AnAcquireManyWithAnotherNodesKeyTakesNothingAndGetsItsRefusalAgain) {
  publish(5);
  const std::string mine = key_of(true);
  const std::string theirs = key_of(false);
  const Message r = only_reply_to(send(kAlice, {many({mine, theirs}, 9)}, alice_), alice_);
  EXPECT_EQ(r.type, MessageType::kRedirect);
  EXPECT_FALSE(held(mine));
  // Inactive own keys: RECOVERING, nothing held either.
  publish(6, /*active=*/false);
  const Message waiting =
      only_reply_to(send(kAlice, {many({mine}, 10, /*wait_ms=*/500)}, alice_), alice_);
  EXPECT_EQ(waiting.type, MessageType::kRecovering);
  EXPECT_FALSE(held(mine));
  // Once active, a late copy (same request id) is refused again and takes
  // nothing; the client's next request (a fresh id) is granted.
  publish(7);
  const Message late = only_reply_to(send(kAlice, {many({mine}, 10, 500)}, alice_), alice_);
  EXPECT_EQ(late.type, MessageType::kRecovering);
  EXPECT_FALSE(held(mine));
  const Message again = only_reply_to(send(kAlice, {many({mine, theirs}, 9)}, alice_), alice_);
  EXPECT_EQ(again.type, MessageType::kRedirect);
  const Message granted = only_reply_to(send(kAlice, {many({mine}, 11, 500)}, alice_), alice_);
  ASSERT_EQ(granted.type, MessageType::kGrantedMany);
  EXPECT_EQ(granted.listed_token(0) >> 32, 7u);
}

// A waiting ACQUIRE_MANY holds its taken keys pending.
// When a gate moves one of its keys to another node, the request is
// abandoned at once (REDIRECT, pending holds released), so the hand-off's
// count of leases in the moved bucket is not held up for its wait + TTL.
TEST_F(DispatcherGateTest, AWaitingAcquireManyLetsGoOfAMovedKeyAtOnce) {
  publish(5);
  const std::vector<std::string> keys = own_keys_in_order(2);
  (void)single_token(kBob, keys[1], 1, bob_);  // the request will wait on it
  Message m = many(keys, 2, /*wait_ms=*/60'000);
  m.ttl_ms = 30'000;
  EXPECT_TRUE(send(kAlice, {m}, alice_).empty());  // queued, keys[0] taken
  const auto leases_on = [&](const std::string& key) {
    return dispatcher_->count_leases([&](std::string_view k) { return k == key; });
  };
  ASSERT_EQ(leases_on(keys[0]), 1u);

  move_away(6, keys[0]);
  now_ms_ += 5;  // the next I/O tick
  std::vector<OutDatagram> out;
  dispatcher_->tick(0, out);
  dispatcher_->tick(1, out);
  EXPECT_EQ(leases_on(keys[0]), 0u) << "the hand-off would wait for the pending hold";
  const Message answer = only_reply_to(out, alice_);
  EXPECT_EQ(answer.type, MessageType::kRedirect);
  EXPECT_EQ(answer.epoch, 6u);
  // Bob's lease is untouched, and the request no longer waits on it.
  EXPECT_EQ(leases_on(keys[1]), 1u);
  const auto query = send(kCarol, {request(MessageType::kQuery, keys[1], 77)}, carol_);
  EXPECT_EQ(decoded(query.at(0)).messages[0].waiters, 0u);
}

// The same race from the other side: a request whose last key is handed to
// it after a gate moved one of its taken keys must not confirm that key.
TEST_F(DispatcherGateTest, AnAcquireManyNeverCompletesOnAKeyMovedWhileItWaited) {
  publish(5);
  const std::vector<std::string> keys = own_keys_in_order(2);
  const std::uint64_t bob_token = single_token(kBob, keys[1], 1, bob_);
  EXPECT_TRUE(send(kAlice, {many(keys, 2, 60'000)}, alice_).empty());
  move_away(6, keys[0]);
  // Bob releases before any tick: the hand-off continues the walk.
  const auto out = release_key(kBob, keys[1], bob_token, 3, bob_);
  const Message answer = only_reply_to(out, alice_);
  EXPECT_EQ(answer.type, MessageType::kRedirect);
  EXPECT_FALSE(held(keys[0]));
  EXPECT_FALSE(held(keys[1]));
}

// ---- Replication (docs/cluster.md, "Replication") -------------------------

class DispatcherReplicationTest : public DispatcherGateTest {
 protected:
  DispatcherReplicationTest() : a_(ReplicatorOptions{}, 0), b_(ReplicatorOptions{}, 0) {
    replicator_ = &a_;
    make(4, std::nullopt);
    publish(3);
    // "a" (this dispatcher) is the primary of its buckets, "b" (port 2002)
    // their backup.
    auto gate = std::make_shared<ClusterGate>(*gate_);
    gate->replicated.assign(gate->buckets.size(), 0);
    ReplicaLayout la;
    la.self_id = "a";
    la.epoch = 3;
    la.peers = {ReplicaPeer{"b", peer_on_port(2002)}};
    la.backups.resize(gate->buckets.size());
    ReplicaLayout lb;
    lb.self_id = "b";
    lb.epoch = 3;
    lb.peers = {ReplicaPeer{"a", peer_on_port(2001)}};
    lb.backing.assign(gate->buckets.size(), ReplicaLayout::kNone);
    for (std::size_t b = 0; b < gate->buckets.size(); ++b) {
      if (gate->buckets[b] == ClusterGate::kForeign) continue;
      gate->replicated[b] = 1;
      la.backups[b] = {0};
      lb.backing[b] = 0;
    }
    gate->replica_deadline = [this](std::size_t bucket) { return a_.lease_until(bucket); };
    gate_ = gate;
    dispatcher_->publish_gate(std::move(gate));
    for (const auto& [peer, bucket] : a_.set_layout(la, ns())) {
      dispatcher_->replicate_bucket(peer, bucket);
    }
    (void)b_.set_layout(lb, ns());
  }

  std::int64_t ns() const { return now_ms_ * 1'000'000; }

  // Ticks the dispatcher and carries node-to-node datagrams both ways until
  // none is left; returns what went to clients.
  std::vector<OutDatagram> pump() {
    std::vector<OutDatagram> clients;
    std::vector<OutDatagram> out;
    dispatcher_->tick(0, out);
    while (!out.empty()) {
      std::vector<OutDatagram> next;
      for (const OutDatagram& d : out) {
        if (port_of(d.peer) != 2002) {
          clients.push_back(d);
          continue;
        }
        std::vector<OutDatagram> acks;
        EXPECT_TRUE(b_.on_datagram({d.bytes.data(), d.length}, peer_on_port(2001), ns(), acks));
        for (const OutDatagram& ack : acks) {
          dispatcher_->handle(0, {ack.bytes.data(), ack.length}, peer_on_port(2002), next);
        }
      }
      out = std::move(next);
    }
    return clients;
  }

  Replicator a_;
  Replicator b_;
};

// The other way a grant could outlive the primary lease: the gate used the time a datagram
// arrived, read before the wait for the shard's lock, so a request that
// arrived inside the primary lease and was decided after it was granted
// without a lease. Here every clock reading is 10 ms after the one before:
// the request arrives 2 ms before the lease ends and is decided after it.
TEST_F(DispatcherReplicationTest, TheGateDecidesByTheClockAtTheDecisionNotTheArrival) {
  const std::string key = key_of(true);
  EXPECT_TRUE(pump().empty());  // the lease comes back
  const auto bucket = gate_->bucket_of(key);
  const std::int64_t lease_end_ms = a_.lease_until(bucket).count() / 1'000'000;
  ASSERT_GT(lease_end_ms, now_ms_);
  now_ms_ = lease_end_ms - 2;
  clock_step_ms_ = 10;
  EXPECT_EQ(try_single(kAlice, key, 5), MessageType::kRecovering);
  clock_step_ms_ = 0;
  EXPECT_FALSE(held(key)) << "granted after the primary lease ended";
}

TEST_F(DispatcherReplicationTest, AGrantIsAnsweredOnlyOnceTheBackupHasIt) {
  const std::string key = key_of(true);
  // No primary lease from the backup yet: nothing is granted.
  EXPECT_EQ(try_single(kAlice, key, 1), MessageType::kRecovering);
  EXPECT_TRUE(pump().empty());  // heartbeat and snapshots; the lease comes back

  // The GRANTED waits in the replicator...
  Message acquire = request(MessageType::kAcquire, key, 2);
  acquire.value = "leader at 10.0.0.1:80";  // a holder value: replicated with the grant
  EXPECT_TRUE(send(kAlice, {acquire}, alice_).empty());
  // ...until the backup has acknowledged the grant.
  const std::vector<OutDatagram> released = pump();
  const Message granted = only_reply_to(released, alice_);
  ASSERT_EQ(granted.type, MessageType::kGranted);

  // The backup has the holder, and takes it over once "a" is gone from its
  // map and its promise has run out.
  ReplicaLayout none;
  none.self_id = "b";
  none.backing.assign(gate_->buckets.size(), ReplicaLayout::kNone);
  (void)b_.set_layout(none, ns());
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  const auto bucket = static_cast<std::uint32_t>(gate_->bucket_of(key));
  ASSERT_TRUE(b_.takeover("a", bucket, ns() + 251'000'000, holders));
  ASSERT_EQ(holders.size(), 1U);
  EXPECT_EQ(holders[0].first, key);
  EXPECT_EQ(holders[0].second.token, granted.token);
  EXPECT_EQ(holders[0].second.owner, kAlice);
  EXPECT_EQ(holders[0].second.value, "leader at 10.0.0.1:80");
}

TEST_F(DispatcherReplicationTest, ABatchsGrantsLeaveAtTheBatchsEndInOneDatagram) {
  (void)pump();
  const std::vector<std::string> own = own_keys_in_order(2);
  // Two datagrams of one received batch: their grants wait, and nothing
  // goes to the backup until the batch ends...
  EXPECT_TRUE(send(kAlice, {request(MessageType::kAcquire, own[0], 2)}, alice_).empty());
  EXPECT_TRUE(send(kBob, {request(MessageType::kAcquire, own[1], 3)}, bob_).empty());
  // ...and then one REPLICATE carries both, without waiting for a tick.
  std::vector<OutDatagram> out;
  dispatcher_->end_batch(out);
  ASSERT_EQ(out.size(), 1U);
  ASSERT_EQ(port_of(out[0].peer), 2002);
  replication::ReplicateHeader header;
  std::vector<replication::Entry> entries;
  ASSERT_TRUE(replication::decode_replicate({out[0].bytes.data(), out[0].length}, header, entries));
  ASSERT_EQ(entries.size(), 2U);
  EXPECT_EQ(entries[0].kind, replication::EntryKind::kGrant);
  EXPECT_EQ(entries[1].kind, replication::EntryKind::kGrant);
  // The backup's acknowledgement releases both answers.
  std::vector<OutDatagram> acks;
  ASSERT_TRUE(b_.on_datagram({out[0].bytes.data(), out[0].length}, peer_on_port(2001), ns(), acks));
  ASSERT_EQ(acks.size(), 1U);
  std::vector<OutDatagram> answers;
  dispatcher_->handle(0, {acks[0].bytes.data(), acks[0].length}, peer_on_port(2002), answers);
  EXPECT_EQ(only_reply_to(answers, alice_).type, MessageType::kGranted);
  EXPECT_EQ(only_reply_to(answers, bob_).type, MessageType::kGranted);
  // A batch that granted nothing sends nothing.
  out.clear();
  dispatcher_->end_batch(out);
  EXPECT_TRUE(out.empty());
}

TEST_F(DispatcherReplicationTest, ATakeoverInstallsEachKeysNewestExclusiveHolder) {
  const std::string key = key_of(true);
  (void)pump();
  // A replica that knows two exclusive holders of one key (the older one's
  // release had not reached it), listed oldest first.
  replication::ReplicaHolder older;
  older.owner = kAlice;
  older.token = (std::uint64_t{3} << 32) | 7;
  older.request_id = 1;
  older.ttl_ms = 5000;
  replication::ReplicaHolder newer = older;
  newer.token = older.token + 1;
  newer.request_id = 2;
  EXPECT_EQ(dispatcher_->inherit({{key, older}, {key, newer}}, now_ms_ + 5000),
            std::optional<std::size_t>{1});
  // The newer one is the holder: it renews, the older one is over.
  Message renew = request(MessageType::kRenew, key, 3);
  renew.token = newer.token;
  EXPECT_EQ(only_reply_to(send(kAlice, {renew}, alice_), alice_).type, MessageType::kRenewed);
  renew.request_id = 4;
  renew.token = older.token;
  EXPECT_NE(only_reply_to(send(kAlice, {renew}, alice_), alice_).type, MessageType::kRenewed);
}

// Shared holders are installed in token order, so the
// key lists them oldest first and its version (the newest token, the holder
// count) is what it was at the primary: a watch since that version sees no
// change that did not happen.
TEST_F(DispatcherReplicationTest, ATakeoverInstallsSharedHoldersInTokenOrder) {
  const std::string key = key_of(true);
  (void)pump();
  replication::ReplicaHolder first;
  first.owner = kAlice;
  first.mode = LeaseMode::kShared;
  first.token = (std::uint64_t{3} << 32) | 7;
  first.request_id = 1;
  first.ttl_ms = 5000;
  replication::ReplicaHolder second = first;
  second.owner = kBob;
  second.token = first.token + 1;
  replication::ReplicaHolder stale = first;  // an exclusive holder whose release was lost
  stale.owner = kCarol;
  stale.mode = LeaseMode::kExclusive;
  stale.token = first.token - 1;
  // Listed newest first, as a replica may hand them out.
  EXPECT_EQ(dispatcher_->inherit({{key, second}, {key, stale}, {key, first}}, now_ms_ + 5000),
            std::optional<std::size_t>{2});
  const auto out = send(kBob, {request(MessageType::kQuery, key, 9)}, carol_);
  ASSERT_EQ(out.size(), 1U);
  const Message q = decoded(out[0]).messages[0];
  EXPECT_EQ(q.holders, 2U);
  EXPECT_EQ(q.mode, LeaseMode::kShared);
  // A WATCH since the version the primary had, (second, 2), parks: no
  // change happened. Installed newest first, the version read (first, 2)
  // and the watch was answered at once.
  Message watch = request(MessageType::kWatch, key, 10);
  watch.token = second.token;
  watch.holders = 2;
  watch.wait_ms = 1000;
  EXPECT_TRUE(send(kBob, {watch}, carol_).empty()) << "a change that did not happen";
}

// Simulation seed 7852: a node taking a bucket back still had a holder of
// its own for a key there, from when it owned the bucket before. The
// replicated holder (another client's, granted since by the bucket's
// primary) could not be installed beside it, and the takeover activated the
// bucket all the same; once the stale holder expired, the key was granted
// again beside the holder never installed. The takeover now fails closed
// until the stale holder is gone, and then installs the replicated one.
TEST_F(DispatcherReplicationTest, ATakeoverThatCannotInstallAHolderFailsClosed) {
  const std::string key = key_of(true);
  (void)pump();
  (void)send(kAlice, {request(MessageType::kAcquire, key, 2)}, alice_);
  const Message stale = only_reply_to(pump(), alice_);
  ASSERT_EQ(stale.type, MessageType::kGranted);
  replication::ReplicaHolder replicated;
  replicated.owner = kBob;
  replicated.token = stale.token + (std::uint64_t{1} << 32);  // a later map's grant
  replicated.request_id = 1;
  replicated.ttl_ms = 5000;
  EXPECT_EQ(dispatcher_->inherit({{key, replicated}}, now_ms_ + 5000), std::nullopt);
  // Bob's holder is not there: his renewal is refused.
  Message renew = request(MessageType::kRenew, key, 3);
  renew.token = replicated.token;
  EXPECT_NE(only_reply_to(send(kBob, {renew}, bob_), bob_).type, MessageType::kRenewed);
  // Alice's lease ends (her release, here): the takeover goes through.
  (void)release_key(kAlice, key, stale.token, 4, alice_);
  (void)pump();
  EXPECT_EQ(dispatcher_->inherit({{key, replicated}}, now_ms_ + 5000),
            std::optional<std::size_t>{1});
  renew.request_id = 5;
  EXPECT_EQ(only_reply_to(send(kBob, {renew}, bob_), bob_).type, MessageType::kRenewed);
}

TEST_F(DispatcherReplicationTest, PastThePrimaryLeaseNothingIsGrantedOrRenewed) {
  const std::string key = key_of(true);
  (void)pump();
  (void)send(kAlice, {request(MessageType::kAcquire, key, 2)}, alice_);
  const Message granted = only_reply_to(pump(), alice_);
  ASSERT_EQ(granted.type, MessageType::kGranted);
  // The backup stops answering (its acknowledgements are lost): the lease
  // runs out 250 ms after the last acknowledged send.
  now_ms_ += 300;
  Message renew = request(MessageType::kRenew, key, 3);
  renew.token = granted.token;
  const auto out = send(kAlice, {renew}, alice_);
  EXPECT_EQ(only_reply_to(out, alice_).type, MessageType::kRecovering);
  const std::vector<std::string> own = own_keys_in_order(2);
  EXPECT_EQ(try_single(kBob, own[0] == key ? own[1] : own[0], 4), MessageType::kRecovering);
  // Heard again: renewals resume.
  (void)pump();
  renew.request_id = 5;
  EXPECT_EQ(only_reply_to(send(kAlice, {renew}, alice_), alice_).type, MessageType::kRenewed);
}

// RELEASED was answered at once while the release
// streamed lazily, so a primary that died before sending it left the backup
// a holder the client had been told was gone: inherited at the takeover, it
// blocked the key for a whole TTL. RELEASED now waits for the backups as
// GRANTED does; if the primary dies first, the client's retransmission finds
// the holder at the new owner and releases it there.
TEST_F(DispatcherReplicationTest, AReleaseIsAnsweredOnlyOnceTheBackupHasIt) {
  const std::string key = key_of(true);
  (void)pump();
  (void)send(kAlice, {request(MessageType::kAcquire, key, 2)}, alice_);
  const Message granted = only_reply_to(pump(), alice_);
  const auto out = release_key(kAlice, key, granted.token, 3, alice_);
  EXPECT_TRUE(std::none_of(out.begin(), out.end(), [&](const OutDatagram& d) {
    return port_of(d.peer) == port_of(alice_);
  })) << "RELEASED before the backup had the release";
  EXPECT_EQ(only_reply_to(pump(), alice_).type, MessageType::kReleased);
  ReplicaLayout none;
  none.self_id = "b";
  none.backing.assign(gate_->buckets.size(), ReplicaLayout::kNone);
  (void)b_.set_layout(none, ns());
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  ASSERT_TRUE(b_.takeover("a", static_cast<std::uint32_t>(gate_->bucket_of(key)),
                          ns() + 251'000'000, holders));
  EXPECT_TRUE(holders.empty());
}

// A holder may release under a closed gate (the node registered again, or
// stopped following the map): the gate has no routing then, and the
// dispatcher must not ask it for the RELEASED's bucket (a null routing
// crashed the simulation's long run, seed range 1..10,000). The answer waits
// for every backup stream instead.
TEST_F(DispatcherReplicationTest, AReleaseUnderAClosedGateIsAnsweredWithoutItsBucket) {
  const std::string key = key_of(true);
  (void)pump();
  (void)send(kAlice, {request(MessageType::kAcquire, key, 2)}, alice_);
  const Message granted = only_reply_to(pump(), alice_);
  ASSERT_EQ(granted.type, MessageType::kGranted);
  dispatcher_->publish_gate(ClusterGate::closed());
  std::vector<OutDatagram> out = release_key(kAlice, key, granted.token, 3, alice_);
  for (const OutDatagram& d : pump()) out.push_back(d);
  EXPECT_EQ(only_reply_to(out, alice_).type, MessageType::kReleased);
  EXPECT_FALSE(held(key));
}

}  // namespace
}  // namespace shardlock::lease::internal
