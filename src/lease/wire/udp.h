// What the server and the client share about UDP: one rule for "HOST:PORT"
// addresses, and the recvmmsg / sendmmsg batching. Private to src/lease/.
#pragma once

#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
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

// One datagram to send: where to, and the bytes. `any_order`: it answers
// (or is) an independent request, so it may leave before datagrams queued
// ahead of it; others (the replication stream's) keep their order.
struct OutgoingView {
  const void* address = nullptr;
  socklen_t address_length = 0;
  std::span<const std::uint8_t> bytes;
  bool any_order = false;
};

// UDP segmentation offload (UDP_SEGMENT, Linux 4.18): datagrams to one
// address of one size (the last may be shorter) go to the kernel as one
// buffer with a segment size, and travel the stack as one packet as far as
// the device (loopback: the receiving socket), which cuts it into the same
// datagrams. One request per datagram on the wire still; what is saved is the
// per-datagram cost of the send path (a msghdr copied in, a route lookup, an
// skb built and queued, the loopback's receive softirq). At most kMaxSegments
// datagrams (UDP_MAX_SEGMENTS) and kMaxSegmentedBytes (one IP packet's
// payload) per send.
//
// Only datagrams of at most kMaxSegmentSize bytes are segmented: those
// carrying one request or a few, whose send costs more than their work.
// Runs of datagrams packed with many requests (shardlock-bench's default,
// about 1 KB each) lost throughput when segmented (about 0.75x; they arrive
// together, so the server cannot start on the first while the next is sent),
// while runs of one-request datagrams gained 1.6x.
inline constexpr std::size_t kMaxSegments = 64;
inline constexpr std::size_t kMaxSegmentedBytes = 65'000;
inline constexpr std::size_t kMaxSegmentSize = 256;

// Whether `fd`, a UDP socket, can send with UDP_SEGMENT: asked of the kernel,
// which refuses an option it does not know. (A kernel that lacks it would
// ignore the control message and send the run as one datagram, so no run is
// built unless this says yes.)
[[nodiscard]] bool segmentation_supported(int fd) noexcept;

// Writes the UDP_SEGMENT control message for `segment_size` into `control`
// (SegmentControl) and points `header` at it.
struct alignas(cmsghdr) SegmentControl {
  std::array<char, CMSG_SPACE(sizeof(std::uint16_t))> bytes{};
};
void set_segment_size(msghdr& header, SegmentControl& control, std::uint16_t segment_size) noexcept;

// The order and grouping of up to N datagrams to send: any_order ones sorted
// by address and size, largest first, after the others (which keep their
// order), then cut into runs: consecutive datagrams to one address, all of
// the first's size (at most kMaxSegmentSize) but the last, which may be
// shorter (the kernel's rule for segments). Without `segment` every datagram is a run of its own,
// in the order given.
template <std::size_t N>
class SendPlan {
 public:
  struct Run {
    std::uint16_t begin = 0;  // positions in order()
    std::uint16_t end = 0;
    [[nodiscard]] std::size_t size() const noexcept { return end - begin; }
  };

  // Plans views[0, n); returns the number of runs.
  std::size_t plan(const std::array<OutgoingView, N>& views, std::size_t n, bool segment) noexcept {
    for (std::size_t i = 0; i < n; ++i) order_[i] = static_cast<std::uint16_t>(i);
    if (!segment) {
      for (std::size_t i = 0; i < n; ++i) {
        runs_[i] = {static_cast<std::uint16_t>(i), static_cast<std::uint16_t>(i + 1)};
      }
      return n;
    }
    std::stable_sort(order_.begin(), order_.begin() + n, [&](std::uint16_t x, std::uint16_t y) {
      const OutgoingView& a = views[x];
      const OutgoingView& b = views[y];
      if (a.any_order != b.any_order) return b.any_order;
      if (!a.any_order) return false;
      if (const int c = compare_address(a, b); c != 0) return c < 0;
      return a.bytes.size() > b.bytes.size();
    });
    std::size_t runs = 0;
    for (std::size_t k = 0; k < n;) {
      const OutgoingView& first = views[order_[k]];
      std::size_t end = k + 1;
      std::size_t bytes = first.bytes.size();
      while (end < n && end - k < kMaxSegments && first.bytes.size() <= kMaxSegmentSize) {
        const OutgoingView& d = views[order_[end]];
        if (d.bytes.size() > first.bytes.size() || bytes + d.bytes.size() > kMaxSegmentedBytes ||
            compare_address(first, d) != 0) {
          break;
        }
        bytes += d.bytes.size();
        ++end;
        if (d.bytes.size() < first.bytes.size()) break;  // a shorter one ends the run
      }
      runs_[runs++] = {static_cast<std::uint16_t>(k), static_cast<std::uint16_t>(end)};
      k = end;
    }
    return runs;
  }

  [[nodiscard]] std::size_t order(std::size_t position) const noexcept { return order_[position]; }
  [[nodiscard]] const Run& run(std::size_t r) const noexcept { return runs_[r]; }

 private:
  static int compare_address(const OutgoingView& a, const OutgoingView& b) noexcept {
    if (a.address_length != b.address_length) return a.address_length < b.address_length ? -1 : 1;
    return std::memcmp(a.address, b.address, a.address_length);
  }

  std::array<std::uint16_t, N> order_{};
  std::array<Run, N> runs_{};
};

// Whether a failed send may have failed for its own reason (a full buffer,
// a signal) rather than because the route cannot segment.
[[nodiscard]] inline bool transient_send_error(int error) noexcept {
  return error == EAGAIN || error == EWOULDBLOCK || error == ENOBUFS || error == EINTR;
}

// Sends datagrams view(0) .. view(count - 1) with sendmmsg, kBatch at a
// time, without blocking; with `segment` (segmentation_supported()), runs of
// them as one segmented message each (SendPlan). A datagram the kernel
// refuses (EAGAIN / ENOBUFS: the socket buffer is full; or an error for its
// destination) is lost, as any UDP datagram may be, and skipped rather than
// retried. A run refused for another reason (a device without checksum
// offload, a path MTU below the segment size) turns `segment` off for the
// socket and goes out one datagram at a time. Returns how many were lost.
template <class View>
std::size_t send_batched(int fd, std::size_t count, View&& view, bool& segment) noexcept {
  constexpr std::size_t kBatch = 64;
  std::array<OutgoingView, kBatch> views;
  SendPlan<kBatch> plan;
  std::array<mmsghdr, kBatch> headers;
  std::array<iovec, kBatch> iovs;
  std::array<SegmentControl, kBatch> controls;
  std::size_t lost = 0;
  const auto prepare = [&](std::size_t m, const SendPlan<kBatch>::Run& run) {
    const OutgoingView& first = views[plan.order(run.begin)];
    for (std::size_t p = run.begin; p < run.end; ++p) {
      const OutgoingView& d = views[plan.order(p)];
      iovs[p] = {const_cast<std::uint8_t*>(d.bytes.data()), d.bytes.size()};
    }
    headers[m] = {};
    msghdr& h = headers[m].msg_hdr;
    h.msg_name = const_cast<void*>(first.address);
    h.msg_namelen = first.address_length;
    h.msg_iov = &iovs[run.begin];
    h.msg_iovlen = run.size();
    if (run.size() > 1) {
      set_segment_size(h, controls[m], static_cast<std::uint16_t>(first.bytes.size()));
    }
  };
  for (std::size_t next = 0; next < count;) {
    const std::size_t n = std::min(kBatch, count - next);
    for (std::size_t i = 0; i < n; ++i) views[i] = view(next + i);
    next += n;
    const std::size_t runs = plan.plan(views, n, segment);
    for (std::size_t r = 0; r < runs; ++r) prepare(r, plan.run(r));
    for (std::size_t done = 0; done < runs;) {
      const int sent =
          ::sendmmsg(fd, &headers[done], static_cast<unsigned>(runs - done), MSG_DONTWAIT);
      if (sent > 0) {
        done += static_cast<std::size_t>(sent);
        continue;
      }
      const int error = sent < 0 ? errno : EAGAIN;
      if (error == EINTR) continue;
      const SendPlan<kBatch>::Run run = plan.run(done++);
      if (run.size() == 1 || transient_send_error(error)) {
        lost += run.size();  // the first of the rest failed; the others get their own try
        continue;
      }
      segment = false;
      for (std::size_t p = run.begin; p < run.end; ++p) {
        const OutgoingView& d = views[plan.order(p)];
        if (::sendto(fd, d.bytes.data(), d.bytes.size(), MSG_DONTWAIT,
                     static_cast<const sockaddr*>(d.address), d.address_length) < 0) {
          ++lost;
        }
      }
    }
  }
  return lost;
}

}  // namespace shardlock::lease::internal
