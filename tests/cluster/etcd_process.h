// etcd_process.h: a real single-member etcd for tests, on loopback.
//
//   if (!EtcdProcess::available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
//   EtcdProcess etcd;
//   ASSERT_TRUE(etcd.start()) << etcd.error();
//   ... connect to etcd.endpoint() ...
//   etcd.kill();                              // kill -9
//   ASSERT_TRUE(etcd.start()) << etcd.error(); // same ports, same data dir
//
// Runs /usr/bin/etcd (Debian's etcd-server) as a child process
// (tests/torture/process.h: it dies with the test, in its own process
// group), with a temporary data dir and two free loopback ports: the client
// port and the peer port. start() returns once etcd answers /health, or
// fails with the tail of etcd's log in error(). The destructor kills it and
// removes the temporary directory.
//
// Free ports come from binding port 0 and closing the socket: another
// process may take one in between, which start() reports (etcd exits) rather
// than hides.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "process.h"  // tests/torture: ChildProcess

namespace shardlock::test_support {

// A loopback TCP port nothing listens on right now (0 when none is found).
inline std::uint16_t free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  std::uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  ::close(fd);
  return port;
}

// One HTTP/1.0 GET to 127.0.0.1:port; the whole answer, or empty.
inline std::string http_get_loopback(std::uint16_t port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  timeval timeout{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  std::string answer;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char chunk[1024];
      ssize_t n = 0;
      while ((n = ::recv(fd, chunk, sizeof chunk, 0)) > 0) {
        answer.append(chunk, static_cast<std::size_t>(n));
      }
    }
  }
  ::close(fd);
  return answer;
}

class EtcdProcess {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";
  static constexpr const char* kMissingMessage =
      "/usr/bin/etcd is missing: apt-get install etcd-server (or run tools/install-deps.sh)";

  [[nodiscard]] static bool available() { return ::access(kBinary, X_OK) == 0; }

  EtcdProcess() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "shardlock-etcd-XXXXXX").string();
    if (::mkdtemp(pattern.data()) != nullptr) base_dir_ = pattern;
    client_port_ = free_loopback_port();
    peer_port_ = free_loopback_port();
    while (peer_port_ != 0 && peer_port_ == client_port_) peer_port_ = free_loopback_port();
  }
  ~EtcdProcess() {
    kill();
    if (!base_dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(base_dir_, ignored);
    }
  }
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // Starts etcd (again after kill(): same ports, same data dir) and waits up
  // to `timeout` until /health says it is healthy. False, with error() set,
  // when it could not start or did not become healthy in time.
  [[nodiscard]] bool start(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    if (base_dir_.empty() || client_port_ == 0 || peer_port_ == 0) {
      error_ = "no temporary directory or no free loopback port";
      return false;
    }
    const std::string client_url = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer_port_);
    const std::vector<std::string> argv = {
        kBinary,
        "--name=default",
        "--data-dir=" + data_dir(),
        "--listen-client-urls=" + client_url,
        "--advertise-client-urls=" + client_url,
        "--listen-peer-urls=" + peer_url,
        "--initial-advertise-peer-urls=" + peer_url,
        "--initial-cluster=default=" + peer_url,
        "--logger=zap",
        "--log-outputs=stderr",
        "--log-level=warn",
    };
    if (!process_.start(argv, /*capture_stdout=*/false, log_path())) {
      error_ = "could not start etcd: " + process_.error();
      return false;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (http_get_loopback(client_port_, "/health").find("\"health\":\"true\"") !=
          std::string::npos) {
        return true;
      }
      if (process_.wait_for(std::chrono::milliseconds(0))) {
        error_ = "etcd exited during start-up (status " + std::to_string(process_.exit_status()) +
                 "); its log ends:\n" + log_tail();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    error_ = "etcd did not report healthy within " + std::to_string(timeout.count()) +
             " ms; its log ends:\n" + log_tail();
    kill();
    return false;
  }

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
  [[nodiscard]] std::string log_tail(std::size_t lines = 20) const {
    std::ifstream in(log_path());
    std::vector<std::string> all;
    for (std::string line; std::getline(in, line);) all.push_back(line);
    std::ostringstream out;
    for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
      out << all[i] << '\n';
    }
    return out.str();
  }

 private:
  torture::ChildProcess process_;
  std::string base_dir_;
  std::uint16_t client_port_ = 0;
  std::uint16_t peer_port_ = 0;
  std::string error_;
};

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
