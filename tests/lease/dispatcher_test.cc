// The request path without sockets: datagram bytes in, reply datagrams out,
// time a number the test moves.
#include "dispatcher.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <set>
#include <string>
#include <vector>

#include "shardlock/lease/auth.h"

namespace shardlock::lease::internal {
namespace {

constexpr ClientId kAlice{1, 1};
constexpr ClientId kBob{2, 2};

Peer peer_on_port(std::uint16_t port) {
  Peer p;
  p.addr.v4.sin_family = AF_INET;
  p.addr.v4.sin_port = htons(port);
  p.addr.v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  p.len = sizeof(sockaddr_in);
  return p;
}

std::uint16_t port_of(const Peer& p) { return ntohs(p.addr.v4.sin_port); }

class DispatcherTest : public ::testing::Test {
 protected:
  DispatcherTest() { make(4, std::nullopt); }

  void make(std::uint32_t shard_count, std::optional<AuthKey> key) {
    ShardLimits limits;
    limits.hash_seed = 0x1234'5678'9abcULL;
    std::vector<std::unique_ptr<Shard>> shards;
    for (std::uint32_t i = 0; i < shard_count; ++i) {
      shards.push_back(std::make_unique<Shard>(i, limits, ShardTokens{}, now_ms_));
    }
    DispatcherOptions o;
    o.auth_key = key;
    o.clock = [this] { return std::chrono::milliseconds(now_ms_); };
    o.log = [this](std::string_view line) { log_.emplace_back(line); };
    o.key_seed = limits.hash_seed;
    o.workers = 2;
    dispatcher_ = std::make_unique<Dispatcher>(std::move(o), std::move(shards));
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

  std::uint64_t counter(StatCounter c) const {
    return dispatcher_->stats().counters[static_cast<std::size_t>(c)];
  }

  std::int64_t now_ms_ = 1'000'000;
  std::size_t last_sent_ = 0;  // bytes of the last datagram send() handed over
  AuthKey key_ = generate_auth_key();
  std::vector<std::string> log_;
  std::deque<std::string> keys_;
  std::unique_ptr<Dispatcher> dispatcher_;
  const Peer alice_ = peer_on_port(1001);
  const Peer bob_ = peer_on_port(1002);
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
  Message stats;
  stats.type = MessageType::kStats;
  stats.request_id = 11;
  const auto out = send(kAlice, {stats}, alice_);
  ASSERT_EQ(out.size(), 1u);
  const Datagram r = decoded(out[0]);
  ASSERT_EQ(r.messages[0].type, MessageType::kStatsReply);
  EXPECT_EQ(r.messages[0].shard_count, 4u);
  EXPECT_EQ(r.messages[0].counters[static_cast<std::size_t>(StatCounter::kSendDrops)], 2u);
  EXPECT_EQ(to_string(StatCounter::kSendDrops), "send_drops");
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

}  // namespace
}  // namespace shardlock::lease::internal
