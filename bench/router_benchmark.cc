// Router lookup, rebuild and memory, against jump consistent hash on the same
// keys in the same run.
//
//   cmake --preset bench -B build/router-bench
//   cmake --build build/router-bench -j2 --target router_benchmark
//   build/router-bench/bench/router_benchmark
//
// Keys: 2^20 random printable strings of 16..32 bytes from a fixed-seed
// PRNG, stored back to back and visited in order, so every lookup hashes a
// key it has not seen for a million calls and hits a random bucket.
#include <benchmark/benchmark.h>
#include <xxhash.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "shardlock/router.h"

namespace {

using shardlock::Node;
using shardlock::Router;
using shardlock::RouterOptions;

class KeySet {
 public:
  explicit KeySet(std::size_t count) {
    std::mt19937_64 rng(20261122);
    std::uniform_int_distribution<int> length(16, 32);
    std::uniform_int_distribution<int> letter(33, 126);
    offsets_.reserve(count + 1);
    offsets_.push_back(0);
    for (std::size_t i = 0; i < count; ++i) {
      const int n = length(rng);
      for (int j = 0; j < n; ++j) bytes_.push_back(static_cast<char>(letter(rng)));
      offsets_.push_back(bytes_.size());
    }
  }
  std::size_t size() const { return offsets_.size() - 1; }
  std::string_view operator[](std::size_t i) const {
    return {bytes_.data() + offsets_[i], offsets_[i + 1] - offsets_[i]};
  }

 private:
  std::string bytes_;
  std::vector<std::size_t> offsets_;
};

constexpr int kKeyBits = 16;
constexpr std::size_t kKeyMask = (std::size_t{1} << kKeyBits) - 1;

const KeySet& keys() {
  static const KeySet set(std::size_t{1} << kKeyBits);
  return set;
}

std::vector<Node> make_nodes(std::size_t n) {
  std::vector<Node> nodes;
  nodes.reserve(n);
  // Addresses as ids, 12 to 15 bytes ("10.0.3.231:7700"), as deployments name
  // lease servers.
  for (std::size_t i = 0; i < n; ++i) {
    nodes.push_back({"10." + std::to_string(i >> 16) + "." + std::to_string((i >> 8) & 255) + "." +
                         std::to_string(i & 255) + ":7700",
                     1});
  }
  return nodes;
}

// One router per (node count, bucket bits), built once and shared by the
// thread-count variants.
Router& router_for(std::size_t n, int bits) {
  static std::vector<std::unique_ptr<Router>> routers;
  static std::vector<std::pair<std::size_t, int>> configs;
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  for (std::size_t i = 0; i < configs.size(); ++i) {
    if (configs[i] == std::pair{n, bits}) return *routers[i];
  }
  RouterOptions options;
  options.bucket_bits = bits;
  routers.push_back(std::make_unique<Router>(make_nodes(n), options));
  configs.emplace_back(n, bits);
  return *routers.back();
}

// Lamping and Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm"
// (2014), Figure 1.
std::int32_t jump_consistent_hash(std::uint64_t key, std::int32_t buckets) {
  std::int64_t b = -1;
  std::int64_t j = 0;
  while (j < buckets) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<std::int64_t>(
        static_cast<double>(b + 1) *
        (static_cast<double>(std::int64_t{1} << 31) / static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<std::int32_t>(b);
}

// Runs `lookup` on consecutive keys, starting at `first`.
template <typename Lookup>
void lookup_loop(benchmark::State& state, std::size_t first, Lookup lookup) {
  const KeySet& k = keys();
  std::size_t i = first;
  for (auto _ : state) benchmark::DoNotOptimize(lookup(k[i++ & kKeyMask]));
}

// Like lookup_loop, but every key is new: 24 bytes, a fixed 16-byte prefix
// and a scrambled counter, built in place. Unlike the 2^16-key set (whose
// buckets fit in 4 MiB of table), this touches the whole table, as a
// service with millions of distinct keys does. Building the key costs about
// a nanosecond, paid equally by the jump baseline.
template <typename Lookup>
void fresh_key_loop(benchmark::State& state, Lookup lookup) {
  char key[24] = {'s', 'h', 'a', 'r', 'd', 'l', 'o', 'c', 'k', '/', 'k', 'e', 'y', '/', '0', '/'};
  std::uint64_t i = 0;
  for (auto _ : state) {
    const std::uint64_t scrambled = (++i) * 0x9E3779B97F4A7C15ULL;
    std::memcpy(key + 16, &scrambled, sizeof(scrambled));
    benchmark::DoNotOptimize(lookup(std::string_view(key, sizeof(key))));
  }
}

Router& router_for(const benchmark::State& state) {
  return router_for(static_cast<std::size_t>(state.range(0)), static_cast<int>(state.range(1)));
}

// The baseline: hash the same key with the same XXH3 and seed, then jump.
void BM_JumpHash(benchmark::State& state) {
  const auto n = static_cast<std::int32_t>(state.range(0));
  lookup_loop(state, 0, [n](std::string_view key) {
    return jump_consistent_hash(
        XXH3_64bits_withSeed(key.data(), key.size(), shardlock::kDefaultRouterSeed), n);
  });
}

void BM_JumpHashFreshKeys(benchmark::State& state) {
  const auto n = static_cast<std::int32_t>(state.range(0));
  fresh_key_loop(state, [n](std::string_view key) {
    return jump_consistent_hash(
        XXH3_64bits_withSeed(key.data(), key.size(), shardlock::kDefaultRouterSeed), n);
  });
}

void BM_SnapshotOwnerFreshKeys(benchmark::State& state) {
  const auto snapshot = router_for(state).snapshot();
  fresh_key_loop(state, [&snapshot](std::string_view key) { return &snapshot->owner(key); });
}

// owner_indices() over batches of 64 fresh keys (built as in fresh_key_loop);
// the time is per key, so it compares directly with the single lookups.
void BM_SnapshotOwnerBatchFreshKeys(benchmark::State& state) {
  const auto snapshot = router_for(state).snapshot();
  constexpr std::size_t kBatch = 64;
  std::array<std::array<char, 24>, kBatch> storage{};
  std::array<std::string_view, kBatch> batch;
  std::array<std::uint16_t, kBatch> out{};
  constexpr std::string_view kPrefix = "shardlock/key/0/";
  for (std::size_t i = 0; i < kBatch; ++i) {
    std::memcpy(storage[i].data(), kPrefix.data(), kPrefix.size());
    batch[i] = std::string_view(storage[i].data(), storage[i].size());
  }
  std::uint64_t counter = 0;
  for (auto _ : state) {
    for (auto& key : storage) {
      const std::uint64_t scrambled = (++counter) * 0x9E3779B97F4A7C15ULL;
      std::memcpy(key.data() + kPrefix.size(), &scrambled, sizeof(scrambled));
    }
    benchmark::DoNotOptimize(snapshot->owner_indices(batch, out));
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kBatch));
  state.counters["ns_per_key"] =
      benchmark::Counter(static_cast<double>(state.iterations() * kBatch),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_RouterOwnerFreshKeys(benchmark::State& state) {
  Router& router = router_for(state);
  fresh_key_loop(state, [&router](std::string_view key) { return router.owner(key); });
}

// Router::owner(): thread-cache check, hash, table load, and the NodeId copy
// (ids here fit the small-string buffer).
void BM_RouterOwner(benchmark::State& state) {
  Router& router = router_for(state);
  lookup_loop(state, static_cast<std::size_t>(state.thread_index()) * 7919,
              [&router](std::string_view key) { return router.owner(key); });
}

// Router::current().owner(): the thread-cache check without the NodeId copy.
void BM_RouterCurrentOwner(benchmark::State& state) {
  Router& router = router_for(state);
  lookup_loop(state, 0, [&router](std::string_view key) { return &router.current().owner(key); });
}

// The same lookup on a held snapshot, returning a reference: no copy.
void BM_SnapshotOwner(benchmark::State& state) {
  const auto snapshot = router_for(state).snapshot();
  lookup_loop(state, 0, [&snapshot](std::string_view key) { return &snapshot->owner(key); });
  state.counters["bytes_per_node"] =
      static_cast<double>(snapshot->memory_bytes()) / static_cast<double>(snapshot->size());
}

void BM_SnapshotOwners3(benchmark::State& state) {
  const auto snapshot = router_for(state).snapshot();
  lookup_loop(state, 0, [&snapshot](std::string_view key) { return snapshot->owners(key, 3); });
}

// One membership change at n nodes, timed alone: range(2) == 0 adds a node
// (and untimed, removes it again); 1 removes the middle node (and re-adds it).
void BM_Rebuild(benchmark::State& state) {
  RouterOptions options;
  options.bucket_bits = static_cast<int>(state.range(1));
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  Router router(make_nodes(n), options);
  const bool remove_first = state.range(2) == 1;
  const std::string id = remove_first ? make_nodes(n)[n / 2].id : "10.255.255.255:7700";
  const auto change = [&](bool add) {
    if ((add ? router.add(id) : router.remove(id)) != shardlock::RouterStatus::kOk) {
      state.SkipWithError("membership change failed");
    }
  };
  for (auto _ : state) {
    change(!remove_first);
    state.PauseTiming();
    change(remove_first);
    state.ResumeTiming();
  }
  state.SetLabel(remove_first ? "remove middle node" : "add node");
}

void BM_FullBuild(benchmark::State& state) {
  RouterOptions options;
  options.bucket_bits = static_cast<int>(state.range(1));
  const auto nodes = make_nodes(static_cast<std::size_t>(state.range(0)));
  Router router(options);
  for (auto _ : state) {
    if (router.assign(nodes) != shardlock::RouterStatus::kOk) state.SkipWithError("assign");
  }
}

void NodeCounts(benchmark::internal::Benchmark* b) {
  for (const std::int64_t n : {10, 100, 1000, 10000}) b->Args({n, shardlock::kDefaultBucketBits});
}
void BucketBits(benchmark::internal::Benchmark* b) {
  for (const std::int64_t bits : {20, 22, 23, 24}) b->Args({1000, bits});
}

BENCHMARK(BM_JumpHash)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000);
BENCHMARK(BM_RouterOwner)->Apply(NodeCounts);
BENCHMARK(BM_RouterCurrentOwner)->Apply(NodeCounts);
BENCHMARK(BM_SnapshotOwner)->Apply(NodeCounts);
BENCHMARK(BM_SnapshotOwner)->Apply(BucketBits);
BENCHMARK(BM_RouterOwner)
    ->Args({1000, shardlock::kDefaultBucketBits})
    ->ThreadRange(1, 2 * static_cast<int>(std::thread::hardware_concurrency()))
    ->UseRealTime();
BENCHMARK(BM_JumpHashFreshKeys)->Arg(1000);
BENCHMARK(BM_SnapshotOwnerFreshKeys)->Apply(BucketBits);
BENCHMARK(BM_SnapshotOwnerBatchFreshKeys)->Apply(BucketBits);
BENCHMARK(BM_RouterOwnerFreshKeys)->Args({1000, shardlock::kDefaultBucketBits});
BENCHMARK(BM_SnapshotOwners3)->Args({1000, shardlock::kDefaultBucketBits});
BENCHMARK(BM_Rebuild)
    ->Args({1000, shardlock::kDefaultBucketBits, 0})
    ->Args({1000, shardlock::kDefaultBucketBits, 1})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);
BENCHMARK(BM_FullBuild)
    ->Args({1000, shardlock::kDefaultBucketBits})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
