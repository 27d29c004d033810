// The C ABI (c_api.h, libshardlock_c.so) against a real LeaseServer on
// loopback. The scenarios themselves are C (c_api_test_scenarios.c) and see
// only the C header; this file starts the server and reports.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "c_api_test_scenarios.h"
#include "shardlock/lease/server/server.h"

namespace shardlock::lease {
namespace {

using namespace std::chrono_literals;

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LeaseServerOptions options;
    options.bind_address = "127.0.0.1:0";
    options.shards = 4;
    options.lock_delay = 0ms;
    options.max_ttl = 60s;
    options.log = [](std::string_view) {};
    server_ = std::make_unique<LeaseServer>(options);
    const std::error_code ec = server_->start();
    ASSERT_FALSE(ec) << ec.message() << ": " << server_->error_detail();
    address_ = "127.0.0.1:" + std::to_string(server_->port());
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

TEST_F(CApiTest, WatchdogKeepsALeaseAndLossIsReportedOnce) {
  expect_passes(c_api_watchdog_and_lost(
      address_.c_str(), [](void* server) { static_cast<LeaseServer*>(server)->stop(); },
      server_.get()));
}

}  // namespace
}  // namespace shardlock::lease
