// See proxy.h.
#include "proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <queue>
#include <vector>

#include "recorder.h"
#include "shardlock/workload/zipf.h"

namespace shardlock::torture {
namespace {

// Seeded, so a run's faults repeat as far as scheduling allows.
class Random {
 public:
  explicit Random(std::uint64_t seed) : bits_(seed) {}
  std::uint64_t next() noexcept { return bits_.next(); }
  bool chance(double p) noexcept {
    return p > 0 && static_cast<double>(bits_.next() >> 11) * 0x1.0p-53 < p;
  }

 private:
  workload::SplitMix64 bits_;
};

using Bytes = std::vector<std::uint8_t>;

// Where a datagram goes: upstream (fd connected to the server), or to `to`
// from `fd` (a client's answer from the listening socket, a node's datagram
// from its own proxy's).
struct Destination {
  int fd = -1;
  bool to_address = false;
  sockaddr_in to{};
};

struct Scheduled {
  std::int64_t due_ns;
  std::uint64_t sequence;  // FIFO among equal due times
  Destination where;
  Bytes bytes;
  friend bool operator>(const Scheduled& a, const Scheduled& b) noexcept {
    return a.due_ns != b.due_ns ? a.due_ns > b.due_ns : a.sequence > b.sequence;
  }
};

std::uint64_t address_key(const sockaddr_in& a) noexcept {
  return (static_cast<std::uint64_t>(a.sin_addr.s_addr) << 16) | a.sin_port;
}

}  // namespace

struct UdpProxy::Impl {
  int listen_fd = -1;
  // relaxed everywhere: set before the first client's datagram can need it
  // (the server's clients learn the proxy's address after it is set).
  std::atomic<std::uint16_t> server_port{0};
  std::thread thread;
  std::atomic<bool> stopping{false};
  mutable std::mutex mutex;  // guards faults, the cut and counters
  ProxyFaults faults;
  std::vector<std::uint16_t> cut_ports;
  std::map<std::uint16_t, int> node_fds;  // a node's server port -> its proxy's socket
  CutSources cut_which = CutSources::kListed;
  ProxyCounters counters;

  // Proxy thread only.
  std::map<std::uint64_t, int> upstream_of;  // client address -> upstream fd
  std::map<int, sockaddr_in> client_of;      // upstream fd -> client address
  std::priority_queue<Scheduled, std::vector<Scheduled>, std::greater<>> queue;
  std::uint64_t sequence = 0;
  std::optional<Scheduled> held_up;    // reordering, client -> server
  std::optional<Scheduled> held_down;  // reordering, server -> client

  ~Impl() {
    for (const auto& [fd, address] : client_of) ::close(fd);
    if (listen_fd >= 0) ::close(listen_fd);
  }

  void send_now(const Destination& d, const Bytes& bytes) {
    if (d.to_address) {
      (void)::sendto(d.fd, bytes.data(), bytes.size(), 0, reinterpret_cast<const sockaddr*>(&d.to),
                     sizeof d.to);
    } else {
      (void)::send(d.fd, bytes.data(), bytes.size(), 0);  // fails while the server is down
    }
  }

  int upstream_for(const sockaddr_in& client) {
    const auto it = upstream_of.find(address_key(client));
    if (it != upstream_of.end()) return it->second;
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    const sockaddr_in server = server_address();
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&server), sizeof server) != 0) {
      ::close(fd);
      return -1;
    }
    upstream_of[address_key(client)] = fd;
    client_of[fd] = client;
    return fd;
  }

  // The socket of the proxy of the node at `from`, or -1 when `from` is no
  // registered node.
  int node_socket(const sockaddr_in& from) {
    std::lock_guard lock(mutex);
    const auto it = node_fds.find(ntohs(from.sin_port));
    return it == node_fds.end() ? -1 : it->second;
  }

  sockaddr_in server_address() const {
    sockaddr_in server{};
    server.sin_family = AF_INET;
    server.sin_port = htons(server_port.load(std::memory_order_relaxed));
    server.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return server;
  }

  // Whether the current cut drops traffic from or to the client at `peer`.
  bool cut_off(const sockaddr_in& peer) {
    const std::uint16_t port = ntohs(peer.sin_port);
    std::lock_guard lock(mutex);
    const bool listed = std::find(cut_ports.begin(), cut_ports.end(), port) != cut_ports.end();
    if (listed == (cut_which == CutSources::kListed)) {
      ++counters.cut;
      return true;
    }
    return false;
  }

  // Applies the current faults to one datagram.
  void forward(Random& random, const Destination& d, Bytes bytes, bool upstream) {
    ProxyFaults f;
    {
      std::lock_guard lock(mutex);
      f = faults;
    }
    const std::int64_t now = monotonic_ns();
    std::optional<Scheduled>& held = upstream ? held_up : held_down;
    const auto count = [&](std::uint64_t ProxyCounters::*field) {
      std::lock_guard lock(mutex);
      ++(counters.*field);
    };
    if (random.chance(f.loss)) {
      count(&ProxyCounters::dropped);
      return;
    }
    const int copies = random.chance(f.duplicate) ? 2 : 1;
    if (copies == 2) count(&ProxyCounters::duplicated);
    for (int c = 0; c < copies; ++c) {
      std::int64_t due = now;
      if (f.max_delay_ms > 0 && random.chance(f.delay)) {
        due += static_cast<std::int64_t>(random.next() %
                                         (static_cast<std::uint64_t>(f.max_delay_ms) * 1'000'000));
        count(&ProxyCounters::delayed);
      }
      Scheduled s{due, sequence++, d, bytes};
      if (!held && random.chance(f.reorder)) {
        // Released behind the next datagram in this direction, or after
        // 50 ms if none comes.
        s.due_ns = now + 50'000'000;
        held = std::move(s);
        count(&ProxyCounters::reordered);
        continue;
      }
      queue.push(std::move(s));
      if (held) {
        held->due_ns = due;  // right behind the datagram that overtook it
        held->sequence = sequence++;
        queue.push(std::move(*held));
        held.reset();
      }
    }
  }

  void flush_due(std::int64_t now) {
    for (std::optional<Scheduled>* held : {&held_up, &held_down}) {
      if (*held && (*held)->due_ns <= now) {
        queue.push(std::move(**held));
        held->reset();
      }
    }
    while (!queue.empty() && queue.top().due_ns <= now) {
      {
        // Counted before it leaves, so whoever receives it sees the count.
        std::lock_guard lock(mutex);
        ++counters.forwarded;
      }
      send_now(queue.top().where, queue.top().bytes);
      queue.pop();
    }
  }

  void run(std::uint64_t seed) {
    Random random(seed);
    Bytes buffer(65536);
    std::vector<pollfd> fds;
    while (!stopping.load(std::memory_order_relaxed)) {  // relaxed: a stop flag, joined after
      const std::int64_t now = monotonic_ns();
      flush_due(now);
      int timeout_ms = 20;
      if (!queue.empty()) {
        timeout_ms = static_cast<int>(
            std::clamp<std::int64_t>((queue.top().due_ns - now) / 1'000'000, 0, 20));
      }
      if (held_up || held_down) timeout_ms = std::min(timeout_ms, 5);
      fds.clear();
      fds.push_back({listen_fd, POLLIN, 0});
      for (const auto& [fd, address] : client_of) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) continue;
      for (const pollfd& p : fds) {
        if ((p.revents & POLLIN) == 0) continue;
        for (int round = 0; round < 64; ++round) {
          sockaddr_in from{};
          socklen_t from_len = sizeof from;
          const ssize_t n = ::recvfrom(p.fd, buffer.data(), buffer.size(), MSG_DONTWAIT,
                                       reinterpret_cast<sockaddr*>(&from), &from_len);
          if (n < 0) break;  // EAGAIN, or ECONNREFUSED while the server is down
          Bytes bytes(buffer.begin(), buffer.begin() + n);
          if (p.fd == listen_fd) {
            if (cut_off(from)) continue;
            if (const int node = node_socket(from); node >= 0) {
              forward(random, Destination{node, true, server_address()}, std::move(bytes), true);
              continue;
            }
            const int up = upstream_for(from);
            if (up >= 0) forward(random, Destination{up, false, {}}, std::move(bytes), true);
          } else {
            const sockaddr_in& client = client_of[p.fd];
            if (cut_off(client)) continue;
            forward(random, Destination{listen_fd, true, client}, std::move(bytes), false);
          }
        }
      }
    }
  }
};

UdpProxy::UdpProxy() : impl_(std::make_unique<Impl>()) {}
UdpProxy::~UdpProxy() { stop(); }

bool UdpProxy::start(std::uint16_t server_port, std::uint64_t seed) {
  impl_->server_port.store(server_port, std::memory_order_relaxed);
  impl_->listen_fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (impl_->listen_fd < 0) {
    error_ = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  const int buffer = 4 << 20;
  (void)::setsockopt(impl_->listen_fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(impl_->listen_fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    error_ = std::string("bind: ") + std::strerror(errno);
    return false;
  }
  port_ = ntohs(addr.sin_port);
  impl_->thread = std::thread([this, seed] { impl_->run(seed); });
  return true;
}

void UdpProxy::set_server_port(std::uint16_t server_port) noexcept {
  impl_->server_port.store(server_port, std::memory_order_relaxed);
}

void UdpProxy::stop() {
  impl_->stopping.store(true, std::memory_order_relaxed);  // relaxed: joined next
  if (impl_->thread.joinable()) impl_->thread.join();
}

void UdpProxy::set_faults(const ProxyFaults& faults) {
  std::lock_guard lock(impl_->mutex);
  impl_->faults = faults;
}

void UdpProxy::add_node(std::uint16_t server_port, const UdpProxy& its_proxy) {
  std::lock_guard lock(impl_->mutex);
  impl_->node_fds[server_port] = its_proxy.impl_->listen_fd;
}

void UdpProxy::set_cut(std::vector<std::uint16_t> ports, CutSources which) {
  std::lock_guard lock(impl_->mutex);
  impl_->cut_ports = std::move(ports);
  impl_->cut_which = which;
}

ProxyCounters UdpProxy::counters() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->counters;
}

}  // namespace shardlock::torture
