// See certificates.h.
#include "support/certificates.h"

#include <unistd.h>

#include <chrono>
#include <fstream>

#include "support/process.h"

namespace shardlock::test_support {

namespace {

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  return static_cast<bool>(out);
}

}  // namespace

bool TestCertificates::available() { return ::access(kOpenssl, X_OK) == 0; }

bool TestCertificates::openssl(const std::vector<std::string>& args) {
  const ToolResult result = run_tool(kOpenssl, args, std::chrono::seconds(30));
  if (result.exit_code == 0) return true;
  error_ = "openssl";
  for (const std::string& arg : args) error_ += " " + arg;
  error_ += " exited " + std::to_string(result.exit_code) + ": " + result.err;
  return false;
}

bool TestCertificates::make_ca(const std::string& name) {
  return openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                  "-nodes", "-keyout", key(name), "-out", cert(name), "-days", "2", "-subj",
                  "/CN=shardlock test CA " + name});
}

bool TestCertificates::make_certificate(const std::string& name, const std::string& ca,
                                        const std::string& common_name, CertificateUse use,
                                        bool expired) {
  const std::string request = dir_ + "/" + name + ".csr";
  const std::string extensions = dir_ + "/" + name + ".ext";
  if (!openssl({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", key(name), "-out", request, "-subj", "/CN=" + common_name})) {
    return false;
  }
  const std::string usage =
      use == CertificateUse::kServer
          ? "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
          : "extendedKeyUsage=clientAuth\n";
  if (!write_file(extensions, usage)) {
    error_ = "cannot write " + extensions;
    return false;
  }
  if (!expired) {
    return openssl({"x509", "-req", "-in", request, "-CA", cert(ca), "-CAkey", key(ca),
                    "-CAcreateserial", "-out", cert(name), "-days", "1", "-extfile", extensions});
  }
  // openssl ca takes a start and an end date; it needs a database.
  const std::string config = dir_ + "/" + ca + "-ca.cnf";
  const std::string database = dir_ + "/" + ca + "-index.txt";
  const std::string serial = dir_ + "/" + ca + "-serial";
  if (::access(config.c_str(), R_OK) != 0 &&
      !(write_file(config, "[ca]\ndefault_ca = test_ca\n[test_ca]\ndatabase = " + database +
                               "\nnew_certs_dir = " + dir_ + "\nserial = " + serial +
                               "\ndefault_md = sha256\npolicy = any_name\nunique_subject = no\n"
                               "[any_name]\ncommonName = supplied\n") &&
        write_file(database, "") && write_file(serial, "01\n"))) {
    error_ = "cannot write the CA database in " + dir_;
    return false;
  }
  return openssl({"ca", "-batch", "-config", config, "-cert", cert(ca), "-keyfile", key(ca),
                  "-in", request, "-out", cert(name), "-startdate", "20200101000000Z",
                  "-enddate", "20200102000000Z", "-extfile", extensions, "-notext"});
}

}  // namespace shardlock::test_support
