// ClientUsage: per-client counts of one shard, shared by a client's lease
// handles (owner_client()), each bounded on its own, and forgotten at zero.
#include "shardlock/lease/server/internal/client_usage.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace shardlock::lease::internal
