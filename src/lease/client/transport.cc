// The default DatagramTransport (a non-blocking UDP socket) and endpoint
// parsing: the datagram seam declared in call.h.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <string>

#include "shardlock/lease/client/call.h"
#include "wire/udp.h"

namespace shardlock::lease {

namespace {

class UdpTransport final : public DatagramTransport {
 public:
  UdpTransport(int fd, bool sealed) noexcept
      : fd_(fd), sealed_(sealed), segment_(internal::segmentation_supported(fd)) {}
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
    // retransmission timer covers it. Requests are independent of each
    // other, so they may leave in any order (grouped for segmentation).
    (void)internal::send_batched(
        fd_, datagrams.size(),
        [&](std::size_t i) {
          const Outgoing& d = datagrams[i];
          return internal::OutgoingView{&d.to->address, d.to->length, d.bytes,
                                        /*any_order=*/true};
        },
        segment_);
  }

  std::size_t receive(const std::function<void(std::span<const std::uint8_t>)>& deliver) override {
    std::size_t total = 0;
    // Bounded: at most kRounds x kBatch datagrams per call, so a flood cannot
    // keep the I/O thread from its timers.
    for (int round = 0; round < kRounds; ++round) {
      const std::size_t n = batch_.receive(fd_);
      for (std::size_t i = 0; i < n; ++i) {
        // A datagram larger than the buffer is truncated; the codec rejects it.
        if (batch_.truncated(i)) continue;
        const std::span<const std::uint8_t> bytes = batch_.bytes(i);
        if (bytes.size() > kHeaderFlagsOffset &&
            ((bytes[kHeaderFlagsOffset] & kFlagAuthenticated) != 0) != sealed_) {
          // The engine drops it too; counted here for the error message.
          // Relaxed: a statistic.
          auth_mismatches_.fetch_add(1, std::memory_order_relaxed);
        }
        deliver(bytes);
      }
      total += n;
      if (n < kBatch) break;
    }
    return total;
  }

  int fd() const noexcept override { return fd_; }

  TransportCounters counters() const noexcept override {
    // Relaxed: statistics, read for error messages.
    return {auth_mismatches_.load(std::memory_order_relaxed)};
  }

 private:
  static constexpr std::size_t kBatch = 32;
  static constexpr int kRounds = 8;
  int fd_;
  bool sealed_;   // the client seals its requests and expects sealed replies
  bool segment_;  // UDP_SEGMENT works (send_many() is the I/O thread's alone)
  std::atomic<std::uint64_t> auth_mismatches_{0};
  internal::ReceiveBatch<kBatch> batch_;
};

}  // namespace

std::error_code parse_endpoint(std::string_view text, Endpoint& out, std::string& detail) {
  // The text's form first, so a name that does not resolve (DNS down, a
  // typo in the host) is not reported as a malformed address.
  std::string host;
  std::uint16_t port = 0;
  const bool well_formed = internal::split_host_port(text, host, port) && port != 0;
  if (!internal::resolve_udp_address(text, /*passive=*/false, /*allow_port_zero=*/false,
                                     out.address, out.length, detail)) {
    return well_formed ? LeaseErrc::kUnreachable : LeaseErrc::kBadAddress;
  }
  out.text = std::string(text);
  return {};
}

std::error_code parse_endpoint(std::string_view text, Endpoint& out) {
  std::string detail;
  return parse_endpoint(text, out, detail);
}

std::error_code make_udp_transport(int family, std::unique_ptr<DatagramTransport>& out,
                                   bool sealed) {
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
  out = std::make_unique<UdpTransport>(fd, sealed);
  return {};
}

PortProbe probe_port(const Endpoint& to, std::chrono::milliseconds wait) {
  // A connected UDP socket learns of the ICMP port-unreachable its datagram
  // causes (an unconnected one, like the client's, does not); the empty
  // datagram is one the server drops and counts as malformed.
  const int fd = ::socket(to.address.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return PortProbe::kUnknown;
  PortProbe result = PortProbe::kUnknown;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&to.address), to.length) == 0 &&
      ::send(fd, "", 0, 0) == 0) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(wait.count()));
    char byte = 0;
    if (ready == 0) {
      result = PortProbe::kSilent;
    } else if (ready > 0 && ::recv(fd, &byte, 1, MSG_DONTWAIT) < 0) {
      result = errno == ECONNREFUSED ? PortProbe::kRefused : PortProbe::kUnknown;
    } else if (ready > 0) {
      result = PortProbe::kAnswered;
    }
  }
  ::close(fd);
  return result;
}

}  // namespace shardlock::lease
