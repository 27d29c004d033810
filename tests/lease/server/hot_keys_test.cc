// HotKeys, the space-saving sketch behind HOT_KEYS: its memory is fixed,
// it finds the heavy hitters of a skewed stream, and its counts keep the
// algorithm's bounds (count - error <= true count <= count, the smallest
// count at most N / capacity); halving on shared boundaries, and the window
// that turns counts into rates. Past kExactRequests it samples: counts are
// exact below it, and estimates within the documented error above it.
#include "shardlock/lease/server/internal/hot_keys.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "shardlock/lease/wire/internal/string_key.h"
#include "shardlock/workload/zipf.h"

namespace shardlock::lease::internal {
namespace {

constexpr std::uint64_t kSeed = 0x5eed;

// Every slot with a count, by key.
std::map<std::string, HotKeys::Entry> entries(HotKeys& sketch, std::int64_t now_ms) {
  std::map<std::string, HotKeys::Entry> out;
  sketch.for_each(now_ms, [&](const HotKeys::Entry& e) { out[std::string(e.key)] = e; });
  return out;
}

void record(HotKeys& sketch, const std::string& key, std::int64_t now_ms, bool busy = false) {
  sketch.record(hash_key(key, kSeed), key, busy, now_ms);
}

// Records `requests` keys drawn Zipf(0.99) from 10000, as shardlock-bench
// sends them; returns each key's true count.
std::map<std::string, std::uint32_t> record_zipf(HotKeys& sketch, std::size_t requests) {
  workload::ZipfGenerator zipf(10'000, 0.99, 42);
  std::map<std::string, std::uint32_t> truth;
  for (std::size_t i = 0; i < requests; ++i) {
    const std::string key = "k" + std::to_string(zipf.next());
    ++truth[key];
    record(sketch, key, 0);
  }
  return truth;
}

TEST(HotKeys, CountsEachKeyExactlyWhileThereIsRoom) {
  HotKeys sketch(4, 256, /*half_life_ms=*/0, 0);
  for (int i = 0; i < 5; ++i) record(sketch, "a", 0);
  record(sketch, "b", 0, /*busy=*/true);
  record(sketch, "b", 0, /*busy=*/true);
  record(sketch, "c", 0);
  const auto e = entries(sketch, 0);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e.at("a").requests, 5u);
  EXPECT_EQ(e.at("a").error, 0u);
  EXPECT_EQ(e.at("a").busy, 0u);
  EXPECT_EQ(e.at("b").requests, 2u);
  EXPECT_EQ(e.at("b").busy, 2u);
  EXPECT_EQ(e.at("c").requests, 1u);
  EXPECT_EQ(e.at("c").hash, hash_key("c", kSeed));
}

// The lookup reads hashes four at a time: a capacity that is no multiple
// of four, and a key whose hash is 0 (what the unused slots hold), still
// count right.
TEST(HotKeys, OddCapacitiesAndAZeroHash) {
  HotKeys sketch(5, 256, 0, 0);
  for (int i = 0; i < 3; ++i) sketch.record(0, "zero", false, 0);
  for (int i = 0; i < 3; ++i) record(sketch, "k" + std::to_string(i), 0);
  EXPECT_EQ(entries(sketch, 0).at("zero").requests, 3u);
  for (int i = 3; i < 9; ++i) record(sketch, "k" + std::to_string(i), 0);
  EXPECT_EQ(sketch.capacity(), 5u);
  EXPECT_EQ(sketch.size(), 5u);
  EXPECT_EQ(entries(sketch, 0).size(), 5u);
  EXPECT_EQ(entries(sketch, 0).at("zero").requests, 3u);  // never the smallest
}

// 100000 distinct keys through 16 slots: never more than 16, and no memory
// beyond what construction took (the vectors keep their buffers).
TEST(HotKeys, MemoryIsBoundedWhateverTheKeys) {
  HotKeys sketch(16, 256, 0, 0);
  for (int i = 0; i < 100'000; ++i) record(sketch, "key/" + std::to_string(i), 0);
  EXPECT_EQ(sketch.capacity(), 16u);
  EXPECT_EQ(sketch.size(), 16u);
  EXPECT_EQ(entries(sketch, 0).size(), 16u);
  // Keys longer than the bound are not recorded at all.
  HotKeys short_keys(4, 8, 0, 0);
  record(short_keys, std::string(9, 'k'), 0);
  record(short_keys, std::string(8, 'k'), 0);
  EXPECT_EQ(short_keys.size(), 1u);
  // Capacity 0 is off.
  HotKeys off(0, 256, 0, 0);
  record(off, "a", 0);
  EXPECT_FALSE(off.enabled());
  EXPECT_TRUE(entries(off, 0).empty());
}

// A Zipf(0.99) stream over 10000 keys, as shardlock-bench sends: the heavy
// hitters are all in a 32-slot sketch, each count brackets the true count,
// the counts sum to the stream's length, and the smallest is at most N / K.
TEST(HotKeys, FindsTheHeavyHittersOfASkewedStreamWithinTheBounds) {
  constexpr std::size_t kCapacity = 32;
  constexpr std::size_t kRequests = 200'000;
  // Every request recorded: the algorithm's bounds hold exactly.
  HotKeys sketch(kCapacity, 256, 0, 0, HotKeys::kNeverSample);
  const std::map<std::string, std::uint32_t> truth = record_zipf(sketch, kRequests);
  const auto e = entries(sketch, 0);
  ASSERT_EQ(e.size(), kCapacity);
  std::uint64_t sum = 0;
  std::uint32_t smallest = UINT32_MAX;
  for (const auto& [key, entry] : e) {
    SCOPED_TRACE(key);
    const std::uint32_t real = truth.at(key);
    EXPECT_LE(real, entry.requests);
    EXPECT_GE(real, entry.requests - entry.error);
    sum += entry.requests;
    smallest = std::min(smallest, entry.requests);
  }
  EXPECT_EQ(sum, kRequests);
  EXPECT_LE(smallest, kRequests / kCapacity);
  // Every key requested more than N / K times is in a slot (the guarantee;
  // fewer than the slots: the long tail churns the rest), and the three
  // busiest come first in their true order.
  std::vector<std::pair<std::uint32_t, std::string>> by_count;
  for (const auto& [key, n] : truth) by_count.emplace_back(n, key);
  std::sort(by_count.rbegin(), by_count.rend());
  for (const auto& [n, key] : by_count) {
    if (n <= kRequests / kCapacity) break;
    EXPECT_TRUE(e.contains(key)) << key << " with " << n;
  }
  std::vector<std::pair<std::uint32_t, std::string>> reported;
  for (const auto& [key, entry] : e) reported.emplace_back(entry.requests, key);
  std::sort(reported.rbegin(), reported.rend());
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(reported[i].second, by_count[i].second) << i;
}

// Every request counts until the counts sum to kExactRequests; from there
// one in kSampleEvery counts kSampleEvery. Halving back below the threshold
// makes it exact again.
TEST(HotKeys, ExactUntilTheCountsReachTheThresholdThenSampled) {
  HotKeys sketch(4, 256, /*half_life_ms=*/1000, 0);
  for (std::uint64_t i = 0; i + 1 < HotKeys::kExactRequests; ++i) record(sketch, "a", 0, true);
  EXPECT_FALSE(sketch.sampling());
  EXPECT_EQ(entries(sketch, 0).at("a").requests, HotKeys::kExactRequests - 1);
  EXPECT_EQ(entries(sketch, 0).at("a").busy, HotKeys::kExactRequests - 1);
  record(sketch, "a", 0);
  EXPECT_TRUE(sketch.sampling());
  EXPECT_EQ(sketch.total(), HotKeys::kExactRequests);
  constexpr int kMore = 160'000;
  for (int i = 0; i < kMore; ++i) record(sketch, "a", 0);
  const std::uint32_t count = entries(sketch, 0).at("a").requests;
  EXPECT_EQ((count - HotKeys::kExactRequests) % HotKeys::kSampleEvery, 0u);
  EXPECT_EQ(sketch.total(), count);
  // 160000 more, estimated within 5 standard deviations (sqrt(15 x 160000)
  // = 1549).
  EXPECT_NEAR(static_cast<double>(count - HotKeys::kExactRequests), kMore, 5 * 1549.0);
  // Halved to below the threshold (7 boundaries: 164096 >> 7 = 1282), every
  // request counts again.
  EXPECT_LT(entries(sketch, 7000).at("a").requests, HotKeys::kExactRequests);
  EXPECT_FALSE(sketch.sampling());
  const std::uint32_t before = entries(sketch, 7000).at("a").requests;
  record(sketch, "a", 7000);
  EXPECT_EQ(entries(sketch, 7000).at("a").requests, before + 1);
}

// The sampled sketch on the skewed stream above: each count brackets an
// estimate of the true count within the documented error (5 standard
// deviations of sqrt(15 n)), the counts sum to about N, the keys above
// N / K are found, and the three busiest come first in their true order.
TEST(HotKeys, SampledCountsEstimateTheTrueCountsWithinTheDocumentedError) {
  constexpr std::size_t kCapacity = 32;
  constexpr std::size_t kRequests = 200'000;
  HotKeys sketch(kCapacity, 256, 0, 0);
  const std::map<std::string, std::uint32_t> truth = record_zipf(sketch, kRequests);
  ASSERT_TRUE(sketch.sampling());
  const auto e = entries(sketch, 0);
  ASSERT_EQ(e.size(), kCapacity);
  const auto sigma = [](double n) { return std::sqrt((HotKeys::kSampleEvery - 1) * n); };
  std::uint64_t sum = 0;
  for (const auto& [key, entry] : e) {
    SCOPED_TRACE(key);
    const double real = truth.at(key);
    EXPECT_LE(real, entry.requests + 5 * sigma(real));
    EXPECT_GE(real, entry.requests - entry.error - 5 * sigma(real));
    sum += entry.requests;
  }
  EXPECT_NEAR(static_cast<double>(sum), kRequests, 5 * sigma(kRequests));
  std::vector<std::pair<std::uint32_t, std::string>> by_count;
  for (const auto& [key, n] : truth) by_count.emplace_back(n, key);
  std::sort(by_count.rbegin(), by_count.rend());
  // Keys clearly above N / K (by the sampling's 5 deviations) hold a slot.
  for (const auto& [n, key] : by_count) {
    if (n <= kRequests / kCapacity + 5 * sigma(kRequests)) break;
    EXPECT_TRUE(e.contains(key)) << key << " with " << n;
  }
  std::vector<std::pair<std::uint32_t, std::string>> reported;
  for (const auto& [key, entry] : e) reported.emplace_back(entry.requests, key);
  std::sort(reported.rbegin(), reported.rend());
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(reported[i].second, by_count[i].second) << i;
}

// A key that comes after the slots filled takes the smallest count's slot,
// with that count as its error; a key that stays busy keeps its slot.
TEST(HotKeys, ANewKeyTakesTheSmallestSlotWithItsCountAsError) {
  HotKeys sketch(2, 256, 0, 0);
  for (int i = 0; i < 10; ++i) record(sketch, "hot", 0);
  for (int i = 0; i < 3; ++i) record(sketch, "warm", 0);
  record(sketch, "new", 0, /*busy=*/true);
  auto e = entries(sketch, 0);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_FALSE(e.contains("warm"));
  EXPECT_EQ(e.at("new").requests, 4u);
  EXPECT_EQ(e.at("new").error, 3u);
  EXPECT_EQ(e.at("new").busy, 1u);  // the slot's busy count starts afresh
  EXPECT_EQ(e.at("hot").requests, 10u);
}

// Counts halve every half-life after the origin (the server's start, the
// same in every shard), lazily: several boundaries at once halve as often.
TEST(HotKeys, CountsHalveOnEachBoundary) {
  HotKeys sketch(4, 256, /*half_life_ms=*/1000, /*origin_ms=*/1500);
  for (int i = 0; i < 64; ++i) record(sketch, "a", 1500, i % 2 == 0);
  EXPECT_EQ(sketch.origin_ms(), 1500);
  EXPECT_EQ(entries(sketch, 2499).at("a").requests, 64u);
  EXPECT_EQ(entries(sketch, 2500).at("a").requests, 32u);  // boundary 2500
  EXPECT_EQ(entries(sketch, 2500).at("a").busy, 16u);
  record(sketch, "a", 3000);
  EXPECT_EQ(entries(sketch, 3499).at("a").requests, 33u);
  EXPECT_EQ(entries(sketch, 5500).at("a").requests, 4u);  // 3500, 4500, 5500
  EXPECT_TRUE(entries(sketch, 100'000).empty());          // all halved away
  record(sketch, "b", 100'000);
  EXPECT_EQ(entries(sketch, 100'000).at("b").requests, 1u);
  // Without a half-life nothing halves.
  HotKeys kept(4, 256, 0, 0);
  record(kept, "a", 0);
  EXPECT_EQ(entries(kept, 1'000'000'000).at("a").requests, 1u);
}

// window_ms(): each millisecond weighs as a request made then; a key
// requested at a steady rate has count / window = that rate.
TEST(HotKeys, WindowTurnsCountsIntoRates) {
  EXPECT_EQ(HotKeys::window_ms(0, 700, 0), 700);
  EXPECT_EQ(HotKeys::window_ms(100, 700, 1000), 600);  // no boundary yet
  EXPECT_EQ(HotKeys::window_ms(0, 1000, 1000), 500);   // [0,1000) halved once
  EXPECT_EQ(HotKeys::window_ms(0, 1250, 1000), 750);   // 250 + 1000 / 2
  EXPECT_EQ(HotKeys::window_ms(500, 2750, 1000), 250 + 500 + 250);
  EXPECT_EQ(HotKeys::window_ms(700, 700, 1000), 0);
  // A steady 2 requests per millisecond since 500 ms.
  HotKeys sketch(2, 256, 1000, 500);
  for (std::int64_t t = 500; t < 3250; ++t) {
    record(sketch, "k", t);
    record(sketch, "k", t);
  }
  const std::int64_t now = 3250;
  const double count = entries(sketch, now).at("k").requests;
  const double rate = count / static_cast<double>(HotKeys::window_ms(500, now, 1000));
  EXPECT_NEAR(rate, 2.0, 0.02);
}

}  // namespace
}  // namespace shardlock::lease::internal
