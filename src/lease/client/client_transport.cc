// The default DatagramTransport (a non-blocking UDP socket), endpoint
// parsing, the client error category and client id formatting.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>

#include "shardlock/lease/client/client.h"
#include "wire/udp.h"

namespace shardlock::lease {

namespace {

class LeaseCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "shardlock.lease.client"; }
  std::string message(int value) const override {
    return std::string(to_string(static_cast<LeaseErrc>(value)));
  }
};

class UdpTransport final : public DatagramTransport {
 public:
  explicit UdpTransport(int fd) noexcept : fd_(fd) {}
  ~UdpTransport() override { ::close(fd_); }
  UdpTransport(const UdpTransport&) = delete;
  UdpTransport& operator=(const UdpTransport&) = delete;

  std::error_code send(const Endpoint& to, std::span<const std::uint8_t> bytes) override {
    const ssize_t n = ::sendto(fd_, bytes.data(), bytes.size(), MSG_DONTWAIT,
                               reinterpret_cast<const sockaddr*>(&to.address), to.length);
    if (n < 0) return {errno, std::system_category()};
    return {};
  }

  void send_many(std::span<const Outgoing> datagrams) override {
    // A datagram the kernel refused (buffer full) is a lost datagram: the
    // retransmission timer covers it.
    (void)internal::send_batched(fd_, datagrams.size(), [&](std::size_t i) {
      const Outgoing& d = datagrams[i];
      return internal::OutgoingView{&d.to->address, d.to->length, d.bytes};
    });
  }

  std::size_t receive(const std::function<void(std::span<const std::uint8_t>)>& deliver) override {
    std::size_t total = 0;
    // Bounded: at most kRounds x kBatch datagrams per call, so a flood cannot
    // keep the I/O thread from its timers.
    for (int round = 0; round < kRounds; ++round) {
      const std::size_t n = batch_.receive(fd_);
      for (std::size_t i = 0; i < n; ++i) {
        // A datagram larger than the buffer is truncated; the codec rejects it.
        if (!batch_.truncated(i)) deliver(batch_.bytes(i));
      }
      total += n;
      if (n < kBatch) break;
    }
    return total;
  }

  int fd() const noexcept override { return fd_; }

 private:
  static constexpr std::size_t kBatch = 32;
  static constexpr int kRounds = 8;
  int fd_;
  internal::ReceiveBatch<kBatch> batch_;
};

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string_view to_string(LeaseErrc e) noexcept {
  switch (e) {
    case LeaseErrc::kOk:
      return "ok";
    case LeaseErrc::kBusy:
      return "busy";
    case LeaseErrc::kTimeout:
      return "timeout";
    case LeaseErrc::kUnreachable:
      return "unreachable";
    case LeaseErrc::kRecovering:
      return "recovering";
    case LeaseErrc::kNotOwner:
      return "not owner";
    case LeaseErrc::kExpired:
      return "expired";
    case LeaseErrc::kServerError:
      return "server error";
    case LeaseErrc::kBadArgument:
      return "bad argument";
    case LeaseErrc::kNotStarted:
      return "client not started";
    case LeaseErrc::kBadAddress:
      return "bad address";
    case LeaseErrc::kLeaseInactive:
      return "lease not held";
    case LeaseErrc::kGrantExpired:
      return "grant expired";
    case LeaseErrc::kCrossNode:
      return "keys owned by different nodes";
    case LeaseErrc::kRedirected:
      return "redirected: the key's owner node was not reached";
  }
  return "unknown";
}

const std::error_category& lease_category() noexcept {
  static const LeaseCategory category;
  return category;
}

std::error_code parse_endpoint(std::string_view text, Endpoint& out) {
  std::string detail;
  if (!internal::resolve_udp_address(text, /*passive=*/false, /*allow_port_zero=*/false,
                                     out.address, out.length, detail)) {
    return LeaseErrc::kBadAddress;
  }
  out.text = std::string(text);
  return {};
}

LeaseClock::time_point LeaseClock::now() noexcept {
  timespec ts{};
  // CLOCK_BOOTTIME cannot fail on Linux >= 2.6.39 with a valid pointer.
  (void)::clock_gettime(CLOCK_BOOTTIME, &ts);
  return time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

std::error_code make_udp_transport(int family, std::unique_ptr<DatagramTransport>& out) {
  const int fd = ::socket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return {errno, std::system_category()};
  // Room for a burst of replies while the I/O thread is busy with completions.
  const int buffer = 4 << 20;
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  sockaddr_storage any{};
  socklen_t length = 0;
  if (family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&any);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    length = sizeof(sockaddr_in6);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&any);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    length = sizeof(sockaddr_in);
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&any), length) != 0) {
    const int saved = errno;
    ::close(fd);
    return {saved, std::system_category()};
  }
  out = std::make_unique<UdpTransport>(fd);
  return {};
}

std::vector<std::string> split_node_list(std::string_view text) {
  std::vector<std::string> nodes;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    if (comma > start) nodes.emplace_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return nodes;
}

ClientId random_client_id() noexcept {
  std::array<std::uint64_t, 2> words{};
  if (::getrandom(words.data(), sizeof words, 0) != static_cast<ssize_t>(sizeof words)) return {};
  return ClientId{words[0], words[1]};
}

std::string to_hex(const ClientId& id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text(32, '0');
  for (int i = 0; i < 16; ++i) {
    text[static_cast<std::size_t>(15 - i)] = kDigits[(id.hi >> (4 * i)) & 0xF];
    text[static_cast<std::size_t>(31 - i)] = kDigits[(id.lo >> (4 * i)) & 0xF];
  }
  return text;
}

std::optional<ClientId> parse_client_id(std::string_view hex) noexcept {
  if (hex.size() != 32) return std::nullopt;
  ClientId id;
  for (std::size_t i = 0; i < 32; ++i) {
    const int v = hex_value(hex[i]);
    if (v < 0) return std::nullopt;
    std::uint64_t& half = i < 16 ? id.hi : id.lo;
    half = (half << 4) | static_cast<std::uint64_t>(v);
  }
  return id;
}

}  // namespace shardlock::lease
