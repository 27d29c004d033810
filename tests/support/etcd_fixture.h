// etcd_fixture.h: the cluster tests' etcd fixture, over EtcdProcess (etcd.h,
// a real single-member etcd on loopback, which the torture harness's
// cluster mode shares).
//
//   class MyTest : public test_support::EtcdSuiteTest { ... };
//   ... connect to etcd_->endpoint(), or start nodes with cluster_flags() ...
//
// Over TLS with client certificates and authentication, a fixture's own
// SetUpTestSuite() starts the suite's etcd so instead:
//
//   class MyTlsTest : public test_support::EtcdSuiteTest {
//    protected:
//     static void SetUpTestSuite() { start_tls_suite_etcd(); }
//   };
//
// One etcd per suite and process: ctest runs each TEST as a process of its
// own (gtest_discover_tests), so there it is one etcd per test; a binary
// run by hand shares one across the suite's tests.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "support/certificates.h"
#include "support/etcd.h"

namespace shardlock::test_support {

// A fixture base with one etcd for the whole suite (started once, stopped
// after the last test). A derived SetUp() calls EtcdSuiteTest::SetUp() first
// and returns if the test was skipped (no etcd binary) or failed (etcd did
// not start); each test then works under its own key prefix.
class EtcdSuiteTest : public ::testing::Test {
 protected:
  // The TLS suite's etcd users (start_tls_suite_etcd()): root, and the one
  // the nodes run as, which may read and write /shardlock/ only.
  static constexpr const char* kRootPassword = "root-secret";
  static constexpr const char* kNodeUser = "shardlock";
  static constexpr const char* kNodePassword = "node-secret";

  static void SetUpTestSuite() { start_suite_etcd({}); }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
    start_error_.clear();
    skip_reason_.clear();
    node_flags_.clear();
    if (certificates_) {
      std::error_code ignored;
      std::filesystem::remove_all(certificates_->dir(), ignored);
      certificates_.reset();
    }
  }
  void SetUp() override {
    if (!EtcdProcess::available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
    if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;
    ASSERT_TRUE(start_error_.empty()) << start_error_;
  }
  // The test's name: a key prefix no other test of the suite uses.
  static std::string test_name() {
    return ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  // Starts the suite's etcd with `options`.
  static void start_suite_etcd(EtcdOptions options) {
    if (!EtcdProcess::available()) return;
    etcd_ = new EtcdProcess(std::move(options));
    if (!etcd_->start()) start_error_ = etcd_->error();
  }

  // Starts the suite's etcd over TLS, with --client-cert-auth and
  // authentication on (`extra_flags` are more of etcd's), and makes, in a
  // directory of the suite's (certificates_->dir()):
  //   ca             signed etcd's certificate and the client certificates
  //   other-ca       signed nothing etcd knows (a wrong --etcd-cacert)
  //   node           a client certificate, CN=node (no etcd user by that name)
  //   expired        a client certificate signed by ca, valid only in 2020
  //   node.password  kNodePassword;  wrong.password: another
  // and the users root (kRootPassword) and kNodeUser (kNodePassword, read
  // and write under /shardlock/). node_flags_ are the flags that reach it as
  // kNodeUser with the node certificate.
  static void start_tls_suite_etcd(std::vector<std::string> extra_flags = {}) {
    if (!EtcdProcess::available()) return;
    if (!EtcdProcess::ctl_available()) {
      skip_reason_ = EtcdProcess::kCtlMissingMessage;
      return;
    }
    if (!TestCertificates::available()) {
      skip_reason_ = TestCertificates::kMissingMessage;
      return;
    }
    std::string pattern =
        (std::filesystem::temp_directory_path() / "shardlock-pki-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      start_error_ = "mkdtemp failed";
      return;
    }
    certificates_ = std::make_unique<TestCertificates>(pattern);
    TestCertificates& pki = *certificates_;
    using Use = CertificateUse;
    if (!pki.make_ca("ca") || !pki.make_ca("other-ca") ||
        !pki.make_certificate("server", "ca", "etcd", Use::kServer) ||
        !pki.make_certificate("node", "ca", "node", Use::kClient) ||
        !pki.make_certificate("admin", "ca", "root", Use::kClient) ||
        !pki.make_certificate("expired", "ca", "node", Use::kClient, /*expired=*/true)) {
      start_error_ = pki.error();
      return;
    }
    for (const auto& [name, text] : {std::pair{"node.password", kNodePassword},
                                     std::pair{"wrong.password", "not-the-password"}}) {
      std::ofstream(pki.dir() + "/" + name) << text << "\n";
      std::filesystem::permissions(pki.dir() + "/" + name, std::filesystem::perms::owner_read |
                                                               std::filesystem::perms::owner_write);
    }
    EtcdOptions options;
    options.tls = EtcdTlsFiles{.ca = pki.cert("ca"),
                               .server_cert = pki.cert("server"),
                               .server_key = pki.key("server"),
                               .client_cert = pki.cert("admin"),
                               .client_key = pki.key("admin")};
    // A cheap password hash: each authentication runs bcrypt at this cost.
    options.extra_flags = {"--bcrypt-cost=4"};
    options.extra_flags.insert(options.extra_flags.end(), extra_flags.begin(), extra_flags.end());
    start_suite_etcd(std::move(options));
    if (!start_error_.empty()) return;
    if (!etcd_->enable_auth(kRootPassword) ||
        !etcd_->add_user(kNodeUser, kNodePassword, "/shardlock/")) {
      start_error_ = etcd_->error();
      return;
    }
    node_flags_ = {"--etcd-cacert",       pki.cert("ca"),   "--etcd-cert", pki.cert("node"),
                   "--etcd-key",          pki.key("node"),  "--etcd-user", kNodeUser,
                   "--etcd-password-file", pki.dir() + "/node.password"};
  }

  // The flags that put a shardlockd (or shardlockctl) on the suite's etcd:
  // --cluster URL, and over TLS node_flags_.
  static std::vector<std::string> cluster_flags() {
    std::vector<std::string> flags = {"--cluster", etcd_->url()};
    flags.insert(flags.end(), node_flags_.begin(), node_flags_.end());
    return flags;
  }

  inline static EtcdProcess* etcd_ = nullptr;
  inline static std::string start_error_;
  inline static std::string skip_reason_;  // a tool the suite needs is missing
  inline static std::unique_ptr<TestCertificates> certificates_;  // over TLS
  inline static std::vector<std::string> node_flags_;
};

}  // namespace shardlock::test_support
