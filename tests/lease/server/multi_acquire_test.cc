// StalledSteps: a shard's intrusive list of ACQUIRE_MANY steps that could
// not be handed back, taken newest first with the step each stalled on.
#include "shardlock/lease/server/internal/multi_acquire.h"

#include <gtest/gtest.h>

namespace shardlock::lease::internal {
namespace {

TEST(StalledStepsTest, TakesNewestFirstAndUnlinks) {
  StalledSteps stalled;
  EXPECT_TRUE(stalled.empty());
  EXPECT_EQ(stalled.take(), nullptr);
  MultiAcquire a;
  MultiAcquire b;
  stalled.stall(a, MessageType::kGranted);
  stalled.stall(b, MessageType::kTimeout);
  EXPECT_FALSE(stalled.empty());
  EXPECT_EQ(stalled.take(), &b);
  EXPECT_EQ(b.stalled_step, MessageType::kTimeout);
  EXPECT_EQ(b.next_stalled, nullptr);
  EXPECT_EQ(stalled.take(), &a);
  EXPECT_EQ(a.stalled_step, MessageType::kGranted);
  EXPECT_TRUE(stalled.empty());
  stalled.stall(b, MessageType::kError);  // unlinked, so it may stall again
  EXPECT_EQ(stalled.take(), &b);
  EXPECT_EQ(b.stalled_step, MessageType::kError);
}

}  // namespace
}  // namespace shardlock::lease::internal
