// SpinLock and UnfairSpinLock (pure TTAS) through the shared conformance
// suite. Their fairness is a matter of degree, measured in bench/.
#include "shardlock/spin_lock.h"

#include <gtest/gtest.h>

#include "lock_conformance.h"

namespace shardlock {
namespace {

using SpinLocks = ::testing::Types<SpinLock, UnfairSpinLock>;
INSTANTIATE_TYPED_TEST_SUITE_P(SpinLock, ExclusiveLockTest, SpinLocks);

}  // namespace
}  // namespace shardlock
