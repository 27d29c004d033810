// The lease codec: round trips, every truncation, random bytes, padding and
// the anti-amplification bound.
#include "shardlock/lease/wire/protocol.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace shardlock::lease {
namespace {

const std::string kKey = "orders/42";

// The counters of a STATS_REPLY: an encoder must write all of them.
const std::vector<std::uint8_t> kZeroCounters(8 * kStatCounterCount, 0);

std::vector<Message> one_of_each_type() {
  std::vector<Message> all;
  auto add = [&](MessageType t, auto fill) {
    Message m;
    m.type = t;
    m.request_id = 0x1122334455667700ULL + all.size();
    fill(m);
    all.push_back(m);
  };
  add(MessageType::kAcquire, [](Message& m) {
    m.key = kKey;
    m.ttl_ms = 30000;
    m.wait_ms = 500;
  });
  add(MessageType::kRenew, [](Message& m) {
    m.key = kKey;
    m.token = 77;
    m.ttl_ms = 1000;
  });
  add(MessageType::kRelease, [](Message& m) {
    m.key = kKey;
    m.token = 78;
  });
  add(MessageType::kQuery, [](Message& m) { m.key = kKey; });
  add(MessageType::kStats, [](Message& m) { m.first_shard = 7; });
  add(MessageType::kAcquireShared, [](Message& m) {
    m.key = kKey;
    m.ttl_ms = 30000;
    m.wait_ms = 500;
  });
  add(MessageType::kAcquirePermit, [](Message& m) {
    m.key = kKey;
    m.ttl_ms = 30000;
    m.wait_ms = 500;
    m.permits = 3;
  });
  static const std::vector<std::uint8_t> key_list = [] {
    const std::string_view keys[] = {"a", "orders/42"};
    std::vector<std::uint8_t> out;
    EXPECT_TRUE(encode_key_list(keys, out));
    return out;
  }();
  add(MessageType::kAcquireMany, [](Message& m) {
    m.mode = LeaseMode::kShared;
    m.ttl_ms = 30000;
    m.wait_ms = 500;
    m.key_count = 2;
    m.key_list = key_list;
  });
  add(MessageType::kGranted, [](Message& m) {
    m.key = kKey;
    m.token = 0xFFFFFFFFFFFFFFF0ULL;
    m.ttl_ms = 30000;
  });
  add(MessageType::kBusy, [](Message& m) {
    m.key = kKey;
    m.ttl_ms = 1234;
  });
  add(MessageType::kTimeout, [](Message& m) { m.key = kKey; });
  add(MessageType::kRenewed, [](Message& m) {
    m.key = kKey;
    m.ttl_ms = 999;
  });
  add(MessageType::kReleased, [](Message&) {});
  add(MessageType::kNotOwner, [](Message&) {});
  add(MessageType::kExpired, [](Message&) {});
  add(MessageType::kRecovering, [](Message& m) { m.retry_after_ms = 4321; });
  add(MessageType::kError, [](Message& m) { m.error = WireError::kKeyTooLong; });
  add(MessageType::kQueryReply, [](Message& m) {
    m.key = kKey;
    m.held = true;
    m.token = 5;
    m.ttl_ms = 17;
    m.waiters = 3;
    m.mode = LeaseMode::kPermit;
    m.holders = 2;
    m.permits = 4;
  });
  static const std::vector<std::uint8_t> tokens = {1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 9};
  add(MessageType::kStatsReply, [](Message& m) {
    m.shard_count = 64;
    m.first_shard = 3;
    static const std::vector<std::uint8_t> counters = [] {
      std::vector<std::uint8_t> out;
      for (std::size_t i = 0; i < kStatCounterCount; ++i) {
        for (std::size_t b = 0; b < 8; ++b)
          out.push_back(static_cast<std::uint8_t>((1000 + i) >> (8 * b)));
      }
      return out;
    }();
    m.counters_le = counters;
    m.shard_tokens_le = tokens;
  });
  add(MessageType::kGrantedMany, [](Message& m) {
    m.ttl_ms = 30000;
    m.tokens_le = tokens;
  });
  add(MessageType::kBusyMany, [](Message& m) {
    m.index = 1;
    m.ttl_ms = 1234;
  });
  add(MessageType::kMap, [](Message& m) { m.first_member = 5; });
  add(MessageType::kRedirect, [](Message& m) { m.epoch = 0x0000000100000002ULL; });
  static const std::vector<std::uint8_t> members = [] {
    const MemberEntry entries[] = {{"n2", "10.0.0.2:7000", 1}, {"node-3", "[::1]:7001", 300}};
    std::vector<std::uint8_t> out;
    EXPECT_TRUE(encode_member_list(entries, out));
    return out;
  }();
  add(MessageType::kMapReply, [](Message& m) {
    m.epoch = 7;
    m.member_count = 3;
    m.first_member = 1;
    m.member_list_count = 2;
    m.member_list = members;
  });
  add(MessageType::kQueryHolders, [](Message& m) {
    m.key = kKey;
    m.first_holder = 2;
  });
  static const std::vector<std::uint8_t> holders = [] {
    std::vector<std::uint8_t> out;
    EXPECT_TRUE(append_holder_entry({{0x11, 0x22}, 40, 900, 0, "10.0.0.7:80"}, out));
    EXPECT_TRUE(append_holder_entry({{0x33, 0x44}, 41, 0, kHolderFlagPending, ""}, out));
    return out;
  }();
  add(MessageType::kHoldersReply, [](Message& m) {
    m.key = kKey;
    m.mode = LeaseMode::kShared;
    m.waiters = 3;
    m.holders = 5;
    m.first_holder = 2;
    m.holder_list_count = 2;
    m.holder_list = holders;
  });
  add(MessageType::kHotKeys, [](Message&) {});
  static const std::vector<std::uint8_t> hot_keys = [] {
    std::vector<std::uint8_t> out;
    EXPECT_TRUE(append_hot_key_entry({kKey, 100, 3, 7, 1, 2}, out));
    EXPECT_TRUE(append_hot_key_entry({"a", 5, 5, 0, 0, 0}, out));
    return out;
  }();
  add(MessageType::kHotKeysReply, [](Message& m) {
    m.window_ms = 10000;
    m.hot_key_count = 2;
    m.hot_key_list = hot_keys;
  });
  add(MessageType::kWatch, [](Message& m) {
    m.key = kKey;
    m.token = 41;
    m.holders = 2;
    m.wait_ms = 30000;
  });
  return all;
}

void expect_same(const Message& a, const Message& b) {
  EXPECT_EQ(a.type, b.type);
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.owner, b.owner);
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.token, b.token);
  EXPECT_EQ(a.ttl_ms, b.ttl_ms);
  EXPECT_EQ(a.wait_ms, b.wait_ms);
  EXPECT_EQ(a.retry_after_ms, b.retry_after_ms);
  if (a.type == MessageType::kError) {
    EXPECT_EQ(a.error, b.error);
  }
  EXPECT_EQ(a.held, b.held);
  EXPECT_EQ(a.waiters, b.waiters);
  EXPECT_EQ(a.first_shard, b.first_shard);
  EXPECT_EQ(a.shard_count, b.shard_count);
  for (std::size_t i = 0; i < kStatCounterCount + 1; ++i)
    EXPECT_EQ(a.counter_at(i), b.counter_at(i));
  EXPECT_EQ(a.mode, b.mode);
  EXPECT_EQ(a.permits, b.permits);
  EXPECT_EQ(a.holders, b.holders);
  EXPECT_EQ(a.index, b.index);
  EXPECT_EQ(a.key_count, b.key_count);
  EXPECT_TRUE(
      std::equal(a.key_list.begin(), a.key_list.end(), b.key_list.begin(), b.key_list.end()));
  ASSERT_EQ(a.listed_token_count(), b.listed_token_count());
  for (std::size_t i = 0; i < a.listed_token_count(); ++i) {
    EXPECT_EQ(a.listed_token(i), b.listed_token(i));
  }
  ASSERT_EQ(a.shard_token_count(), b.shard_token_count());
  for (std::size_t i = 0; i < a.shard_token_count(); ++i) {
    EXPECT_EQ(a.shard_token(i), b.shard_token(i));
  }
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.first_member, b.first_member);
  EXPECT_EQ(a.member_count, b.member_count);
  EXPECT_EQ(a.member_list_count, b.member_list_count);
  EXPECT_TRUE(std::equal(a.member_list.begin(), a.member_list.end(), b.member_list.begin(),
                         b.member_list.end()));
  EXPECT_EQ(a.window_ms, b.window_ms);
  EXPECT_EQ(a.hot_key_count, b.hot_key_count);
  EXPECT_TRUE(std::equal(a.hot_key_list.begin(), a.hot_key_list.end(), b.hot_key_list.begin(),
                         b.hot_key_list.end()));
  EXPECT_EQ(a.value, b.value);
  EXPECT_EQ(a.first_holder, b.first_holder);
  EXPECT_EQ(a.holder_list_count, b.holder_list_count);
  EXPECT_TRUE(std::equal(a.holder_list.begin(), a.holder_list.end(), b.holder_list.begin(),
                         b.holder_list.end()));
}

Datagram single(const Message& m) {
  Datagram d;
  d.client_id = {0xAAAA, 0xBBBB};
  d.request_id = m.request_id;
  EXPECT_TRUE(d.push(m));
  return d;
}

std::vector<std::uint8_t> encode_or_die(const Datagram& d, std::size_t pad_to = 0) {
  std::vector<std::uint8_t> buf(kMaxDatagramSize);
  std::size_t n = 0;
  EXPECT_EQ(encode(d, buf, n, pad_to), ProtocolError::kOk);
  buf.resize(n);
  return buf;
}

// Decodes from a heap copy of exactly `bytes` so ASan flags any over-read.
// The copy stays alive until the next call, since `out` holds views into it.
ProtocolError decode_exact(const std::vector<std::uint8_t>& bytes, Datagram& out) {
  static std::unique_ptr<std::uint8_t[]> copy;
  copy = std::make_unique<std::uint8_t[]>(bytes.size());
  std::copy(bytes.begin(), bytes.end(), copy.get());
  return decode(std::span<const std::uint8_t>(copy.get(), bytes.size()), out);
}

TEST(Protocol, EverySingleMessageRoundTrips) {
  for (const Message& m : one_of_each_type()) {
    SCOPED_TRACE(std::string(to_string(m.type)));
    const auto bytes = encode_or_die(single(m));
    EXPECT_EQ(bytes.size(), encoded_size(single(m)));
    Datagram out;
    ASSERT_EQ(decode_exact(bytes, out), ProtocolError::kOk);
    EXPECT_FALSE(out.batch);
    EXPECT_EQ(out.client_id, (ClientId{0xAAAA, 0xBBBB}));
    EXPECT_EQ(out.request_id, m.request_id);
    ASSERT_EQ(out.count, 1);
    expect_same(m, out.messages[0]);
  }
}

TEST(Protocol, BatchRoundTripsWithPerItemRequestIds) {
  Datagram d;
  d.client_id = {1, 2};
  d.request_id = 99;
  for (const Message& m : one_of_each_type()) ASSERT_TRUE(d.push(m));
  const auto bytes = encode_or_die(d);
  Datagram out;
  ASSERT_EQ(decode_exact(bytes, out), ProtocolError::kOk);
  EXPECT_TRUE(out.batch);
  EXPECT_EQ(out.request_id, 99u);
  ASSERT_EQ(out.count, d.count);
  for (std::size_t i = 0; i < d.count; ++i) expect_same(d.messages[i], out.messages[i]);
}

// Items may act for their own owner; the others keep the header's.
TEST(Protocol, BatchItemsCarryTheirOwnOwner) {
  Datagram d;
  d.client_id = {1, 2};
  d.request_id = 77;
  std::size_t with_owner = 0;
  for (Message m : one_of_each_type()) {
    const bool owned = d.count % 2 == 1;
    if (owned) m.owner = ClientId{100u + d.count, 200u + d.count};
    ASSERT_TRUE(d.push(m));
    if (encoded_size(d) > kMaxDatagramSize) {  // as many types as one datagram holds
      --d.count;
      break;
    }
    if (owned) ++with_owner;
  }
  Datagram plain = d;
  for (Message& m : plain.items()) m.owner.reset();
  EXPECT_EQ(encoded_size(d), encoded_size(plain) + with_owner * kBatchItemOwnerSize);
  EXPECT_EQ(max_reply_size(d), max_reply_size(plain));  // replies carry no owner
  const auto bytes = encode_or_die(d);
  Datagram out;
  ASSERT_EQ(decode_exact(bytes, out), ProtocolError::kOk);
  EXPECT_EQ(out.client_id, (ClientId{1, 2}));
  ASSERT_EQ(out.count, d.count);
  for (std::size_t i = 0; i < d.count; ++i) expect_same(d.messages[i], out.messages[i]);

  // One message with an owner is framed as a batch of one.
  Datagram one = single(one_of_each_type()[0]);
  one.messages[0].owner = ClientId{5, 6};
  const auto one_bytes = encode_or_die(one);
  ASSERT_EQ(decode_exact(one_bytes, out), ProtocolError::kOk);
  EXPECT_TRUE(out.batch);
  EXPECT_EQ(out.messages[0].owner, (ClientId{5, 6}));

  // Reserved item flag bits are rejected (item flags sit at header + 1);
  // bit 1 is kItemFlagValue (ProtocolHolders below).
  for (int bit = 2; bit < 8; ++bit) {
    auto bad = one_bytes;
    bad[kHeaderSize + 1] = static_cast<std::uint8_t>(kItemFlagOwner | (1 << bit));
    EXPECT_EQ(decode_exact(bad, out), ProtocolError::kBadFlags) << "bit " << bit;
  }
}

TEST(Protocol, BatchOfOneKeepsBatchFraming) {
  Datagram d = single(one_of_each_type()[0]);
  d.batch = true;
  d.request_id = 5;
  const auto bytes = encode_or_die(d);
  EXPECT_EQ(bytes.size(), kHeaderSize + kBatchItemHeaderSize + 2 + kKey.size() + 8);
  Datagram out;
  ASSERT_EQ(decode_exact(bytes, out), ProtocolError::kOk);
  EXPECT_TRUE(out.batch);
  EXPECT_EQ(out.request_id, 5u);
  EXPECT_EQ(out.messages[0].request_id, d.messages[0].request_id);
}

TEST(Protocol, EveryTruncationOfEveryMessageIsRejected) {
  std::vector<Datagram> datagrams;
  for (const Message& m : one_of_each_type()) {
    datagrams.push_back(single(m));
    Datagram b = single(m);
    b.batch = true;
    datagrams.push_back(b);
  }
  // Every type batched, in as few datagrams as hold them with an owner and
  // an epoch each: plain, with owners, with owners and an epoch.
  std::vector<Datagram> batches(1);
  for (Message m : one_of_each_type()) {
    m.owner = ClientId{3, 4};
    Datagram& last = batches.back();
    ASSERT_TRUE(last.push(m));
    last.epoch = 9;
    if (encoded_size(last) > kMaxDatagramSize) {
      --last.count;
      batches.emplace_back();
      ASSERT_TRUE(batches.back().push(m));
    }
  }
  for (Datagram& all : batches) {
    all.epoch.reset();
    for (Message& m : all.items()) m.owner.reset();
    all.batch = true;
    datagrams.push_back(all);
    for (Message& m : all.items()) m.owner = ClientId{3, 4};
    datagrams.push_back(all);
    all.epoch = 9;
    datagrams.push_back(all);
  }
  // With a map epoch after the header, single.
  for (const Message& m : one_of_each_type()) {
    Datagram e = single(m);
    e.epoch = 0x0102030405060708ULL;
    datagrams.push_back(e);
  }

  for (const Datagram& d : datagrams) {
    const auto bytes = encode_or_die(d);
    for (std::size_t len = 0; len < bytes.size(); ++len) {
      SCOPED_TRACE(::testing::Message()
                   << to_string(d.messages[0].type) << " batch=" << d.batch << " len=" << len);
      std::vector<std::uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<long>(len));
      Datagram out;
      EXPECT_NE(decode_exact(prefix, out), ProtocolError::kOk);
    }
  }
}

TEST(Protocol, ZeroPaddingAcceptedNonZeroRejected) {
  const Message m = one_of_each_type()[0];
  auto bytes = encode_or_die(single(m), 200);
  ASSERT_EQ(bytes.size(), 200u);
  Datagram out;
  EXPECT_EQ(decode_exact(bytes, out), ProtocolError::kOk);
  bytes.back() = 1;
  EXPECT_EQ(decode_exact(bytes, out), ProtocolError::kNonZeroPadding);
}

TEST(Protocol, HeaderErrors) {
  const auto good = encode_or_die(single(one_of_each_type()[0]));
  Datagram out;
  auto bad = good;
  bad[0] ^= 1;
  EXPECT_EQ(decode_exact(bad, out), ProtocolError::kBadMagic);

  bad = good;
  bad[4] = 2;  // version
  EXPECT_EQ(decode_exact(bad, out), ProtocolError::kUnsupportedVersion);
  EXPECT_EQ(out.version, 2);
  EXPECT_EQ(out.request_id, one_of_each_type()[0].request_id);
  EXPECT_EQ(out.client_id, (ClientId{0xAAAA, 0xBBBB}));

  // Flags: bit 0 (a sealed datagram, its tag already removed) decodes and is
  // reported; bit 1 (kFlagEpoch) has its own tests; every reserved bit is
  // rejected.
  bad = good;
  bad[5] = kFlagAuthenticated;
  EXPECT_EQ(decode_exact(bad, out), ProtocolError::kOk);
  EXPECT_EQ(out.flags, kFlagAuthenticated);
  EXPECT_FALSE(out.epoch.has_value());
  for (int bit = 2; bit < 8; ++bit) {
    bad = good;
    bad[5] = static_cast<std::uint8_t>(1 << bit);
    EXPECT_EQ(decode_exact(bad, out), ProtocolError::kBadFlags) << "bit " << bit;
  }
  bad = good;
  bad[6] = 0x42;  // type
  EXPECT_EQ(decode_exact(bad, out), ProtocolError::kBadType);
  bad = good;
  bad[7] = 2;  // count of a single message
  EXPECT_EQ(decode_exact(bad, out), ProtocolError::kBadCount);

  std::vector<std::uint8_t> big(kMaxDatagramSize + 1, 0);
  std::copy(good.begin(), good.end(), big.begin());
  EXPECT_EQ(decode_exact(big, out), ProtocolError::kTooLarge);
}

TEST(Protocol, BatchItemLengthMustMatchBody) {
  Datagram d = single(one_of_each_type()[3]);  // QUERY
  d.batch = true;
  auto bytes = encode_or_die(d);
  // body_length sits at header + 2; claim one byte more than the body.
  bytes.push_back(0);
  bytes[kHeaderSize + 2] = static_cast<std::uint8_t>(bytes[kHeaderSize + 2] + 1);
  Datagram out;
  EXPECT_EQ(decode_exact(bytes, out), ProtocolError::kBadLength);
  // And one byte less: the key no longer fits in the item.
  bytes.pop_back();
  bytes[kHeaderSize + 2] = static_cast<std::uint8_t>(bytes[kHeaderSize + 2] - 2);
  EXPECT_EQ(decode_exact(bytes, out), ProtocolError::kBadLength);
}

TEST(Protocol, EncodeRefusesOversizedOrInvalidDatagrams) {
  std::vector<std::uint8_t> buf(4096);
  std::size_t n = 0;
  Datagram empty;
  EXPECT_EQ(encode(empty, buf, n), ProtocolError::kBadCount);

  const std::string long_key(1400, 'k');
  Message m;
  m.type = MessageType::kQuery;
  m.key = long_key;
  EXPECT_EQ(encode(single(m), buf, n), ProtocolError::kTooLarge);
  EXPECT_EQ(n, 0u);

  m.key = "k";
  std::vector<std::uint8_t> tiny(10);
  EXPECT_EQ(encode(single(m), tiny, n), ProtocolError::kTooLarge);
  EXPECT_EQ(encode(single(m), buf, n, kMaxDatagramSize + 1), ProtocolError::kTooLarge);

  m.type = MessageType::kBatch;
  EXPECT_EQ(encode(single(m), buf, n), ProtocolError::kBadType);
}

TEST(Protocol, KeysOutsideServerLimitsStillDecode) {
  // The codec is structural; the server answers ERROR(kKeyTooLong / kBadKey).
  const std::string key(300, 'x');
  Message m;
  m.type = MessageType::kAcquire;
  m.key = key;
  m.ttl_ms = 1;
  Datagram out;
  ASSERT_EQ(decode_exact(encode_or_die(single(m)), out), ProtocolError::kOk);
  EXPECT_EQ(out.messages[0].key.size(), 300u);
  m.key = {};
  ASSERT_EQ(decode_exact(encode_or_die(single(m)), out), ProtocolError::kOk);
  EXPECT_TRUE(out.messages[0].key.empty());
}

// Every reply the server could send for a request fits in max_reply_size(),
// which encode_request() pads to: no reply is ever larger than its request.
TEST(Protocol, PaddedRequestsBoundEveryReply) {
  std::mt19937_64 rng(7);
  const auto replies = one_of_each_type();
  for (int round = 0; round < 200; ++round) {
    const std::string key(1 + rng() % 256, 'k');
    Datagram req;
    req.client_id = {rng(), rng()};
    if (rng() % 2 == 0) req.epoch = rng();  // replies never carry it
    const std::size_t n = 1 + rng() % 4;
    for (std::size_t i = 0; i < n; ++i) {
      Message m = one_of_each_type()[rng() % 5];
      if (rng() % 6 == 0) {
        m.type = MessageType::kQueryHolders;
        m.first_holder = static_cast<std::uint32_t>(rng());
      }
      m.key = key;
      ASSERT_TRUE(req.push(m));
    }
    std::vector<std::uint8_t> buf(kMaxDatagramSize);
    std::size_t req_len = 0;
    ASSERT_EQ(encode_request(req, buf, req_len), ProtocolError::kOk);
    ASSERT_EQ(req_len, std::max(encoded_size(req), max_reply_size(req)));

    // Worst case per request type, framed like the request.
    Datagram reply;
    reply.batch = req.batch;
    for (const Message& r : req.items()) {
      Message worst;
      worst.key = r.key;
      switch (r.type) {
        case MessageType::kAcquire:
          worst.type = MessageType::kGranted;
          break;
        case MessageType::kRenew:
          worst.type = MessageType::kRenewed;
          break;
        case MessageType::kRelease:
          worst.type = MessageType::kError;
          break;
        case MessageType::kQuery:
          worst.type = MessageType::kQueryReply;
          break;
        case MessageType::kQueryHolders:
          worst.type = MessageType::kHoldersReply;  // with no holders: its bound
          break;
        default:
          worst.type = MessageType::kStatsReply;
          worst.counters_le = kZeroCounters;
          break;
      }
      ASSERT_TRUE(reply.push(worst));
    }
    EXPECT_LE(encoded_size(reply), req_len);
    // A deferred answer to a queued ACQUIRE (a single GRANTED) also fits.
    const bool has_acquire =
        std::any_of(req.items().begin(), req.items().end(),
                    [](const Message& r) { return r.type == MessageType::kAcquire; });
    Message granted;
    granted.type = MessageType::kGranted;
    granted.key = key;
    if (has_acquire) {
      EXPECT_LE(encoded_size(single(granted)), req_len);
    }
  }
}

// Whichever waiting ACQUIREs of a padded request get queued, the immediate
// reply to the others plus one single GRANTED per queued one fits the
// request's bytes, and each GRANTED fits its own deferred_reply_credit().
TEST(Protocol, PaddingCoversEveryDeferredAnswer) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 300; ++round) {
    const std::string key(1 + rng() % 40, 'k');
    Datagram req;
    if (rng() % 2 == 0) req.epoch = rng();  // a cluster client's request: 8 bytes more
    const std::size_t n = 1 + rng() % 8;
    for (std::size_t i = 0; i < n; ++i) {
      Message m;
      m.type = rng() % 2 == 0 ? MessageType::kAcquire : MessageType::kRelease;
      m.key = key;
      m.wait_ms = static_cast<std::uint32_t>(rng() % 2);
      ASSERT_TRUE(req.push(m));
    }
    std::vector<std::uint8_t> buf(kMaxDatagramSize);
    std::size_t req_len = 0;
    ASSERT_EQ(encode_request(req, buf, req_len), ProtocolError::kOk);
    EXPECT_LE(max_immediate_reply_size(req), max_reply_size(req));
    Message granted;
    granted.type = MessageType::kGranted;
    granted.key = key;
    const std::size_t deferred = encoded_size(single(granted));
    for (unsigned mask = 0; mask < (1u << n); ++mask) {
      Datagram reply;
      reply.batch = req.batch || req.count > 1;
      std::size_t total = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const Message& r = req.messages[i];
        const std::size_t credit = deferred_reply_credit(req, req_len, i);
        const bool waits = r.type == MessageType::kAcquire && r.wait_ms > 0;
        EXPECT_EQ(credit > 0, waits) << "only waiting ACQUIREs can be queued";
        if ((mask >> i & 1) != 0 && waits) {
          EXPECT_LE(deferred, credit);
          total += credit;
          continue;
        }
        Message worst;
        worst.key = key;
        worst.type = r.type == MessageType::kAcquire ? MessageType::kGranted : MessageType::kError;
        ASSERT_TRUE(reply.push(worst));
      }
      if (reply.count > 0) total += encoded_size(reply);
      EXPECT_LE(total, req_len) << "mask " << mask;
    }
  }
}

TEST(Protocol, RandomBytesNeverCrash) {
  std::mt19937_64 rng(12345);
  const auto valid = encode_or_die(single(one_of_each_type()[0]));
  Datagram out;
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::uint8_t> bytes(rng() % (kMaxDatagramSize + 2));
    for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
    if (i % 2 == 0 && bytes.size() >= kHeaderSize) {
      // Keep a valid header half the time so the body parsers get exercised.
      std::copy(valid.begin(), valid.begin() + 8, bytes.begin());
      if (i % 4 == 0) bytes[6] = 0xFF;
      bytes[7] = static_cast<std::uint8_t>(1 + rng() % 3);
    }
    (void)decode_exact(bytes, out);
  }
  SUCCEED();
}

TEST(Protocol, MutatedValidDatagramsNeverCrash) {
  std::mt19937_64 rng(99);
  Datagram all;
  for (const Message& m : one_of_each_type()) ASSERT_TRUE(all.push(m));
  const auto base = encode_or_die(all);
  Datagram out;
  for (int i = 0; i < 20000; ++i) {
    auto bytes = base;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<std::uint8_t>(rng());
    if (decode_exact(bytes, out) == ProtocolError::kOk) {
      // Whatever decoded must re-encode to something that decodes again.
      std::vector<std::uint8_t> again(kMaxDatagramSize);
      std::size_t n = 0;
      ASSERT_EQ(encode(out, again, n), ProtocolError::kOk);
    }
  }
}

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (const std::uint8_t b : bytes) {
    s += kDigits[b >> 4];
    s += kDigits[b & 0xF];
  }
  return s;
}

// The wire bytes of every message, as the codec wrote them before it was
// derived from one table: a change to the codec cannot change the format
// unnoticed. Also pins the reply bound each request is padded to.
TEST(Protocol, WireBytesArePinned) {
  struct Pinned {
    MessageType type;
    const char* body;
    std::size_t max_reply_size;
  };
  const Pinned pinned[] = {
      {MessageType::kAcquire, "09006f72646572732f343230750000f4010000", 55},
      {MessageType::kRenew, "09006f72646572732f34324d00000000000000e8030000", 47},
      {MessageType::kRelease, "09006f72646572732f34324e00000000000000", 34},
      {MessageType::kQuery, "09006f72646572732f3432", 69},
      {MessageType::kStats, "07000000", 259},
      {MessageType::kAcquireShared, "09006f72646572732f343230750000f4010000", 55},
      {MessageType::kAcquirePermit, "09006f72646572732f343230750000f401000003000000", 55},
      {MessageType::kAcquireMany, "0130750000f40100000201006109006f72646572732f3432", 53},
      {MessageType::kGranted, "09006f72646572732f3432f0ffffffffffffff30750000", 34},
      {MessageType::kBusy, "09006f72646572732f3432d2040000", 34},
      {MessageType::kTimeout, "09006f72646572732f3432", 34},
      {MessageType::kRenewed, "09006f72646572732f3432e7030000", 34},
      {MessageType::kReleased, "", 34},
      {MessageType::kNotOwner, "", 34},
      {MessageType::kExpired, "", 34},
      {MessageType::kRecovering, "e1100000", 34},
      {MessageType::kError, "0300", 34},
      {MessageType::kQueryReply,
       "09006f72646572732f34320105000000000000001100000003000000020200000004000000", 34},
      {MessageType::kStatsReply,
       "4000000003000000"
       "1be803000000000000e903000000000000ea03000000000000eb03000000000000ec03000000000000"
       "ed03000000000000ee03000000000000ef03000000000000f003000000000000f103000000000000"
       "f203000000000000f303000000000000f403000000000000f503000000000000f603000000000000"
       "f703000000000000f803000000000000f903000000000000fa03000000000000fb03000000000000"
       "fc03000000000000"
       // the gauges: leases, keys, waiters, uptime, lock-delay left, version
       "fd03000000000000fe03000000000000ff030000000000000004000000000000"
       "01040000000000000204000000000000"
       "020001000000000000000200000000000009",
       34},
      {MessageType::kGrantedMany, "307500000201000000000000000200000000000009", 34},
      {MessageType::kBusyMany, "01d2040000", 34},
      {MessageType::kMap, "05000000", 49},
      {MessageType::kRedirect, "0200000001000000", 34},
      {MessageType::kMapReply,
       "0700000000000000"
       "03000000"
       "01000000"
       "02"
       "0200"
       "6e32"
       "0d00"
       "31302e302e302e323a37303030"
       "01000000"
       "0600"
       "6e6f64652d33"
       "0a00"
       "5b3a3a315d3a37303031"
       "2c010000",
       34},
      {MessageType::kQueryHolders, "09006f72646572732f343202000000", 61},
      {MessageType::kHoldersReply,
       "09006f72646572732f3432"
       "01"
       "00000000"
       "03000000"
       "05000000"
       "02000000"
       "02"
       "1100000000000000"
       "2200000000000000"
       "2800000000000000"
       "84030000"
       "00"
       "0b00"
       "31302e302e302e373a3830"
       "3300000000000000"
       "4400000000000000"
       "2900000000000000"
       "00000000"
       "01"
       "0000",
       34},
      {MessageType::kHotKeys, "", 37},
      {MessageType::kHotKeysReply,
       "10270000"
       "02"
       "0900"
       "6f72646572732f3432"
       "64000000"
       "03000000"
       "07000000"
       "01000000"
       "02000000"
       "0100"
       "61"
       "05000000"
       "05000000"
       "00000000"
       "00000000"
       "00000000",
       34},
      {MessageType::kWatch,
       "09006f72646572732f3432290000000000000002000000"
       "30750000",
       61},
  };
  const auto all = one_of_each_type();
  ASSERT_EQ(all.size(), std::size(pinned));
  for (std::size_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE(std::string(to_string(all[i].type)));
    ASSERT_EQ(all[i].type, pinned[i].type);
    const auto bytes = encode_or_die(single(all[i]));
    ASSERT_GE(bytes.size(), kHeaderSize);
    EXPECT_EQ(to_hex(std::span(bytes).subspan(kHeaderSize)), pinned[i].body);
    EXPECT_EQ(max_reply_size(single(all[i])), pinned[i].max_reply_size);
    EXPECT_EQ(max_immediate_reply_size(single(all[i])), pinned[i].max_reply_size);
  }
  const auto acquire_bytes = encode_or_die(single(all[0]));
  EXPECT_EQ(to_hex(std::span(acquire_bytes).first(kHeaderSize)),
            "53484c4b010001010077665544332211aaaa000000000000bbbb000000000000");

  // With a map epoch: flag bit 1, the u64 after the header, then the body.
  Datagram with_epoch = single(all[0]);
  with_epoch.epoch = 0x0102030405060708ULL;
  const auto epoch_bytes = encode_or_die(with_epoch);
  EXPECT_EQ(to_hex(epoch_bytes),
            "53484c4b010201010077665544332211aaaa000000000000bbbb000000000000"
            "0807060504030201"
            "09006f72646572732f343230750000f4010000");
  EXPECT_EQ(max_reply_size(with_epoch), 55u);  // the reply carries no epoch

  // A padded batch: an ACQUIRE with its own owner and a RELEASE.
  Datagram d;
  d.client_id = {1, 2};
  d.request_id = 99;
  Message acquire = all[0];
  acquire.owner = ClientId{3, 4};
  ASSERT_TRUE(d.push(acquire));
  ASSERT_TRUE(d.push(all[2]));
  EXPECT_EQ(max_reply_size(d), 101u);
  EXPECT_EQ(max_immediate_reply_size(d), 81u);
  std::vector<std::uint8_t> buf(kMaxDatagramSize);
  std::size_t n = 0;
  ASSERT_EQ(encode_request(d, buf, n), ProtocolError::kOk);
  EXPECT_EQ(to_hex(std::span(buf).first(n)),
            "53484c4b0100ff02630000000000000001000000000000000200000000000000"
            "0101130000776655443322110300000000000000040000000000000009006f72646572732f343230750000"
            "f4010000"
            "03001300027766554433221109006f72646572732f34324e00000000000000");
}

// ---- The tables (kMessageBodies, kRequestReplies) ----------------------------

// The samples the tests above round-trip and truncate cover every row of
// kMessageBodies, so a new message type cannot go untested.
TEST(ProtocolTable, SamplesCoverEveryMessageBody) {
  const auto all = one_of_each_type();
  ASSERT_EQ(all.size(), kMessageBodies.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].type, kMessageBodies[i].type) << i;
    EXPECT_EQ(to_string(all[i].type), kMessageBodies[i].name);
  }
}

TEST(ProtocolTable, EveryTypeIsARequestOrAReplyWithABody) {
  for (unsigned t = 0; t < 256; ++t) {
    const auto type = static_cast<MessageType>(t);
    SCOPED_TRACE(t);
    EXPECT_FALSE(is_request(type) && is_reply(type));
    EXPECT_EQ(message_body(type) != nullptr, is_request(type) || is_reply(type));
    if (message_body(type) != nullptr) {
      EXPECT_EQ(message_body(type)->type, type);
    }
  }
  EXPECT_EQ(message_body(MessageType::kBatch), nullptr);
  // Every reply answers some request.
  for (const MessageBody& body : kMessageBodies) {
    if (!is_reply(body.type)) continue;
    bool answers_one = false;
    for (const RequestReplies& row : kRequestReplies) {
      answers_one = answers_one || reply_answers(row.request, body.type);
    }
    EXPECT_TRUE(answers_one) << to_string(body.type);
  }
}

TEST(ProtocolTable, EveryRequestHasAnswersAndErrorIsOne) {
  ASSERT_FALSE(kRequestReplies.empty());
  for (const RequestReplies& row : kRequestReplies) {
    SCOPED_TRACE(std::string(to_string(row.request)));
    EXPECT_TRUE(is_request(row.request));
    ASSERT_NE(message_body(row.request), nullptr);
    EXPECT_GE(row.replies.count, 2u) << "an answer besides ERROR";
    EXPECT_TRUE(row.replies.contains(MessageType::kError)) << "any request can be refused";
    for (const MessageType reply : row.replies) {
      EXPECT_TRUE(is_reply(reply)) << to_string(reply);
      EXPECT_TRUE(reply_answers(row.request, reply)) << to_string(reply);
      EXPECT_FALSE(row.also_accepted.contains(reply)) << "listed twice: " << to_string(reply);
    }
    for (const MessageType reply : row.also_accepted) {
      EXPECT_TRUE(is_reply(reply)) << to_string(reply);
      EXPECT_TRUE(reply_answers(row.request, reply)) << to_string(reply);
    }
    // Only a request with a wait field can be queued.
    EXPECT_EQ(row.queues_when_waiting, message_body(row.request)->has(BodyField::kWait));
  }
  // Requests, and types that are no request, are never answers.
  for (const RequestReplies& row : kRequestReplies) {
    for (unsigned t = 0; t < 256; ++t) {
      const auto type = static_cast<MessageType>(t);
      if (!is_reply(type)) {
        EXPECT_FALSE(reply_answers(row.request, type)) << t;
      }
      EXPECT_FALSE(reply_answers(type, row.request)) << t;
    }
  }
}

// reply_answers() and reply_carries_key() give exactly what the client's own
// lists said before they moved into the table.
TEST(ProtocolTable, ClientReplyMatchingIsUnchanged) {
  using enum MessageType;
  const auto answered_before = [](MessageType request, MessageType reply) {
    if (reply == kError || reply == kRecovering) return true;
    switch (request) {
      case kAcquire:
      case kAcquireShared:
      case kAcquirePermit:
        return reply == kGranted || reply == kBusy || reply == kTimeout;
      case kAcquireMany:
        return reply == kGrantedMany || reply == kBusyMany || reply == kTimeout;
      case kRenew:
      case kRelease:
        return reply == (request == kRenew ? kRenewed : kReleased) || reply == kNotOwner ||
               reply == kExpired;
      case kQuery:
        return reply == kQueryReply;
      case kStats:
        return reply == kStatsReply;
      default:
        return false;
    }
  };
  // What cluster mode added: REDIRECT to the requests on a key whose
  // owner a map decides, and the MAP request. Holder listing: QUERY_HOLDERS, routed
  // and answered as QUERY is, and HOT_KEYS, answered as MAP is.
  const auto answered_now = [&](MessageType request, MessageType reply) {
    if (request == kMap) return reply == kMapReply || reply == kError || reply == kRecovering;
    if (request == kHotKeys) {
      return reply == kHotKeysReply || reply == kError || reply == kRecovering;
    }
    // WATCH, a blocking QUERY_HOLDERS, answered as it is.
    if (request == kQueryHolders || request == kWatch) {
      return reply == kHoldersReply || reply == kError || reply == kRecovering ||
             reply == kRedirect;
    }
    if (reply == kRedirect) {
      return is_acquire(request) || request == kRenew || request == kQuery;
    }
    return answered_before(request, reply);
  };
  for (const RequestReplies& row : kRequestReplies) {
    for (unsigned t = 0; t < 256; ++t) {
      const auto reply = static_cast<MessageType>(t);
      EXPECT_EQ(reply_answers(row.request, reply), answered_now(row.request, reply))
          << to_string(row.request) << " / " << t;
    }
  }
  for (unsigned t = 0; t < 256; ++t) {
    const auto reply = static_cast<MessageType>(t);
    const bool carried_before = reply == kGranted || reply == kBusy || reply == kTimeout ||
                                reply == kRenewed || reply == kQueryReply || reply == kHoldersReply;
    EXPECT_EQ(reply_carries_key(reply), carried_before) << t;
  }
}

// The encoded body of every message is the table's fixed size plus its key
// and shard tokens, single or batched, and encoded_size() is what encode()
// writes.
TEST(ProtocolTable, SizesAreTheBytesWritten) {
  for (Message m : one_of_each_type()) {
    SCOPED_TRACE(std::string(to_string(m.type)));
    const MessageBody& body = *message_body(m.type);
    const std::size_t expected =
        body.fixed_size() + (body.has(BodyField::kKey) ? m.key.size() : 0) +
        m.shard_tokens_le.size() + m.key_list.size() + m.tokens_le.size() + m.member_list.size() +
        m.holder_list.size() + m.hot_key_list.size();
    const auto bytes = encode_or_die(single(m));
    EXPECT_EQ(bytes.size(), encoded_size(single(m)));
    EXPECT_EQ(bytes.size(), kHeaderSize + expected);
    m.owner = ClientId{1, 2};
    const auto batched = encode_or_die(single(m));
    EXPECT_EQ(batched.size(), encoded_size(single(m)));
    EXPECT_EQ(batched.size(), kHeaderSize + kBatchItemHeaderSize + kBatchItemOwnerSize + expected);
  }
}

// Cutting any field of any message short inside a batch item (whose length
// then disagrees with its body) is rejected too, not just a short datagram.
TEST(ProtocolTable, EveryShortBodyIsRejected) {
  for (const Message& m : one_of_each_type()) {
    Datagram d = single(m);
    d.batch = true;
    const auto bytes = encode_or_die(d);
    const std::size_t body_at = kHeaderSize + kBatchItemHeaderSize;
    const std::size_t body_length = bytes.size() - body_at;
    for (std::size_t len = 0; len < body_length; ++len) {
      SCOPED_TRACE(::testing::Message() << to_string(m.type) << " body length " << len);
      std::vector<std::uint8_t> cut(bytes.begin(),
                                    bytes.begin() + static_cast<long>(body_at + len));
      cut[kHeaderSize + 2] = static_cast<std::uint8_t>(len);
      cut[kHeaderSize + 3] = static_cast<std::uint8_t>(len >> 8);
      Datagram out;
      EXPECT_EQ(decode_exact(cut, out), ProtocolError::kBadLength);
    }
  }
}

// max_reply_size() of a request is the largest body among the replies its
// row lists, each with the request's key and STATS_REPLY without tokens.
TEST(ProtocolTable, ReplyBoundIsTheLargestListedReply) {
  for (const RequestReplies& row : kRequestReplies) {
    for (const std::size_t key_length : {0, 1, 9, 40, 256, 300}) {
      SCOPED_TRACE(::testing::Message() << to_string(row.request) << " key " << key_length);
      const std::string key(key_length, 'k');
      Message request;
      request.type = row.request;
      request.key = key;
      const std::size_t bound = max_reply_size(single(request)) - kHeaderSize;
      EXPECT_EQ(bound, max_reply_body_bound(row.request)(key_length));
      std::size_t largest = 0;
      for (const MessageType type : row.replies) {
        Message reply;
        reply.type = type;
        reply.key = key;
        reply.counters_le = kZeroCounters;
        const std::size_t body = encoded_size(single(reply)) - kHeaderSize;
        EXPECT_LE(body, bound) << to_string(type);
        largest = std::max(largest, body);
      }
      EXPECT_EQ(largest, bound);
    }
  }
  // A reply type sent as a request gets ERROR(kNotARequest).
  Message reply;
  reply.type = MessageType::kGranted;
  reply.key = "k";
  EXPECT_EQ(max_reply_size(single(reply)),
            kHeaderSize + message_body(MessageType::kError)->fixed_size());
}

// ACQUIRE_MANY's padding pays for a token per key it lists: its largest
// reply, GRANTED_MANY, fits the padded request whatever the keys' lengths.
TEST(ProtocolTable, AcquireManyIsPaddedForATokenPerKey) {
  for (std::size_t keys = 1; keys <= kMaxKeysPerRequest; ++keys) {
    for (const std::size_t key_length : {1, 7, 256}) {
      std::vector<std::string> names;
      for (std::size_t i = 0; i < keys; ++i)
        names.push_back(std::string(key_length, static_cast<char>('a' + i)));
      std::vector<std::string_view> views(names.begin(), names.end());
      std::vector<std::uint8_t> list;
      ASSERT_TRUE(encode_key_list(views, list));
      Message request;
      request.type = MessageType::kAcquireMany;
      request.key_count = static_cast<std::uint8_t>(keys);
      request.key_list = list;
      request.wait_ms = 1;
      std::vector<std::uint8_t> buf(kMaxDatagramSize);
      std::size_t written = 0;
      if (encode_request(single(request), buf, written) != ProtocolError::kOk) {
        EXPECT_GT(keys * (2 + key_length), 1000U) << "only too many long keys overflow";
        continue;
      }
      std::vector<std::uint8_t> tokens(8 * keys, 0xFF);
      Message granted;
      granted.type = MessageType::kGrantedMany;
      granted.tokens_le = tokens;
      EXPECT_LE(encoded_size(single(granted)), written) << keys << " keys of " << key_length;
      // The list reads back key by key.
      Datagram out;
      ASSERT_EQ(decode(std::span(buf).first(written), out), ProtocolError::kOk);
      std::size_t i = 0;
      for (const std::string_view k : KeyList(out.messages[0])) EXPECT_EQ(k, names[i++]);
      EXPECT_EQ(i, keys);
    }
  }
}

// A key list whose count says more keys than its bytes hold is truncated;
// a lease mode past kPermit is a bad field.
TEST(ProtocolTable, MalformedKeyListsAndModesAreRejected) {
  const std::string_view keys[] = {"a", "bb"};
  std::vector<std::uint8_t> list;
  ASSERT_TRUE(encode_key_list(keys, list));
  Message m;
  m.type = MessageType::kAcquireMany;
  m.key_count = 3;  // one more than the entries
  m.key_list = list;
  auto bytes = encode_or_die(single(m));
  Datagram out;
  EXPECT_EQ(decode_exact(bytes, out), ProtocolError::kTruncated);
  m.key_count = 2;
  bytes = encode_or_die(single(m));
  ASSERT_EQ(decode_exact(bytes, out), ProtocolError::kOk);
  bytes[kHeaderSize] = 3;  // the mode byte
  EXPECT_EQ(decode_exact(bytes, out), ProtocolError::kBadField);
}

// REDIRECT answers the requests a cluster node may send to the key's owner,
// never RELEASE (a lease is released where it was granted), STATS or MAP;
// the server sends it (it is in the reply bound) and it carries no key.
TEST(ProtocolTable, RedirectAnswersTheKeyedRequestsButRelease) {
  using enum MessageType;
  for (const MessageType request :
       {kAcquire, kAcquireShared, kAcquirePermit, kAcquireMany, kRenew, kQuery}) {
    bool sent = false;
    for (const RequestReplies& row : kRequestReplies) {
      if (row.request == request) sent = row.replies.contains(kRedirect);
    }
    EXPECT_TRUE(sent) << to_string(request);
    EXPECT_TRUE(reply_answers(request, kRedirect)) << to_string(request);
  }
  for (const MessageType request : {kRelease, kStats, kMap}) {
    EXPECT_FALSE(reply_answers(request, kRedirect)) << to_string(request);
  }
  EXPECT_FALSE(reply_carries_key(kRedirect));
  EXPECT_TRUE(reply_answers(kMap, kMapReply));
  EXPECT_TRUE(reply_answers(kMap, kRecovering));
  EXPECT_FALSE(reply_answers(kStats, kMapReply));
  EXPECT_FALSE(reply_carries_key(kMapReply));
  EXPECT_EQ(to_string(kRedirect), "REDIRECT");
  EXPECT_EQ(to_string(kMap), "MAP");
  EXPECT_EQ(to_string(kMapReply), "MAP_REPLY");
}

// REDIRECT's 8 bytes never change how far a request is padded: for any
// valid key (or key list), the request's own body or another reply it may
// get is at least as large, so a client built before REDIRECT pads its
// requests enough for a server that sends it.
TEST(ProtocolTable, RedirectDoesNotChangeRequestPadding) {
  const std::size_t redirect = message_body(MessageType::kRedirect)->fixed_size();
  ASSERT_EQ(redirect, 8u);
  for (const RequestReplies& row : kRequestReplies) {
    if (!row.replies.contains(MessageType::kRedirect)) continue;
    for (const std::size_t key_length :
         {kMinKeyLength, std::size_t{2}, std::size_t{9}, kMaxKeyLength}) {
      SCOPED_TRACE(::testing::Message() << to_string(row.request) << " key " << key_length);
      const std::string key(key_length, 'k');
      const std::string_view keys[] = {key};
      std::vector<std::uint8_t> list;
      ASSERT_TRUE(encode_key_list(keys, list));
      Message request;
      request.type = row.request;
      request.key = key;
      if (row.request == MessageType::kAcquireMany) {
        request.key = {};
        request.key_count = 1;
        request.key_list = list;
      }
      const std::size_t request_body = encoded_size(single(request)) - kHeaderSize;
      std::size_t other_replies = 0;
      for (const MessageType type : row.replies) {
        if (type == MessageType::kRedirect) continue;
        other_replies = std::max(other_replies, message_body(type)->fixed_size());
      }
      EXPECT_GE(std::max(request_body, other_replies), redirect);
      // And the padded size is the larger of the request and its bound.
      std::vector<std::uint8_t> buf(kMaxDatagramSize);
      std::size_t written = 0;
      ASSERT_EQ(encode_request(single(request), buf, written), ProtocolError::kOk);
      EXPECT_EQ(written, kHeaderSize +
                             std::max(request_body, max_reply_size(single(request)) - kHeaderSize));
    }
  }
}

// A MAP request is padded for a MAP_REPLY without members: epoch, member
// count, first member and the list's count byte.
TEST(ProtocolTable, MapIsPaddedForAnEmptyMapReply) {
  Message map;
  map.type = MessageType::kMap;
  EXPECT_EQ(max_reply_size(single(map)), kHeaderSize + 8 + 4 + 4 + 1);
  Message empty;
  empty.type = MessageType::kMapReply;
  EXPECT_EQ(encoded_size(single(empty)), max_reply_size(single(map)));
}

// QUERY_HOLDERS is padded for a HOLDERS_REPLY without holders (its key,
// mode, permits, waiters, holders, first holder and the list's count byte);
// the holders it gets are paid for by padding beyond that.
TEST(ProtocolTable, QueryHoldersIsPaddedForAnEmptyPage) {
  Message query;
  query.type = MessageType::kQueryHolders;
  query.key = kKey;
  EXPECT_EQ(max_reply_size(single(query)), kHeaderSize + 2 + kKey.size() + 1 + 4 + 4 + 4 + 4 + 1);
  Message empty;
  empty.type = MessageType::kHoldersReply;
  empty.key = kKey;
  EXPECT_EQ(encoded_size(single(empty)), max_reply_size(single(query)));
  EXPECT_TRUE(reply_carries_key(MessageType::kHoldersReply));
  EXPECT_EQ(to_string(MessageType::kQueryHolders), "QUERY_HOLDERS");
  EXPECT_EQ(to_string(MessageType::kHoldersReply), "HOLDERS_REPLY");
}

TEST(ProtocolTable, OnlyAWaitingAcquireOrWatchMayBeAnsweredLater) {
  for (Message m : one_of_each_type()) {
    m.wait_ms = 0;
    EXPECT_FALSE(may_answer_later(m)) << to_string(m.type);
    m.wait_ms = 1;
    EXPECT_EQ(may_answer_later(m), is_acquire(m.type) || m.type == MessageType::kWatch)
        << to_string(m.type);
  }
}

// ---- The map epoch (kFlagEpoch) -------------------------------------------

// Every message, single or batched, round-trips with an epoch; the datagram
// is 8 bytes longer and its reply bound is unchanged.
TEST(ProtocolEpoch, RoundTripsSingleAndBatched) {
  for (const std::uint64_t epoch : {std::uint64_t{0}, std::uint64_t{1}, ~std::uint64_t{0}}) {
    for (const Message& m : one_of_each_type()) {
      SCOPED_TRACE(::testing::Message() << to_string(m.type) << " epoch " << epoch);
      Datagram d = single(m);
      const std::size_t plain_size = encoded_size(d);
      const std::size_t plain_bound = max_reply_size(d);
      const std::size_t plain_immediate = max_immediate_reply_size(d);
      d.epoch = epoch;
      EXPECT_EQ(encoded_size(d), plain_size + kEpochSize);
      EXPECT_EQ(max_reply_size(d), plain_bound);
      EXPECT_EQ(max_immediate_reply_size(d), plain_immediate);
      const auto bytes = encode_or_die(d);
      EXPECT_EQ(bytes.size(), plain_size + kEpochSize);
      EXPECT_EQ(bytes[kHeaderFlagsOffset], kFlagEpoch);
      Datagram out;
      ASSERT_EQ(decode_exact(bytes, out), ProtocolError::kOk);
      EXPECT_EQ(out.epoch, epoch);
      EXPECT_EQ(out.flags, kFlagEpoch);
      ASSERT_EQ(out.count, 1);
      expect_same(m, out.messages[0]);
    }
  }
  Datagram all;
  all.client_id = {1, 2};
  all.request_id = 3;
  all.epoch = 42;
  for (const Message& m : one_of_each_type()) ASSERT_TRUE(all.push(m));
  const auto bytes = encode_or_die(all);
  Datagram out;
  ASSERT_EQ(decode_exact(bytes, out), ProtocolError::kOk);
  EXPECT_TRUE(out.batch);
  EXPECT_EQ(out.epoch, 42u);
  ASSERT_EQ(out.count, all.count);
  for (std::size_t i = 0; i < all.count; ++i) expect_same(all.messages[i], out.messages[i]);
  // Re-encoding what was decoded gives the same bytes.
  EXPECT_EQ(encode_or_die(out), bytes);
}

// The flag follows `epoch`, not `flags`: no epoch, no flag; a decoded
// datagram without the flag has no epoch even when decoded into one that had.
TEST(ProtocolEpoch, FlagIsSetExactlyWhenTheEpochIs) {
  Datagram d = single(one_of_each_type()[0]);
  d.flags = kFlagEpoch;  // stale: no epoch
  const auto plain = encode_or_die(d);
  EXPECT_EQ(plain[kHeaderFlagsOffset], 0);
  EXPECT_EQ(plain, encode_or_die(single(one_of_each_type()[0])));
  Datagram out;
  out.epoch = 5;
  ASSERT_EQ(decode_exact(plain, out), ProtocolError::kOk);
  EXPECT_FALSE(out.epoch.has_value());

  // With the other flag too (a sealed datagram whose tag was removed).
  d.flags = kFlagAuthenticated;
  d.epoch = 3;
  const auto both = encode_or_die(d);
  EXPECT_EQ(both[kHeaderFlagsOffset], kFlagAuthenticated | kFlagEpoch);
  ASSERT_EQ(decode_exact(both, out), ProtocolError::kOk);
  EXPECT_EQ(out.epoch, 3u);
  EXPECT_EQ(out.flags, kFlagAuthenticated | kFlagEpoch);
}

// A datagram that sets the flag but ends inside the epoch is truncated; one
// that sets it without an epoch misreads its body as the epoch and fails.
TEST(ProtocolEpoch, ShortEpochIsTruncated) {
  const auto header = encode_or_die(single(one_of_each_type()[4]));  // STATS: 4-byte body
  Datagram out;
  for (std::size_t extra = 0; extra < kEpochSize; ++extra) {
    std::vector<std::uint8_t> bytes(header.begin(), header.begin() + kHeaderSize);
    bytes[kHeaderFlagsOffset] = kFlagEpoch;
    bytes.resize(kHeaderSize + extra, 0);
    EXPECT_EQ(decode_exact(bytes, out), ProtocolError::kTruncated) << extra;
  }
  auto flagged = header;
  flagged[kHeaderFlagsOffset] = kFlagEpoch;  // 4 body bytes where 8 + 4 belong
  EXPECT_EQ(decode_exact(flagged, out), ProtocolError::kTruncated);
}

// encode_request() pads a request with an epoch to the same reply bound; the
// anti-amplification check (the reply fits the request) holds a fortiori.
TEST(ProtocolEpoch, PaddedRequestWithEpochIsNoShorter) {
  for (const Message& m : one_of_each_type()) {
    if (!is_request(m.type)) continue;
    SCOPED_TRACE(std::string(to_string(m.type)));
    Datagram d = single(m);
    std::vector<std::uint8_t> buf(kMaxDatagramSize);
    std::size_t plain = 0;
    ASSERT_EQ(encode_request(d, buf, plain), ProtocolError::kOk);
    d.epoch = 77;
    std::size_t with_epoch = 0;
    ASSERT_EQ(encode_request(d, buf, with_epoch), ProtocolError::kOk);
    EXPECT_GE(with_epoch, plain);
    EXPECT_GE(with_epoch, max_reply_size(d));
    EXPECT_EQ(with_epoch, std::max(encoded_size(d), max_reply_size(d)));
  }
}

// ---- MAP_REPLY's member list ------------------------------------------------

TEST(ProtocolMembers, ListReadsBackMemberByMember) {
  const std::string long_id(kMaxMemberIdLength, 'i');
  const std::string long_address(kMaxMemberAddressLength, 'a');
  const MemberEntry entries[] = {
      {"a", "h:1", 1}, {long_id, long_address, 0xFFFFFFFF}, {"node-2", "127.0.0.1:7000", 3}};
  std::vector<std::uint8_t> list;
  ASSERT_TRUE(encode_member_list(entries, list));
  std::size_t size = 0;
  for (const MemberEntry& e : entries) size += member_entry_size(e);
  EXPECT_EQ(list.size(), size);
  Message m;
  m.type = MessageType::kMapReply;
  m.epoch = 12;
  m.member_count = 3;
  m.member_list_count = 3;
  m.member_list = list;
  Datagram out;
  ASSERT_EQ(decode_exact(encode_or_die(single(m)), out), ProtocolError::kOk);
  const Message& got = out.messages[0];
  EXPECT_EQ(got.epoch, 12u);
  EXPECT_EQ(got.member_count, 3u);
  const MemberList members(got);
  ASSERT_EQ(members.size(), 3u);
  std::size_t i = 0;
  for (const MemberEntry& e : members) {
    ASSERT_LT(i, std::size(entries));
    EXPECT_EQ(e.id, entries[i].id);
    EXPECT_EQ(e.address, entries[i].address);
    EXPECT_EQ(e.weight, entries[i].weight);
    ++i;
  }
  EXPECT_EQ(i, 3u);
  // A non-cluster server's answer: epoch 0, no members.
  Message none;
  none.type = MessageType::kMapReply;
  ASSERT_EQ(decode_exact(encode_or_die(single(none)), out), ProtocolError::kOk);
  EXPECT_EQ(out.messages[0].epoch, 0u);
  EXPECT_EQ(MemberList(out.messages[0]).begin(), MemberList(out.messages[0]).end());
}

TEST(ProtocolMembers, EncoderRefusesWhatDecodeWouldRefuse) {
  const std::string too_long_id(kMaxMemberIdLength + 1, 'i');
  const std::string too_long_address(kMaxMemberAddressLength + 1, 'a');
  std::vector<std::uint8_t> list;
  for (const MemberEntry bad :
       {MemberEntry{"", "h:1", 1}, MemberEntry{too_long_id, "h:1", 1}, MemberEntry{"n", "", 1},
        MemberEntry{"n", too_long_address, 1}, MemberEntry{"n", "h:1", 0}}) {
    const MemberEntry one[] = {bad};
    EXPECT_FALSE(encode_member_list(one, list)) << bad.id.size() << " " << bad.address.size();
  }
  const std::vector<MemberEntry> many(256, MemberEntry{"n", "h:1", 1});
  EXPECT_FALSE(encode_member_list(many, list));
  EXPECT_TRUE(encode_member_list(std::span(many).first(255), list));
}

// Hand-built entries outside the bounds are kBadField; a count above the
// entries is kTruncated (single) or kBadLength (in a batch item).
TEST(ProtocolMembers, BadEntriesAreRejected) {
  // One entry, written field by field so its bounds can be broken.
  const auto entry = [](std::size_t id_length, std::size_t address_length, std::uint32_t weight) {
    std::vector<std::uint8_t> e;
    e.push_back(static_cast<std::uint8_t>(id_length));
    e.push_back(static_cast<std::uint8_t>(id_length >> 8));
    e.insert(e.end(), id_length, 'i');
    e.push_back(static_cast<std::uint8_t>(address_length));
    e.push_back(static_cast<std::uint8_t>(address_length >> 8));
    e.insert(e.end(), address_length, 'a');
    for (int b = 0; b < 4; ++b) e.push_back(static_cast<std::uint8_t>(weight >> (8 * b)));
    return e;
  };
  const auto decode_list = [](std::uint8_t count, const std::vector<std::uint8_t>& list,
                              bool batch) {
    Message m;
    m.type = MessageType::kMapReply;
    m.epoch = 1;
    m.member_count = count;
    m.member_list_count = count;
    m.member_list = list;
    Datagram d = single(m);
    d.batch = batch;
    Datagram out;
    return decode_exact(encode_or_die(d), out);
  };
  struct Case {
    std::size_t id_length, address_length;
    std::uint32_t weight;
    ProtocolError expected;
  };
  const Case cases[] = {
      {1, 1, 1, ProtocolError::kOk},
      {kMaxMemberIdLength, kMaxMemberAddressLength, 1, ProtocolError::kOk},
      {0, 5, 1, ProtocolError::kBadField},
      {kMaxMemberIdLength + 1, 5, 1, ProtocolError::kBadField},
      {3, 0, 1, ProtocolError::kBadField},
      {3, kMaxMemberAddressLength + 1, 1, ProtocolError::kBadField},
      {3, 5, 0, ProtocolError::kBadField},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.id_length << " " << c.address_length << " " << c.weight);
    // Alone, and after a good entry.
    EXPECT_EQ(decode_list(1, entry(c.id_length, c.address_length, c.weight), false), c.expected);
    auto two = entry(2, 9, 1);
    const auto second = entry(c.id_length, c.address_length, c.weight);
    two.insert(two.end(), second.begin(), second.end());
    EXPECT_EQ(decode_list(2, two, false), c.expected);
    EXPECT_EQ(decode_list(2, two, true), c.expected);
  }
  // More members counted than the bytes hold.
  EXPECT_EQ(decode_list(2, entry(2, 9, 1), false), ProtocolError::kTruncated);
  EXPECT_EQ(decode_list(2, entry(2, 9, 1), true), ProtocolError::kBadLength);
  // A bad entry followed by a short one: truncation wins, as for every body.
  auto bad_then_short = entry(0, 9, 1);
  EXPECT_EQ(decode_list(2, bad_then_short, false), ProtocolError::kTruncated);
}

// Walking a hand-built list that is cut short stops at the last whole entry.
TEST(ProtocolMembers, WalkingAMalformedListStops) {
  const MemberEntry entries[] = {{"a", "h:1", 1}, {"bb", "h:2", 2}};
  std::vector<std::uint8_t> list;
  ASSERT_TRUE(encode_member_list(entries, list));
  for (std::size_t cut = 0; cut <= list.size(); ++cut) {
    std::size_t walked = 0;
    for (const MemberEntry& e : MemberList(2, std::span(list).first(cut))) {
      EXPECT_EQ(e.weight, walked + 1);
      ++walked;
    }
    const std::size_t whole = cut >= list.size() ? 2 : cut >= member_entry_size(entries[0]) ? 1 : 0;
    EXPECT_EQ(walked, whole) << cut;
  }
}

TEST(ProtocolHolders, ListReadsBackHolderByHolder) {
  const std::string longest(kMaxHolderValueLength, 'v');
  const HolderEntry entries[] = {{{1, 2}, 7, 1000, 0, ""},
                                 {{~0ULL, ~1ULL}, ~0ULL, 0xFFFFFFFF, kHolderFlagPending, longest},
                                 {{5, 6}, 9, 0, 0, "host:1 pid 42"}};
  std::vector<std::uint8_t> list;
  std::size_t size = 0;
  for (const HolderEntry& e : entries) {
    ASSERT_TRUE(append_holder_entry(e, list));
    size += holder_entry_size(e);
  }
  EXPECT_EQ(list.size(), size);
  Message m;
  m.type = MessageType::kHoldersReply;
  m.key = kKey;
  m.mode = LeaseMode::kPermit;
  m.permits = 9;
  m.waiters = 4;
  m.holders = 3;
  m.holder_list_count = 3;
  m.holder_list = list;
  // The longest value still leaves a page of one within a datagram.
  Datagram out;
  ASSERT_EQ(decode_exact(encode_or_die(single(m)), out), ProtocolError::kOk);
  const Message& got = out.messages[0];
  EXPECT_EQ(got.mode, LeaseMode::kPermit);
  EXPECT_EQ(got.permits, 9u);
  EXPECT_EQ(got.waiters, 4u);
  EXPECT_EQ(got.holders, 3u);
  const HolderList holders(got);
  ASSERT_EQ(holders.size(), 3u);
  std::size_t i = 0;
  for (const HolderEntry& e : holders) {
    ASSERT_LT(i, std::size(entries));
    EXPECT_EQ(e.owner, entries[i].owner);
    EXPECT_EQ(e.token, entries[i].token);
    EXPECT_EQ(e.ttl_left_ms, entries[i].ttl_left_ms);
    EXPECT_EQ(e.flags, entries[i].flags);
    EXPECT_EQ(e.value, entries[i].value);
    ++i;
  }
  EXPECT_EQ(i, 3u);
  // A free key: no holders, and the walk ends at once.
  Message free;
  free.type = MessageType::kHoldersReply;
  free.key = kKey;
  free.first_holder = 7;
  ASSERT_EQ(decode_exact(encode_or_die(single(free)), out), ProtocolError::kOk);
  EXPECT_EQ(out.messages[0].first_holder, 7u);
  EXPECT_EQ(HolderList(out.messages[0]).begin(), HolderList(out.messages[0]).end());
}

TEST(ProtocolHolders, EncoderRefusesWhatDecodeWouldRefuse) {
  const std::string too_long(kMaxHolderValueLength + 1, 'v');
  std::vector<std::uint8_t> list;
  EXPECT_FALSE(append_holder_entry({{1, 1}, 1, 1, 0, too_long}, list));
  EXPECT_FALSE(append_holder_entry({{1, 1}, 1, 1, 0x02, ""}, list));
  EXPECT_TRUE(list.empty());  // nothing appended
}

// Hand-built entries with reserved flags or a value too long are kBadField;
// a count above the entries is kTruncated (single) or kBadLength (batch).
TEST(ProtocolHolders, BadEntriesAreRejected) {
  const auto entry = [](std::uint8_t flags, std::size_t value_length) {
    std::vector<std::uint8_t> e(16 + 8 + 4, 0x5A);
    e.push_back(flags);
    e.push_back(static_cast<std::uint8_t>(value_length));
    e.push_back(static_cast<std::uint8_t>(value_length >> 8));
    e.insert(e.end(), value_length, 'v');
    return e;
  };
  const auto decode_list = [](std::uint8_t count, const std::vector<std::uint8_t>& list,
                              bool batch) {
    Message m;
    m.type = MessageType::kHoldersReply;
    m.key = kKey;
    m.holders = count;
    m.holder_list_count = count;
    m.holder_list = list;
    Datagram d = single(m);
    d.batch = batch;
    Datagram out;
    return decode_exact(encode_or_die(d), out);
  };
  struct Case {
    std::uint8_t flags;
    std::size_t value_length;
    ProtocolError expected;
  };
  const Case cases[] = {
      {0, 0, ProtocolError::kOk},
      {kHolderFlagPending, kMaxHolderValueLength, ProtocolError::kOk},
      {0x02, 0, ProtocolError::kBadField},
      {0x80, 3, ProtocolError::kBadField},
      {0, kMaxHolderValueLength + 1, ProtocolError::kBadField},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << int{c.flags} << " " << c.value_length);
    EXPECT_EQ(decode_list(1, entry(c.flags, c.value_length), false), c.expected);
    auto two = entry(0, 4);
    const auto second = entry(c.flags, c.value_length);
    two.insert(two.end(), second.begin(), second.end());
    EXPECT_EQ(decode_list(2, two, false), c.expected);
    EXPECT_EQ(decode_list(2, two, true), c.expected);
  }
  EXPECT_EQ(decode_list(2, entry(0, 4), false), ProtocolError::kTruncated);
  EXPECT_EQ(decode_list(2, entry(0, 4), true), ProtocolError::kBadLength);
}

// HOT_KEYS_REPLY entries read back key by key; the encoder refuses what
// decode() would: an empty or too long key, an error above the requests.
TEST(ProtocolHotKeys, ListReadsBackAndBadEntriesAreRejected) {
  const std::string longest(kMaxKeyLength, 'k');
  std::vector<std::uint8_t> list;
  ASSERT_TRUE(append_hot_key_entry({longest, 9, 2, 1, 3, 4}, list));
  ASSERT_TRUE(append_hot_key_entry({"b", 0, 0, 0, 0, 0}, list));
  std::vector<std::uint8_t> refused;
  EXPECT_FALSE(append_hot_key_entry({"", 1, 0, 0, 0, 0}, refused));
  EXPECT_FALSE(append_hot_key_entry({longest + "k", 1, 0, 0, 0, 0}, refused));
  EXPECT_FALSE(append_hot_key_entry({"c", 1, 2, 0, 0, 0}, refused));
  EXPECT_TRUE(refused.empty());

  const auto decode_list = [](std::uint8_t count, const std::vector<std::uint8_t>& entries,
                              bool batch, Datagram& out) {
    Message m;
    m.type = MessageType::kHotKeysReply;
    m.window_ms = 5000;
    m.hot_key_count = count;
    m.hot_key_list = entries;
    Datagram d = single(m);
    d.batch = batch;
    return decode_exact(encode_or_die(d), out);
  };
  Datagram out;
  ASSERT_EQ(decode_list(2, list, false, out), ProtocolError::kOk);
  std::vector<HotKeyEntry> read(HotKeyList(out.messages[0]).begin(),
                                HotKeyList(out.messages[0]).end());
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[0].key, longest);
  EXPECT_EQ(read[0].requests, 9u);
  EXPECT_EQ(read[0].error, 2u);
  EXPECT_EQ(read[0].busy, 1u);
  EXPECT_EQ(read[0].holders, 3u);
  EXPECT_EQ(read[0].waiters, 4u);
  EXPECT_EQ(read[1].key, "b");

  // Hand-built entries the encoder would refuse.
  const auto entry = [](std::size_t key_length, std::uint32_t requests, std::uint32_t error) {
    std::vector<std::uint8_t> e = {static_cast<std::uint8_t>(key_length),
                                   static_cast<std::uint8_t>(key_length >> 8)};
    e.insert(e.end(), key_length, 'k');
    for (const std::uint32_t v : {requests, error, 0U, 0U, 0U}) {
      for (int b = 0; b < 4; ++b) e.push_back(static_cast<std::uint8_t>(v >> (8 * b)));
    }
    return e;
  };
  for (const bool batch : {false, true}) {
    EXPECT_EQ(decode_list(1, entry(0, 1, 0), batch, out), ProtocolError::kBadField);
    EXPECT_EQ(decode_list(1, entry(kMaxKeyLength + 1, 1, 0), batch, out), ProtocolError::kBadField);
    EXPECT_EQ(decode_list(1, entry(3, 1, 2), batch, out), ProtocolError::kBadField);
    EXPECT_EQ(decode_list(1, entry(3, 2, 2), batch, out), ProtocolError::kOk);
  }
  EXPECT_EQ(decode_list(2, entry(3, 2, 2), false, out), ProtocolError::kTruncated);
  EXPECT_EQ(decode_list(2, entry(3, 2, 2), true, out), ProtocolError::kBadLength);
}

// HOT_KEYS is padded for a reply with no keys: the padding pays for them.
TEST(ProtocolTable, HotKeysIsPaddedForAnEmptyList) {
  Message m;
  m.type = MessageType::kHotKeys;
  EXPECT_EQ(max_reply_size(single(m)), kHeaderSize + 4 + 1);
  EXPECT_TRUE(reply_answers(MessageType::kHotKeys, MessageType::kHotKeysReply));
  EXPECT_TRUE(reply_answers(MessageType::kHotKeys, MessageType::kRecovering));
  EXPECT_FALSE(reply_answers(MessageType::kHotKeys, MessageType::kStatsReply));
  EXPECT_FALSE(reply_carries_key(MessageType::kHotKeysReply));
}

// Walking a hand-built list that is cut short stops at the last whole entry.
TEST(ProtocolHolders, WalkingAMalformedListStops) {
  const HolderEntry entries[] = {{{1, 1}, 1, 0, 0, "a"}, {{2, 2}, 2, 0, 0, "bb"}};
  std::vector<std::uint8_t> list;
  for (const HolderEntry& e : entries) ASSERT_TRUE(append_holder_entry(e, list));
  for (std::size_t cut = 0; cut <= list.size(); ++cut) {
    std::size_t walked = 0;
    for (const HolderEntry& e : HolderList(2, std::span(list).first(cut))) {
      EXPECT_EQ(e.token, walked + 1);
      ++walked;
    }
    const std::size_t whole = cut >= list.size() ? 2 : cut >= holder_entry_size(entries[0]) ? 1 : 0;
    EXPECT_EQ(walked, whole) << cut;
  }
}

// A single-key ACQUIRE may attach a holder value, in its batch
// item (kItemFlagValue), after the owner when it has one.
TEST(ProtocolHolders, AnAcquireCarriesItsValueInItsItem) {
  const std::string longest(kMaxHolderValueLength, 'v');
  for (const MessageType type :
       {MessageType::kAcquire, MessageType::kAcquireShared, MessageType::kAcquirePermit}) {
    for (const bool with_owner : {false, true}) {
      for (const std::string_view value :
           {std::string_view("10.0.0.7:8080 pid 42"), std::string_view(longest)}) {
        SCOPED_TRACE(::testing::Message()
                     << to_string(type) << " owner=" << with_owner << " value=" << value.size());
        Message m;
        m.type = type;
        m.request_id = 9;
        m.key = kKey;
        m.ttl_ms = 1000;
        m.permits = type == MessageType::kAcquirePermit ? 3 : 0;
        m.value = value;
        if (with_owner) m.owner = ClientId{5, 6};
        const Datagram d = single(m);
        const auto bytes = encode_or_die(d);
        ASSERT_FALSE(bytes.empty());
        EXPECT_EQ(bytes[6], static_cast<std::uint8_t>(MessageType::kBatch));  // framed as a batch
        EXPECT_EQ(bytes[kHeaderSize + 1],
                  kItemFlagValue | (with_owner ? kItemFlagOwner : std::uint8_t{0}));
        EXPECT_EQ(bytes.size(), encoded_size(d));
        Datagram out;
        ASSERT_EQ(decode_exact(bytes, out), ProtocolError::kOk);
        EXPECT_EQ(out.messages[0].value, value);
        EXPECT_EQ(out.messages[0].key, kKey);
        EXPECT_EQ(out.messages[0].owner.has_value(), with_owner);
        for (std::size_t len = 0; len < bytes.size(); ++len) {
          std::vector<std::uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<long>(len));
          EXPECT_NE(decode_exact(prefix, out), ProtocolError::kOk) << len;
        }
        // The value makes the request longer, never its reply.
        Message plain = m;
        plain.value = {};
        Datagram framed = single(plain);
        framed.batch = true;
        EXPECT_EQ(max_reply_size(d), max_reply_size(framed));
      }
    }
  }
}

TEST(ProtocolHolders, ValuesOnlyOnSingleKeyAcquiresAndWithinTheLimit) {
  const std::string too_long(kMaxHolderValueLength + 1, 'v');
  Message m;
  m.type = MessageType::kAcquire;
  m.key = kKey;
  m.ttl_ms = 1000;
  m.value = too_long;
  std::vector<std::uint8_t> buf(kMaxDatagramSize);
  std::size_t n = 0;
  EXPECT_NE(encode(single(m), buf, n), ProtocolError::kOk);
  m.type = MessageType::kRenew;
  m.value = "v";
  EXPECT_NE(encode(single(m), buf, n), ProtocolError::kOk);
  EXPECT_EQ(encoded_size(single(m)), 0u);

  // Hand-built items: a value on a RENEW, an empty one, one too long.
  m.type = MessageType::kAcquire;
  m.value = "v";
  const auto good = encode_or_die(single(m));
  Datagram out;
  ASSERT_EQ(decode_exact(good, out), ProtocolError::kOk);
  auto on_renew = good;
  on_renew[kHeaderSize] = static_cast<std::uint8_t>(MessageType::kRenew);
  EXPECT_EQ(decode_exact(on_renew, out), ProtocolError::kBadField);
  auto unknown_flag = good;
  unknown_flag[kHeaderSize + 1] |= 0x04;
  EXPECT_EQ(decode_exact(unknown_flag, out), ProtocolError::kBadFlags);
  // The value field sits after the 12-byte item header: u16 length + bytes.
  const std::size_t at = kHeaderSize + kBatchItemHeaderSize;
  std::vector<std::uint8_t> empty(good.begin(), good.begin() + static_cast<long>(at));
  empty.push_back(0);
  empty.push_back(0);
  empty.insert(empty.end(), good.begin() + static_cast<long>(at + 3), good.end());
  EXPECT_EQ(decode_exact(empty, out), ProtocolError::kBadField);
  std::vector<std::uint8_t> long_one(good.begin(), good.begin() + static_cast<long>(at));
  long_one.push_back(static_cast<std::uint8_t>(too_long.size()));
  long_one.push_back(static_cast<std::uint8_t>(too_long.size() >> 8));
  long_one.insert(long_one.end(), too_long.begin(), too_long.end());
  long_one.insert(long_one.end(), good.begin() + static_cast<long>(at + 3), good.end());
  EXPECT_EQ(decode_exact(long_one, out), ProtocolError::kBadField);
}

// A server that predates the gauges sends 21 values: a newer client reads
// them, and every gauge as 0; an older client reads a newer server's first
// 21 and ignores the rest.
TEST(Protocol, StatsGaugesAreAppendedToTheCounters) {
  std::vector<std::uint8_t> values;
  for (std::size_t i = 0; i < kStatCounterCount; ++i) {
    for (std::size_t b = 0; b < 8; ++b)
      values.push_back(static_cast<std::uint8_t>((i + 1) >> (8 * b)));
  }
  Datagram d;
  Message m;
  m.type = MessageType::kStatsReply;
  m.shard_count = 2;
  m.counters_le = values;
  ASSERT_TRUE(d.push(m));
  std::array<std::uint8_t, kMaxDatagramSize> out{};
  std::size_t written = 0;
  ASSERT_EQ(encode(d, out, written), ProtocolError::kOk);
  // The counter count is the byte after shard_count and first_shard.
  const std::size_t count_at = kHeaderSize + 8;
  ASSERT_EQ(out[count_at], kStatCounterCount);
  Datagram read;
  ASSERT_EQ(decode(std::span(out).first(written), read), ProtocolError::kOk);
  EXPECT_EQ(read.messages[0].counter(StatCounter::kLeases), 22u);
  EXPECT_EQ(read.messages[0].counter(StatCounter::kVersion), 27u);

  // The same reply as an older server sends it: 21 values.
  std::vector<std::uint8_t> old(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(written));
  old[count_at] = kStatCounterCountWithoutGauges;
  const auto gauges_at =
      static_cast<std::ptrdiff_t>(count_at + 1 + 8 * kStatCounterCountWithoutGauges);
  old.erase(old.begin() + gauges_at,
            old.begin() + gauges_at + 8 * (kStatCounterCount - kStatCounterCountWithoutGauges));
  ASSERT_EQ(decode(old, read), ProtocolError::kOk);
  EXPECT_EQ(read.messages[0].counter(StatCounter::kRedirects), 21u);
  for (std::size_t i = kStatCounterCountWithoutGauges; i < kStatCounterCount; ++i) {
    EXPECT_TRUE(is_gauge(static_cast<StatCounter>(i)));
    EXPECT_EQ(read.messages[0].counter_at(i), 0u) << i;
  }
  EXPECT_FALSE(is_gauge(StatCounter::kRedirects));
  EXPECT_EQ(to_string(StatCounter::kUptimeMs), "uptime_ms");
  EXPECT_EQ(to_string(StatCounter::kVersion), "version");
}

TEST(Protocol, VersionsPackIntoOneGauge) {
  static_assert(pack_version("1.2.3") == (1ULL << 32 | 2ULL << 16 | 3));
  EXPECT_EQ(version_text(pack_version("0.1.0")), "0.1.0");
  EXPECT_EQ(version_text(pack_version("12.65535.7")), "12.65535.7");
  EXPECT_EQ(version_text(0), "");
  for (const char* bad : {"", "1", "1.2", "1.2.3.4", "1..3", ".1.2", "1.2.", "1.2.x", "1.65536.0",
                          "v1.2.3", "1.2.3-rc1"}) {
    EXPECT_EQ(pack_version(bad), 0u) << bad;
  }
}

TEST(Protocol, ErrorCategory) {
  const std::error_code ec = ProtocolError::kTruncated;
  EXPECT_EQ(ec.category().name(), std::string("shardlock.lease.protocol"));
  EXPECT_EQ(ec.message(), "truncated datagram");
  EXPECT_EQ(to_string(MessageType::kGranted), "GRANTED");
  EXPECT_EQ(to_string(static_cast<MessageType>(0x42)), "UNKNOWN");
}

}  // namespace
}  // namespace shardlock::lease
