// RwSpinLock through the shared conformance suite (its exclusive side), plus
// the shared side: readers share, a writer excludes both, and a waiting
// writer holds back new readers (writer preference).
#include "shardlock/rw_spin_lock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "lock_conformance.h"
#include "poll_until.h"

namespace shardlock {
namespace {

using test_support::poll_until;
using test_support::try_lock_from_another_thread;

INSTANTIATE_TYPED_TEST_SUITE_P(RwSpinLock, ExclusiveLockTest, ::testing::Types<RwSpinLock>);

// Whether a thread other than the caller gets `lock` shared (and leaves it
// as it found it): std::shared_lock's try_lock/unlock are the shared side.
bool try_lock_shared_from_another_thread(RwSpinLock& lock) {
  std::shared_lock<RwSpinLock> reader(lock, std::defer_lock);
  return try_lock_from_another_thread(reader);
}

TEST(RwSpinLockTest, ReadersShare) {
  RwSpinLock lock;
  constexpr int kReaders = 4;
  std::atomic<int> inside{0};
  std::atomic<int> max_inside{0};
  std::barrier all_in(kReaders);
  std::vector<std::thread> readers;
  for (int i = 0; i < kReaders; ++i) {
    readers.emplace_back([&] {
      std::shared_lock guard(lock);
      const int now = inside.fetch_add(1) + 1;
      int seen = max_inside.load();
      while (now > seen && !max_inside.compare_exchange_weak(seen, now)) {
      }
      // Every reader waits here until all are inside: only possible if they
      // share the lock.
      all_in.arrive_and_wait();
      inside.fetch_sub(1);
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(max_inside.load(), kReaders);
}

TEST(RwSpinLockTest, WriterExcludesReadersAndWriters) {
  RwSpinLock lock;
  lock.lock();
  EXPECT_FALSE(try_lock_shared_from_another_thread(lock));
  EXPECT_FALSE(try_lock_from_another_thread(lock));
  lock.unlock();

  lock.lock_shared();
  EXPECT_EQ(lock.readers(), 1u);
  EXPECT_FALSE(try_lock_from_another_thread(lock));
  lock.unlock_shared();
  EXPECT_EQ(lock.readers(), 0u);
}

TEST(RwSpinLockTest, WaitingWriterStopsNewReaders) {
  RwSpinLock lock;
  lock.lock_shared();  // an existing reader
  std::atomic<bool> writer_done{false};
  std::thread writer([&] {
    lock.lock();
    writer_done = true;
    lock.unlock();
  });
  EXPECT_TRUE(poll_until([&] { return lock.waiting_writers() != 0; }));
  // A writer is waiting: a new reader must not get in ahead of it.
  EXPECT_FALSE(try_lock_shared_from_another_thread(lock));
  EXPECT_FALSE(writer_done.load());
  lock.unlock_shared();  // the existing reader leaves; the writer goes
  writer.join();
  EXPECT_TRUE(writer_done.load());
}

TEST(RwSpinLockTest, MixedReadersAndWritersKeepInvariant) {
  RwSpinLock lock;
  std::uint64_t a = 0, b = 0;  // invariant under the lock: a == b
  std::atomic<bool> torn{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 3'000; ++i) {
        if (t % 3 == 0) {
          std::scoped_lock guard(lock);
          ++a;
          ++b;
        } else {
          std::shared_lock guard(lock);
          if (a != b) torn = true;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(torn.load());
  EXPECT_EQ(a, 2u * 3'000u);
}

}  // namespace
}  // namespace shardlock
