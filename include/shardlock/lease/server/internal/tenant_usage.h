// TenantUsage: what each tenant holds, has queued and has parked over every
// shard of a server, and the tenant's bounds on them (the tenant file's
// max-leases, max-waiters and max-watches).
//
// A tenant is named by the key id in the top 32 bits of an owner id
// (owner_tenant()): a server with a tenant file forces it there
// (tenant_gate.h), so every lease, waiter and watch of a tenant counts
// against it, whichever client and shard it is in.
//
// One table is shared by every shard of a server, so the counts are
// atomics. Slots are made for a key id on its first use and never removed,
// so an add and its drop always find the same slot; a table that is full
// (kCapacity key ids seen) counts nothing more for new key ids and bounds
// nothing for them. A bound is checked, not reserved: shards that admit a
// tenant's requests on different I/O threads at the same instant can each
// pass it, so a tenant may go over its bound by at most one per other I/O
// thread (none with one I/O thread, the default).
//
// Not API: ClientUsage's building block. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "shardlock/lease/tenants.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease::internal {

// The tenant an owner id belongs to, under a tenant file: its key id.
[[nodiscard]] constexpr std::uint32_t owner_tenant(const ClientId& owner) noexcept {
  return static_cast<std::uint32_t>(owner.hi >> 32);
}

class TenantUsage {
 public:
  static constexpr std::size_t kCapacity = 16384;  // key ids counted (a power of two)

  enum Field : std::uint8_t { kLeases = 0, kWaiters = 1, kWatches = 2 };

  TenantUsage() : slots_(std::make_unique<std::array<Slot, kCapacity>>()) {}

  // Sets each tenant's bounds from `table` (0: none); key ids it does not
  // name keep their counts and lose their bounds. Concurrent checks see the
  // old or the new bound. May be called at any time (a reload).
  void set_limits(const TenantTable& table) noexcept;

  // One more / one fewer lease, queued ACQUIRE or parked WATCH for the
  // tenant of `owner`. Never throws, never allocates.
  void add(const ClientId& owner, Field field) noexcept;
  void drop(const ClientId& owner, Field field) noexcept;
  // Whether the tenant of `owner` is below its bound on `field`.
  [[nodiscard]] bool may_add(const ClientId& owner, Field field) const noexcept;

  // What the tenant with `key_id` uses now (zero when never counted).
  struct Counts {
    std::uint64_t leases = 0;
    std::uint64_t waiters = 0;
    std::uint64_t watches = 0;
  };
  [[nodiscard]] Counts of(std::uint32_t key_id) const noexcept;

 private:
  struct alignas(64) Slot {
    // key id + 1; 0: free. Set once, by the first add or set_limits.
    std::atomic<std::uint64_t> tag{0};
    std::array<std::atomic<std::uint32_t>, 3> bound{};  // 0: none
    std::array<std::atomic<std::int64_t>, 3> count{};
  };

  // The slot of `key_id`, made if `make`; nullptr when absent (or the table
  // is full).
  [[nodiscard]] Slot* find(std::uint32_t key_id, bool make) const noexcept;

  std::unique_ptr<std::array<Slot, kCapacity>> slots_;
};

}  // namespace shardlock::lease::internal
