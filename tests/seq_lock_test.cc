// SeqLock through the shared conformance suite (as a writer lock), plus the
// reader protocol: SeqLocked<T> never hands out a torn value, update() is an
// atomic read-modify-write, and read_retry() sees an overlapping write.
#include "shardlock/seq_lock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "lock_conformance.h"
#include "poll_until.h"

namespace shardlock {
namespace {

INSTANTIATE_TYPED_TEST_SUITE_P(SeqLock, ExclusiveLockTest, ::testing::Types<SeqLock>);

struct Pair {
  std::uint64_t x;
  std::uint64_t not_x;
};

TEST(SeqLockTest, ReadersNeverSeeATornValue) {
  constexpr int kReaders = 3;
  SeqLocked<Pair> value(Pair{0, ~0ull});
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> torn{0}, reads{0};
  std::atomic<int> readers_running{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      // Start writing only once every reader is reading, so the reads
      // overlap the writes even when the scheduler is slow to start them.
      EXPECT_TRUE(test_support::poll_until([&] { return readers_running.load() == kReaders; }));
      for (std::uint64_t i = 1; i <= 20'000; ++i) {
        const std::uint64_t x = i * 2 + static_cast<std::uint64_t>(w);
        value.store(Pair{x, ~x});
      }
    });
  }
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&] {
      readers_running.fetch_add(1);
      while (!stop.load(std::memory_order_relaxed)) {
        const Pair p = value.load();
        if (p.not_x != ~p.x) torn.fetch_add(1);
        reads.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  threads[0].join();
  threads[1].join();
  stop = true;
  for (std::size_t i = 2; i < threads.size(); ++i) threads[i].join();
  EXPECT_EQ(torn.load(), 0u);
  EXPECT_GT(reads.load(), 0u);
  const Pair last = value.load();
  EXPECT_EQ(last.not_x, ~last.x);
  EXPECT_EQ(value.version(), 2u * 2u * 20'000u);  // two bumps per store
}

TEST(SeqLockTest, UpdateIsAtomicReadModifyWrite) {
  SeqLocked<std::uint64_t> counter;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5'000; ++i) counter.update([](std::uint64_t& v) { ++v; });
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(counter.load(), 20'000u);
}

TEST(SeqLockTest, ReadRetryDetectsAnOverlappingWrite) {
  SeqLock lock;
  const std::uint32_t version = lock.read_begin();
  EXPECT_FALSE(lock.read_retry(version));
  lock.lock();
  lock.unlock();
  EXPECT_TRUE(lock.read_retry(version));
}

TEST(SeqLockTest, VersionIsOddExactlyWhileAWriterIsInside) {
  SeqLock lock;
  EXPECT_EQ(lock.version() % 2, 0u);
  lock.lock();
  EXPECT_EQ(lock.version() % 2, 1u);
  lock.unlock();
  EXPECT_EQ(lock.version(), 2u);
}

}  // namespace
}  // namespace shardlock
