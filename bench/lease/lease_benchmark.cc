// The lease service's request path in user space, piece by piece: the codec,
// the shard state machine (with and without its hot-key sketch), the dedup
// cache and the timer wheel. No sockets:
// what these cost is what the server adds to the network round trip. One
// exception, BM_ClientAcquireRelease: a LeaseClient's acquire+release pair
// through a LeaseServer on loopback, with one owner for every lease or a
// fresh one per lease (every acquire its own owner), side by side in the same run.
//
//   build/bench/bench/lease_benchmark --benchmark_filter=Owner
#include <benchmark/benchmark.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/dispatcher.h"
#include "shardlock/internal/cpu.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/server/internal/dedup_cache.h"
#include "shardlock/lease/server/internal/hot_keys.h"
#include "shardlock/lease/server/internal/shard.h"
#include "shardlock/lease/server/internal/timer_wheel.h"
#include "shardlock/lease/server/server.h"
#include "shardlock/lease/wire/internal/string_key.h"
#include "shardlock/lease/wire/protocol.h"
#include "shardlock/workload/zipf.h"

namespace shardlock::lease {
namespace {

using internal::DedupCache;
using internal::DeferredReply;
using internal::HotKeys;
using internal::Peer;
using internal::Shard;
using internal::ShardLimits;
using internal::ShardTokens;
using internal::TimerNode;
using internal::TimerWheel;

std::vector<std::string> make_keys(std::size_t n) {
  std::vector<std::string> keys;
  keys.reserve(n);
  for (std::size_t i = 0; i < n; ++i) keys.push_back("orders/" + std::to_string(i * 7919));
  return keys;
}

Datagram acquire_datagram(std::string_view key, std::size_t items) {
  Datagram d;
  d.client_id = ClientId{0x1234, 0x5678};
  d.request_id = 1;
  for (std::size_t i = 0; i < items; ++i) {
    Message m;
    m.type = MessageType::kAcquire;
    m.request_id = 100 + i;
    m.key = key;
    m.ttl_ms = 30'000;
    m.wait_ms = 0;
    (void)d.push(m);
  }
  d.batch = items > 1;
  return d;
}

// Encoding one request datagram, padded for its replies (what a client does
// per send). Arg: items per datagram.
void BM_EncodeAcquire(benchmark::State& state) {
  const Datagram d = acquire_datagram("orders/42", static_cast<std::size_t>(state.range(0)));
  std::array<std::uint8_t, kMaxDatagramSize> out{};
  for (auto _ : state) {
    std::size_t written = 0;
    benchmark::DoNotOptimize(encode_request(d, out, written));
    benchmark::DoNotOptimize(written);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_EncodeAcquire)->Arg(1)->Arg(16);

// Decoding it (what the server does per datagram).
void BM_DecodeAcquire(benchmark::State& state) {
  const Datagram d = acquire_datagram("orders/42", static_cast<std::size_t>(state.range(0)));
  std::array<std::uint8_t, kMaxDatagramSize> bytes{};
  std::size_t written = 0;
  if (encode_request(d, bytes, written) != ProtocolError::kOk) {
    state.SkipWithError("encode failed");
    return;
  }
  Datagram in;
  for (auto _ : state) {
    benchmark::DoNotOptimize(decode(std::span(bytes).first(written), in));
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_DecodeAcquire)->Arg(1)->Arg(16);

// One ACQUIRE of `key` by `owner` at the shard's clock time 1000 and the
// RELEASE of its grant, each with the next request id.
void acquire_then_release(Shard& shard, const ClientId& owner, std::string_view key,
                          std::uint64_t& request_id, Message& reply,
                          std::vector<DeferredReply>& deferred) {
  const Peer peer;
  Message m;
  m.type = MessageType::kAcquire;
  m.key = key;
  m.ttl_ms = 30'000;
  m.request_id = ++request_id;
  (void)shard.handle(owner, peer, m, 1000, reply, deferred);
  m.type = MessageType::kRelease;
  m.token = reply.token;
  m.request_id = ++request_id;
  (void)shard.handle(owner, peer, m, 1000, reply, deferred);
}

// One ACQUIRE of a free key and its RELEASE, through the shard state machine
// (dedup cache, key table, timer wheel, token counter). Arg: the hot-key
// sketch's slots (ShardLimits::hot_keys; 0: none), so /0 against /16 is
// what HOT_KEYS costs the request path; the second arg: keys cycled through
// (many more than the slots: every request misses the sketch, its worst
// case; 4: every request hits).
void BM_ShardAcquireRelease(benchmark::State& state) {
  Shard shard(0, ShardLimits{.hot_keys = static_cast<std::size_t>(state.range(0))}, ShardTokens{},
              1000);
  const std::vector<std::string> keys = make_keys(static_cast<std::size_t>(state.range(1)));
  const std::size_t mask = keys.size() - 1;
  const ClientId client{1, 1};
  std::vector<DeferredReply> deferred;
  Message reply;
  std::uint64_t request_id = 1;
  std::size_t k = 0;
  for (auto _ : state) {
    acquire_then_release(shard, client, keys[k++ & mask], request_id, reply, deferred);
    benchmark::DoNotOptimize(reply);
  }
  state.SetItemsProcessed(state.iterations() * 2);
}
BENCHMARK(BM_ShardAcquireRelease)
    ->ArgNames({"hot_keys", "keys"})
    ->Args({0, 1024})
    ->Args({16, 1024})
    ->Args({64, 1024})
    ->Args({0, 4})
    ->Args({16, 4});

// One QUERY datagram through the dispatcher, as a socket hands it over:
// decode, the anti-amplification check, the key's shard under its lock,
// the reply encoded. Args as BM_ShardAcquireRelease's: sketch slots per
// shard (0: none), and keys cycled through (1024: every request misses
// the sketch once its slots are taken; 4: every one hits).
void BM_DispatcherQuery(benchmark::State& state) {
  constexpr std::uint32_t kShards = 4;
  const ShardLimits limits{.hash_seed = 42, .hot_keys = static_cast<std::size_t>(state.range(0))};
  std::vector<std::unique_ptr<Shard>> shards;
  for (std::uint32_t i = 0; i < kShards; ++i) {
    shards.push_back(std::make_unique<Shard>(i, limits, ShardTokens{}, 0));
  }
  internal::DispatcherOptions options;
  options.log = [](std::string_view) {};
  options.key_seed = limits.hash_seed;
  internal::Dispatcher dispatcher(std::move(options), std::move(shards));
  const std::vector<std::string> keys = make_keys(static_cast<std::size_t>(state.range(1)));
  std::vector<std::vector<std::uint8_t>> datagrams;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    Datagram d;
    d.client_id = ClientId{1, 1};
    d.request_id = i + 1;
    Message m;
    m.type = MessageType::kQuery;
    m.request_id = i + 1;
    m.key = keys[i];
    (void)d.push(m);
    std::vector<std::uint8_t>& bytes = datagrams.emplace_back(kMaxDatagramSize);
    std::size_t written = 0;
    if (encode_request(d, bytes, written) != ProtocolError::kOk) {
      state.SkipWithError("encode failed");
      return;
    }
    bytes.resize(written);
  }
  const Peer peer;
  std::vector<internal::OutDatagram> replies;
  replies.reserve(4);
  std::size_t k = 0;
  for (auto _ : state) {
    replies.clear();
    dispatcher.handle(0, datagrams[k++ & (datagrams.size() - 1)], peer, replies);
    benchmark::DoNotOptimize(replies.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_DispatcherQuery)
    ->ArgNames({"hot_keys", "keys"})
    ->Args({0, 1024})
    ->Args({16, 1024})
    ->Args({0, 4})
    ->Args({16, 4});

// The sketch alone: one record() of a Zipf(0.99) key over 100000 (most hit
// a slot, the tail misses), per capacity; past its first kExactRequests it
// samples, as a busy shard's does.
void BM_HotKeysRecord(benchmark::State& state) {
  HotKeys sketch(static_cast<std::size_t>(state.range(0)), kMaxKeyLength, 10'000, 0);
  const std::vector<std::string> keys = make_keys(100'000);
  std::vector<std::uint64_t> hashes;
  hashes.reserve(keys.size());
  for (const std::string& key : keys) hashes.push_back(internal::hash_key(key, 42));
  workload::ZipfGenerator zipf(keys.size(), 0.99, 7);
  std::vector<std::uint32_t> order(1 << 16);
  for (std::uint32_t& i : order) i = static_cast<std::uint32_t>(zipf.next());
  std::size_t n = 0;
  for (auto _ : state) {
    const std::uint32_t i = order[n++ & (order.size() - 1)];
    sketch.record(hashes[i], keys[i], false, 0);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HotKeysRecord)->Arg(16)->Arg(64);

// A retransmitted ACQUIRE that is still queued, past the dedup cache, behind
// Arg waiters on one key: one index lookup, whatever the queue length (it
// was a scan of the queue).
void BM_ShardQueuedRetransmission(benchmark::State& state) {
  Shard shard(0, ShardLimits{.dedup_capacity = 0}, ShardTokens{}, 1000);
  const Peer peer;
  std::vector<DeferredReply> deferred;
  Message reply;
  Message m;
  m.type = MessageType::kAcquire;
  m.key = "hot";
  m.ttl_ms = 30'000;
  m.request_id = 1;
  (void)shard.handle(ClientId{0, 0}, peer, m, 1000, reply, deferred);
  m.wait_ms = 60'000;
  const auto waiters = static_cast<std::uint64_t>(state.range(0));
  for (std::uint64_t i = 1; i <= waiters; ++i) {
    m.request_id = 1000 + i;
    (void)shard.handle(ClientId{i, i}, peer, m, 1000, reply, deferred);
  }
  m.request_id = 1000 + waiters;  // the last in line retransmits
  const ClientId last{waiters, waiters};
  for (auto _ : state) {
    benchmark::DoNotOptimize(shard.handle(last, peer, m, 1000, reply, deferred));
  }
}
BENCHMARK(BM_ShardQueuedRetransmission)->Arg(16)->Arg(1024)->Arg(8192);

// The dedup cache once it is full: a put evicts the oldest entry, then the
// lookup a retransmission makes.
void BM_DedupCachePutFind(benchmark::State& state) {
  DedupCache<std::uint64_t> cache(4096, 42);
  const ClientId client{7, 7};
  std::uint64_t request_id = 0;
  for (; request_id < 4096; ++request_id) cache.put(client, request_id, request_id);
  for (auto _ : state) {
    cache.put(client, request_id, request_id);
    benchmark::DoNotOptimize(cache.find(client, request_id - 100));
    ++request_id;
  }
}
BENCHMARK(BM_DedupCachePutFind);

// Scheduling a lease's expiry and moving time past it (the wheel's work per
// lease that expires without release).
void BM_TimerWheelScheduleAndFire(benchmark::State& state) {
  std::int64_t now = 0;
  TimerWheel wheel(now);
  std::vector<TimerNode> nodes(1024);
  std::size_t fired = 0;
  std::size_t i = 0;
  for (auto _ : state) {
    wheel.schedule(nodes[i++ & 1023], now + 30);
    now += 1;
    wheel.advance(now, [&](TimerNode&) { ++fired; });
  }
  for (TimerNode& node : nodes) wheel.cancel(node);
  benchmark::DoNotOptimize(fired);
}
BENCHMARK(BM_TimerWheelScheduleAndFire);

// BM_ShardAcquireRelease's pair with one owner for every lease (Arg 0, as a
// client's acquires once shared one owner) or a fresh handle owner per pair (Arg 1, as
// every acquire is now: handle_owner() of one client, so the per-client
// usage entry is the same): what the server pays for owners per handle.
void BM_ShardAcquireReleaseOwner(benchmark::State& state) {
  Shard shard(0, ShardLimits{}, ShardTokens{}, 1000);
  const std::vector<std::string> keys = make_keys(1024);
  const bool fresh = state.range(0) != 0;
  const ClientId client{0x5eed'0000'0000, 7};
  std::vector<DeferredReply> deferred;
  Message reply;
  std::uint64_t request_id = 1;
  std::uint32_t handle = 0;
  std::size_t k = 0;
  for (auto _ : state) {
    const ClientId owner = fresh ? handle_owner(client, ++handle) : client;
    acquire_then_release(shard, owner, keys[k++ & 1023], request_id, reply, deferred);
    benchmark::DoNotOptimize(reply);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ShardAcquireReleaseOwner)->ArgName("fresh_owner")->Arg(0)->Arg(1);

// One try_acquire() and release() through a LeaseClient and a LeaseServer on
// loopback (two round trips), each lease with a fresh owner (Arg 1, the
// default) or all of them as one known owner (Arg 0, LeaseOptions::owner:
// the old one-owner-per-client identity). The ratio of the two is the cost
// of an owner per handle end to end.
void BM_ClientAcquireReleaseOwner(benchmark::State& state) {
  using namespace std::chrono_literals;
  LeaseServerOptions server_options;
  server_options.bind_address = "127.0.0.1:0";
  server_options.lock_delay = 0ms;
  server_options.shards = 4;
  server_options.log = [](std::string_view) {};
  LeaseServer server(server_options);
  if (server.start()) {
    state.SkipWithError("the server did not start");
    return;
  }
  LeaseClientOptions client_options;
  client_options.nodes = {"127.0.0.1:" + std::to_string(server.port())};
  LeaseClient client(client_options);
  if (client.start()) {
    state.SkipWithError("the client did not start");
    return;
  }
  LeaseOptions options;
  if (state.range(0) == 0) options.owner = client.client_id();
  const std::vector<std::string> keys = make_keys(1024);
  std::size_t k = 0;
  for (auto _ : state) {
    AcquireResult r = client.try_acquire(keys[k++ & 1023], 30s, options);
    if (!r || r.lease.release()) {
      state.SkipWithError("acquire or release failed");
      return;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ClientAcquireReleaseOwner)->ArgName("fresh_owner")->Arg(0)->Arg(1)->UseRealTime();

}  // namespace
}  // namespace shardlock::lease

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("cpu_model", shardlock::internal::cpu_model_name());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
