// etcd_fixture.h: the cluster tests' etcd fixture, over EtcdProcess (etcd.h,
// a real single-member etcd on loopback, which the torture harness's
// cluster mode shares).
//
//   class MyTest : public test_support::EtcdSuiteTest { ... };
//   ... connect to etcd_->endpoint() ...
//
// One etcd per suite and process: ctest runs each TEST as a process of its
// own (gtest_discover_tests), so there it is one etcd per test; a binary
// run by hand shares one across the suite's tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "support/etcd.h"

namespace shardlock::test_support {

// A fixture base with one etcd for the whole suite (started once, stopped
// after the last test). A derived SetUp() calls EtcdSuiteTest::SetUp() first
// and returns if the test was skipped (no etcd binary) or failed (etcd did
// not start); each test then works under its own key prefix.
class EtcdSuiteTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!EtcdProcess::available()) return;
    etcd_ = new EtcdProcess();
    if (!etcd_->start()) start_error_ = etcd_->error();
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
    start_error_.clear();
  }
  void SetUp() override {
    if (!EtcdProcess::available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
    ASSERT_TRUE(start_error_.empty()) << start_error_;
  }
  // The test's name: a key prefix no other test of the suite uses.
  static std::string test_name() {
    return ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  inline static EtcdProcess* etcd_ = nullptr;
  inline static std::string start_error_;
};

}  // namespace shardlock::test_support
