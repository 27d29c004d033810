// Conformance suite for every exclusive lock, plus the per-type behaviour of
// TicketLock, RwSpinLock, SeqLock, Recursive and Instrumented.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "shardlock/instrumented.h"
#include "shardlock/mutex.h"
#include "shardlock/recursive.h"
#include "shardlock/rw_spin_lock.h"
#include "shardlock/seq_lock.h"
#include "shardlock/spin_lock.h"
#include "shardlock/ticket_lock.h"

// This suite drives locks the way no annotated program would (try_lock from
// a second thread while the first holds the lock, unlock inside lambdas), so
// the static analysis is off here; tests/thread_safety/ checks the
// annotations themselves.
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wthread-safety-analysis"
#endif

namespace shardlock {
namespace {

using namespace std::chrono_literals;

template <class L>
class ExclusiveLockTest : public ::testing::Test {};

using ExclusiveLocks =
    ::testing::Types<SpinLock, UnfairSpinLock, TicketLock, RwSpinLock, SeqLock, Mutex,
                     Recursive<SpinLock>, Recursive<Mutex>, Instrumented<SpinLock>,
                     Instrumented<TicketLock>, Instrumented<Mutex>>;
TYPED_TEST_SUITE(ExclusiveLockTest, ExclusiveLocks);

// Every thread mixes every slot of a shared array under the lock. If two
// threads were ever inside together, their read-modify-write sequences would
// interleave and the slots would disagree; the plain counter would lose
// increments.
template <class L>
void run_mutual_exclusion(int threads, int iterations) {
  constexpr int kSlots = 16;
  L lock;
  std::uint64_t slots[kSlots] = {};
  std::uint64_t counter = 0;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < iterations; ++i) {
        std::scoped_lock guard(lock);
        const std::uint64_t mix = static_cast<std::uint64_t>(t * 1'000'003 + i);
        for (auto& slot : slots) slot = slot * 31 + mix;
        ++counter;
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(counter, static_cast<std::uint64_t>(threads) * iterations);
  for (int s = 1; s < kSlots; ++s) EXPECT_EQ(slots[s], slots[0]) << "slot " << s;
}

TYPED_TEST(ExclusiveLockTest, MutualExclusion2Threads) {
  run_mutual_exclusion<TypeParam>(2, 20'000);
}
TYPED_TEST(ExclusiveLockTest, MutualExclusion4Threads) {
  run_mutual_exclusion<TypeParam>(4, 5'000);
}
TYPED_TEST(ExclusiveLockTest, MutualExclusion8Threads) {
  run_mutual_exclusion<TypeParam>(8, 2'000);
}
TYPED_TEST(ExclusiveLockTest, MutualExclusion16Threads) {
  run_mutual_exclusion<TypeParam>(16, 500);
}

// Oversubscription: 8 threads on this 2-core machine, a fixed amount of work
// each; it must finish (bounded by the ctest TIMEOUT, never by a speed bar).
TYPED_TEST(ExclusiveLockTest, OversubscribedThreadsAllFinish) {
  TypeParam lock;
  std::atomic<int> finished{0};
  std::uint64_t counter = 0;
  std::vector<std::thread> workers;
  for (int t = 0; t < 8; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < 3'000; ++i) {
        lock.lock();
        ++counter;
        lock.unlock();
      }
      finished.fetch_add(1, std::memory_order_relaxed);
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(finished.load(), 8);
  EXPECT_EQ(counter, 8u * 3'000u);
}

TYPED_TEST(ExclusiveLockTest, TryLockFailsWhileHeldAndSucceedsWhenFree) {
  TypeParam lock;
  ASSERT_TRUE(lock.try_lock());
  // Another thread must fail (the owner itself would re-enter a Recursive).
  bool other_got_it = true;
  std::thread([&] {
    other_got_it = lock.try_lock();
    if (other_got_it) lock.unlock();
  }).join();
  EXPECT_FALSE(other_got_it);
  lock.unlock();
  std::thread([&] {
    other_got_it = lock.try_lock();
    if (other_got_it) lock.unlock();
  }).join();
  EXPECT_TRUE(other_got_it);
}

TYPED_TEST(ExclusiveLockTest, TimedTryWaitsAtLeastTheTimeoutWhenHeld) {
  if constexpr (TimedLockable<TypeParam>) {
    TypeParam lock;
    lock.lock();
    bool got = true;
    std::chrono::steady_clock::duration waited{};
    std::thread([&] {
      const auto start = std::chrono::steady_clock::now();
      got = lock.try_lock_for(30ms);
      waited = std::chrono::steady_clock::now() - start;
      if (got) lock.unlock();
    }).join();
    EXPECT_FALSE(got);
    EXPECT_GE(waited, 30ms);  // lower bound only: the machine may be slow
    lock.unlock();

    std::thread([&] {
      got = lock.try_lock_until(std::chrono::steady_clock::now() + 30ms);
      if (got) lock.unlock();
    }).join();
    EXPECT_TRUE(got);
  } else {
    GTEST_SKIP() << "not TimedLockable (documented in the lock's header)";
  }
}

// A timed waiter that gives up must leave the lock fully usable.
TYPED_TEST(ExclusiveLockTest, TimedOutWaiterDoesNotBreakTheLock) {
  if constexpr (TimedLockable<TypeParam>) {
    TypeParam lock;
    lock.lock();
    std::thread([&] { EXPECT_FALSE(lock.try_lock_for(5ms)); }).join();
    lock.unlock();
    run_mutual_exclusion<TypeParam>(2, 1'000);
    EXPECT_TRUE(lock.try_lock());
    lock.unlock();
  } else {
    GTEST_SKIP() << "not TimedLockable";
  }
}

// ---- TicketLock: entry in ticket order -----------------------------------

TEST(TicketLockTest, EntersInTicketOrder) {
  constexpr int kWaiters = 6;
  TicketLock lock;
  lock.lock();  // ticket 0, held while the waiters queue up
  std::vector<int> entry_order;
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      lock.lock();
      entry_order.push_back(i);  // guarded by the ticket lock
      lock.unlock();
    });
    // Wait until waiter i holds its ticket before starting waiter i+1, so
    // ticket order is known: waiter i has ticket i+1.
    while (lock.queue_length() != static_cast<std::uint32_t>(i + 2)) std::this_thread::yield();
  }
  lock.unlock();
  for (auto& w : waiters) w.join();
  std::vector<int> expected(kWaiters);
  for (int i = 0; i < kWaiters; ++i) expected[i] = i;
  EXPECT_EQ(entry_order, expected);
}

TEST(TicketLockTest, TryLockDoesNotJumpTheQueue) {
  TicketLock lock;
  lock.lock();
  std::thread waiter([&] {
    lock.lock();
    lock.unlock();
  });
  while (lock.queue_length() != 2) std::this_thread::yield();
  EXPECT_FALSE(lock.try_lock());
  lock.unlock();
  waiter.join();
  EXPECT_TRUE(lock.try_lock());
  lock.unlock();
}

// ---- RwSpinLock ------------------------------------------------------------

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
  bool reader_got = true, writer_got = true;
  std::thread([&] {
    reader_got = lock.try_lock_shared();
    if (reader_got) lock.unlock_shared();
    writer_got = lock.try_lock();
    if (writer_got) lock.unlock();
  }).join();
  EXPECT_FALSE(reader_got);
  EXPECT_FALSE(writer_got);
  lock.unlock();

  lock.lock_shared();
  std::thread([&] { writer_got = lock.try_lock(); }).join();
  EXPECT_FALSE(writer_got);
  lock.unlock_shared();
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
  while (lock.waiting_writers() == 0) std::this_thread::yield();
  // A writer is waiting: a new reader must not get in ahead of it.
  bool new_reader_got = true;
  std::thread([&] {
    new_reader_got = lock.try_lock_shared();
    if (new_reader_got) lock.unlock_shared();
  }).join();
  EXPECT_FALSE(new_reader_got);
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

// ---- SeqLock ---------------------------------------------------------------

struct Pair {
  std::uint64_t x;
  std::uint64_t not_x;
};

TEST(SeqLockTest, ReadersNeverSeeATornValue) {
  SeqLocked<Pair> value(Pair{0, ~0ull});
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> torn{0}, reads{0};
  std::atomic<int> readers_running{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      // Start writing only once every reader is reading, so the reads
      // overlap the writes even when the scheduler is slow to start them.
      while (readers_running.load() != 3) std::this_thread::yield();
      for (std::uint64_t i = 1; i <= 20'000; ++i) {
        const std::uint64_t x = i * 2 + static_cast<std::uint64_t>(w);
        value.store(Pair{x, ~x});
      }
    });
  }
  for (int r = 0; r < 3; ++r) {
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

// ---- Recursive -------------------------------------------------------------

TEST(RecursiveTest, OwnerNestsOthersWaitForOutermostUnlock) {
  Recursive<Mutex> lock;
  lock.lock();
  lock.lock();
  ASSERT_TRUE(lock.try_lock());
  EXPECT_EQ(lock.depth(), 3u);
  auto other_tries = [&] {
    bool got = true;
    std::thread([&] {
      got = lock.try_lock();
      if (got) lock.unlock();
    }).join();
    return got;
  };
  lock.unlock();
  EXPECT_FALSE(other_tries());
  lock.unlock();
  EXPECT_FALSE(other_tries());
  lock.unlock();  // outermost
  EXPECT_EQ(lock.depth(), 0u);
  EXPECT_TRUE(other_tries());
}

#if !defined(NDEBUG) && GTEST_HAS_DEATH_TEST
TEST(RecursiveDeathTest, UnlockByNonOwnerAsserts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Recursive<SpinLock> lock;
        lock.unlock();
      },
      "does not hold the lock");
}
#endif

// ---- Instrumented ------------------------------------------------------------

TEST(InstrumentedTest, CountsAcquisitionsAndContention) {
  Instrumented<SpinLock> lock;
  lock.lock();
  lock.unlock();
  ASSERT_TRUE(lock.try_lock());
  lock.unlock();
  EXPECT_EQ(lock.stats().acquisitions, 2u);
  EXPECT_EQ(lock.stats().contended, 0u);

  lock.lock();
  std::atomic<bool> waiting{false};
  std::thread waiter([&] {
    waiting = true;
    lock.lock();  // must wait: contended
    lock.unlock();
  });
  while (!waiting) std::this_thread::yield();
  std::this_thread::sleep_for(5ms);
  lock.unlock();
  waiter.join();
  const ContentionStats s = lock.stats();
  EXPECT_EQ(s.acquisitions, 4u);
  EXPECT_EQ(s.contended, 1u);
  EXPECT_GT(s.total_wait_ns, 0u);
  EXPECT_EQ(s.max_wait_ns, s.total_wait_ns);

  lock.reset_stats();
  EXPECT_EQ(lock.stats().acquisitions, 0u);
}

TEST(InstrumentedTest, SharedAcquisitionsAreCounted) {
  Instrumented<RwSpinLock> lock;
  std::vector<std::thread> readers;
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&] {
      for (int j = 0; j < 1'000; ++j) {
        std::shared_lock guard(lock);
      }
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(lock.stats().acquisitions, 4'000u);
}

}  // namespace
}  // namespace shardlock
