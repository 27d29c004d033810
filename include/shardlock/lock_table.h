// LockTable<Lock>: per-key locking without a lock per key.
//
//   shardlock::LockTable<> table;                  // SpinLock stripes
//   {
//     auto guard = table.lock("user:42");          // blocks; RAII
//     ...                                          // this key's critical section
//   }
//   auto both = table.lock_many(from_id, to_id);   // deadlock-free, any order
//   table.with_lock(sku, [&] { --stock[sku]; });   // combines on hot stripes
//
// Use it when an application needs mutual exclusion per key (an account, an
// inventory item, a request id) over an unbounded key space, inside one
// process. Keys are hashed onto a fixed array of lock stripes, so memory is
// constant and no lock is ever allocated or freed; the price is that two
// keys on one stripe exclude each other (false conflicts, 1/stripes of pairs).
//
// Design
//   * Stripes: a power of two, fixed at construction. The default is
//     64 x std::thread::hardware_concurrency() rounded up to a power of two
//     (128 on a 2-CPU machine, 4096 on 64 CPUs), which keeps the chance that
//     two running threads want the same stripe by accident near 1/64.
//   * Each stripe is aligned and padded to kFalseSharingRange (128 bytes,
//     two cache lines: x86's adjacent-line prefetcher pulls lines in pairs),
//     so no two stripes' locks ever share or ping-pong a line. A stripe holds
//     its Lock and the head of its combining stack (below), nothing else.
//   * Placement: stripe = XXH3-64(key bytes, seed) & (stripes - 1). Strings
//     hash their bytes; integers are widened to 64 bits and hashed as 8
//     little-endian bytes, so 5, 5u and 5LL share a stripe on every platform.
//     The seed is random per table unless the caller fixes one (stable
//     placement, reproducible tests), which stops a client who can choose
//     keys from aiming them all at one stripe.
//   * lock_many: hashes every key, sorts the stripe indices, drops
//     duplicates and locks in ascending index order. A global acquisition
//     order cannot deadlock, and a stripe shared by two keys is locked once.
//     Up to kInlineStripes stripes are kept inside the guard (no allocation).
//   * with_lock(key, fn): flat combining, as folly's DistributedMutex
//     lock_combine. A caller that finds the stripe locked pushes a request
//     (fn, result slot, done flag; on its own stack) onto the stripe's
//     lock-free stack and spins on its own done flag. The holder, before it
//     unlocks, pops the whole stack and runs those critical sections itself,
//     with the stripe's lock and the data already in its cache. On a hot
//     stripe this turns "every operation moves the lock line and the data
//     line to another core" into "a batch of operations moves only the
//     requests". fn can therefore run on another thread: it must not depend
//     on thread identity (thread_locals, the thread's held locks).
//   * Fairness: that of Lock; combined requests run in LIFO batches, bounded
//     by kMaxCombineRounds per holder, and a waiting combiner that sees the
//     lock free takes it and runs its own request (and the others) itself.
//   * Threads > cores: that of Lock. A combining waiter backs off and yields
//     like SpinLock's waiters (internal::Backoff).
//
// Measured numbers and the command that produced them: docs/lock-table.md.
#pragma once

// libxxhash in its header-only mode, so the hash of a short key inlines into
// lock() (the out-of-line call and its length dispatch were a fifth of an
// uncontended lock()). xxhash.h supports this alongside ordinary includes of
// itself in the same translation unit, before or after this one.
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#define SHARDLOCK_DEFINED_XXH_INLINE_ALL_
#endif
#include <xxhash.h>
#ifdef SHARDLOCK_DEFINED_XXH_INLINE_ALL_
#undef XXH_INLINE_ALL
#undef SHARDLOCK_DEFINED_XXH_INLINE_ALL_
#endif

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardlock/instrumented.h"
#include "shardlock/internal/backoff.h"
#include "shardlock/internal/cpu.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lockable.h"
#include "shardlock/spin_lock.h"

namespace shardlock {

// A key the table can hash: any integer, or anything that converts to
// std::string_view (std::string, const char*, string literals).
template <class K>
concept LockTableKey =
    (std::integral<K> && !std::same_as<K, bool>) || std::convertible_to<const K&, std::string_view>;

// One stripe's counters, as returned by LockTable::hottest().
struct StripeStats {
  std::size_t stripe = 0;
  ContentionStats stats;
};

namespace internal {

// A lock that keeps ContentionStats, such as Instrumented<L>.
template <class L>
concept HasContentionStats = requires(const L& l) {
  { l.stats() } -> std::same_as<ContentionStats>;
};

// The seeded 64-bit hash that places keys (not API; tests recompute
// placement with it).
inline std::uint64_t hash_key(std::string_view key, std::uint64_t seed) noexcept {
  return XXH3_64bits_withSeed(key.data(), key.size(), seed);
}

constexpr std::uint64_t byteswap64(std::uint64_t v) noexcept {
  std::uint64_t out = 0;
  for (int i = 0; i < 8; ++i) out |= ((v >> (8 * i)) & 0xff) << (56 - 8 * i);
  return out;
}

template <std::integral I>
inline std::uint64_t hash_key(I key, std::uint64_t seed) noexcept {
  // Widen (sign-extending signed types) so every integer type of the same
  // value hashes alike, then hash a fixed little-endian byte order.
  std::uint64_t wide;
  if constexpr (std::is_signed_v<I>) {
    wide = static_cast<std::uint64_t>(static_cast<std::int64_t>(key));
  } else {
    wide = static_cast<std::uint64_t>(key);
  }
  // One 8-byte store, which XXH3 reads back as two 4-byte halves (a store
  // per byte would stall store-to-load forwarding on the way back).
  if constexpr (std::endian::native == std::endian::big) wide = byteswap64(wide);
  unsigned char bytes[8];
  std::memcpy(bytes, &wide, sizeof bytes);
  return XXH3_64bits_withSeed(bytes, sizeof bytes, seed);
}

template <class K>
requires(!std::integral<K>) inline std::uint64_t
    hash_key(const K& key, std::uint64_t seed) noexcept {
  return hash_key(std::string_view(key), seed);
}

// 64 x hardware threads, rounded up to a power of two (defined in
// src/lock_table.cc).
std::size_t default_stripe_count() noexcept;

// A fresh seed per call, different across tables and processes.
std::uint64_t random_table_seed() noexcept;

// A waiting with_lock() caller's request, on that caller's stack. The
// combiner reads `next` before it runs the request and never touches the
// request after storing `done`.
struct CombineRequest {
  void (*run)(CombineRequest*) noexcept = nullptr;
  CombineRequest* next = nullptr;
  std::atomic<bool> done{false};
};

}  // namespace internal

template <Lockable Lock = SpinLock>
class LockTable {
  struct Stripe;

 public:
  using lock_type = Lock;

  // Stripes one guard holds without allocating.
  static constexpr std::size_t kInlineStripes = 8;
  // Batches a with_lock() holder combines before it unlocks. Bounds how long
  // one caller works for others; leftover waiters take the lock themselves.
  static constexpr int kMaxCombineRounds = 4;

  // ---------------------------------------------------------------------
  // Guards. Move-only; an empty (moved-from or failed try_lock) guard holds
  // nothing and its destructor does nothing.
  //
  // Thread-safety analysis: the classes are scoped capabilities, but their
  // release functions carry no RELEASE attribute, because Clang before 16
  // cannot follow a scoped capability returned by value (it would report
  // every `auto g = table.lock(k);` as releasing a lock it never saw taken),
  // and which stripe a key needs is decided by a hash at run time anyway.
  // The members that touch the stripe locks opt out with that reason.
  // ---------------------------------------------------------------------

  // Holds one stripe, exclusively (Guard) or shared (SharedGuard).
  template <bool kShared>
  class SHARDLOCK_SCOPED_CAPABILITY StripeGuard {
   public:
    StripeGuard() noexcept = default;
    StripeGuard(StripeGuard&& other) noexcept
        : lock_(std::exchange(other.lock_, nullptr)), stripe_(other.stripe_) {}
    StripeGuard& operator=(StripeGuard&& other) noexcept {
      if (this != &other) {
        reset();
        lock_ = std::exchange(other.lock_, nullptr);
        stripe_ = other.stripe_;
      }
      return *this;
    }
    ~StripeGuard() { reset(); }

    // Releases the stripe early. Precondition: owns_lock().
    void unlock() noexcept {
      assert(owns_lock());
      reset();
    }

    bool owns_lock() const noexcept { return lock_ != nullptr; }
    explicit operator bool() const noexcept { return owns_lock(); }
    // The stripe this guard holds (meaningful only while owns_lock()).
    std::size_t stripe() const noexcept { return stripe_; }

   private:
    friend class LockTable;
    StripeGuard(Lock& lock, std::size_t stripe) noexcept : lock_(&lock), stripe_(stripe) {}
    void reset() noexcept SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS /* see above */ {
      if (lock_ == nullptr) return;
      if constexpr (kShared) {
        lock_->unlock_shared();
      } else {
        lock_->unlock();
      }
      lock_ = nullptr;
    }

    Lock* lock_ = nullptr;
    std::size_t stripe_ = 0;
  };
  using Guard = StripeGuard<false>;
  using SharedGuard = StripeGuard<true>;

  // Holds a set of distinct stripes, released in reverse acquisition order.
  class SHARDLOCK_SCOPED_CAPABILITY MultiGuard {
   public:
    MultiGuard() noexcept = default;
    MultiGuard(MultiGuard&& other) noexcept { take(other); }
    MultiGuard& operator=(MultiGuard&& other) noexcept {
      if (this != &other) {
        reset();
        take(other);
      }
      return *this;
    }
    ~MultiGuard() { reset(); }

    // Releases every stripe early. Precondition: owns_lock().
    void unlock() noexcept {
      assert(owns_lock());
      reset();
    }

    bool owns_lock() const noexcept { return held_ != 0; }
    explicit operator bool() const noexcept { return owns_lock(); }
    // How many distinct stripes are held (<= the number of keys).
    std::size_t size() const noexcept { return held_; }
    // The held stripe indices, ascending.
    std::span<const std::uint32_t> stripes() const noexcept { return {data(), held_}; }

   private:
    friend class LockTable;

    std::uint32_t* data() noexcept { return heap_ ? heap_.get() : inline_; }
    const std::uint32_t* data() const noexcept { return heap_ ? heap_.get() : inline_; }

    // Storage for n indices; allocates only when n > kInlineStripes.
    std::uint32_t* reserve(std::size_t n) {
      if (n > kInlineStripes) heap_ = std::make_unique<std::uint32_t[]>(n);
      return data();
    }

    void take(MultiGuard& other) noexcept {
      table_ = std::exchange(other.table_, nullptr);
      held_ = std::exchange(other.held_, 0);
      heap_ = std::move(other.heap_);
      std::copy(other.inline_, other.inline_ + kInlineStripes, inline_);
    }

    void reset() noexcept SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS /* see above */ {
      const std::uint32_t* indices = data();
      while (held_ != 0) {
        --held_;
        table_->stripes_[indices[held_]].lock.unlock();
      }
      heap_.reset();
    }

    LockTable* table_ = nullptr;
    std::size_t held_ = 0;  // stripes locked, a prefix of data()
    std::unique_ptr<std::uint32_t[]> heap_;
    std::uint32_t inline_[kInlineStripes] = {};
  };

  // ---------------------------------------------------------------------
  // Construction
  // ---------------------------------------------------------------------

  // `stripes` is rounded up to a power of two; 0 means the default (see the
  // class comment). `seed` fixes placement; without it each table draws a
  // random one. Allocates the stripes, the only allocation the table makes.
  // Precondition: stripes <= 2^31.
  explicit LockTable(std::size_t stripes = 0, std::optional<std::uint64_t> seed = std::nullopt)
      : stripe_count_(std::bit_ceil(stripes != 0 ? stripes : internal::default_stripe_count())),
        mask_(stripe_count_ - 1),
        seed_(seed ? *seed : internal::random_table_seed()),
        stripes_(std::make_unique<Stripe[]>(stripe_count_)) {}

  LockTable(const LockTable&) = delete;
  LockTable& operator=(const LockTable&) = delete;

  // Precondition: no guard, lock or with_lock call is outstanding.
  ~LockTable() = default;

  std::size_t stripe_count() const noexcept { return stripe_count_; }
  std::uint64_t seed() const noexcept { return seed_; }

  // The stripe `key` maps to. Two keys exclude each other exactly when
  // their stripes are equal. Pure: never blocks.
  template <LockTableKey K>
  std::size_t stripe_of(const K& key) const noexcept {
    return static_cast<std::size_t>(internal::hash_key(key, seed_) & mask_);
  }

  // Starts pulling `key`'s stripe into this core's cache, in exclusive
  // state, without waiting or locking: a hint for a caller that knows which
  // key it will lock a little later (the next request in a batch). Costs one
  // hash. Never blocks; safe at any time.
  template <LockTableKey K>
  void prefetch(const K& key) const noexcept {
    internal::prefetch_for_write(&stripes_[stripe_of(key)]);
  }

  // ---------------------------------------------------------------------
  // Single-key locking
  // ---------------------------------------------------------------------

  // Blocks until the caller holds `key`'s stripe. Precondition: the caller
  // does not already hold that stripe (by this key or another one on it).
  template <LockTableKey K>
  [[nodiscard]] Guard lock(const K& key) noexcept(noexcept(std::declval<Lock&>().lock()))
      SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS /* see Guards */ {
    const std::size_t stripe = stripe_of(key);
    Lock& l = stripes_[stripe].lock;
    // No prefetch here: SpinLock::lock() issues its own PREFETCHW before
    // its first load, and a lock whose first access is a CAS (Mutex) asks
    // for the line exclusive anyway.
    l.lock();
    return Guard(l, stripe);
  }

  // Takes `key`'s stripe if it is free. Never blocks. The guard is empty on
  // failure; failure may be spurious, as for Lock::try_lock.
  template <LockTableKey K>
  [[nodiscard]] Guard try_lock(const K& key) noexcept SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS {
    const std::size_t stripe = stripe_of(key);
    Lock& l = stripes_[stripe].lock;
    if (!l.try_lock()) return Guard();
    return Guard(l, stripe);
  }

  // Blocks for at most `timeout`. The guard is empty if it timed out.
  template <LockTableKey K, class Rep, class Period>
  requires TimedLockable<Lock>
  [[nodiscard]] Guard try_lock_for(const K& key,
                                   const std::chrono::duration<Rep, Period>& timeout) noexcept {
    return try_lock_until(key, std::chrono::steady_clock::now() + timeout);
  }

  // Blocks until `deadline` at most. The guard is empty if it timed out.
  template <LockTableKey K, class Clock, class Duration>
  requires TimedLockable<Lock>
  [[nodiscard]] Guard try_lock_until(const K& key,
                                     const std::chrono::time_point<Clock, Duration>&
                                         deadline) noexcept SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS {
    const std::size_t stripe = stripe_of(key);
    Lock& l = stripes_[stripe].lock;
    if (!l.try_lock_until(deadline)) return Guard();
    return Guard(l, stripe);
  }

  // Shared (reader) mode on `key`'s stripe; other shared holders may run
  // concurrently, exclusive ones may not. Blocks.
  template <LockTableKey K>
  requires SharedLockable<Lock>
  [[nodiscard]] SharedGuard lock_shared(const K& key) SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS {
    const std::size_t stripe = stripe_of(key);
    Lock& l = stripes_[stripe].lock;
    l.lock_shared();
    return SharedGuard(l, stripe);
  }

  // Shared mode if available without waiting. Never blocks.
  template <LockTableKey K>
  requires SharedLockable<Lock>
  [[nodiscard]] SharedGuard try_lock_shared(const K& key) SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS {
    const std::size_t stripe = stripe_of(key);
    Lock& l = stripes_[stripe].lock;
    if (!l.try_lock_shared()) return SharedGuard();
    return SharedGuard(l, stripe);
  }

  // ---------------------------------------------------------------------
  // Several keys at once
  // ---------------------------------------------------------------------

  // Locks the distinct stripes of all `keys` in ascending stripe order and
  // returns one guard for all of them. Blocks. Cannot deadlock against other
  // lock_many() calls or single-key lock() calls, provided the caller holds
  // no other stripe of this table. Allocates only for more than
  // kInlineStripes keys.
  template <LockTableKey... Ks>
  requires(sizeof...(Ks) > 0) [[nodiscard]] MultiGuard lock_many(const Ks&... keys) {
    MultiGuard guard;
    std::uint32_t* indices = guard.reserve(sizeof...(Ks));
    std::size_t n = 0;
    ((indices[n++] = static_cast<std::uint32_t>(stripe_of(keys))), ...);
    lock_sorted(guard, indices, n);
    return guard;
  }

  // As above, for a run-time list: std::span<const Key>, std::vector<Key>,
  // std::array<Key, N> or any other sized range of keys.
  template <std::ranges::sized_range R>
  requires LockTableKey<std::ranges::range_value_t<R>> &&
      (!std::convertible_to<const R&, std::string_view>) [[nodiscard]] MultiGuard
      lock_many(const R& keys) {
    MultiGuard guard;
    const std::size_t count = std::ranges::size(keys);
    if (count == 0) return guard;
    std::uint32_t* indices = guard.reserve(count);
    std::size_t n = 0;
    for (const auto& key : keys) indices[n++] = static_cast<std::uint32_t>(stripe_of(key));
    lock_sorted(guard, indices, n);
    return guard;
  }

  // ---------------------------------------------------------------------
  // Combining
  // ---------------------------------------------------------------------

  // Runs fn() while holding `key`'s stripe and returns its result. Blocks.
  // If the stripe is busy, fn may be run by the thread that holds it (flat
  // combining, see the class comment), so fn must not care which thread runs
  // it; everything it wrote is visible to the caller when with_lock returns,
  // and an exception it throws is rethrown in the caller. Mutually exclusive
  // with lock(), lock_many() and other with_lock() calls on the same stripe.
  // Precondition: the caller holds no stripe of this table.
  template <LockTableKey K, class F>
  requires std::invocable<F&> std::invoke_result_t<F&> with_lock(const K& key, F&& fn)
  SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS /* the lock taken here is released by run_as_combiner */ {
    using Result = std::invoke_result_t<F&>;
    static_assert(!std::is_reference_v<Result>, "with_lock: return a value, not a reference");
    Stripe& stripe = stripes_[stripe_of(key)];
    internal::prefetch_for_write(&stripe);
    if (stripe.lock.try_lock()) return run_as_combiner<Result>(stripe, fn);
    return run_as_waiter<Result>(stripe, fn);
  }

  // ---------------------------------------------------------------------
  // Statistics (Lock must keep them, e.g. Instrumented<SpinLock>)
  // ---------------------------------------------------------------------

  // One stripe's counters. Safe from any thread; never blocks.
  // Precondition: stripe < stripe_count().
  ContentionStats stripe_stats(
      std::size_t stripe) const noexcept requires internal::HasContentionStats<Lock> {
    return stripes_[stripe].lock.stats();
  }

  // All stripes summed.
  ContentionStats total_stats() const noexcept requires internal::HasContentionStats<Lock> {
    ContentionStats total;
    for (std::size_t i = 0; i < stripe_count_; ++i) total += stripes_[i].lock.stats();
    return total;
  }

  // The `n` stripes with the most contended acquisitions, most contended
  // first (ties: more acquisitions first, then lower index). Allocates.
  std::vector<StripeStats> hottest(
      std::size_t n) const requires internal::HasContentionStats<Lock> {
    std::vector<StripeStats> all(stripe_count_);
    for (std::size_t i = 0; i < stripe_count_; ++i) all[i] = {i, stripes_[i].lock.stats()};
    n = std::min(n, all.size());
    std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), all.end(),
                      [](const StripeStats& a, const StripeStats& b) {
                        if (a.stats.contended != b.stats.contended) {
                          return a.stats.contended > b.stats.contended;
                        }
                        if (a.stats.acquisitions != b.stats.acquisitions) {
                          return a.stats.acquisitions > b.stats.acquisitions;
                        }
                        return a.stripe < b.stripe;
                      });
    all.resize(n);
    return all;
  }

  // Zeroes every stripe's counters (racy against concurrent acquisitions).
  void reset_stats() noexcept requires requires(Lock& l) { l.reset_stats(); }
  {
    for (std::size_t i = 0; i < stripe_count_; ++i) stripes_[i].lock.reset_stats();
  }

 private:
  // One stripe: its lock and the head of its combining stack, padded so no
  // other stripe shares (or prefetches as a pair) its cache lines.
  struct alignas(internal::kFalseSharingRange) Stripe {
    Lock lock;
    // Requests pushed by with_lock() callers who found `lock` taken. Pushed
    // with CAS (release), popped wholesale with exchange (acquire) by the
    // lock holder only.
    std::atomic<internal::CombineRequest*> pending{nullptr};
  };
  static_assert(alignof(Stripe) == internal::kFalseSharingRange);
  static_assert(sizeof(Stripe) % internal::kFalseSharingRange == 0);

  // Sorts, deduplicates and locks indices[0, n) into `guard`.
  void lock_sorted(MultiGuard& guard, std::uint32_t* indices,
                   std::size_t n) SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS /* see Guards */ {
    if (n <= kInlineStripes) {
      // Insertion sort: a handful of elements, no call, no branches mispredicted much.
      for (std::size_t i = 1; i < n; ++i) {
        const std::uint32_t v = indices[i];
        std::size_t j = i;
        for (; j > 0 && indices[j - 1] > v; --j) indices[j] = indices[j - 1];
        indices[j] = v;
      }
    } else {
      std::sort(indices, indices + n);
    }
    n = static_cast<std::size_t>(std::unique(indices, indices + n) - indices);
    guard.table_ = this;
    // held_ grows as we go, so a Lock::lock() that throws (std::mutex can)
    // leaves a guard that releases exactly what was taken.
    for (std::size_t i = 0; i < n; ++i) {
      stripes_[indices[i]].lock.lock();
      guard.held_ = i + 1;
    }
  }

  // A request carrying fn and its result. Lives on the waiter's stack.
  template <class Result, class F>
  struct Request : internal::CombineRequest {
    explicit Request(F& f) noexcept : fn(f) { run = &Request::execute; }
    static void execute(internal::CombineRequest* base) noexcept {
      auto* self = static_cast<Request*>(base);
      try {
        if constexpr (std::is_void_v<Result>) {
          std::invoke(self->fn);
        } else {
          self->result.emplace(std::invoke(self->fn));
        }
      } catch (...) {
        self->error = std::current_exception();
      }
    }
    Result take() {
      if (error) std::rethrow_exception(error);
      if constexpr (!std::is_void_v<Result>) return std::move(*result);
    }
    F& fn;
    std::conditional_t<std::is_void_v<Result>, char, std::optional<Result>> result{};
    std::exception_ptr error;
  };

  // Runs every queued request, at most kMaxCombineRounds batches.
  // Precondition: the caller holds stripe.lock.
  static void drain(Stripe& stripe) noexcept {
    for (int round = 0; round < kMaxCombineRounds; ++round) {
      // Relaxed peek first: the line is already ours (we hold the lock in
      // it), and an empty stack is the common case.
      if (stripe.pending.load(std::memory_order_relaxed) == nullptr) return;
      // Acquire pairs with the release CAS in push(): the request's fields
      // (run, the captured fn) are visible before we call it.
      internal::CombineRequest* request =
          stripe.pending.exchange(nullptr, std::memory_order_acquire);
      while (request != nullptr) {
        internal::CombineRequest* next = request->next;
        request->run(request);
        // Release pairs with the waiter's acquire load of `done`: the
        // critical section's writes and the result happen-before its return.
        // The request may vanish right after this store.
        request->done.store(true, std::memory_order_release);
        request = next;
      }
    }
  }

  // Holds stripe.lock on entry; runs fn, then everyone waiting, then unlocks.
  template <class Result, class F>
  static Result run_as_combiner(Stripe& stripe, F& fn) SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS {
    struct Finish {
      Stripe& stripe;
      ~Finish() SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS {
        drain(stripe);
        stripe.lock.unlock();
      }
    } finish{stripe};
    return std::invoke(fn);
  }

  template <class Result, class F>
  static Result run_as_waiter(Stripe& stripe, F& fn) SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS {
    Request<Result, F> request(fn);
    internal::CombineRequest* head = stripe.pending.load(std::memory_order_relaxed);
    do {
      request.next = head;
      // Release pairs with drain()'s acquire exchange (publishes the
      // request's fields). Relaxed on failure: we only learn the new head.
    } while (!stripe.pending.compare_exchange_weak(head, &request, std::memory_order_release,
                                                   std::memory_order_relaxed));
    internal::Backoff backoff;
    // Acquire pairs with drain()'s release store of `done`.
    while (!request.done.load(std::memory_order_acquire)) {
      // The holder may have unlocked without seeing our request (it checked
      // the stack just before we pushed, or it used lock() rather than
      // with_lock()). Whoever next holds the lock drains, so take it.
      if (stripe.lock.try_lock()) {
        drain(stripe);
        stripe.lock.unlock();
        // Our request was on the stack and only lock holders pop it, so it
        // has run by now (by us or by an earlier holder).
        break;
      }
      backoff.wait();
    }
    return request.take();
  }

  const std::size_t stripe_count_;
  const std::uint64_t mask_;
  const std::uint64_t seed_;
  std::unique_ptr<Stripe[]> stripes_;
};

}  // namespace shardlock
