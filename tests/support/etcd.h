// etcd.h: a real single-member etcd on loopback, for the cluster tests
// (tests/cluster/etcd/, through etcd_fixture.h) and shardlock-torture's
// cluster mode.
//
//   if (!EtcdProcess::available()) ... skip: EtcdProcess::kMissingMessage
//   EtcdProcess etcd;
//   if (!etcd.start()) ... etcd.error()
//   ... connect to etcd.endpoint() ...
//   etcd.kill();   // kill -9
//   etcd.start();  // same ports, same data dir
//
// Runs /usr/bin/etcd (Debian's etcd-server) as a ChildProcess (process.h: it
// dies with its parent, in its own process group), with a temporary data dir
// and two free loopback ports: the client port and the peer port. start()
// returns once etcd answers /health, or fails with the tail of etcd's log in
// error(). The destructor kills it and removes the temporary directory.
//
// Free ports come from binding port 0 and closing the socket: another
// process may take one in between, which start() reports (etcd exits) rather
// than hides.
//
// Over TLS, with client certificates and authentication (certificates from
// certificates.h):
//
//   EtcdProcess etcd(EtcdOptions{.tls = EtcdTlsFiles{...}});
//   etcd.start() && etcd.enable_auth("root-password")
//       && etcd.add_user("shardlock", "its-password", "/shardlock/") || ... etcd.error()
//   ... connect to etcd.url() (etcds://127.0.0.1:PORT) ...
//
// etcd then also serves /health in plaintext on a third loopback port (its
// --listen-metrics-urls), which start() polls.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "support/process.h"

namespace shardlock::test_support {

// A loopback TCP port nothing listens on right now (0 when none is found).
[[nodiscard]] std::uint16_t free_loopback_port();

// One HTTP/1.0 GET to 127.0.0.1:port; the whole answer, or empty.
[[nodiscard]] std::string http_get_loopback(std::uint16_t port, const std::string& path);

// The files of an etcd over TLS.
struct EtcdTlsFiles {
  // The CA that signed the server's certificate and the client certificates
  // etcd accepts (--trusted-ca-file with client_cert_auth).
  std::string ca;
  std::string server_cert;
  std::string server_key;
  // etcdctl's own client certificate (enable_auth(), add_user()).
  std::string client_cert;
  std::string client_key;
};

// How start() runs etcd.
struct EtcdOptions {
  std::optional<EtcdTlsFiles> tls;  // unset: plaintext
  // With tls: refuse a client without a certificate signed by tls->ca
  // (--client-cert-auth).
  bool client_cert_auth = true;
  // More of etcd's flags, e.g. "--auth-token-ttl=1".
  std::vector<std::string> extra_flags;
};

class EtcdProcess {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";
  static constexpr const char* kCtlBinary = "/usr/bin/etcdctl";
  static constexpr const char* kMissingMessage =
      "/usr/bin/etcd is missing: apt-get install etcd-server (or run tools/install-deps.sh)";
  static constexpr const char* kCtlMissingMessage =
      "/usr/bin/etcdctl is missing: apt-get install etcd-client (or run tools/install-deps.sh)";

  [[nodiscard]] static bool available();
  [[nodiscard]] static bool ctl_available();

  explicit EtcdProcess(EtcdOptions options = {});
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // Starts etcd (again after kill(): same ports, same data dir) and waits up
  // to `timeout` until /health says it is healthy. False, with error() set,
  // when it could not start or did not become healthy in time.
  [[nodiscard]] bool start(std::chrono::milliseconds timeout = std::chrono::seconds(10));

  // kill -9, and reap it. The data dir stays for the next start().
  void kill() noexcept { process_.kill(); }

  // Runs etcdctl against this etcd (its TLS files, and after enable_auth()
  // the root user) with `args`; its stdout, or nothing with error() set.
  [[nodiscard]] std::optional<std::string> etcdctl(const std::vector<std::string>& args);
  // Adds the user root with `root_password` and turns authentication on.
  [[nodiscard]] bool enable_auth(const std::string& root_password);
  // After enable_auth(): adds `user` with `password` and a role of the same
  // name that may read and write every key under `prefix`.
  [[nodiscard]] bool add_user(const std::string& user, const std::string& password,
                              const std::string& prefix);

  [[nodiscard]] bool running() const noexcept { return process_.running(); }
  // "127.0.0.1:PORT", the client endpoint.
  [[nodiscard]] std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  // The --cluster URL: etcd://127.0.0.1:PORT, or etcds:// over TLS.
  [[nodiscard]] std::string url() const {
    return (options_.tls ? "etcds://" : "etcd://") + endpoint();
  }
  [[nodiscard]] const EtcdOptions& options() const noexcept { return options_; }
  [[nodiscard]] std::uint16_t client_port() const noexcept { return client_port_; }
  [[nodiscard]] const std::string& error() const noexcept { return error_; }
  [[nodiscard]] std::string data_dir() const { return base_dir_ + "/data"; }
  [[nodiscard]] std::string log_path() const { return base_dir_ + "/etcd.log"; }

  // The last `lines` lines of etcd's log.
  [[nodiscard]] std::string log_tail(std::size_t lines = 20) const;

 private:
  EtcdOptions options_;
  ChildProcess process_;
  std::string base_dir_;
  std::uint16_t client_port_ = 0;
  std::uint16_t peer_port_ = 0;
  std::uint16_t health_port_ = 0;  // with TLS: /health in plaintext
  std::string root_password_;      // after enable_auth()
  std::string error_;
};

}  // namespace shardlock::test_support
