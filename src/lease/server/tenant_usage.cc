// Per-tenant usage over a server's shards. See internal/tenant_usage.h.
#include "shardlock/lease/server/internal/tenant_usage.h"

#include <cassert>

namespace shardlock::lease::internal {
namespace {

// Fibonacci hashing of the key id: key ids are small and dense in practice,
// and this spreads them without clustering the probes.
constexpr std::size_t home_of(std::uint32_t key_id) noexcept {
  static_assert((TenantUsage::kCapacity & (TenantUsage::kCapacity - 1)) == 0);
  return static_cast<std::size_t>((std::uint64_t{key_id} * 0x9E37'79B9'7F4A'7C15ULL) >> 40) &
         (TenantUsage::kCapacity - 1);
}

}  // namespace

TenantUsage::Slot* TenantUsage::find(std::uint32_t key_id, bool make) const noexcept {
  const std::uint64_t tag = std::uint64_t{key_id} + 1;
  std::array<Slot, kCapacity>& slots = *slots_;
  // Linear probing over slots that are only ever claimed, never freed: a
  // key id's slot, once claimed, is found at the same place by every later
  // probe, and a probe that meets a free slot knows the key id has none.
  for (std::size_t i = 0, at = home_of(key_id); i < kCapacity; ++i, at = (at + 1) % kCapacity) {
    Slot& slot = slots[at];
    std::uint64_t seen = slot.tag.load(std::memory_order_acquire);
    if (seen == tag) return &slot;
    if (seen != 0) continue;
    if (!make) return nullptr;
    if (slot.tag.compare_exchange_strong(seen, tag, std::memory_order_acq_rel)) return &slot;
    if (seen == tag) return &slot;  // another thread claimed it for this key id
  }
  return nullptr;
}

void TenantUsage::set_limits(const TenantTable& table) noexcept {
  // Bounds of key ids the table no longer names are lifted first; a key id
  // it names gets its own right after, so a check in between sees no bound
  // rather than a wrong one.
  for (Slot& slot : *slots_) {
    if (slot.tag.load(std::memory_order_acquire) == 0) continue;
    for (auto& bound : slot.bound) bound.store(0, std::memory_order_relaxed);
  }
  for (const Tenant& tenant : table.tenants()) {
    const TenantLimits& l = tenant.limits;
    if (l.max_leases == 0 && l.max_waiters == 0 && l.max_watches == 0) continue;
    Slot* slot = find(tenant.key_id, /*make=*/true);
    if (slot == nullptr) continue;  // full: this key id is not bounded
    slot->bound[kLeases].store(l.max_leases, std::memory_order_relaxed);
    slot->bound[kWaiters].store(l.max_waiters, std::memory_order_relaxed);
    slot->bound[kWatches].store(l.max_watches, std::memory_order_relaxed);
  }
}

void TenantUsage::add(const ClientId& owner, Field field) noexcept {
  if (Slot* slot = find(owner_tenant(owner), /*make=*/true)) {
    slot->count[field].fetch_add(1, std::memory_order_relaxed);
  }
}

void TenantUsage::drop(const ClientId& owner, Field field) noexcept {
  Slot* slot = find(owner_tenant(owner), /*make=*/false);
  // Absent only when the table was full at the add, too (slots stay).
  if (slot == nullptr) return;
  [[maybe_unused]] const std::int64_t before =
      slot->count[field].fetch_sub(1, std::memory_order_relaxed);
  assert(before > 0 && "drop without a matching add");
}

bool TenantUsage::may_add(const ClientId& owner, Field field) const noexcept {
  const Slot* slot = find(owner_tenant(owner), /*make=*/false);
  if (slot == nullptr) return true;
  const std::uint32_t bound = slot->bound[field].load(std::memory_order_relaxed);
  return bound == 0 || slot->count[field].load(std::memory_order_relaxed) < std::int64_t{bound};
}

TenantUsage::Counts TenantUsage::of(std::uint32_t key_id) const noexcept {
  const Slot* slot = find(key_id, /*make=*/false);
  if (slot == nullptr) return {};
  const auto read = [&](Field f) {
    const std::int64_t n = slot->count[f].load(std::memory_order_relaxed);
    return n > 0 ? static_cast<std::uint64_t>(n) : 0;
  };
  return Counts{.leases = read(kLeases), .waiters = read(kWaiters), .watches = read(kWatches)};
}

}  // namespace shardlock::lease::internal
