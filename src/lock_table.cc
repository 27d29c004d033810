#include "shardlock/lock_table.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <thread>

#include "shardlock/internal/cpu.h"

namespace shardlock::internal {

std::size_t default_stripe_count() noexcept {
  const std::size_t threads = std::max(1u, std::thread::hardware_concurrency());
  return std::bit_ceil(64 * threads);
}

std::uint64_t random_table_seed() noexcept {
  // Not cryptographic: it only has to differ between tables and runs so
  // that placement cannot be predicted from outside the process. A counter
  // separates tables made in the same nanosecond; the clock and an address
  // (ASLR) separate processes. XXH3 mixes them into one word.
  static std::atomic<std::uint64_t> tables_made{0};
  struct {
    std::uint64_t count;
    std::int64_t now;
    const void* where;
  } entropy{};
  // Relaxed: only uniqueness of the value matters, not ordering.
  entropy.count = tables_made.fetch_add(1, std::memory_order_relaxed);
  entropy.now = monotonic_nanos();
  entropy.where = &entropy;
  return XXH3_64bits(&entropy, sizeof entropy);
}

}  // namespace shardlock::internal
