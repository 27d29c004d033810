// epoch_token.h: fencing tokens in cluster mode (docs/cluster.md, Tokens).
//
// A token is `epoch << 32 | counter`: the map's epoch in the high 32 bits and
// the shard's counter, reset when the epoch changes, in the low 32. Ordering
// tokens as integers orders them by (epoch, counter), so a grant in a later
// epoch outranks every grant of an earlier one, whoever issued it.
//
// Neither half may reach 2^32: a larger value would spill into (or off) the
// other half and break that order. compose_token() refuses such pairs by
// returning kInvalidToken (0, which no grant ever carries); a shard whose
// counter nears 2^32 must ask for a new epoch instead.
//
// It sits in the wire room because a token is what GRANTED carries to every
// client and what a resource compares (FencingValidator): the server's token
// store and shards compose them, the cluster layer picks the epoch. The
// namespace stays shardlock::cluster, where its users have always named it.
#pragma once

#include <cstdint>

namespace shardlock::cluster {

inline constexpr std::uint64_t kInvalidToken = 0;
// Epochs and counters must stay below this.
inline constexpr std::uint64_t kTokenHalfLimit = std::uint64_t{1} << 32;

// The token for `counter` in `epoch`, or kInvalidToken when either is >= 2^32
// (or both are 0, which would compose to 0 itself).
[[nodiscard]] constexpr std::uint64_t compose_token(std::uint64_t epoch,
                                                    std::uint64_t counter) noexcept {
  if (epoch >= kTokenHalfLimit || counter >= kTokenHalfLimit) return kInvalidToken;
  return epoch << 32 | counter;
}

[[nodiscard]] constexpr std::uint64_t token_epoch(std::uint64_t token) noexcept {
  return token >> 32;
}

[[nodiscard]] constexpr std::uint64_t token_counter(std::uint64_t token) noexcept {
  return token & (kTokenHalfLimit - 1);
}

static_assert(compose_token(1, 0) > compose_token(0, kTokenHalfLimit - 1),
              "a new epoch outranks every counter of the previous one");
static_assert(token_epoch(compose_token(7, 9)) == 7 && token_counter(compose_token(7, 9)) == 9);
static_assert(compose_token(kTokenHalfLimit, 0) == kInvalidToken);
static_assert(compose_token(0, kTokenHalfLimit) == kInvalidToken);

}  // namespace shardlock::cluster
