// random.h: SplitMix64, the small deterministic PRNG the tree shares: the
// workload generators (workload/zipf.h) draw Zipf ranks from it, and the
// lease client jitters its retransmissions and RECOVERING retries with it.
// Not API: include the header of the part that uses it.
//
// Why not <random>: its engines are larger than one word, and its
// distributions' output differs between standard libraries, so the same seed
// would not give the same sequence everywhere.
#pragma once

#include <cstdint>

namespace shardlock::internal {

// 64x64->128-bit products for multiply-shift range reduction (GCC and Clang;
// __extension__ keeps -Wpedantic quiet about the non-ISO type).
__extension__ using Uint128 = unsigned __int128;

// SplitMix64: 64-bit state, one add and three xor-shift-multiplies per
// output, full period 2^64. Good enough statistically (passes BigCrush) for
// workload generation; not for anything adversarial.
class SplitMix64 {
 public:
  explicit constexpr SplitMix64(std::uint64_t seed) noexcept : state_(seed) {}

  constexpr std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  constexpr std::uint64_t operator()() noexcept { return next(); }

  // Uniform in [0, n), by Lemire's multiply-shift (bias below n / 2^64).
  // Precondition: n > 0.
  constexpr std::uint64_t uniform(std::uint64_t n) noexcept {
    return static_cast<std::uint64_t>((static_cast<Uint128>(next()) * n) >> 64);
  }

 private:
  std::uint64_t state_;
};

}  // namespace shardlock::internal
