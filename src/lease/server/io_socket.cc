// The portable datagram loop: poll, then recvmmsg / sendmmsg in batches.
#include <poll.h>
#include <sys/socket.h>

#include <memory>

#include "server/io_loop.h"
#include "wire/udp.h"

namespace shardlock::lease::internal {
namespace {

constexpr std::size_t kRecvBatch = 32;
// Receive batches per wake-up before timers get their turn.
constexpr int kRecvRoundsPerTick = 16;

// Sends and clears `out`; each datagram the kernel refuses is counted.
void send_all(int fd, std::vector<OutDatagram>& out, DatagramSink& sink, bool& segment) {
  const std::size_t lost = send_batched(
      fd, out.size(),
      [&](std::size_t i) {
        const OutDatagram& d = out[i];
        return OutgoingView{&d.peer.addr, d.peer.len, {d.bytes.data(), d.length}, d.any_order};
      },
      segment);
  for (std::size_t i = 0; i < lost; ++i) sink.on_send_drop();
  out.clear();
}

}  // namespace

void run_socket_loop(int fd, unsigned worker, DatagramSink& sink, const std::atomic<bool>& stop,
                     BusyPoll busy_poll) {
  SpinWindow spin(busy_poll);
  auto batch = std::make_unique<ReceiveBatch<kRecvBatch>>();
  std::vector<OutDatagram> out;
  out.reserve(std::size_t{kRecvBatch} * 2);
  bool segment = segmentation_supported(fd);

  // Relaxed: stop only asks the loop to finish; LeaseServer::stop() joins
  // the thread, which orders everything after it.
  while (!stop.load(std::memory_order_relaxed)) {
    // While spinning, try the socket directly (recvmmsg returns at once
    // when it is empty); otherwise sleep in poll until data or the tick.
    const bool spinning = spin.spinning(SpinWindow::Clock::now());
    bool ready = spinning;
    if (!ready) {
      pollfd p{fd, POLLIN, 0};
      ready = ::poll(&p, 1, kTickMs) > 0;
    }
    for (int round = 0; ready && round < kRecvRoundsPerTick; ++round) {
      const std::size_t n = batch->receive(fd);
      if (n > 0) spin.on_activity(SpinWindow::Clock::now());
      if (n == 0 && spinning && round == 0) idle_while_polling();
      for (std::size_t i = 0; i < n; ++i) {
        if (batch->truncated(i)) {
          sink.on_oversized();
          continue;
        }
        sink.on_datagram(worker, batch->bytes(i), batch->peer(i), out);
      }
      if (n > 0) sink.on_batch_end(worker, out);
      send_all(fd, out, sink, segment);
      if (n < kRecvBatch) break;
    }
    if (spin.tick_due(SpinWindow::Clock::now())) {
      sink.on_tick(worker, out);
      send_all(fd, out, sink, segment);
    }
  }
}

}  // namespace shardlock::lease::internal
