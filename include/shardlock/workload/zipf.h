// Hot-key workloads: a Zipf rank distribution and the small PRNG that drives
// it, shared by the lock-table benchmark, the scenario tests and
// shardlock-bench.
//
//   shardlock::workload::ZipfGenerator gen(/*keys=*/1'000'000, /*theta=*/0.99, /*seed=*/7);
//   std::uint64_t rank = gen.next();  // 0 is the hottest key, keys - 1 the coldest
//
// Rank r (0-based) is drawn with probability (r + 1)^-theta / H(keys, theta),
// where H is the generalized harmonic number. theta = 0 is uniform; YCSB's
// default, 0.99, sends 6.5% of draws to rank 0 over 1 M keys.
//
// Design
//   * Exact, not approximate. YCSB's ZipfianGenerator (Gray et al., "Quickly
//     Generating Billion-Record Synthetic Databases", SIGMOD 1994) is exact
//     only for ranks 0 and 1 and approximates the tail with a power
//     function. Walker's alias method (Vose's O(n) construction) samples
//     the exact distribution in O(1) worst case: one 64-bit random word, one
//     128-bit multiply, one table lookup and one compare.
//   * Setup: O(keys) time, 8 bytes per key (a 32-bit acceptance threshold
//     and a 32-bit alias); 8 MB and ~30 ms for the default 1 M keys. The
//     table is immutable after construction and shared by generators made
//     with fork(), so per-thread generators cost one pointer and 8 bytes.
//   * Determinism: the random source is SplitMix64 (Steele, Lea, Flood,
//     "Fast Splittable Pseudorandom Number Generators", OOPSLA 2014), not a
//     <random> distribution, whose output differs between standard
//     libraries. The same options give the same sequence everywhere.
//   * Threads: a ZipfGenerator is not thread-safe (it advances its state);
//     give each thread its own via fork(). ZipfDistribution is immutable
//     and safe to share.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "shardlock/internal/random.h"

namespace shardlock::workload {

// The random source lives in internal/random.h, which the lease client
// shares; these names keep it where the workload code has always found it.
using internal::SplitMix64;
using internal::Uint128;

// The immutable alias table for Zipf(keys, theta).
class ZipfDistribution {
 public:
  // Builds the table. Preconditions: 1 <= keys <= 2^32, 0 <= theta (theta
  // = 1 is fine: the alias method needs no closed form). Allocates.
  explicit ZipfDistribution(std::uint64_t keys = 1'000'000, double theta = 0.99);

  // Maps one uniformly random 64-bit word to a rank in [0, keys).
  std::uint64_t operator()(std::uint64_t random_bits) const noexcept {
    // keys * random_bits / 2^64: the high word picks a column uniformly, and
    // the low word's top 32 bits are the uniform fraction within it.
    const auto product = static_cast<Uint128>(random_bits) * keys_;
    const auto column = static_cast<std::uint64_t>(product >> 64);
    const auto fraction = static_cast<std::uint32_t>(static_cast<std::uint64_t>(product) >> 32);
    const Column& c = columns_[column];
    return fraction < c.threshold ? column : c.alias;
  }

  // The exact probability of `rank` under Zipf(keys, theta).
  double probability(std::uint64_t rank) const noexcept;

  std::uint64_t keys() const noexcept { return keys_; }
  double theta() const noexcept { return theta_; }
  // H(keys, theta) = sum over r in 1..keys of r^-theta.
  double harmonic() const noexcept { return harmonic_; }

 private:
  // Column i yields i when the fraction is below threshold (out of 2^32),
  // else alias. Columns that keep all their mass have alias == i.
  struct Column {
    std::uint32_t threshold;
    std::uint32_t alias;
  };

  std::uint64_t keys_;
  double theta_;
  double harmonic_ = 0.0;
  std::vector<Column> columns_;
};

// A Zipf rank source: a shared distribution plus a private SplitMix64.
class ZipfGenerator {
 public:
  static constexpr std::uint64_t kDefaultSeed = 0x5eed'5eed'5eed'5eedULL;

  // Builds a ZipfDistribution(keys, theta) (same preconditions; allocates).
  explicit ZipfGenerator(std::uint64_t keys = 1'000'000, double theta = 0.99,
                         std::uint64_t seed = kDefaultSeed)
      : distribution_(std::make_shared<const ZipfDistribution>(keys, theta)), random_(seed) {}

  // The next rank in [0, keys); 0 is the most popular. O(1), never allocates.
  std::uint64_t next() noexcept { return (*distribution_)(random_.next()); }
  std::uint64_t operator()() noexcept { return next(); }

  // A generator over the same table with its own seed (for another thread).
  // Cheap: shares the table.
  ZipfGenerator fork(std::uint64_t seed) const { return {distribution_, seed}; }

  const ZipfDistribution& distribution() const noexcept { return *distribution_; }

 private:
  ZipfGenerator(std::shared_ptr<const ZipfDistribution> distribution, std::uint64_t seed)
      : distribution_(std::move(distribution)), random_(seed) {}

  std::shared_ptr<const ZipfDistribution> distribution_;
  SplitMix64 random_;
};

}  // namespace shardlock::workload
