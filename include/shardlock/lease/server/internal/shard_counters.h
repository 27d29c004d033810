// ShardCounters: one shard's STATS counters (protocol.h's StatCounter), and
// RequestKey, the (client id, request id) that names a parked request, with
// the seeded hash the shard's per-client tables use.
//
// Not API: Shard and its units (watch_registry.h, client_usage.h,
// shard_reply.h) share one ShardCounters per shard. Not thread-safe (the
// shard lock guards it).
#pragma once

#include <xxhash.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease::internal {

class ShardCounters {
 public:
  void count(StatCounter c) noexcept { ++values_[static_cast<std::size_t>(c)]; }
  [[nodiscard]] std::uint64_t operator[](StatCounter c) const noexcept {
    return values_[static_cast<std::size_t>(c)];
  }
  [[nodiscard]] const std::array<std::uint64_t, kStatCounterCount>& values() const noexcept {
    return values_;
  }

 private:
  std::array<std::uint64_t, kStatCounterCount> values_{};
};

// (client id, request id) of a queued ACQUIRE or a parked WATCH: what a
// retransmission of it repeats.
struct RequestKey {
  ClientId client;
  std::uint64_t request_id = 0;
  friend bool operator==(const RequestKey&, const RequestKey&) = default;
};

// Client ids and request ids come from the network: the tables keyed by them
// hash under the shard's secret seed (ShardLimits::hash_seed).
struct SeededHash {
  std::uint64_t seed = 0;
  std::size_t operator()(const RequestKey& id) const noexcept {
    const std::uint64_t words[3] = {id.client.lo, id.client.hi, id.request_id};
    return static_cast<std::size_t>(XXH3_64bits_withSeed(words, sizeof words, seed));
  }
  std::size_t operator()(const ClientId& id) const noexcept {
    const std::uint64_t words[2] = {id.lo, id.hi};
    return static_cast<std::size_t>(XXH3_64bits_withSeed(words, sizeof words, seed));
  }
};

}  // namespace shardlock::lease::internal
