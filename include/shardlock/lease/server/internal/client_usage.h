// ClientUsage: what each client holds, has queued and has parked in one
// shard, and the per-client bounds on them (ShardLimits::max_*_per_client).
//
// A client is owner_client() of an owner: the lease handles of one client
// share its quota. An entry exists only while one of its counts is nonzero,
// so the table's size is the number of clients the shard tracks (STATS).
//
// Not API: Shard's building block. Not thread-safe (the shard lock guards
// it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "shardlock/lease/server/internal/shard_counters.h"
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
  ClientUsage(const Limits& limits, std::uint64_t seed)
      : limits_(limits), clients_(16, SeededHash{seed}) {}

  // One more lease, queued ACQUIRE or parked WATCH for `owner`'s client.
  // May throw std::bad_alloc (a client's first entry), with nothing changed.
  void add_lease(const ClientId& owner) { grow(owner, &Counts::leases); }
  void add_waiter(const ClientId& owner) { grow(owner, &Counts::waiters); }
  void add_watch(const ClientId& owner) { grow(owner, &Counts::watches); }
  // One fewer; never throws. Precondition: a matching add_*() was made.
  void drop_lease(const ClientId& owner) noexcept { shrink(owner, &Counts::leases); }
  void drop_waiter(const ClientId& owner) noexcept { shrink(owner, &Counts::waiters); }
  void drop_watch(const ClientId& owner) noexcept { shrink(owner, &Counts::watches); }

  // Whether `owner`'s client is below its bound on leases / queued ACQUIREs
  // / parked WATCHes, so it may take one more.
  [[nodiscard]] bool may_hold(const ClientId& owner) const noexcept {
    return of(owner).leases < limits_.max_leases;
  }
  [[nodiscard]] bool may_queue(const ClientId& owner) const noexcept {
    return of(owner).waiters < limits_.max_waiters;
  }
  [[nodiscard]] bool may_watch(const ClientId& owner) const noexcept {
    return of(owner).watches < limits_.max_watches;
  }

  // What `owner`'s client uses now (all zero when untracked).
  [[nodiscard]] Counts of(const ClientId& owner) const noexcept {
    const auto it = clients_.find(owner_client(owner));
    return it == clients_.end() ? Counts{} : it->second;
  }
  // Clients with anything held, queued or parked.
  [[nodiscard]] std::size_t clients() const noexcept { return clients_.size(); }

 private:
  void grow(const ClientId& owner, std::size_t Counts::*field);
  void shrink(const ClientId& owner, std::size_t Counts::*field) noexcept;

  Limits limits_;
  std::unordered_map<ClientId, Counts, SeededHash> clients_;
};

}  // namespace shardlock::lease::internal
