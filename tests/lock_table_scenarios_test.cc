// The classic "distributed lock" scenarios, run against the in-process
// LockTable: each one is a race that a missing or misplaced lock loses, and
// the assertions are the invariants the lock exists to keep. The shared state
// is deliberately plain (non-atomic) so that ThreadSanitizer reports any
// access the table failed to order.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "shardlock/lock_table.h"
#include "shardlock/mutex.h"
#include "shardlock/spin_lock.h"
#include "shardlock/workload/zipf.h"

namespace shardlock {
namespace {

using workload::SplitMix64;
using workload::ZipfGenerator;

constexpr int kThreads = 8;

template <class Fn>
void run_threads(int count, Fn fn) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(count));
  for (int t = 0; t < count; ++t) threads.emplace_back(fn, t);
  for (auto& thread : threads) thread.join();
}

template <class Lock>
class LockTableScenarioTest : public ::testing::Test {};
using LockTypes = ::testing::Types<SpinLock, Mutex>;
TYPED_TEST_SUITE(LockTableScenarioTest, LockTypes);

// Flash sale: 8 buyers, 1,000 items with 40 units each, Zipf 0.99 demand so
// the popular items sell out while buyers still hammer them. Half the
// buyers use guards, half use with_lock (combining), on the same items.
TYPED_TEST(LockTableScenarioTest, FlashSaleNeverOversells) {
  constexpr std::size_t kItems = 1000;
  constexpr std::int64_t kInitialStock = 40;
  constexpr int kAttemptsPerBuyer = 20'000;
  LockTable<TypeParam> table(64);  // fewer stripes than items: shared stripes too
  std::vector<std::int64_t> stock(kItems, kInitialStock);  // stock[i], sold[i]: i's stripe
  std::vector<std::int64_t> sold(kItems, 0);
  // Each buyer's own receipts, merged after the sale: an independent ledger.
  std::vector<std::vector<std::int64_t>> receipts(kThreads, std::vector<std::int64_t>(kItems, 0));
  const ZipfGenerator demand(kItems, 0.99, 2024);

  run_threads(kThreads, [&](int buyer) {
    ZipfGenerator mine = demand.fork(static_cast<std::uint64_t>(buyer) + 1);
    SplitMix64 quantity(static_cast<std::uint64_t>(buyer) + 100);
    auto& my_receipts = receipts[static_cast<std::size_t>(buyer)];
    for (int i = 0; i < kAttemptsPerBuyer; ++i) {
      const std::size_t item = mine.next();
      const auto want = static_cast<std::int64_t>(quantity.uniform(3) + 1);
      auto buy = [&] {
        if (stock[item] < want) return false;
        stock[item] -= want;
        sold[item] += want;
        return true;
      };
      bool bought;
      if (buyer % 2 == 0) {
        auto guard = table.lock(item);
        bought = buy();
      } else {
        bought = table.with_lock(item, buy);
      }
      if (bought) my_receipts[item] += want;
    }
  });

  std::int64_t sold_out = 0;
  for (std::size_t item = 0; item < kItems; ++item) {
    EXPECT_GE(stock[item], 0) << "item " << item;
    EXPECT_EQ(sold[item] + stock[item], kInitialStock) << "item " << item;
    std::int64_t receipted = 0;
    for (const auto& r : receipts) receipted += r[item];
    EXPECT_EQ(receipted, sold[item]) << "item " << item;
    sold_out += stock[item] < 3 ? 1 : 0;
  }
  // The scenario only tests something if demand outran supply somewhere.
  EXPECT_GT(sold_out, 10);
}

// Run once: 8 workers each walk all 1,000 jobs in their own random order
// and try to claim each; a claimed job runs outside the lock. Every job
// must run exactly once.
TYPED_TEST(LockTableScenarioTest, EachJobRunsExactlyOnce) {
  constexpr std::size_t kJobs = 1000;
  LockTable<TypeParam> table(128);
  std::vector<char> claimed(kJobs, 0);  // claimed[j] guarded by j's stripe
  std::vector<std::atomic<int>> runs(kJobs);

  run_threads(kThreads, [&](int worker) {
    std::vector<std::size_t> order(kJobs);
    std::iota(order.begin(), order.end(), 0);
    SplitMix64 random(static_cast<std::uint64_t>(worker) * 7919 + 1);
    for (std::size_t i = kJobs - 1; i > 0; --i) {
      std::swap(order[i], order[random.uniform(i + 1)]);
    }
    for (const std::size_t job : order) {
      const std::string key = "job/" + std::to_string(job);
      bool mine = false;
      {
        auto guard = table.lock(key);
        if (claimed[job] == 0) {
          claimed[job] = 1;
          mine = true;
        }
      }
      // Relaxed: the count is read after join(), which synchronizes.
      if (mine) runs[job].fetch_add(1, std::memory_order_relaxed);
    }
  });

  for (std::size_t job = 0; job < kJobs; ++job) {
    EXPECT_EQ(runs[job].load(std::memory_order_relaxed), 1) << "job " << job;
  }
}

// Duplicate submissions: every request id is submitted by all 8 clients
// (retries), in different orders. The dedup set is sharded to match the
// table's stripes, so each shard is guarded by exactly one stripe.
TYPED_TEST(LockTableScenarioTest, DuplicateSubmissionsAreAcceptedOnce) {
  constexpr int kRequests = 2000;
  LockTable<TypeParam> table(64);
  std::vector<std::unordered_set<std::string>> seen(table.stripe_count());
  std::vector<std::atomic<int>> accepted(kRequests);
  std::atomic<int> rejected{0};

  run_threads(kThreads, [&](int client) {
    for (int i = 0; i < kRequests; ++i) {
      const int request = (i * 7 + client * 251) % kRequests;  // 7 is coprime to 2000
      const std::string id = "req-" + std::to_string(request);
      bool fresh;
      {
        auto guard = table.lock(id);
        fresh = seen[guard.stripe()].insert(id).second;
      }
      // Relaxed: read after join().
      if (fresh) {
        accepted[static_cast<std::size_t>(request)].fetch_add(1, std::memory_order_relaxed);
      } else {
        rejected.fetch_add(1, std::memory_order_relaxed);
      }
    }
  });

  for (int r = 0; r < kRequests; ++r) {
    EXPECT_EQ(accepted[static_cast<std::size_t>(r)].load(std::memory_order_relaxed), 1)
        << "request " << r;
  }
  EXPECT_EQ(rejected.load(), (kThreads - 1) * kRequests);
}

// Transfers: 8 threads move money between 1,000 accounts, each transfer
// holding both accounts through lock_many (in whatever order the caller
// names them), some touching three accounts. An auditor repeatedly locks
// every account at once and checks the books balance mid-flight. Nothing
// may deadlock (ctest's TIMEOUT bounds the test) and money is conserved.
TYPED_TEST(LockTableScenarioTest, LockManyTransfersConserveMoneyWithoutDeadlock) {
  constexpr std::size_t kAccounts = 1000;
  constexpr std::int64_t kInitialBalance = 1000;
  constexpr int kTransfersPerThread = 20'000;
  constexpr std::int64_t kTotal = kAccounts * kInitialBalance;
  LockTable<TypeParam> table(256);
  std::vector<std::int64_t> balance(kAccounts, kInitialBalance);  // by account's stripe
  std::vector<std::uint64_t> all_accounts(kAccounts);
  std::iota(all_accounts.begin(), all_accounts.end(), 0);
  std::unordered_set<std::size_t> stripes_used;
  for (const auto account : all_accounts) stripes_used.insert(table.stripe_of(account));
  std::atomic<int> finished{0};
  std::atomic<int> audits{0};

  std::thread auditor([&] {
    // At least a few audits, and keep auditing while transfers run.
    while (audits.load() < 3 || finished.load(std::memory_order_acquire) < kThreads) {
      auto everything = table.lock_many(all_accounts);
      EXPECT_EQ(everything.size(), stripes_used.size());
      const std::int64_t sum = std::accumulate(balance.begin(), balance.end(), std::int64_t{0});
      EXPECT_EQ(sum, kTotal);
      audits.fetch_add(1);
    }
  });

  run_threads(kThreads, [&](int teller) {
    SplitMix64 random(static_cast<std::uint64_t>(teller) + 77);
    for (int i = 0; i < kTransfersPerThread; ++i) {
      const std::size_t from = random.uniform(kAccounts);
      std::size_t to = random.uniform(kAccounts - 1);
      if (to >= from) ++to;  // distinct accounts
      if (i % 8 == 0) {
        // Three-party: from pays `to` and a fee account.
        const std::size_t fee = random.uniform(kAccounts);
        auto guard = table.lock_many(to, fee, from);
        const std::int64_t amount = std::min<std::int64_t>(balance[from], 10);
        balance[from] -= 2 * (amount / 2);
        balance[to] += amount / 2;
        balance[fee] += amount / 2;
      } else {
        auto guard = table.lock_many(from, to);
        const auto amount = static_cast<std::int64_t>(random.uniform(50));
        if (balance[from] >= amount) {
          balance[from] -= amount;
          balance[to] += amount;
        }
      }
    }
    finished.fetch_add(1, std::memory_order_release);
  });
  auditor.join();

  EXPECT_EQ(std::accumulate(balance.begin(), balance.end(), std::int64_t{0}), kTotal);
  for (std::size_t a = 0; a < kAccounts; ++a) EXPECT_GE(balance[a], 0) << "account " << a;
  EXPECT_GE(audits.load(), 3);
}

}  // namespace
}  // namespace shardlock
