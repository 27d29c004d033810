// Transparent hash and equality for std::string-keyed unordered maps, so a
// std::string_view (a key still inside a received datagram) can be looked up
// without building a std::string. Not API.
#pragma once

#include <cstddef>
#include <string_view>

namespace shardlock::lease::internal {

struct StringKeyHash {
  using is_transparent = void;
  // XXH3 with a seed of its own, distinct from the key -> shard placement
  // seed, so keys that share a shard still spread over a table's buckets.
  std::size_t operator()(std::string_view s) const noexcept;
};

struct StringKeyEqual {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const noexcept { return a == b; }
};

}  // namespace shardlock::lease::internal
