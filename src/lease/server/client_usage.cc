// Per-client usage of one shard. See internal/client_usage.h.
#include "shardlock/lease/server/internal/client_usage.h"

#include <cassert>

namespace shardlock::lease::internal {

void ClientUsage::grow(const ClientId& owner, std::size_t Counts::*field,
                       TenantUsage::Field tenant_field) {
  // try_emplace may throw before anything changed; the counts are bumped after.
  ++(clients_.try_emplace(owner_client(owner)).first->second.*field);
  if (tenants_ != nullptr) tenants_->add(owner, tenant_field);
}

void ClientUsage::shrink(const ClientId& owner, std::size_t Counts::*field,
                         TenantUsage::Field tenant_field) noexcept {
  const auto it = clients_.find(owner_client(owner));
  assert(it != clients_.end() && it->second.*field > 0 && "drop without a matching add");
  if (it == clients_.end()) return;
  if (tenants_ != nullptr) tenants_->drop(owner, tenant_field);
  Counts& c = it->second;
  --(c.*field);
  if (c.leases == 0 && c.waiters == 0 && c.watches == 0) clients_.erase(it);
}

}  // namespace shardlock::lease::internal
