// ClientUsage: what each client holds, has queued and has parked in one
// shard, and the per-client bounds on them (ShardLimits::max_*_per_client).
//
// A client is owner_client() of an owner: the lease handles of one client
// share its quota. An entry exists only while one of its counts is nonzero,
// so the table's size is the number of clients the shard tracks (STATS).
//
// Under a tenant file every count also goes to the server's TenantUsage
// (tenant_usage.h), shared by its shards, and the tenant's bounds are
// checked beside the client's.
//
// Not API: Shard's building block. Not thread-safe (the shard lock guards
// it); the TenantUsage it shares is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>

#include "shardlock/lease/server/internal/shard_counters.h"
#include "shardlock/lease/server/internal/tenant_usage.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease::internal {

class ClientUsage {
 public:
  struct Limits {
    std::size_t max_leases = SIZE_MAX;   // leases one client holds here
    std::size_t max_waiters = SIZE_MAX;  // ACQUIREs one client has queued here
    std::size_t max_watches = SIZE_MAX;  // WATCHes one client has parked here
  };
  // What one client uses.
  struct Counts {
    std::size_t leases = 0;
    std::size_t waiters = 0;
    std::size_t watches = 0;
  };

  // `seed` keys the table's hash (client ids come from the network).
  // `tenants`: the server's per-tenant usage under a tenant file, else
  // nullptr; it must outlive this.
  ClientUsage(const Limits& limits, std::uint64_t seed, TenantUsage* tenants = nullptr)
      : limits_(limits), tenants_(tenants), clients_(16, SeededHash{seed}) {}

  // One more lease, queued ACQUIRE or parked WATCH for `owner`'s client
  // (and its tenant). May throw std::bad_alloc (a client's first entry),
  // with nothing changed.
  void add_lease(const ClientId& owner) { grow(owner, &Counts::leases, TenantUsage::kLeases); }
  void add_waiter(const ClientId& owner) { grow(owner, &Counts::waiters, TenantUsage::kWaiters); }
  void add_watch(const ClientId& owner) { grow(owner, &Counts::watches, TenantUsage::kWatches); }
  // One fewer; never throws. Precondition: a matching add_*() was made.
  void drop_lease(const ClientId& owner) noexcept {
    shrink(owner, &Counts::leases, TenantUsage::kLeases);
  }
  void drop_waiter(const ClientId& owner) noexcept {
    shrink(owner, &Counts::waiters, TenantUsage::kWaiters);
  }
  void drop_watch(const ClientId& owner) noexcept {
    shrink(owner, &Counts::watches, TenantUsage::kWatches);
  }

  // Which bound, if any, keeps `owner` from one more lease / queued
  // ACQUIRE / parked WATCH: kLimitExceeded for its client's (here),
  // kTenantLeaseLimit, kTenantWaiterLimit or kTenantWatchLimit for its
  // tenant's (over the server); nullopt when it may take one more.
  [[nodiscard]] std::optional<WireError> lease_refusal(const ClientId& owner) const noexcept {
    return refusal(owner, of(owner).leases < limits_.max_leases, TenantUsage::kLeases,
                   WireError::kTenantLeaseLimit);
  }
  [[nodiscard]] std::optional<WireError> waiter_refusal(const ClientId& owner) const noexcept {
    return refusal(owner, of(owner).waiters < limits_.max_waiters, TenantUsage::kWaiters,
                   WireError::kTenantWaiterLimit);
  }
  [[nodiscard]] std::optional<WireError> watch_refusal(const ClientId& owner) const noexcept {
    return refusal(owner, of(owner).watches < limits_.max_watches, TenantUsage::kWatches,
                   WireError::kTenantWatchLimit);
  }
  // Whether `owner` may take one more (no refusal above).
  [[nodiscard]] bool may_hold(const ClientId& owner) const noexcept {
    return !lease_refusal(owner);
  }
  [[nodiscard]] bool may_queue(const ClientId& owner) const noexcept {
    return !waiter_refusal(owner);
  }
  [[nodiscard]] bool may_watch(const ClientId& owner) const noexcept {
    return !watch_refusal(owner);
  }

  // What `owner`'s client uses now (all zero when untracked).
  [[nodiscard]] Counts of(const ClientId& owner) const noexcept {
    const auto it = clients_.find(owner_client(owner));
    return it == clients_.end() ? Counts{} : it->second;
  }
  // Clients with anything held, queued or parked.
  [[nodiscard]] std::size_t clients() const noexcept { return clients_.size(); }

 private:
  void grow(const ClientId& owner, std::size_t Counts::*field, TenantUsage::Field tenant_field);
  void shrink(const ClientId& owner, std::size_t Counts::*field,
              TenantUsage::Field tenant_field) noexcept;
  [[nodiscard]] std::optional<WireError> refusal(const ClientId& owner, bool client_may,
                                                 TenantUsage::Field tenant_field,
                                                 WireError tenant_error) const noexcept {
    if (!client_may) return WireError::kLimitExceeded;
    if (tenants_ != nullptr && !tenants_->may_add(owner, tenant_field)) return tenant_error;
    return std::nullopt;
  }

  Limits limits_;
  TenantUsage* tenants_;
  std::unordered_map<ClientId, Counts, SeededHash> clients_;
};

}  // namespace shardlock::lease::internal
