// See resource.h.
#include "resource.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

namespace shardlock::torture {
namespace {

// An abstract AF_UNIX address: no file to clean up, gone with the process.
socklen_t abstract_address(const std::string& name, sockaddr_un& out) {
  out = {};
  out.sun_family = AF_UNIX;
  const std::size_t n = std::min(name.size(), sizeof out.sun_path - 1);
  std::memcpy(out.sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// Reads one line from `fd` into `line`, keeping extra bytes in `buffered`.
bool read_line(int fd, std::string& buffered, std::string& line) {
  for (;;) {
    const std::size_t newline = buffered.find('\n');
    if (newline != std::string::npos) {
      line = buffered.substr(0, newline);
      buffered.erase(0, newline + 1);
      return true;
    }
    char chunk[512];
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buffered.append(chunk, static_cast<std::size_t>(n));
  }
}

bool write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

FencedResource::~FencedResource() { stop(); }

bool FencedResource::start(const std::string& name, const std::string& history_path) {
  if (!recorder_.open(history_path)) {
    error_ = "cannot create " + history_path + ": " + std::strerror(errno);
    return false;
  }
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  const socklen_t len = abstract_address(name, addr);
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listen_fd_, 256) != 0) {
    error_ = std::string("resource socket: ") + std::strerror(errno);
    return false;
  }
  acceptor_ = std::thread([this] {
    while (!stopping_.load(std::memory_order_relaxed)) {  // relaxed: a stop flag, joined after
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::lock_guard lock(connections_mutex_);
      connection_fds_.push_back(fd);
      connections_.emplace_back([this, fd] { serve(fd); });
    }
  });
  return true;
}

void FencedResource::serve(int fd) {
  std::string buffered;
  std::string line;
  while (read_line(fd, buffered, line)) {
    if (!write_all(fd, handle(line) + "\n")) break;
  }
}

std::string FencedResource::handle(const std::string& request) {
  std::istringstream in(request);
  char op = 0;
  std::string key;
  std::uint64_t token = 0;
  std::int64_t value = 0;
  std::int64_t client = -1;
  in >> op >> key >> token;
  if (op == 'W') in >> value;
  in >> client;
  if (!in || (op != 'R' && op != 'W')) return "ERR";
  std::lock_guard lock(mutex_);
  Event e;
  e.client = client;
  e.key = key;
  e.token = token;
  if (!fence_.check_and_advance(key, token)) {
    e.kind = EventKind::kWriteRejected;
    e.value = op == 'R' ? -1 : value;  // -1: a refused read
    e.highest = fence_.highest(key).value_or(0);
    recorder_.record(e);
    return "NO " + std::to_string(e.highest);
  }
  std::int64_t& counter = counters_[key];
  if (op == 'R') return "OK " + std::to_string(counter);
  counter = value;
  e.kind = EventKind::kWriteAccepted;
  e.value = value;
  recorder_.record(e);
  return "OK";
}

void FencedResource::stop() {
  if (stopping_.exchange(true, std::memory_order_relaxed)) return;  // relaxed: joined below
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard lock(connections_mutex_);
    for (const int fd : connection_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  for (std::thread& t : connections_) t.join();
  for (const int fd : connection_fds_) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  std::lock_guard lock(mutex_);
  for (const auto& [key, value] : counters_) {
    Event e;
    e.kind = EventKind::kFinalCounter;
    e.key = key;
    e.value = value;
    recorder_.record(e);
  }
}

ResourceConnection::~ResourceConnection() {
  if (fd_ >= 0) ::close(fd_);
}

bool ResourceConnection::connect(const std::string& name) {
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  const socklen_t len = abstract_address(name, addr);
  return fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0;
}

std::string ResourceConnection::call(const std::string& request) {
  std::string line;
  if (fd_ < 0 || !write_all(fd_, request + "\n") || !read_line(fd_, buffered_, line)) return {};
  return line;
}

}  // namespace shardlock::torture
