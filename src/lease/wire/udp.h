// What the server and the client share about UDP: one rule for "HOST:PORT"
// addresses, and the recvmmsg / sendmmsg batching. Private to src/lease/.
#pragma once

#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "shardlock/lease/wire/internal/peer.h"

namespace shardlock::lease::internal {

// The address rule: "HOST:PORT" or "[IPV6]:PORT", HOST a name or a numeric
// address, PORT 0..65535 in decimal. An unbracketed IPv6 address works when
// its last colon-group is the port ("::1:7000"), as getaddrinfo reads it.
// Splits `text` into host and port; false when it breaks the rule.
[[nodiscard]] bool split_host_port(std::string_view text, std::string& host, std::uint16_t& port);

// Resolves `text` (the rule above) to its first UDP address. `passive`:
// for bind (an empty host means any address). Port 0 is refused unless
// `allow_port_zero`. On failure returns false and says why in `detail`.
[[nodiscard]] bool resolve_udp_address(std::string_view text, bool passive, bool allow_port_zero,
                                       sockaddr_storage& out, socklen_t& length,
                                       std::string& detail);

// "1.2.3.4:5" or "[::1]:5".
[[nodiscard]] std::string format_address(const sockaddr_storage& address);
[[nodiscard]] std::uint16_t port_of(const sockaddr_storage& address) noexcept;
// Same family, address, port (and IPv6 scope).
[[nodiscard]] bool same_address(const sockaddr_storage& a, const sockaddr_storage& b) noexcept;

// What a busy-polling thread (server I/O loop, client I/O thread) does after
// an empty poll: yield rather than pause. With fewer free cores than
// spinning threads (a server and a client on one host), the thread that will
// produce the next datagram then gets the core at once.
inline void idle_while_polling() noexcept { ::sched_yield(); }

// Larger than any valid datagram (kMaxDatagramSize), so an oversized one is
// seen whole and dropped as malformed rather than silently cut.
inline constexpr std::size_t kReceiveBufferSize = 2048;

// Up to N datagrams received with one recvmmsg, with their sources.
template <std::size_t N>
class ReceiveBatch {
 public:
  // Receives what is queued (up to N) without blocking; returns how many
  // arrived (0 when none, or on error).
  std::size_t receive(int fd) noexcept {
    for (std::size_t i = 0; i < N; ++i) {
      iovs_[i] = {buffers_[i].data(), buffers_[i].size()};
      headers_[i] = {};
      headers_[i].msg_hdr.msg_name = &peers_[i].addr;
      headers_[i].msg_hdr.msg_namelen = sizeof(peers_[i].addr);
      headers_[i].msg_hdr.msg_iov = &iovs_[i];
      headers_[i].msg_hdr.msg_iovlen = 1;
    }
    const int n = ::recvmmsg(fd, headers_.data(), N, MSG_DONTWAIT, nullptr);
    if (n <= 0) return 0;
    for (int i = 0; i < n; ++i) peers_[i].len = headers_[i].msg_hdr.msg_namelen;
    return static_cast<std::size_t>(n);
  }
  // Datagram i was larger than the buffer (and cut).
  [[nodiscard]] bool truncated(std::size_t i) const noexcept {
    return (headers_[i].msg_hdr.msg_flags & MSG_TRUNC) != 0;
  }
  [[nodiscard]] std::span<const std::uint8_t> bytes(std::size_t i) const noexcept {
    return {buffers_[i].data(), headers_[i].msg_len};
  }
  [[nodiscard]] const Peer& peer(std::size_t i) const noexcept { return peers_[i]; }

 private:
  std::array<std::array<std::uint8_t, kReceiveBufferSize>, N> buffers_;
  std::array<Peer, N> peers_;
  std::array<mmsghdr, N> headers_;
  std::array<iovec, N> iovs_;
};

// One datagram to send: where to, and the bytes.
struct OutgoingView {
  const void* address = nullptr;
  socklen_t address_length = 0;
  std::span<const std::uint8_t> bytes;
};

// Sends datagrams view(0) .. view(count - 1) with sendmmsg, kBatch at a
// time, without blocking. A datagram the kernel refuses (EAGAIN / ENOBUFS:
// the socket buffer is full; or an error for its destination) is lost, as
// any UDP datagram may be, and skipped rather than retried. Returns how many
// were lost.
template <class View>
std::size_t send_batched(int fd, std::size_t count, View&& view) noexcept {
  constexpr std::size_t kBatch = 64;
  std::array<mmsghdr, kBatch> headers;
  std::array<iovec, kBatch> iovs;
  std::size_t lost = 0;
  std::size_t next = 0;
  while (next < count) {
    const std::size_t n = std::min(kBatch, count - next);
    for (std::size_t i = 0; i < n; ++i) {
      const OutgoingView d = view(next + i);
      iovs[i] = {const_cast<std::uint8_t*>(d.bytes.data()), d.bytes.size()};
      headers[i] = {};
      headers[i].msg_hdr.msg_name = const_cast<void*>(d.address);
      headers[i].msg_hdr.msg_namelen = d.address_length;
      headers[i].msg_hdr.msg_iov = &iovs[i];
      headers[i].msg_hdr.msg_iovlen = 1;
    }
    const int sent = ::sendmmsg(fd, headers.data(), static_cast<unsigned>(n), MSG_DONTWAIT);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) {
      ++lost;  // the first of the batch failed; the rest get their own try
      ++next;
      continue;
    }
    next += static_cast<std::size_t>(sent);
  }
  return lost;
}

}  // namespace shardlock::lease::internal
