#include "shardlock/lease/wire/internal/string_key.h"

#include <xxhash.h>

namespace shardlock::lease::internal {

std::size_t StringKeyHash::operator()(std::string_view s) const noexcept {
  return static_cast<std::size_t>(XXH3_64bits_withSeed(s.data(), s.size(), seed));
}

std::uint64_t hash_key(std::string_view text, std::uint64_t seed) noexcept {
  return XXH3_64bits_withSeed(text.data(), text.size(), seed);
}

}  // namespace shardlock::lease::internal
