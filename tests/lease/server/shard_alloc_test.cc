// The shard state machine (and the dispatcher's multi-key path) when memory
// runs out (a peer must not be able to crash it): every
// allocation a request makes is failed in turn, by a global operator new
// that throws on command, and the shard must answer ERROR(kResourceExhausted)
// or succeed, stay consistent, and go on serving.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <new>
#include <string>
#include <vector>

#include "server/dispatcher.h"
#include "shardlock/lease/server/internal/shard.h"
#include "support/shard_driver.h"

namespace {

// Allocations left before the next one throws; negative: never throw. Per
// thread, so gtest's own threads (none here) and allocations outside the
// armed window are untouched.
thread_local long allocations_left = -1;

void fail_after(long n) { allocations_left = n; }
void never_fail() { allocations_left = -1; }

}  // namespace

// Replacing the global allocation functions is allowed by the standard and
// works under ASan (the executable's definitions win over the runtime's).
// GCC cannot see that these deletes pair with the malloc-based new below.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t size) {
  if (allocations_left == 0) throw std::bad_alloc();
  if (allocations_left > 0) --allocations_left;
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](std::size_t size) { return ::operator new(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace shardlock::lease::internal {
namespace {

constexpr ClientId kAlice{1, 1};
constexpr ClientId kBob{2, 2};

class ShardAllocationTest : public ::testing::Test {
 protected:
  void SetUp() override { deferred_.reserve(64); }

  Message acquire(std::uint64_t request_id, std::uint32_t wait_ms = 0) {
    Message m;
    m.type = MessageType::kAcquire;
    m.key = key_;
    m.ttl_ms = 1000;
    m.wait_ms = wait_ms;
    m.request_id = request_id;
    return m;
  }
  Message release(std::uint64_t token, std::uint64_t request_id) {
    Message m;
    m.type = MessageType::kRelease;
    m.key = key_;
    m.token = token;
    m.request_id = request_id;
    return m;
  }
  Message query() {
    Message m;
    m.type = MessageType::kQuery;
    m.key = key_;
    m.request_id = 999'999;
    return m;
  }
  // Handles `m` with allocation number `fail_at` (0-based) failing; -1: none.
  bool handle(Shard& shard, const ClientId& c, const Message& m, Message& reply,
              long fail_at = -1) {
    fail_after(fail_at);
    const bool answered = shard.handle(c, peer_, m, now_, reply, deferred_);
    never_fail();
    return answered;
  }
  static std::uint64_t counter(const Shard& s, StatCounter c) {
    return s.counters()[static_cast<std::size_t>(c)];
  }

  std::string key_ = "a-key-long-enough-to-live-on-the-heap";
  Peer peer_;
  std::int64_t now_ = 1000;
  std::vector<DeferredReply> deferred_;
};

TEST_F(ShardAllocationTest, AcquireOfANewKey) {
  int failures = 0;
  for (long n = 0;; ++n) {
    ASSERT_LT(n, 100) << "never succeeded";
    Shard shard(0, ShardLimits{}, ShardTokens{}, now_);
    Message reply;
    ASSERT_TRUE(handle(shard, kAlice, acquire(1), reply, n));
    if (reply.type == MessageType::kError) {
      ++failures;
      EXPECT_EQ(reply.error, WireError::kResourceExhausted);
      EXPECT_EQ(counter(shard, StatCounter::kAllocationFailures), 1u);
      EXPECT_EQ(shard.held_keys(), 0u);
      EXPECT_EQ(shard.tracked_clients(), 0u);
      // Memory back: the same request is granted.
      ASSERT_TRUE(handle(shard, kAlice, acquire(1), reply));
      ASSERT_EQ(reply.type, MessageType::kGranted);
      continue;
    }
    ASSERT_EQ(reply.type, MessageType::kGranted);
    EXPECT_EQ(shard.held_keys(), 1u);
    break;
  }
  EXPECT_GT(failures, 0) << "no allocation was failed: the test proves nothing";
}

TEST_F(ShardAllocationTest, QueueingAWaiter) {
  int failures = 0;
  for (long n = 0;; ++n) {
    ASSERT_LT(n, 100) << "never succeeded";
    Shard shard(0, ShardLimits{}, ShardTokens{}, now_);
    Message reply;
    ASSERT_TRUE(handle(shard, kAlice, acquire(1), reply));
    const std::uint64_t token = reply.token;
    const bool answered = handle(shard, kBob, acquire(2, 5000), reply, n);
    if (answered) {
      ++failures;
      ASSERT_EQ(reply.type, MessageType::kError);
      EXPECT_EQ(reply.error, WireError::kResourceExhausted);
      EXPECT_EQ(shard.queued_waiters(), 0u);
      ASSERT_TRUE(handle(shard, kBob, query(), reply));
      EXPECT_EQ(reply.waiters, 0u);
      EXPECT_EQ(shard.tracked_clients(), 1u) << "only the holder";
      continue;
    }
    EXPECT_EQ(shard.queued_waiters(), 1u);
    // The queue works: the release hands the key to Bob.
    deferred_.clear();
    ASSERT_TRUE(handle(shard, kAlice, release(token, 3), reply));
    ASSERT_EQ(deferred_.size(), 1u);
    EXPECT_EQ(deferred_[0].type, MessageType::kGranted);
    break;
  }
  EXPECT_GT(failures, 0);
}

TEST_F(ShardAllocationTest, HandOffAlwaysCompletes) {
  bool reached_success = false;
  for (long n = 0; n < 100 && !reached_success; ++n) {
    Shard shard(0, ShardLimits{}, ShardTokens{}, now_);
    Message reply;
    ASSERT_TRUE(handle(shard, kAlice, acquire(1), reply));
    const std::uint64_t token = reply.token;
    ASSERT_FALSE(handle(shard, kBob, acquire(2, 5000), reply));
    deferred_.clear();
    ASSERT_TRUE(handle(shard, kAlice, release(token, 3), reply, n));
    reached_success = !deferred_.empty() && counter(shard, StatCounter::kAllocationFailures) == 0;
    // Whatever failed, Bob holds the key now, and his retransmission learns
    // the grant even if its deferred answer could not be built.
    ASSERT_TRUE(handle(shard, kBob, query(), reply));
    EXPECT_TRUE(reply.held);
    const std::uint64_t bob_token = reply.token;
    EXPECT_GT(bob_token, token);
    ASSERT_TRUE(handle(shard, kBob, acquire(2, 5000), reply));
    EXPECT_EQ(reply.type, MessageType::kGranted);
    EXPECT_EQ(reply.token, bob_token);
    EXPECT_EQ(shard.queued_waiters(), 0u);
    EXPECT_EQ(shard.tracked_clients(), 1u);
  }
  EXPECT_TRUE(reached_success);
}

// An ACQUIRE_MANY waiting on a key whose RELEASE runs out of memory at any
// allocation: the request is never left waiting forever. Once its wait and
// TTL have passed, its retransmission is answered (GRANTED_MANY, or an
// ERROR or TIMEOUT), and the keys end up free.
class DispatcherAllocationTest : public ::testing::Test {
 protected:
  void make() {
    ShardLimits limits;
    limits.hash_seed = 0x5eed;
    DispatcherOptions o;
    o.clock = [this] { return std::chrono::milliseconds(now_ms_); };
    o.log = [](std::string_view) {};
    o.key_seed = limits.hash_seed;
    dispatcher_ = std::make_unique<Dispatcher>(
        std::move(o), shardlock::test_support::make_shards(4, limits, now_ms_));
  }
  std::vector<OutDatagram> send(const ClientId& client, const Message& m, long fail_at = -1) {
    Datagram d;
    d.client_id = client;
    d.request_id = m.request_id;
    EXPECT_TRUE(d.push(m));
    std::vector<std::uint8_t> bytes(kMaxDatagramSize);
    std::size_t n = 0;
    EXPECT_EQ(encode_request(d, bytes, n), ProtocolError::kOk);
    std::vector<OutDatagram> out;
    out.reserve(8);
    if (fail_at >= 0) fail_after(fail_at);
    dispatcher_->handle(0, std::span(bytes).first(n), peer_, out);
    never_fail();
    return out;
  }
  Message single(MessageType type, const std::string& key, std::uint64_t id) {
    Message m;
    m.type = type;
    m.key = keys_.emplace_back(key);
    m.request_id = id;
    m.ttl_ms = 1000;
    return m;
  }
  Message many(std::uint64_t id) {
    const std::string_view keys[] = {"m1", "m2", "m3"};
    EXPECT_TRUE(encode_key_list(keys, list_));
    Message m;
    m.type = MessageType::kAcquireMany;
    m.request_id = id;
    m.ttl_ms = 1000;
    m.wait_ms = 5000;
    m.key_count = 3;
    m.key_list = list_;
    return m;
  }
  static Message first(const std::vector<OutDatagram>& out, const ClientId& to) {
    for (const OutDatagram& o : out) {
      Datagram d;
      if (decode({o.bytes.data(), o.length}, d) == ProtocolError::kOk && d.client_id == to) {
        Message m = d.messages[0];
        m.key = {};  // a view into `o`; not needed
        m.tokens_le = {};
        return m;
      }
    }
    Message none;
    none.type = MessageType::kStats;  // no answer
    return none;
  }

  std::int64_t now_ms_ = 1'000'000;
  Peer peer_;
  std::deque<std::string> keys_;
  std::vector<std::uint8_t> list_;
  std::unique_ptr<Dispatcher> dispatcher_;
};

TEST_F(DispatcherAllocationTest, AWaitingAcquireManyIsNeverStrandedByARelease) {
  bool reached_success = false;
  for (long fail_at = 0; fail_at < 400 && !reached_success; ++fail_at) {
    SCOPED_TRACE(fail_at);
    now_ms_ = 1'000'000;
    make();
    const Message held = first(send(kBob, single(MessageType::kAcquire, "m2", 1)), kBob);
    ASSERT_EQ(held.type, MessageType::kGranted);
    ASSERT_TRUE(send(kAlice, many(7)).empty());  // queued behind Bob
    Message release = single(MessageType::kRelease, "m2", 2);
    release.token = held.token;
    const auto out = send(kBob, release, fail_at);
    reached_success = first(out, kAlice).type == MessageType::kGrantedMany;
    // Past the wait and the TTL every lease and wait has run out; the
    // retransmission must be answered, never silently ignored as waiting.
    now_ms_ += 5000 + 1000 + 10;
    std::vector<OutDatagram> ticked;
    dispatcher_->tick(0, ticked);
    const Message again = first(send(kAlice, many(7)), kAlice);
    EXPECT_NE(again.type, MessageType::kStats) << "the ACQUIRE_MANY is stranded";
    EXPECT_TRUE(again.type == MessageType::kGrantedMany || again.type == MessageType::kError ||
                again.type == MessageType::kTimeout)
        << to_string(again.type);
  }
  EXPECT_TRUE(reached_success);
}

}  // namespace
}  // namespace shardlock::lease::internal
