// See tcp_proxy.h.
#include "tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <list>
#include <vector>

namespace shardlock::torture {
namespace {

// Closes with an RST rather than a FIN: the peer learns at once that the
// connection is gone, as it would from a broken network path's ICMP or a
// reset middlebox, and nothing lingers in TIME_WAIT.
void reset(int fd) noexcept {
  if (fd < 0) return;
  const linger abort{1, 0};
  (void)::setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort, sizeof abort);
  ::close(fd);
}

// One direction of a connection: bytes read from `from` not yet written to
// `to`. While some are pending, `from` is not read (back-pressure).
struct Direction {
  std::vector<char> pending;
  std::size_t offset = 0;
  [[nodiscard]] bool idle() const noexcept { return offset == pending.size(); }
};

struct Connection {
  int client = -1;
  int upstream = -1;
  Direction up;    // client -> upstream
  Direction down;  // upstream -> client
  bool dead = false;
};

// Reads what `from` has into `d` (when idle) and writes what `d` holds to
// `to` (non-blocking, so trying costs nothing when `to` is full). False when
// the connection is over (EOF, an error).
bool pump(int from, int to, Direction& d, short from_events, short to_events) {
  if (d.idle() && (from_events & (POLLIN | POLLHUP | POLLERR))) {
    d.pending.resize(65536);
    const ssize_t n = ::recv(from, d.pending.data(), d.pending.size(), MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) {
      d.pending.clear(), d.offset = 0;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    } else {
      d.pending.resize(static_cast<std::size_t>(n));
      d.offset = 0;
    }
  }
  if (!d.idle()) {
    const ssize_t n = ::send(to, d.pending.data() + d.offset, d.pending.size() - d.offset,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    if (n > 0) d.offset += static_cast<std::size_t>(n);
    if (d.idle()) d.pending.clear(), d.offset = 0;
  }
  return (to_events & POLLERR) == 0;
}

}  // namespace

struct TcpProxy::Impl {
  int listen_fd = -1;
  std::uint16_t upstream_port = 0;
  std::thread thread;
  std::atomic<bool> stopping{false};
  std::atomic<bool> cut{false};
  std::atomic<std::uint64_t> connections{0};
  std::atomic<std::uint64_t> resets{0};
  std::list<Connection> open;  // proxy thread only

  ~Impl() {
    for (Connection& c : open) reset(c.client), reset(c.upstream);
    if (listen_fd >= 0) ::close(listen_fd);
  }

  int connect_upstream() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(upstream_port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // Blocking: a loopback connect completes or is refused at once.
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) {
      ::close(fd);
      return -1;
    }
    (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
  }

  void accept_all() {
    for (;;) {
      const int client = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (client < 0) return;
      // relaxed: a flag polled each round; a connection accepted just before
      // a cut is reset in the next round.
      if (cut.load(std::memory_order_relaxed)) {
        // Counted first, so whoever sees the reset sees the count.
        resets.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
        reset(client);
        continue;
      }
      const int upstream = connect_upstream();
      if (upstream < 0) {
        reset(client);
        continue;
      }
      open.push_back(Connection{client, upstream, {}, {}, false});
      connections.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
    }
  }

  void run() {
    std::vector<pollfd> fds;
    while (!stopping.load(std::memory_order_relaxed)) {  // relaxed: a stop flag, joined after
      if (cut.load(std::memory_order_relaxed)) {         // relaxed: see accept_all()
        for (Connection& c : open) {
          resets.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic, counted first
          reset(c.client), reset(c.upstream);
        }
        open.clear();
      }
      fds.clear();
      fds.push_back({listen_fd, POLLIN, 0});
      for (const Connection& c : open) {
        fds.push_back(
            {c.client,
             static_cast<short>((c.up.idle() ? POLLIN : 0) | (c.down.idle() ? 0 : POLLOUT)), 0});
        fds.push_back(
            {c.upstream,
             static_cast<short>((c.down.idle() ? POLLIN : 0) | (c.up.idle() ? 0 : POLLOUT)), 0});
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) accept_all();
      std::size_t at = 1;
      for (Connection& c : open) {
        if (at + 1 >= fds.size()) break;  // accepted in this round: polled next round
        const short client_events = fds[at].revents;
        const short upstream_events = fds[at + 1].revents;
        at += 2;
        if (!pump(c.client, c.upstream, c.up, client_events, upstream_events) ||
            !pump(c.upstream, c.client, c.down, upstream_events, client_events)) {
          c.dead = true;
        }
      }
      for (auto it = open.begin(); it != open.end();) {
        if (it->dead) {
          reset(it->client), reset(it->upstream);
          it = open.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
};

TcpProxy::TcpProxy() : impl_(std::make_unique<Impl>()) {}
TcpProxy::~TcpProxy() { stop(); }

bool TcpProxy::start(std::uint16_t upstream_port) {
  impl_->upstream_port = upstream_port;
  impl_->listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (impl_->listen_fd < 0) {
    error_ = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(impl_->listen_fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(impl_->listen_fd, 64) != 0 ||
      ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    error_ = std::string("bind: ") + std::strerror(errno);
    return false;
  }
  port_ = ntohs(addr.sin_port);
  impl_->thread = std::thread([this] { impl_->run(); });
  return true;
}

void TcpProxy::stop() {
  impl_->stopping.store(true, std::memory_order_relaxed);  // relaxed: joined next
  if (impl_->thread.joinable()) impl_->thread.join();
}

void TcpProxy::set_cut(bool cut) noexcept {
  impl_->cut.store(cut, std::memory_order_relaxed);  // relaxed: polled; see accept_all()
}

std::uint64_t TcpProxy::connections() const noexcept {
  return impl_->connections.load(std::memory_order_relaxed);  // relaxed: a statistic
}
std::uint64_t TcpProxy::resets() const noexcept {
  return impl_->resets.load(std::memory_order_relaxed);  // relaxed: a statistic
}

}  // namespace shardlock::torture
