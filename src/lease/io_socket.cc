// The portable datagram loop: poll, then recvmmsg / sendmmsg in batches.
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "io_loop.h"

namespace shardlock::lease::internal {
namespace {

constexpr unsigned kRecvBatch = 32;
constexpr unsigned kSendBatch = 64;
// Larger than any valid datagram, so an oversized one is seen whole (and
// dropped as malformed) rather than silently cut.
constexpr std::size_t kRecvBufferSize = 2048;
// Receive batches per wake-up before timers get their turn.
constexpr int kRecvRoundsPerTick = 16;

void send_all(int fd, std::vector<OutDatagram>& out, DatagramSink& sink) {
  std::array<mmsghdr, kSendBatch> msgs;
  std::array<iovec, kSendBatch> iovs;
  std::size_t next = 0;
  while (next < out.size()) {
    const unsigned n = static_cast<unsigned>(std::min<std::size_t>(kSendBatch, out.size() - next));
    for (unsigned i = 0; i < n; ++i) {
      OutDatagram& d = out[next + i];
      iovs[i] = {d.bytes.data(), d.length};
      msgs[i] = {};
      msgs[i].msg_hdr.msg_name = &d.peer.addr;
      msgs[i].msg_hdr.msg_namelen = d.peer.len;
      msgs[i].msg_hdr.msg_iov = &iovs[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    const int sent = ::sendmmsg(fd, msgs.data(), n, MSG_DONTWAIT);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) {
      // EAGAIN or ENOBUFS (socket buffer full) or a per-destination error
      // for the first datagram: it is lost, as any UDP datagram may be, and
      // counted; clients retransmit.
      sink.on_send_drop();
      ++next;
      continue;
    }
    next += static_cast<std::size_t>(sent);
  }
  out.clear();
}

}  // namespace

void run_socket_loop(int fd, unsigned worker, DatagramSink& sink, const std::atomic<bool>& stop) {
  std::vector<std::array<std::uint8_t, kRecvBufferSize>> buffers(kRecvBatch);
  std::array<Peer, kRecvBatch> peers;
  std::array<mmsghdr, kRecvBatch> msgs;
  std::array<iovec, kRecvBatch> iovs;
  std::vector<OutDatagram> out;
  out.reserve(std::size_t{kRecvBatch} * 2);

  // Relaxed: stop only asks the loop to finish; LeaseServer::stop() joins
  // the thread, which orders everything after it.
  while (!stop.load(std::memory_order_relaxed)) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, kTickMs);
    for (int round = 0; ready > 0 && round < kRecvRoundsPerTick; ++round) {
      for (unsigned i = 0; i < kRecvBatch; ++i) {
        iovs[i] = {buffers[i].data(), buffers[i].size()};
        msgs[i] = {};
        msgs[i].msg_hdr.msg_name = &peers[i].addr;
        msgs[i].msg_hdr.msg_namelen = sizeof(peers[i].addr);
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
      const int n = ::recvmmsg(fd, msgs.data(), kRecvBatch, MSG_DONTWAIT, nullptr);
      if (n <= 0) break;
      for (int i = 0; i < n; ++i) {
        peers[i].len = msgs[i].msg_hdr.msg_namelen;
        if ((msgs[i].msg_hdr.msg_flags & MSG_TRUNC) != 0) {
          sink.on_oversized();
          continue;
        }
        sink.on_datagram(worker, {buffers[i].data(), msgs[i].msg_len}, peers[i], out);
      }
      send_all(fd, out, sink);
      if (static_cast<unsigned>(n) < kRecvBatch) break;
    }
    sink.on_tick(worker, out);
    send_all(fd, out, sink);
  }
}

}  // namespace shardlock::lease::internal
