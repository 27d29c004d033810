// What sealing costs a request: seal_for() and then open_with() of an
// ACQUIRE datagram as a client sends it (one key of 12 bytes, padded by
// encode_request() to its reply bound), in each envelope form: legacy (one
// shared key, no key id), authenticated with a key id, and encrypted, in the
// portable suite and (where the CPU has AES-NI) the AES-GCM one. With 16
// ACQUIREs in one datagram (shardlock-bench --pack 16) beside it. BM_Open
// is the server's half alone: peek the key id, open the datagram into a
// per-worker buffer. BM_OpenAesStreams opens datagrams of many AES streams
// in turn: up to the receiver's cache (256 slots) each is one GCM call;
// far beyond it most opens derive their stream's key first.
//
//   cmake --preset bench && cmake --build build/bench --target envelope_benchmark
//   build/bench/bench/envelope_benchmark --benchmark_repetitions=5
//
// An encrypted seal used to make one getrandom(2) call for its nonce, about
// 0.4 us on a shared 2-vCPU Xeon; its nonce is now a per-thread random
// prefix and a counter (envelope.cc), and BM_SealOpen/encrypted/items:1 went
// from 1159-1324 ns to 904-1015 ns there (Intel Xeon Processor, 2026-12-08,
// two alternating runs of each build, --benchmark_min_time=0.5).
#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "shardlock/internal/cpu.h"
#include "shardlock/lease/wire/envelope.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease {
namespace {

std::vector<std::uint8_t> acquire_datagram(std::size_t items) {
  Datagram d;
  d.client_id = ClientId{0x1234, 0x5678};
  d.request_id = 1;
  for (std::size_t i = 0; i < items; ++i) {
    Message m;
    m.type = MessageType::kAcquire;
    m.request_id = 100 + i;
    m.key = "orders/79190";
    m.ttl_ms = 30'000;
    (void)d.push(m);
  }
  std::vector<std::uint8_t> bytes(kMaxDatagramSize);
  std::size_t n = 0;
  if (encode_request(d, bytes, n) != ProtocolError::kOk) return {};
  bytes.resize(n);
  return bytes;
}

const EnvelopeKey& bench_key() {
  static const EnvelopeKey key = envelope_key(generate_auth_key());
  return key;
}

constexpr std::uint32_t kKeyId = 7;

// One ACQUIRE datagram of `items` messages, with room to seal it and a
// per-worker buffer to open it into.
struct Scratch {
  explicit Scratch(std::size_t items) : plain(acquire_datagram(items)) {}

  // Copies the plain datagram in and seals it; returns the sealed length.
  std::size_t seal(EnvelopeMode mode) noexcept {
    std::memcpy(buffer.data(), plain.data(), plain.size());
    return seal_for(buffer, plain.size(), mode == EnvelopeMode::kLegacy ? 0 : kKeyId, bench_key(),
                    mode);
  }

  void report(benchmark::State& state, std::size_t sealed) const {
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * plain.size()));
    state.counters["plain_bytes"] = static_cast<double>(plain.size());
    state.counters["sealed_bytes"] = static_cast<double>(sealed);
  }

  std::vector<std::uint8_t> plain;
  std::array<std::uint8_t, kMaxDatagramSize + kMaxEnvelopeOverhead> buffer{};
  std::array<std::uint8_t, kMaxDatagramSize + kMaxEnvelopeOverhead> out{};
};

// False, with the benchmark skipped, where `mode` cannot run here.
bool runs_here(benchmark::State& state, EnvelopeMode mode) {
  if (!envelope_uses_aes(mode) || aes_gcm_available()) return true;
  state.SkipWithError("this CPU has no AES-NI");
  return false;
}

void BM_SealOpen(benchmark::State& state, EnvelopeMode mode) {
  if (!runs_here(state, mode)) return;
  Scratch scratch(static_cast<std::size_t>(state.range(0)));
  std::size_t sealed = 0;
  for (auto _ : state) {
    sealed = scratch.seal(mode);
    const auto opened =
        open_with(std::span(scratch.buffer).first(sealed), bench_key(), scratch.out);
    if (opened.size() != scratch.plain.size()) {
      state.SkipWithError("the sealed datagram did not open");
      break;
    }
    benchmark::DoNotOptimize(opened.data());
    benchmark::ClobberMemory();
  }
  scratch.report(state, sealed);
}

void BM_Open(benchmark::State& state, EnvelopeMode mode) {
  if (!runs_here(state, mode)) return;
  Scratch scratch(static_cast<std::size_t>(state.range(0)));
  const std::size_t sealed = scratch.seal(mode);
  const std::span<const std::uint8_t> datagram = std::span(scratch.buffer).first(sealed);
  for (auto _ : state) {
    const auto id = peek_key_id(datagram);
    const auto opened = open_with(datagram, bench_key(), scratch.out);
    if (!id || opened.size() != scratch.plain.size()) {
      state.SkipWithError("the sealed datagram did not open");
      break;
    }
    benchmark::DoNotOptimize(opened.data());
    benchmark::ClobberMemory();
  }
  scratch.report(state, sealed);
}

// range(0) streams (each key id seals in a stream of its own), one
// encrypted-AES datagram each, opened in turn.
void BM_OpenAesStreams(benchmark::State& state) {
  if (!runs_here(state, EnvelopeMode::kEncryptedAes)) return;
  Scratch scratch(1);
  std::vector<std::vector<std::uint8_t>> datagrams;
  for (std::int64_t id = 0; id < state.range(0); ++id) {
    std::memcpy(scratch.buffer.data(), scratch.plain.data(), scratch.plain.size());
    const std::size_t n =
        seal_for(scratch.buffer, scratch.plain.size(), static_cast<std::uint32_t>(id), bench_key(),
                 EnvelopeMode::kEncryptedAes);
    datagrams.emplace_back(scratch.buffer.begin(),
                           scratch.buffer.begin() + static_cast<std::ptrdiff_t>(n));
  }
  std::size_t next = 0;
  for (auto _ : state) {
    const auto opened = open_with(datagrams[next], bench_key(), scratch.out);
    if (opened.size() != scratch.plain.size()) {
      state.SkipWithError("the sealed datagram did not open");
      break;
    }
    next = next + 1 == datagrams.size() ? 0 : next + 1;
    benchmark::DoNotOptimize(opened.data());
    benchmark::ClobberMemory();
  }
  scratch.report(state, datagrams[0].size());
}
BENCHMARK(BM_OpenAesStreams)->ArgName("streams")->Arg(1)->Arg(200)->Arg(4096)->UseRealTime();

void one_and_sixteen_items(benchmark::internal::Benchmark* b) {
  b->ArgName("items")->Arg(1)->Arg(16)->UseRealTime();
}
BENCHMARK_CAPTURE(BM_SealOpen, legacy, EnvelopeMode::kLegacy)->Apply(one_and_sixteen_items);
BENCHMARK_CAPTURE(BM_SealOpen, key_id, EnvelopeMode::kAuthenticated)->Apply(one_and_sixteen_items);
BENCHMARK_CAPTURE(BM_SealOpen, encrypted, EnvelopeMode::kEncrypted)->Apply(one_and_sixteen_items);
BENCHMARK_CAPTURE(BM_Open, legacy, EnvelopeMode::kLegacy)->Apply(one_and_sixteen_items);
BENCHMARK_CAPTURE(BM_Open, key_id, EnvelopeMode::kAuthenticated)->Apply(one_and_sixteen_items);
BENCHMARK_CAPTURE(BM_Open, encrypted, EnvelopeMode::kEncrypted)->Apply(one_and_sixteen_items);
BENCHMARK_CAPTURE(BM_SealOpen, key_id_aes, EnvelopeMode::kAuthenticatedAes)
    ->Apply(one_and_sixteen_items);
BENCHMARK_CAPTURE(BM_SealOpen, encrypted_aes, EnvelopeMode::kEncryptedAes)
    ->Apply(one_and_sixteen_items);
BENCHMARK_CAPTURE(BM_Open, key_id_aes, EnvelopeMode::kAuthenticatedAes)
    ->Apply(one_and_sixteen_items);
BENCHMARK_CAPTURE(BM_Open, encrypted_aes, EnvelopeMode::kEncryptedAes)
    ->Apply(one_and_sixteen_items);

}  // namespace
}  // namespace shardlock::lease

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("cpu_model", shardlock::internal::cpu_model_name());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
