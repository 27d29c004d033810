#include "shardlock/ticket_lock.h"

#include <sched.h>

#include <cstddef>
#include <cstdint>

#include "shardlock/internal/backoff.h"
#include "shardlock/internal/futex.h"

namespace shardlock {
namespace {

// The process-wide waiting array (TWA). Each slot is a futex word padded to
// its own cache lines, so a wake on one slot does not disturb spinners or
// sleepers on another. Collisions between (lock, ticket) pairs only cause
// spurious wake-ups, which waiters tolerate by re-checking.
struct alignas(internal::kFalseSharingRange) WaitSlot {
  std::atomic<std::uint32_t> sequence{0};
};
constexpr std::size_t kWaitSlots = 512;
WaitSlot g_wait_slots[kWaitSlots];

WaitSlot& slot_for(const void* lock, std::uint32_t ticket) noexcept {
  // Fibonacci hashing of the lock address spreads neighbouring locks; adding
  // the ticket puts consecutive waiters of one lock on consecutive slots.
  const auto address = reinterpret_cast<std::uintptr_t>(lock);
  const std::uint64_t mixed = (address >> 4) * 0x9E3779B97F4A7C15ull;
  return g_wait_slots[(static_cast<std::size_t>(mixed >> 40) + ticket) % kWaitSlots];
}

// A next-in-line waiter spins for this long before it also yields.
constexpr std::int64_t kNextInLineSpinNs = 20'000;
// A waiter further back yields for this long before it parks. Yielding
// hands the core straight to another runnable thread (often the holder or
// next-in-line) with no wake-up system call on the unlock path; parking
// stops a long wait from burning CPU.
constexpr std::int64_t kYieldBeforeParkNs = 200'000;
// Distance-proportional pause before a far waiter re-reads serving_.
constexpr std::uint32_t kPausePerPlaceNs = 100;

}  // namespace

void TicketLock::wait_for_turn(std::uint32_t ticket) noexcept {
  internal::Backoff next_in_line(kNextInLineSpinNs);
  std::int64_t far_since_ns = 0;
  for (;;) {
    // Acquire pairs with unlock()'s release of serving_ (seq_cst RMW).
    std::uint32_t serving = serving_.load(std::memory_order_acquire);
    std::uint32_t distance = ticket - serving;
    if (distance == 0) return;
    if (distance == 1) {
      // Proportional backoff at distance 1 is one short pause: the holder's
      // critical section is all that is left.
      next_in_line.wait();
      continue;
    }
    // Far from the head: a pause proportional to the distance first (cheap
    // when the queue is draining fast), then yield for a while, then park
    // until woken as next in line.
    internal::pause_for(kPausePerPlaceNs * distance);
    serving = serving_.load(std::memory_order_acquire);
    if (ticket - serving < 2) continue;
    const std::int64_t now = internal::monotonic_nanos();
    if (far_since_ns == 0) far_since_ns = now;
    if (now - far_since_ns < kYieldBeforeParkNs) {
      sched_yield();
      continue;
    }

    WaitSlot& slot = slot_for(this, ticket);
    // seq_cst: pairs with unlock()'s seq_cst serving_ RMW + sleepers_ load
    // (Dekker): either unlock() sees this sleeper and wakes our slot, or the
    // serving_ load below sees the advance and we do not sleep.
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t sequence = slot.sequence.load(std::memory_order_seq_cst);
    serving = serving_.load(std::memory_order_seq_cst);
    if (ticket - serving >= 2) {
      // Returns at once if the slot moved since we read it (a wake raced us).
      internal::futex_wait(&slot.sequence, sequence);
    }
    // Relaxed: only the count matters to unlock(); no data is published.
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }
}

void TicketLock::wake_next_in_line(std::uint32_t ticket) noexcept {
  WaitSlot& slot = slot_for(this, ticket);
  // seq_cst bump pairs with the sequence load in wait_for_turn(): a waiter
  // that read the old sequence is either already asleep (and woken below) or
  // its futex_wait sees the change and returns.
  slot.sequence.fetch_add(1, std::memory_order_seq_cst);
  // Wake every sleeper on the slot: colliding waiters of other tickets or
  // locks re-check and park again; waking only one could pick the wrong one.
  internal::futex_wake(&slot.sequence, INT32_MAX);
}

}  // namespace shardlock
