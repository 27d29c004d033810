// The default DatagramTransport (a non-blocking UDP socket) and endpoint
// parsing: the datagram seam declared in call.h.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>

#include "shardlock/lease/client/call.h"
#include "wire/udp.h"

namespace shardlock::lease {

namespace {

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

}  // namespace

std::error_code parse_endpoint(std::string_view text, Endpoint& out) {
  std::string detail;
  if (!internal::resolve_udp_address(text, /*passive=*/false, /*allow_port_zero=*/false,
                                     out.address, out.length, detail)) {
    return LeaseErrc::kBadAddress;
  }
  out.text = std::string(text);
  return {};
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

}  // namespace shardlock::lease
