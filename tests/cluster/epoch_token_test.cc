// Token composition in cluster mode: (epoch, counter) order is integer order,
// and pairs that would not fit are refused with the invalid token.
#include "shardlock/lease/wire/epoch_token.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace shardlock::cluster {
namespace {

constexpr std::uint64_t kMax = kTokenHalfLimit - 1;

TEST(EpochToken, SplitsBackIntoItsHalves) {
  for (auto [epoch, counter] : std::vector<std::pair<std::uint64_t, std::uint64_t>>{
           {1, 0}, {1, 1}, {0, 1}, {kMax, kMax}, {12345, 678}, {kMax, 0}, {1, kMax}}) {
    const std::uint64_t token = compose_token(epoch, counter);
    EXPECT_NE(token, kInvalidToken);
    EXPECT_EQ(token_epoch(token), epoch);
    EXPECT_EQ(token_counter(token), counter);
  }
}

TEST(EpochToken, StrictlyRisesInEpochThenCounterOrder) {
  // Pairs in (epoch, counter) order, including the edges where a counter
  // resets because the epoch rose.
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> ordered = {
      {0, 1}, {0, 2},    {0, kMax}, {1, 0},    {1, 1},    {1, kMax - 1}, {1, kMax},
      {2, 0}, {1000, 5}, {1001, 0}, {kMax, 0}, {kMax, 1}, {kMax, kMax},
  };
  for (std::size_t i = 1; i < ordered.size(); ++i) {
    EXPECT_LT(compose_token(ordered[i - 1].first, ordered[i - 1].second),
              compose_token(ordered[i].first, ordered[i].second))
        << "pair " << i;
  }
}

TEST(EpochToken, RefusesHalvesThatDoNotFit) {
  EXPECT_EQ(compose_token(kTokenHalfLimit, 0), kInvalidToken);
  EXPECT_EQ(compose_token(kTokenHalfLimit, 1), kInvalidToken);
  EXPECT_EQ(compose_token(1, kTokenHalfLimit), kInvalidToken);
  EXPECT_EQ(compose_token(~std::uint64_t{0}, ~std::uint64_t{0}), kInvalidToken);
  // The one pair that composes to 0 is not a token either.
  EXPECT_EQ(compose_token(0, 0), kInvalidToken);
}

// Usable at compile time.
static_assert(compose_token(2, 3) == (std::uint64_t{2} << 32 | 3));
static_assert(compose_token(3, 0) > compose_token(2, kMax));
static_assert(compose_token(2, 4) > compose_token(2, 3));

}  // namespace
}  // namespace shardlock::cluster
