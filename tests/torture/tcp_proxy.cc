// See tcp_proxy.h.
#include "tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
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

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One direction of a connection: chunks read from `from`, each with the time
// it was read, not yet written to `to`. A chunk is due once the direction's
// current delay has passed since its read, so lowering the delay lets what
// is held go at once. Reading goes on while less than kMaxQueued bytes wait, so a
// delay shifts a stream in time without throttling it to a chunk per delay;
// past that, `from` is not read (back-pressure).
struct Direction {
  struct Chunk {
    std::vector<char> bytes;
    std::size_t offset = 0;
    std::int64_t read_ns = 0;
  };
  static constexpr std::size_t kMaxQueued = 1 << 20;
  std::deque<Chunk> queue;
  std::size_t queued = 0;  // bytes in `queue` not yet written
  bool ended = false;      // `from` reached EOF: over once the queue is written
  [[nodiscard]] bool idle() const noexcept { return queue.empty(); }
  [[nodiscard]] bool may_read() const noexcept { return !ended && queued < kMaxQueued; }
  [[nodiscard]] bool due(std::int64_t now, std::int64_t delay_ns) const noexcept {
    return !queue.empty() && queue.front().read_ns + delay_ns <= now;
  }
};

struct Connection {
  int client = -1;
  int upstream = -1;
  Direction up;    // client -> upstream
  Direction down;  // upstream -> client
  bool dead = false;
};

// Reads what `from` has into `d` (while it may) and writes what is due in
// `d` to `to` (non-blocking, so trying costs nothing when `to` is full).
// False when the connection is over (EOF, an error).
bool pump(int from, int to, Direction& d, short from_events, short to_events,
          std::int64_t delay_ns) {
  if (d.may_read() && (from_events & (POLLIN | POLLHUP | POLLERR))) {
    Direction::Chunk chunk;
    chunk.bytes.resize(65536);
    const ssize_t n = ::recv(from, chunk.bytes.data(), chunk.bytes.size(), MSG_DONTWAIT);
    if (n == 0) {
      d.ended = true;
    } else if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    } else {
      chunk.bytes.resize(static_cast<std::size_t>(n));
      chunk.read_ns = now_ns();
      d.queued += chunk.bytes.size();
      d.queue.push_back(std::move(chunk));
    }
  }
  const std::int64_t now = now_ns();
  while (d.due(now, delay_ns)) {
    Direction::Chunk& front = d.queue.front();
    const ssize_t n = ::send(to, front.bytes.data() + front.offset,
                             front.bytes.size() - front.offset, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    if (n <= 0) break;
    front.offset += static_cast<std::size_t>(n);
    d.queued -= static_cast<std::size_t>(n);
    if (front.offset < front.bytes.size()) break;  // `to` is full
    d.queue.pop_front();
  }
  if (d.ended && d.idle()) return false;
  return (to_events & POLLERR) == 0;
}

}  // namespace

struct TcpProxy::Impl {
  int listen_fd = -1;
  std::uint16_t upstream_port = 0;
  std::thread thread;
  std::atomic<bool> stopping{false};
  std::atomic<bool> cut{false};
  std::atomic<std::int64_t> up_delay_ns{0};    // client -> upstream
  std::atomic<std::int64_t> down_delay_ns{0};  // upstream -> client
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
      // relaxed: settings polled each round; a change applies to every byte
      // not yet written.
      const std::int64_t up_delay = up_delay_ns.load(std::memory_order_relaxed);
      const std::int64_t down_delay = down_delay_ns.load(std::memory_order_relaxed);
      const std::int64_t now = now_ns();
      bool waiting = false;  // a delayed chunk is not due yet: poll for at most a round
      fds.clear();
      fds.push_back({listen_fd, POLLIN, 0});
      for (const Connection& c : open) {
        waiting = waiting || (!c.up.idle() && !c.up.due(now, up_delay)) ||
                  (!c.down.idle() && !c.down.due(now, down_delay));
        fds.push_back({c.client,
                       static_cast<short>((c.up.may_read() ? POLLIN : 0) |
                                          (c.down.due(now, down_delay) ? POLLOUT : 0)),
                       0});
        fds.push_back({c.upstream,
                       static_cast<short>((c.down.may_read() ? POLLIN : 0) |
                                          (c.up.due(now, up_delay) ? POLLOUT : 0)),
                       0});
      }
      const int timeout_ms = waiting ? 2 : 20;
      if (::poll(fds.data(), fds.size(), timeout_ms) < 0) continue;
      if (fds[0].revents & POLLIN) accept_all();
      std::size_t at = 1;
      for (Connection& c : open) {
        if (at + 1 >= fds.size()) break;  // accepted in this round: polled next round
        const short client_events = fds[at].revents;
        const short upstream_events = fds[at + 1].revents;
        at += 2;
        if (!pump(c.client, c.upstream, c.up, client_events, upstream_events, up_delay) ||
            !pump(c.upstream, c.client, c.down, upstream_events, client_events, down_delay)) {
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

void TcpProxy::set_delay(std::chrono::milliseconds to_upstream,
                         std::chrono::milliseconds to_client) noexcept {
  // relaxed: polled each round, like the cut.
  impl_->up_delay_ns.store(std::chrono::nanoseconds(to_upstream).count(),
                           std::memory_order_relaxed);
  impl_->down_delay_ns.store(std::chrono::nanoseconds(to_client).count(),
                             std::memory_order_relaxed);
}

std::uint64_t TcpProxy::connections() const noexcept {
  return impl_->connections.load(std::memory_order_relaxed);  // relaxed: a statistic
}
std::uint64_t TcpProxy::resets() const noexcept {
  return impl_->resets.load(std::memory_order_relaxed);  // relaxed: a statistic
}

}  // namespace shardlock::torture
