// Transparent hash and equality for std::string-keyed unordered maps, so a
// std::string_view (a key still inside a received datagram) can be looked up
// without building a std::string. Not API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shardlock::lease::internal {

struct StringKeyHash {
  using is_transparent = void;
  static constexpr std::uint64_t kDefaultSeed = 0x5eed0f5a11ULL;
  // XXH3 with a seed of its own, distinct from the key -> shard placement
  // seed, so keys that share a shard still spread over a table's buckets.
  // Tables that hold keys chosen by remote peers (the server's) pass a
  // secret per-process seed, so colliding keys cannot be built offline.
  explicit StringKeyHash(std::uint64_t table_seed = kDefaultSeed) noexcept : seed(table_seed) {}
  std::size_t operator()(std::string_view s) const noexcept;
  std::uint64_t seed;
};

struct StringKeyEqual {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const noexcept { return a == b; }
};

}  // namespace shardlock::lease::internal
