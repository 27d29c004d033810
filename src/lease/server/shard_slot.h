// ShardSlot: one shard behind its lock, as the Dispatcher and its
// ACQUIRE_MANY driver (multi_driver.h) share them; the shard a key hash goes
// to; the counters kept outside any shard. No sockets, no policy.
//
// Not API: the Dispatcher's building blocks.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "server/replicator.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lease/server/internal/replication.h"
#include "shardlock/lease/server/internal/shard.h"
#include "shardlock/mutex.h"

namespace shardlock::lease::internal {

// One shard and its lock, padded to its own cache lines so neighbouring
// shards' locks do not false-share.
struct alignas(64) ShardSlot {
  mutable Mutex mu;
  std::unique_ptr<Shard> shard SHARDLOCK_PT_GUARDED_BY(mu);
  // The shard's armed timers, as of its last request or tick (written
  // under mu). tick() skips a shard with none without taking its lock:
  // with 64 shards, locking each every millisecond showed in the
  // one-client p99. Relaxed: a timer armed after the read is fired by the
  // next tick, and every request fires due timers itself first.
  std::atomic<std::size_t> timers{0};
  // drain_journal()'s entries, kept for their capacity.
  std::vector<replication::Entry> journal SHARDLOCK_GUARDED_BY(mu);

  // A stalled ACQUIRE_MANY step counts as a timer, so tick() visits it.
  void note_timers() SHARDLOCK_REQUIRES(mu) {
    timers.store(shard->timers() + (shard->has_stalled() ? 1 : 0), std::memory_order_relaxed);
  }
  // Moves the shard's journal into `replicator` (null: no replication).
  void drain_journal(Replicator* replicator) SHARDLOCK_REQUIRES(mu) {
    if (replicator == nullptr || !shard->journal_pending()) return;
    if (shard->journal_lost()) replicator->start_over();
    journal.clear();
    shard->take_journal(journal);
    replicator->route_moved(journal);
  }
};

using ShardSlots = std::vector<std::unique_ptr<ShardSlot>>;

// The shard of a key hash: its high 32 bits scaled to [0, shards), leaving
// the low bits, which the shard's table indexes with, independent of it.
[[nodiscard]] inline std::size_t shard_index(std::uint64_t key_hash, std::size_t shards) noexcept {
  return static_cast<std::size_t>(((key_hash >> 32) * shards) >> 32);
}

// What the Dispatcher counts outside any shard (STATS adds them to the
// shards' counters).
struct DispatchCounters {
  std::atomic<std::uint64_t> malformed{0};
  std::atomic<std::uint64_t> errors{0};
  std::atomic<std::uint64_t> auth_failures{0};
  std::atomic<std::uint64_t> allocation_failures{0};
  std::atomic<std::uint64_t> amplification_drops{0};
  std::atomic<std::uint64_t> send_drops{0};
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::uint64_t> behind_maps{0};  // RECOVERING: a client's map was newer

  static void count(std::atomic<std::uint64_t>& c) noexcept {
    c.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic, read by STATS only
  }
};

}  // namespace shardlock::lease::internal
