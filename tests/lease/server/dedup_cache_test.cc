// DedupCache against a reference model (a map plus a FIFO of keys): random
// finds and puts, with few clients and sequential request ids as real
// clients send them, over small capacities where every index slot and every
// wrap of the ring is exercised.
#include "shardlock/lease/server/internal/dedup_cache.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <random>
#include <utility>

namespace shardlock::lease::internal {
namespace {

using Key = std::pair<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t>;

Key key_of(const ClientId& c, std::uint64_t request_id) { return {{c.lo, c.hi}, request_id}; }

class Model {
 public:
  explicit Model(std::size_t capacity) : capacity_(capacity) {}
  const int* find(const ClientId& c, std::uint64_t id) const {
    const auto it = values_.find(key_of(c, id));
    return it == values_.end() ? nullptr : &it->second;
  }
  void put(const ClientId& c, std::uint64_t id, int value) {
    if (capacity_ == 0) return;
    const Key k = key_of(c, id);
    if (const auto it = values_.find(k); it != values_.end()) {
      it->second = value;
      return;
    }
    if (order_.size() == capacity_) {
      values_.erase(order_.front());
      order_.pop_front();
    }
    order_.push_back(k);
    values_[k] = value;
  }
  std::size_t size() const { return values_.size(); }

 private:
  std::size_t capacity_;
  std::map<Key, int> values_;
  std::deque<Key> order_;
};

void run_against_model(std::size_t capacity, std::uint64_t seed, int steps) {
  SCOPED_TRACE(::testing::Message() << "capacity " << capacity << " seed " << seed);
  DedupCache<int> cache(capacity);
  Model model(capacity);
  std::mt19937_64 rng(seed);
  const ClientId clients[] = {{1, 2}, {3, 4}, {0x9E37, 0x79B9}, {0, 0}};
  std::uint64_t next_id[4] = {1, 1000, 5, 1};
  for (int step = 0; step < steps; ++step) {
    const std::size_t c = rng() % 4;
    // Mostly new ids, sometimes a recent one again (a retransmission), or an
    // old one that may have been evicted.
    std::uint64_t id = next_id[c];
    const std::uint64_t pick = rng() % 10;
    if (pick < 6) {
      id = next_id[c]++;
    } else if (pick < 9 && next_id[c] > 1) {
      id = next_id[c] - 1 - rng() % std::min<std::uint64_t>(next_id[c] - 1, 8);
    } else {
      id = rng() % (next_id[c] + 1);
    }
    const int* expected = model.find(clients[c], id);
    const int* actual = cache.find(clients[c], id);
    ASSERT_EQ(expected == nullptr, actual == nullptr) << "step " << step << " id " << id;
    if (expected != nullptr) {
      ASSERT_EQ(*expected, *actual) << "step " << step;
    }
    if (rng() % 3 != 0) {
      const int value = static_cast<int>(rng() % 1000);
      model.put(clients[c], id, value);
      cache.put(clients[c], id, value);
    }
    ASSERT_EQ(model.size(), cache.size()) << "step " << step;
  }
}

TEST(DedupCacheTest, MatchesAFifoMapModel) {
  for (const std::size_t capacity : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7},
                                     std::size_t{64}, std::size_t{1000}}) {
    for (std::uint64_t seed = 1; seed <= 3; ++seed) run_against_model(capacity, seed, 30'000);
  }
}

TEST(DedupCacheTest, EvictsOldestFirstAndOverwritesInPlace) {
  DedupCache<int> cache(3);
  const ClientId a{1, 1};
  cache.put(a, 1, 10);
  cache.put(a, 2, 20);
  cache.put(a, 3, 30);
  cache.put(a, 1, 11);  // an overwrite does not refresh the entry's age
  EXPECT_EQ(*cache.find(a, 1), 11);
  cache.put(a, 4, 40);  // evicts id 1, the oldest
  EXPECT_EQ(cache.find(a, 1), nullptr);
  EXPECT_EQ(*cache.find(a, 2), 20);
  EXPECT_EQ(*cache.find(a, 4), 40);
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.find(ClientId{1, 2}, 2), nullptr);  // another client, same id
}

TEST(DedupCacheTest, ZeroCapacityKeepsNothing) {
  DedupCache<int> cache(0);
  cache.put(ClientId{1, 1}, 1, 1);
  EXPECT_EQ(cache.find(ClientId{1, 1}, 1), nullptr);
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace shardlock::lease::internal
