#include "shardlock/lock_table.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <set>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "poll_until.h"
#include "shardlock/instrumented.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/mutex.h"
#include "shardlock/spin_lock.h"

namespace shardlock {
namespace {

using namespace std::chrono_literals;

// Two distinct integer keys that share a stripe, and one that does not.
template <class Table>
std::array<int, 3> colliding_keys(const Table& table) {
  const std::size_t target = table.stripe_of(0);
  int same = 1;
  while (table.stripe_of(same) != target) ++same;
  int other = 1;
  while (table.stripe_of(other) == target) ++other;
  return {0, same, other};
}

TEST(LockTableTest, DefaultStripeCountIsAPowerOfTwoWithSixtyFourPerThread) {
  LockTable<> table;
  EXPECT_TRUE(std::has_single_bit(table.stripe_count()));
  EXPECT_GE(table.stripe_count(), 64u * std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_LT(table.stripe_count(), 128u * std::max(1u, std::thread::hardware_concurrency()));
}

TEST(LockTableTest, StripeCountRoundsUpToAPowerOfTwo) {
  EXPECT_EQ(LockTable<>(100).stripe_count(), 128u);
  EXPECT_EQ(LockTable<>(1).stripe_count(), 1u);
  EXPECT_EQ(LockTable<>(4096).stripe_count(), 4096u);
}

TEST(LockTableTest, FixedSeedGivesStablePlacementAndRandomSeedsDiffer) {
  LockTable<> a(1024, 42);
  LockTable<> b(1024, 42);
  LockTable<> c(1024, 43);
  EXPECT_EQ(a.seed(), 42u);
  int moved = 0;
  for (int key = 0; key < 1000; ++key) {
    EXPECT_EQ(a.stripe_of(key), b.stripe_of(key));
    moved += a.stripe_of(key) != c.stripe_of(key) ? 1 : 0;
  }
  EXPECT_GT(moved, 900);  // expected 999 of 1000 with 1024 stripes
  EXPECT_NE(LockTable<>().seed(), LockTable<>().seed());
}

TEST(LockTableTest, PlacementIsTheMaskedSeededXxh3OfTheKeyBytes) {
  LockTable<> table(256, 7);
  EXPECT_EQ(table.stripe_of(std::string_view("user:42")),
            XXH3_64bits_withSeed("user:42", 7, 7) & 255);
  const unsigned char five[8] = {5, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(table.stripe_of(5), XXH3_64bits_withSeed(five, 8, 7) & 255);
}

TEST(LockTableTest, EqualValuesOfDifferentTypesShareAStripe) {
  LockTable<> table(4096, 1);
  EXPECT_EQ(table.stripe_of(5), table.stripe_of(5u));
  EXPECT_EQ(table.stripe_of(5), table.stripe_of(std::int64_t{5}));
  EXPECT_EQ(table.stripe_of(5), table.stripe_of(std::uint8_t{5}));
  EXPECT_EQ(table.stripe_of(-1), table.stripe_of(std::int64_t{-1}));
  const std::string owned = "order-17";
  EXPECT_EQ(table.stripe_of(owned), table.stripe_of(std::string_view("order-17")));
  EXPECT_EQ(table.stripe_of(owned), table.stripe_of("order-17"));
}

TEST(LockTableTest, PlacementSpreadsKeysEvenly) {
  // 128 stripes, 128,000 keys: each stripe expects 1000 (sd ~31.5). Pearson's
  // chi-square over 127 degrees of freedom has mean 127 and sd ~16; a good
  // hash stays far below 300 (p < 1e-15), a broken mask or seed does not.
  constexpr std::size_t kStripes = 128;
  constexpr int kKeys = 128'000;
  for (const std::uint64_t seed : {1ULL, 2ULL, 0xdeadbeefULL}) {
    LockTable<> table(kStripes, seed);
    std::vector<int> ints(kStripes, 0);
    std::vector<int> strings(kStripes, 0);
    for (int key = 0; key < kKeys; ++key) {
      ++ints[table.stripe_of(key)];
      ++strings[table.stripe_of("key:" + std::to_string(key))];
    }
    auto chi_square = [](const std::vector<int>& counts) {
      double sum = 0;
      for (const int n : counts) sum += (n - 1000.0) * (n - 1000.0) / 1000.0;
      return sum;
    };
    EXPECT_LT(chi_square(ints), 300.0) << "seed " << seed;
    EXPECT_LT(chi_square(strings), 300.0) << "seed " << seed;
  }
}

TEST(LockTableTest, LockExcludesEveryKeyOnTheSameStripeOnly) {
  LockTable<> table(64, 3);
  const auto [key, same_stripe, other_stripe] = colliding_keys(table);
  auto guard = table.lock(key);
  ASSERT_TRUE(guard.owns_lock());
  EXPECT_EQ(guard.stripe(), table.stripe_of(key));
  EXPECT_FALSE(table.try_lock(key).owns_lock());
  EXPECT_FALSE(table.try_lock(same_stripe).owns_lock());
  EXPECT_TRUE(table.try_lock(other_stripe).owns_lock());
  guard.unlock();
  EXPECT_FALSE(guard.owns_lock());
  EXPECT_TRUE(table.try_lock(same_stripe).owns_lock());
}

TEST(LockTableTest, GuardIsMoveOnlyAndReleasesOnce) {
  static_assert(!std::is_copy_constructible_v<LockTable<>::Guard>);
  static_assert(std::is_nothrow_move_constructible_v<LockTable<>::Guard>);
  LockTable<> table(16, 3);
  LockTable<>::Guard outer;
  EXPECT_FALSE(outer);
  {
    auto inner = table.lock("k");
    outer = std::move(inner);
    EXPECT_FALSE(inner.owns_lock());  // NOLINT(bugprone-use-after-move): asserting moved-from state
  }
  EXPECT_TRUE(outer);
  EXPECT_FALSE(table.try_lock("k"));
  outer = LockTable<>::Guard();  // releases
  EXPECT_TRUE(table.try_lock("k"));
}

TEST(LockTableTest, TryLockForTimesOutWhileAnotherThreadHoldsTheStripe) {
  LockTable<Mutex> table(16, 3);
  auto held = table.lock(7);
  std::thread other([&] {
    EXPECT_FALSE(table.try_lock_for(7, 2ms).owns_lock());
    EXPECT_FALSE(table.try_lock_until(7, std::chrono::steady_clock::now() + 1ms).owns_lock());
  });
  other.join();
  held.unlock();
  std::thread after([&] { EXPECT_TRUE(table.try_lock_for(7, 1s).owns_lock()); });
  after.join();
}

TEST(LockTableTest, SharedLocksAdmitReadersAndExcludeWriters) {
  LockTable<std::shared_mutex> table(16, 3);
  auto reader = table.lock_shared("doc");
  ASSERT_TRUE(reader.owns_lock());
  std::thread other([&] {
    auto second_reader = table.try_lock_shared("doc");
    EXPECT_TRUE(second_reader.owns_lock());
    EXPECT_FALSE(table.try_lock("doc").owns_lock());
  });
  other.join();
  reader.unlock();
  std::thread writer([&] { EXPECT_TRUE(table.try_lock("doc").owns_lock()); });
  writer.join();
}

TEST(LockTableTest, LockManyLocksEachDistinctStripeOnceInAscendingOrder) {
  LockTable<> table(64, 3);
  const auto [key, same_stripe, other_stripe] = colliding_keys(table);
  {
    auto guard = table.lock_many(other_stripe, key, same_stripe);
    ASSERT_EQ(guard.size(), 2u);  // key and same_stripe share one
    const auto stripes = guard.stripes();
    EXPECT_LT(stripes[0], stripes[1]);
    EXPECT_EQ(std::set<std::size_t>(stripes.begin(), stripes.end()),
              (std::set<std::size_t>{table.stripe_of(key), table.stripe_of(other_stripe)}));
    EXPECT_FALSE(table.try_lock(key));
    EXPECT_FALSE(table.try_lock(other_stripe));
  }
  EXPECT_TRUE(table.try_lock(key));
  EXPECT_TRUE(table.try_lock(other_stripe));
}

TEST(LockTableTest, LockManyAcceptsSpansAndLongListsAndStrings) {
  LockTable<> table(64, 3);
  std::vector<int> keys(200);
  for (int i = 0; i < 200; ++i) keys[static_cast<std::size_t>(i)] = i;
  std::set<std::size_t> distinct;
  for (const int k : keys) distinct.insert(table.stripe_of(k));
  {
    auto guard = table.lock_many(std::span<const int>(keys));
    EXPECT_EQ(guard.size(), distinct.size());
    auto moved = std::move(guard);
    EXPECT_EQ(moved.size(), distinct.size());
    for (const int k : keys) EXPECT_FALSE(table.try_lock(k));
  }
  for (const int k : keys) EXPECT_TRUE(table.try_lock(k));

  const std::vector<std::string> names = {"alice", "bob", "alice"};
  auto guard = table.lock_many(names);
  EXPECT_LE(guard.size(), 2u);
  EXPECT_FALSE(table.try_lock("bob"));
  guard.unlock();
  EXPECT_TRUE(table.try_lock("bob"));
  auto empty = table.lock_many(std::span<const int>());
  EXPECT_FALSE(empty.owns_lock());
}

TEST(LockTableTest, LockManyInOppositeOrdersDoesNotDeadlock) {
  LockTable<> table(8, 3);
  std::int64_t a = 0;  // guarded by the stripes of keys 1 and 2 together
  std::vector<std::thread> threads;
  threads.reserve(8);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        auto guard = (t % 2 == 0) ? table.lock_many(1, 2) : table.lock_many(2, 1);
        ++a;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(a, 4 * 2000);
}

template <class Lock>
void check_mutual_exclusion() {
  LockTable<Lock> table(16, 9);
  constexpr int kKeys = 32;
  constexpr int kThreads = 4;
  constexpr int kIterations = 5000;
  std::array<std::int64_t, kKeys> counters{};  // counters[k] guarded by k's stripe
  std::vector<std::thread> threads;
  threads.reserve(8);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIterations; ++i) {
        const int key = (i * 7 + t) % kKeys;
        auto guard = table.lock(key);
        ++counters[static_cast<std::size_t>(key)];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::int64_t total = 0;
  for (const auto c : counters) total += c;
  EXPECT_EQ(total, std::int64_t{kThreads} * kIterations);
}

TEST(LockTableTest, MutualExclusionWithSpinLock) { check_mutual_exclusion<SpinLock>(); }
TEST(LockTableTest, MutualExclusionWithMutex) { check_mutual_exclusion<Mutex>(); }
TEST(LockTableTest, MutualExclusionWithStdMutex) { check_mutual_exclusion<std::mutex>(); }

TEST(LockTableTest, WithLockIsMutuallyExclusiveAndReturnsTheResult) {
  LockTable<> table(4, 3);
  constexpr int kThreads = 4;
  constexpr int kIterations = 20'000;
  std::int64_t hot = 0;  // guarded by the stripe of "hot"
  std::int64_t cold[kThreads] = {};
  std::vector<std::thread> threads;
  threads.reserve(8);
  std::atomic<std::int64_t> returned{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::int64_t sum = 0;
      for (int i = 0; i < kIterations; ++i) {
        sum += table.with_lock("hot", [&] { return ++hot; });
        if (i % 16 == 0) {
          // Mixed with plain guards on the same stripe.
          auto guard = table.lock("hot");
          ++hot;
          guard.unlock();
          table.with_lock(t, [&] { ++cold[t]; });
        }
      }
      returned.fetch_add(sum, std::memory_order_relaxed);
    });
  }
  for (auto& thread : threads) thread.join();
  const std::int64_t extra = std::int64_t{kThreads} * ((kIterations + 15) / 16);
  EXPECT_EQ(hot, std::int64_t{kThreads} * kIterations + extra);
  for (const auto c : cold) EXPECT_EQ(c, (kIterations + 15) / 16);
  // Every value handed back is a distinct pre-increment result, so their
  // sum is at least 1 + 2 + ... + kThreads*kIterations.
  const std::int64_t n = std::int64_t{kThreads} * kIterations;
  EXPECT_GE(returned.load(), n * (n + 1) / 2);
}

TEST(LockTableTest, WithLockRethrowsInTheCallerAndStaysUsable) {
  LockTable<> table(4, 3);
  std::atomic<int> thrown{0};
  std::vector<std::thread> threads;
  threads.reserve(8);
  std::int64_t counter = 0;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        try {
          table.with_lock("k", [&] {
            ++counter;
            if (i % 10 == 0) throw std::runtime_error("boom");
          });
        } catch (const std::runtime_error&) {
          thrown.fetch_add(1, std::memory_order_relaxed);
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(thrown.load(), 4 * 200);
  EXPECT_EQ(counter, 4 * 2000);
  EXPECT_TRUE(table.try_lock("k"));
}

// A SpinLock that shows when a thread is blocked in lock(), so a test can
// wait for a waiter to block instead of sleeping and hoping it has. Behind
// Instrumented<> that proves contention: its lock() tries once first.
class SHARDLOCK_CAPABILITY("mutex") WaiterCountingSpinLock {
 public:
  void lock() noexcept SHARDLOCK_ACQUIRE() {
    // Relaxed: a test-side signal only; the lock itself orders the data.
    waiters.fetch_add(1, std::memory_order_relaxed);
    lock_.lock();
    waiters.fetch_sub(1, std::memory_order_relaxed);
  }
  [[nodiscard]] bool try_lock() noexcept SHARDLOCK_TRY_ACQUIRE(true) { return lock_.try_lock(); }
  void unlock() noexcept SHARDLOCK_RELEASE() { lock_.unlock(); }

  // Threads inside lock(), over every instance.
  static inline std::atomic<int> waiters{0};

 private:
  SpinLock lock_;
};

TEST(LockTableTest, StatisticsCountPerStripeAndFindTheHottest) {
  LockTable<Instrumented<WaiterCountingSpinLock>> table(64, 3);
  const auto [key, same_stripe, other_stripe] = colliding_keys(table);
  for (int i = 0; i < 3; ++i) auto g = table.lock(key);
  { auto g = table.lock(same_stripe); }
  { auto g = table.lock_many(key, other_stripe); }
  EXPECT_EQ(table.stripe_stats(table.stripe_of(key)).acquisitions, 5u);
  EXPECT_EQ(table.stripe_stats(table.stripe_of(other_stripe)).acquisitions, 1u);
  EXPECT_EQ(table.total_stats().acquisitions, 6u);
  EXPECT_EQ(table.total_stats().contended, 0u);

  // Make other_stripe's stripe contended: hold it while a second thread
  // blocks on it, and release only once it is blocked.
  const int contended_key = other_stripe;  // lambdas cannot capture bindings
  const std::size_t hot = table.stripe_of(contended_key);
  {
    auto held = table.lock(contended_key);
    std::thread waiter([&] { auto g = table.lock(contended_key); });
    EXPECT_TRUE(test_support::poll_until([] {
      return WaiterCountingSpinLock::waiters.load() == 1;
    })) << "the waiter never blocked";
    held.unlock();
    waiter.join();
  }
  EXPECT_EQ(table.stripe_stats(hot).contended, 1u);
  const auto top = table.hottest(2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].stripe, hot);
  EXPECT_GE(top[0].stats.contended, 1u);
  EXPECT_GT(top[0].stats.max_wait_ns, 0u);
  // Ties on zero contention go to the busier stripe.
  EXPECT_EQ(top[1].stripe, table.stripe_of(key));
  EXPECT_EQ(table.hottest(1000).size(), table.stripe_count());

  table.reset_stats();
  EXPECT_EQ(table.total_stats().acquisitions, 0u);
}

}  // namespace
}  // namespace shardlock
