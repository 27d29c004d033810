// See etcd.h.
#include "support/etcd.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace shardlock::test_support {
std::uint16_t free_loopback_port() {
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

std::string http_get_loopback(std::uint16_t port, const std::string& path) {
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

bool EtcdProcess::available() { return ::access(kBinary, X_OK) == 0; }
bool EtcdProcess::ctl_available() { return ::access(kCtlBinary, X_OK) == 0; }

EtcdProcess::EtcdProcess(EtcdOptions options) : options_(std::move(options)) {
  std::string pattern = (std::filesystem::temp_directory_path() / "shardlock-etcd-XXXXXX").string();
  if (::mkdtemp(pattern.data()) != nullptr) base_dir_ = pattern;
  client_port_ = free_loopback_port();
  peer_port_ = free_loopback_port();
  while (peer_port_ != 0 && peer_port_ == client_port_) peer_port_ = free_loopback_port();
  if (options_.tls) {
    health_port_ = free_loopback_port();
    while (health_port_ != 0 && (health_port_ == client_port_ || health_port_ == peer_port_)) {
      health_port_ = free_loopback_port();
    }
  }
}

EtcdProcess::~EtcdProcess() {
  kill();
  if (!base_dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(base_dir_, ignored);
  }
}

bool EtcdProcess::start(std::chrono::milliseconds timeout) {
  if (base_dir_.empty() || client_port_ == 0 || peer_port_ == 0 ||
      (options_.tls && health_port_ == 0)) {
    error_ = "no temporary directory or no free loopback port";
    return false;
  }
  const std::string client_url =
      (options_.tls ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(client_port_);
  const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer_port_);
  std::vector<std::string> argv = {
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
  if (options_.tls) {
    argv.push_back("--cert-file=" + options_.tls->server_cert);
    argv.push_back("--key-file=" + options_.tls->server_key);
    argv.push_back("--listen-metrics-urls=http://127.0.0.1:" + std::to_string(health_port_));
    if (options_.client_cert_auth) {
      argv.push_back("--client-cert-auth");
      argv.push_back("--trusted-ca-file=" + options_.tls->ca);
    }
  }
  argv.insert(argv.end(), options_.extra_flags.begin(), options_.extra_flags.end());
  if (!process_.start(argv, /*capture_stdout=*/false, log_path())) {
    error_ = "could not start etcd: " + process_.error();
    return false;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (http_get_loopback(options_.tls ? health_port_ : client_port_, "/health")
            .find(R"("health":"true")") !=
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

std::optional<std::string> EtcdProcess::etcdctl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"--endpoints=" + std::string(options_.tls ? "https" : "http") +
                                       "://" + endpoint(),
                                   "--dial-timeout=5s", "--command-timeout=10s"};
  if (options_.tls) {
    argv.push_back("--cacert=" + options_.tls->ca);
    argv.push_back("--cert=" + options_.tls->client_cert);
    argv.push_back("--key=" + options_.tls->client_key);
  }
  // A test's throwaway password: on etcdctl's command line is fine here.
  if (!root_password_.empty()) argv.push_back("--user=root:" + root_password_);
  argv.insert(argv.end(), args.begin(), args.end());
  const ToolResult result = run_tool(kCtlBinary, argv, std::chrono::seconds(30));
  if (result.exit_code != 0) {
    error_ = "etcdctl";
    for (const std::string& arg : args) error_ += " " + arg;
    error_ += " exited " + std::to_string(result.exit_code) + ": " + result.err + result.out;
    return std::nullopt;
  }
  return result.out;
}

bool EtcdProcess::enable_auth(const std::string& root_password) {
  if (!etcdctl({"user", "add", "root", "--new-user-password=" + root_password})) return false;
  // etcdctl grants root the root role, which auth enable needs.
  if (!etcdctl({"auth", "enable"})) return false;
  root_password_ = root_password;
  return true;
}

bool EtcdProcess::add_user(const std::string& user, const std::string& password,
                           const std::string& prefix) {
  return etcdctl({"role", "add", user}) &&
         etcdctl({"role", "grant-permission", user, "readwrite", prefix, "--prefix=true"}) &&
         etcdctl({"user", "add", user, "--new-user-password=" + password}) &&
         etcdctl({"user", "grant-role", user, user});
}

std::string EtcdProcess::log_tail(std::size_t lines) const {
  std::ifstream in(log_path());
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::ostringstream out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out << all[i] << '\n';
  }
  return out.str();
}

}  // namespace shardlock::test_support
