// String keys for unordered maps. Not API.
//
//   * StringKeyHash / StringKeyEqual: transparent hash and equality for
//     std::string-keyed maps, so a std::string_view (a key still inside a
//     received datagram) is looked up without building a std::string.
//   * HashedKey / KeyRef / HashedKeyHash / HashedKeyEqual: for the lease
//     server's hot path, where a key is hashed once per request
//     (hash_key()) and that one hash picks the shard, finds the key in the
//     shard's table, stores it there and fingerprints the request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace shardlock::lease::internal {

struct StringKeyHash {
  using is_transparent = void;
  static constexpr std::uint64_t kDefaultSeed = 0x5eed0f5a11ULL;
  // Tables that hold keys chosen by remote peers pass a secret per-process
  // seed, so colliding keys cannot be built offline.
  explicit StringKeyHash(std::uint64_t table_seed = kDefaultSeed) noexcept : seed(table_seed) {}
  std::size_t operator()(std::string_view s) const noexcept;
  std::uint64_t seed;
};

struct StringKeyEqual {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const noexcept { return a == b; }
};

// XXH3 of `text` under `seed`: the one hash a request's key gets.
[[nodiscard]] std::uint64_t hash_key(std::string_view text, std::uint64_t seed) noexcept;

// A key that is not stored (a view into a datagram) with its hash.
struct KeyRef {
  std::string_view text;
  std::uint64_t hash = 0;
};

// A stored key with the hash it was inserted under, so rehashing the table
// and erasing never hash the text again.
struct HashedKey {
  std::string text;
  std::uint64_t hash = 0;
};

// Returns the carried hash. Tables index with its low bits (libstdc++ uses
// prime bucket counts); LeaseServer picks the shard from its high bits, so
// keys that share a shard still spread over the shard's buckets.
struct HashedKeyHash {
  using is_transparent = void;
  std::size_t operator()(const HashedKey& k) const noexcept {
    return static_cast<std::size_t>(k.hash);
  }
  std::size_t operator()(const KeyRef& k) const noexcept {
    return static_cast<std::size_t>(k.hash);
  }
};

struct HashedKeyEqual {
  using is_transparent = void;
  template <class A, class B>
  bool operator()(const A& a, const B& b) const noexcept {
    return a.hash == b.hash && std::string_view(a.text) == std::string_view(b.text);
  }
};

}  // namespace shardlock::lease::internal
