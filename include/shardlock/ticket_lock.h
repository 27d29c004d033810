// TicketLock: a strictly FIFO lock that survives more threads than cores.
//
// Use it when arrival order matters (bounded waiting, predictable tail
// latency). For raw throughput use SpinLock or Mutex: any strict-FIFO lock
// hands every acquisition to a different thread, and with more threads than
// cores that thread is often not running.
//
// Design
//   * Size: 12 bytes (next ticket, now serving, sleeper count).
//   * lock(): take a ticket with one fetch_add; if it is being served, done.
//   * Proportional waiting: the distance d = ticket - serving decides how a
//     waiter waits.
//       d == 1 (next in line): spin on `serving_` with a pause, yielding after
//         a 20 us budget so a preempted holder can run.
//       d >= 2: a pause proportional to d, then sched_yield for up to
//         200 us (the core goes straight to another runnable thread, usually
//         the holder or next-in-line, and unlock needs no wake-up), then park
//         on a futex in a process-wide waiting array (Dice and Kogan's TWA,
//         "Ticket lock with a waiting array"), keyed by lock address and
//         ticket, so a long wait stops burning CPU.
//   * unlock(): advance `serving_` by one, then, only if a waiter is parked,
//     wake the slot of ticket serving+1, the waiter that has just become next
//     in line. It starts spinning while the new holder runs its critical
//     section, so the next hand-off finds it on a CPU.
//   * Why: a textbook ticket lock with 8 threads on 2 cores spins every
//     waiter; the next ticket holder is usually descheduled behind spinners
//     and the lock idles for whole scheduler slices (Concurrency Kit's and a
//     textbook ticket lock measure 200-800 acquisitions/s here). Parking
//     everyone but next-in-line leaves the cores to the holder and its
//     successor.
//   * Fairness: strict FIFO by ticket; no barging.
//   * No timed try_lock_for: a ticket, once taken, must be served or the
//     queue stalls, and un-taking a ticket that others have queued behind is
//     not possible without a much heavier queue. try_lock() only takes a
//     ticket when it would be served at once.
//
// Measured (2-vCPU EPYC VM, one run): 16.8 M/s at 2 threads; oversubscribed
//   0.94 M/s at 4 and 0.20 M/s at 8 threads in the contended loop, 0.67 M/s
//   at 8 in the 150 ms fairness run with spread 2.6 and a 0.24 ms worst
//   wait, where Concurrency Kit's ticket lock gets 0.21 M/s, spread 6,430,
//   80 ms waits. Strict FIFO costs a context switch per rotation of the
//   queue once threads outnumber cores, so it stays far below barging
//   locks (std::mutex 43.6 M/s at 8 threads); see docs/lock-benchmarks.md.
//   Command: build/bench/bench/locks_benchmark --benchmark_min_time=0.3
//   (bench preset; full tables in docs/lock-benchmarks.md).
#pragma once

#include <atomic>
#include <cstdint>

#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lockable.h"

namespace shardlock {

class SHARDLOCK_CAPABILITY("mutex") TicketLock {
 public:
  constexpr TicketLock() noexcept = default;
  TicketLock(const TicketLock&) = delete;
  TicketLock& operator=(const TicketLock&) = delete;

  // Blocks until the caller's ticket is served. Precondition: the caller
  // does not hold the lock.
  void lock() noexcept SHARDLOCK_ACQUIRE() {
    // Relaxed: the ticket number only orders waiters; the happens-before
    // edge comes from the acquire load of serving_ below, which pairs with
    // unlock()'s release of serving_.
    const std::uint32_t ticket = next_.fetch_add(1, std::memory_order_relaxed);
    if (serving_.load(std::memory_order_acquire) == ticket) return;
    wait_for_turn(ticket);
  }

  // Takes the lock only if no one holds or waits for it. Never blocks.
  [[nodiscard]] bool try_lock() noexcept SHARDLOCK_TRY_ACQUIRE(true) {
    // Acquire pairs with unlock()'s release of serving_.
    std::uint32_t serving = serving_.load(std::memory_order_acquire);
    std::uint32_t expected = serving;
    // Taking ticket `serving` is only possible when next_ == serving (free
    // and nobody queued). Relaxed on both paths: the acquire above already
    // synchronized with the previous holder.
    return next_.compare_exchange_strong(expected, serving + 1, std::memory_order_relaxed,
                                         std::memory_order_relaxed);
  }

  // Serves the next ticket. Precondition: the caller holds the lock.
  void unlock() noexcept SHARDLOCK_RELEASE() {
    // Only the holder writes serving_, so a load+RMW is race-free. The
    // seq_cst RMW publishes the critical section (release) and orders the
    // sleepers_ load after it (a store->load edge that a plain release store
    // would not give), pairing with the seq_cst increment in park(): either
    // we see the sleeper, or it sees the new serving_ and does not sleep.
    const std::uint32_t now_serving = serving_.fetch_add(1, std::memory_order_seq_cst) + 1;
    if (sleepers_.load(std::memory_order_seq_cst) != 0) wake_next_in_line(now_serving + 1);
  }

  // A racy snapshot for assertions and statistics only.
  bool is_locked() const noexcept {
    return next_.load(std::memory_order_relaxed) != serving_.load(std::memory_order_relaxed);
  }
  // Number of threads holding or waiting for tickets (racy snapshot).
  std::uint32_t queue_length() const noexcept {
    return next_.load(std::memory_order_relaxed) - serving_.load(std::memory_order_relaxed);
  }

 private:
  [[gnu::cold, gnu::noinline]] void wait_for_turn(std::uint32_t ticket) noexcept;
  [[gnu::cold, gnu::noinline]] void wake_next_in_line(std::uint32_t ticket) noexcept;

  // Next ticket to hand out. Wraps at 2^32; comparisons use differences.
  std::atomic<std::uint32_t> next_{0};
  // Ticket that currently holds the lock (or will, once it notices).
  std::atomic<std::uint32_t> serving_{0};
  // Waiters parked (or about to park) in the waiting array.
  std::atomic<std::uint32_t> sleepers_{0};
};

static_assert(sizeof(TicketLock) == 12);
static_assert(Lockable<TicketLock> && NoexceptLockable<TicketLock>);

}  // namespace shardlock
