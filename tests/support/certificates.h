// certificates.h: TLS certificates made for a test with openssl(1)
// (Debian's openssl package), for an etcd over TLS (etcd.h) and its clients.
//
//   if (!TestCertificates::available()) ... skip: TestCertificates::kMissingMessage
//   TestCertificates pki(dir);
//   pki.make_ca("ca") && pki.make_certificate("server", "ca", "etcd", CertificateUse::kServer)
//       && pki.make_certificate("client", "ca", "node", CertificateUse::kClient)
//       || ... pki.error()
//   ... pki.cert("server"), pki.key("server"), pki.cert("ca") ...
//
// Keys are EC P-256 (fast to make). A server certificate names
// IP:127.0.0.1 and DNS:localhost. An expired certificate is valid only in
// 2020: openssl 3.0's x509 cannot date one in the past, so it is signed with
// `openssl ca -startdate -enddate` and a throwaway CA database in `dir`.
#pragma once

#include <string>
#include <vector>

namespace shardlock::test_support {

enum class CertificateUse { kServer, kClient };

class TestCertificates {
 public:
  static constexpr const char* kOpenssl = "/usr/bin/openssl";
  static constexpr const char* kMissingMessage =
      "/usr/bin/openssl is missing: apt-get install openssl (or run tools/install-deps.sh)";
  [[nodiscard]] static bool available();

  // Writes every file into `dir`, which must exist.
  explicit TestCertificates(std::string dir) : dir_(std::move(dir)) {}

  // A self-signed CA: NAME.crt and NAME.key. False with error() on failure.
  [[nodiscard]] bool make_ca(const std::string& name);
  // NAME.crt (subject CN=`common_name`) and NAME.key, signed by the CA
  // `ca` (made by make_ca()); valid for a day from now, or, with `expired`,
  // only in 2020.
  [[nodiscard]] bool make_certificate(const std::string& name, const std::string& ca,
                                      const std::string& common_name, CertificateUse use,
                                      bool expired = false);

  [[nodiscard]] std::string cert(const std::string& name) const { return dir_ + "/" + name + ".crt"; }
  [[nodiscard]] std::string key(const std::string& name) const { return dir_ + "/" + name + ".key"; }
  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }
  [[nodiscard]] const std::string& error() const noexcept { return error_; }

 private:
  // Runs openssl with `args`; false, with error_ saying what it printed.
  bool openssl(const std::vector<std::string>& args);

  std::string dir_;
  std::string error_;
};

}  // namespace shardlock::test_support
