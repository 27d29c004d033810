// ClientUsage: per-client counts of one shard, shared by a client's lease
// handles (owner_client()), each bounded on its own, and forgotten at zero;
// and under a tenant file, per-tenant counts over every shard (TenantUsage)
// bounded by the tenant's line, each refusal naming its bound.
#include "shardlock/lease/server/internal/client_usage.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "shardlock/lease/server/internal/tenant_usage.h"
#include "shardlock/lease/tenants.h"

namespace shardlock::lease::internal {
namespace {

constexpr ClientId kAlice{0x1'0000'0001, 7};  // two handles of one client
constexpr ClientId kAliceOtherHandle{0x1'0000'0002, 7};
constexpr ClientId kBob{0x2'0000'0001, 8};

TEST(ClientUsageTest, HandlesOfOneClientShareItsQuota) {
  ClientUsage usage({.max_leases = 2}, /*seed=*/42);
  EXPECT_TRUE(usage.may_hold(kAlice));
  usage.add_lease(kAlice);
  usage.add_lease(kAliceOtherHandle);
  EXPECT_FALSE(usage.may_hold(kAlice));
  EXPECT_FALSE(usage.may_hold(kAliceOtherHandle));
  EXPECT_TRUE(usage.may_hold(kBob));
  EXPECT_EQ(usage.of(kAliceOtherHandle).leases, 2U);
  EXPECT_EQ(usage.clients(), 1U);
}

TEST(ClientUsageTest, EachCountHasItsOwnBound) {
  ClientUsage usage({.max_leases = 1, .max_waiters = 2, .max_watches = 1}, 0);
  usage.add_lease(kBob);
  EXPECT_FALSE(usage.may_hold(kBob));
  EXPECT_TRUE(usage.may_queue(kBob));
  EXPECT_TRUE(usage.may_watch(kBob));
  usage.add_waiter(kBob);
  usage.add_waiter(kBob);
  EXPECT_FALSE(usage.may_queue(kBob));
  usage.add_watch(kBob);
  EXPECT_FALSE(usage.may_watch(kBob));
  const ClientUsage::Counts c = usage.of(kBob);
  EXPECT_EQ(c.leases, 1U);
  EXPECT_EQ(c.waiters, 2U);
  EXPECT_EQ(c.watches, 1U);
}

TEST(ClientUsageTest, AClientIsForgottenWhenEveryCountIsZero) {
  ClientUsage usage({}, 0);
  usage.add_lease(kAlice);
  usage.add_watch(kAlice);
  usage.add_waiter(kBob);
  EXPECT_EQ(usage.clients(), 2U);
  usage.drop_lease(kAlice);
  EXPECT_EQ(usage.clients(), 2U);  // a watch left
  usage.drop_watch(kAliceOtherHandle);
  EXPECT_EQ(usage.clients(), 1U);
  usage.drop_waiter(kBob);
  EXPECT_EQ(usage.clients(), 0U);
  EXPECT_EQ(usage.of(kBob).waiters, 0U);
}

TEST(ClientUsageTest, UnboundedByDefault) {
  ClientUsage usage({}, 0);
  for (int i = 0; i < 1000; ++i) usage.add_lease(kAlice);
  EXPECT_TRUE(usage.may_hold(kAlice));
  EXPECT_TRUE(usage.may_queue(kAlice));
  EXPECT_TRUE(usage.may_watch(kAlice));
}

// Owners of tenants 1 and 2: the key id is in the top 32 bits of hi, as a
// server with a tenant file forces it.
constexpr ClientId owner_of(std::uint32_t tenant, std::uint64_t client) {
  return ClientId{.lo = client << 32, .hi = (std::uint64_t{tenant} << 32) | client};
}

TenantTable bounded(std::uint32_t max_leases, std::uint32_t max_waiters,
                    std::uint32_t max_watches) {
  std::vector<Tenant> tenants(2);
  tenants[0].name = "billing";
  tenants[0].key_id = 1;
  tenants[0].key = generate_auth_key();
  tenants[0].limits = {
      .max_leases = max_leases, .max_waiters = max_waiters, .max_watches = max_watches};
  tenants[0].rules = {{.prefix = "", .rights = Rights::kAcquire}};
  tenants[1].name = "ops";
  tenants[1].key_id = 2;
  tenants[1].key = generate_auth_key();
  tenants[1].rules = {{.prefix = "", .rights = Rights::kAcquire}};
  auto built = TenantTable::build(std::move(tenants));
  EXPECT_TRUE(built.ok()) << built.message();
  return built.ok() ? std::move(*built.table) : TenantTable{};
}

TEST(TenantUsageTest, ATenantsBoundCountsItsClientsInEveryShard) {
  TenantUsage tenants;
  tenants.set_limits(bounded(/*max_leases=*/3, 0, 0));
  ClientUsage shard_a({}, 1, &tenants);
  ClientUsage shard_b({}, 2, &tenants);
  shard_a.add_lease(owner_of(1, 10));
  shard_b.add_lease(owner_of(1, 11));
  EXPECT_EQ(shard_a.lease_refusal(owner_of(1, 12)), std::nullopt);
  shard_b.add_lease(owner_of(1, 12));
  // Three held over two shards and three clients: the fourth is refused in
  // either shard, for any client of the tenant, with the tenant's code.
  EXPECT_EQ(shard_a.lease_refusal(owner_of(1, 13)), WireError::kTenantLeaseLimit);
  EXPECT_EQ(shard_b.lease_refusal(owner_of(1, 10)), WireError::kTenantLeaseLimit);
  // Another tenant, and the tenant's waiters and watches, are not bounded by it.
  EXPECT_EQ(shard_a.lease_refusal(owner_of(2, 10)), std::nullopt);
  EXPECT_EQ(shard_a.waiter_refusal(owner_of(1, 10)), std::nullopt);
  EXPECT_EQ(shard_a.watch_refusal(owner_of(1, 10)), std::nullopt);
  EXPECT_EQ(tenants.of(1).leases, 3U);
  shard_b.drop_lease(owner_of(1, 11));
  EXPECT_EQ(shard_a.lease_refusal(owner_of(1, 13)), std::nullopt);
  EXPECT_EQ(tenants.of(1).leases, 2U);
}

TEST(TenantUsageTest, EachRefusalNamesItsBoundAndTheClientsComesFirst) {
  TenantUsage tenants;
  tenants.set_limits(bounded(1, 1, 1));
  ClientUsage usage({.max_leases = 1}, 0, &tenants);
  const ClientId alice = owner_of(1, 10);
  usage.add_lease(alice);
  usage.add_waiter(alice);
  usage.add_watch(alice);
  // Alice is at her own bound too: that one is named (it is hers to fix).
  EXPECT_EQ(usage.lease_refusal(alice), WireError::kLimitExceeded);
  EXPECT_EQ(usage.lease_refusal(owner_of(1, 11)), WireError::kTenantLeaseLimit);
  EXPECT_EQ(usage.waiter_refusal(owner_of(1, 11)), WireError::kTenantWaiterLimit);
  EXPECT_EQ(usage.watch_refusal(owner_of(1, 11)), WireError::kTenantWatchLimit);
  EXPECT_TRUE(is_limit_exceeded(WireError::kTenantWatchLimit));
  EXPECT_FALSE(is_limit_exceeded(WireError::kPermissionDenied));
}

TEST(TenantUsageTest, AReloadChangesBoundsAndKeepsCounts) {
  TenantUsage tenants;
  tenants.set_limits(bounded(2, 0, 0));
  ClientUsage usage({}, 0, &tenants);
  for (std::uint64_t c = 10; c < 12; ++c) usage.add_lease(owner_of(1, c));
  EXPECT_EQ(usage.lease_refusal(owner_of(1, 12)), WireError::kTenantLeaseLimit);
  tenants.set_limits(bounded(3, 0, 0));  // raised
  EXPECT_EQ(usage.lease_refusal(owner_of(1, 12)), std::nullopt);
  usage.add_lease(owner_of(1, 12));
  tenants.set_limits(bounded(1, 0, 0));  // lowered below what is held: nothing is taken away
  EXPECT_EQ(tenants.of(1).leases, 3U);
  EXPECT_EQ(usage.lease_refusal(owner_of(1, 13)), WireError::kTenantLeaseLimit);
  tenants.set_limits(TenantTable{});  // the tenant gone: unbounded, still counted
  EXPECT_EQ(usage.lease_refusal(owner_of(1, 13)), std::nullopt);
  for (std::uint64_t c = 10; c < 13; ++c) usage.drop_lease(owner_of(1, c));
  EXPECT_EQ(tenants.of(1).leases, 0U);
}

// Shards on different I/O threads count one tenant at once: the count ends
// exact, and a slot made by one thread is the slot every other finds.
TEST(TenantUsageTest, ConcurrentShardsCountOneTenantExactly) {
  TenantUsage tenants;
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&tenants, t] {
      ClientUsage usage({}, static_cast<std::uint64_t>(t), &tenants);
      for (int i = 0; i < kRounds; ++i) {
        const ClientId owner = owner_of(7 + static_cast<std::uint32_t>(i % 3), 100 + t);
        usage.add_lease(owner);
        if (i % 2 == 1) usage.drop_lease(owner);
      }
    });
  }
  for (auto& th : threads) th.join();
  const std::uint64_t total = tenants.of(7).leases + tenants.of(8).leases + tenants.of(9).leases;
  EXPECT_EQ(total, static_cast<std::uint64_t>(kThreads * kRounds / 2));
  EXPECT_EQ(tenants.of(42).leases, 0U);  // never counted
}

}  // namespace
}  // namespace shardlock::lease::internal
