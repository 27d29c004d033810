// The C ABI (c_api.h, libshardlock_c.so) against a real LeaseServer on
// loopback. The scenarios themselves are C (c_api_test_scenarios.c) and see
// only the C header; this file starts the server and reports.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "c_api_test_scenarios.h"
#include "shardlock/lease/tenants.h"
#include "shardlock/lease/wire/envelope.h"
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

// SHARDLOCK_CLIENT_TENANT, SHARDLOCK_CLIENT_ENCRYPT and the cipher flags
// against a server with tenants (LeaseServerOptions::tenants).
TEST(CApiTenantTest, ATenantClientEncryptsAndIsHeldToItsPrefix) {
  const AuthKey key = generate_auth_key();
  const std::string key_file = ::testing::TempDir() + "c_api_tenant_" + std::to_string(::getpid());
  std::ofstream(key_file) << format_auth_key(key) << "\n";
  auto parsed = parse_tenant_file(
      "tenant c id=5 key=" + format_auth_key(key) + " encrypt=yes\nallow c \"c/\" acquire\n", "/");
  ASSERT_TRUE(parsed.ok()) << parsed.message();
  LeaseServerOptions o = test_support::loopback_options();
  o.tenants = std::move(*parsed.table);
  auto server = test_support::start_loopback_server(o);
  ASSERT_TRUE(server);
  expect_passes(c_api_tenant(test_support::loopback_address(*server).c_str(), key_file.c_str(), 5));
  expect_passes(c_api_tenant_ciphers(test_support::loopback_address(*server).c_str(),
                                     key_file.c_str(), 5, aes_gcm_available() ? 1 : 0));
  std::remove(key_file.c_str());
}

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
