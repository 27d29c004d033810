// Mutex, the futex-parking lock, through the shared conformance suite.
#include "shardlock/mutex.h"

#include <gtest/gtest.h>

#include "lock_conformance.h"

namespace shardlock {
namespace {

INSTANTIATE_TYPED_TEST_SUITE_P(Mutex, ExclusiveLockTest, ::testing::Types<Mutex>);

}  // namespace
}  // namespace shardlock
