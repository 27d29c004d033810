#include "shardlock/workload/zipf.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <vector>

namespace shardlock::workload {

ZipfDistribution::ZipfDistribution(std::uint64_t keys, double theta)
    : keys_(keys), theta_(theta), columns_(keys) {
  assert(keys >= 1 && keys <= (std::uint64_t{1} << 32) && theta >= 0.0);

  // Weights w_r = (r + 1)^-theta. Summed from the smallest up, so the
  // million tiny tail terms are not lost against the large head.
  std::vector<double> scaled(keys);
  for (std::uint64_t r = keys; r-- > 0;) {
    scaled[r] = std::pow(static_cast<double>(r + 1), -theta);
    harmonic_ += scaled[r];
  }

  // Vose's alias construction. Scale so the mean column holds 1.0; columns
  // below 1 ("small") are topped up from columns above 1 ("large").
  const double scale = static_cast<double>(keys) / harmonic_;
  std::vector<std::uint32_t> small;
  std::vector<std::uint32_t> large;
  small.reserve(keys);
  large.reserve(keys);
  for (std::uint64_t r = 0; r < keys; ++r) {
    scaled[r] *= scale;
    (scaled[r] < 1.0 ? small : large).push_back(static_cast<std::uint32_t>(r));
  }
  constexpr double kOne = 4294967296.0;  // 2^32: thresholds are 32-bit fractions
  while (!small.empty() && !large.empty()) {
    const std::uint32_t s = small.back();
    small.pop_back();
    const std::uint32_t l = large.back();
    // Rounding can leave a donor a hair below zero; clamp before converting.
    columns_[s] = {static_cast<std::uint32_t>(std::max(0.0, scaled[s]) * kOne), l};
    // l gives away (1 - scaled[s]) of its mass to column s.
    scaled[l] = (scaled[l] + scaled[s]) - 1.0;
    if (scaled[l] < 1.0) {
      large.pop_back();
      small.push_back(l);
    }
  }
  // What is left holds (up to rounding) exactly 1.0: it always yields itself.
  for (const std::uint32_t r : large) columns_[r] = {UINT32_MAX, r};
  for (const std::uint32_t r : small) columns_[r] = {UINT32_MAX, r};
}

double ZipfDistribution::probability(std::uint64_t rank) const noexcept {
  if (rank >= keys_) return 0.0;
  return std::pow(static_cast<double>(rank + 1), -theta_) / harmonic_;
}

}  // namespace shardlock::workload
