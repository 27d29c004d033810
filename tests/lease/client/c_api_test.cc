// The C ABI (c_api.h, libshardlock_c.so) against a real LeaseServer on
// loopback. The scenarios themselves are C (c_api_test_scenarios.c) and see
// only the C header; this file starts the server and reports.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "c_api_test_scenarios.h"
#include "support/loopback_server.h"

namespace shardlock::lease {
namespace {

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = test_support::start_loopback_server();
    ASSERT_TRUE(server_);
    address_ = test_support::loopback_address(*server_);
  }
  void TearDown() override { server_->stop(); }

  std::unique_ptr<LeaseServer> server_;
  std::string address_;
};

// Null when the scenario passed, else its message.
void expect_passes(const char* failure) { EXPECT_EQ(failure, nullptr) << failure; }

TEST_F(CApiTest, AcquireBusyRenewRelease) { expect_passes(c_api_exclusive(address_.c_str())); }

TEST_F(CApiTest, SharedLeasesCoexistAndPermitsCount) {
  expect_passes(c_api_shared_and_permits(address_.c_str()));
}

TEST_F(CApiTest, BadArgumentsReturnTheirCodes) {
  expect_passes(c_api_bad_arguments(address_.c_str()));
}

TEST_F(CApiTest, CreateExChecksItsOptions) { expect_passes(c_api_create_ex(address_.c_str())); }

TEST_F(CApiTest, QueryHoldersListsEachHolder) { expect_passes(c_api_holders(address_.c_str())); }

TEST_F(CApiTest, ReentrantHoldsShareAGrant) { expect_passes(c_api_reentrant(address_.c_str())); }

TEST_F(CApiTest, ThreadsSharingOneClientExcludeEachOther) {
  expect_passes(c_api_threads(address_.c_str()));
}

TEST_F(CApiTest, ElectionsAndWatchesSeeEachLeader) {
  expect_passes(c_api_election_and_watch(address_.c_str()));
}

TEST_F(CApiTest, WatchdogKeepsALeaseAndLossIsReportedOnce) {
  expect_passes(c_api_watchdog_and_lost(
      address_.c_str(), [](void* server) { static_cast<LeaseServer*>(server)->stop(); },
      server_.get()));
}

}  // namespace
}  // namespace shardlock::lease
