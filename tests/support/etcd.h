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
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "support/process.h"

namespace shardlock::test_support {

// A loopback TCP port nothing listens on right now (0 when none is found).
[[nodiscard]] std::uint16_t free_loopback_port();

// One HTTP/1.0 GET to 127.0.0.1:port; the whole answer, or empty.
[[nodiscard]] std::string http_get_loopback(std::uint16_t port, const std::string& path);

class EtcdProcess {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";
  static constexpr const char* kMissingMessage =
      "/usr/bin/etcd is missing: apt-get install etcd-server (or run tools/install-deps.sh)";

  [[nodiscard]] static bool available();

  EtcdProcess();
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // Starts etcd (again after kill(): same ports, same data dir) and waits up
  // to `timeout` until /health says it is healthy. False, with error() set,
  // when it could not start or did not become healthy in time.
  [[nodiscard]] bool start(std::chrono::milliseconds timeout = std::chrono::seconds(10));

  // kill -9, and reap it. The data dir stays for the next start().
  void kill() noexcept { process_.kill(); }

  [[nodiscard]] bool running() const noexcept { return process_.running(); }
  // "127.0.0.1:PORT", the client endpoint.
  [[nodiscard]] std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  [[nodiscard]] std::uint16_t client_port() const noexcept { return client_port_; }
  [[nodiscard]] const std::string& error() const noexcept { return error_; }
  [[nodiscard]] std::string data_dir() const { return base_dir_ + "/data"; }
  [[nodiscard]] std::string log_path() const { return base_dir_ + "/etcd.log"; }

  // The last `lines` lines of etcd's log.
  [[nodiscard]] std::string log_tail(std::size_t lines = 20) const;

 private:
  ChildProcess process_;
  std::string base_dir_;
  std::uint16_t client_port_ = 0;
  std::uint16_t peer_port_ = 0;
  std::string error_;
};

}  // namespace shardlock::test_support
