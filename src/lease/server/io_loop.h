// The lease server's datagram loops. Private to src/lease/.
//
// A loop only moves datagrams: it receives batches from one UDP socket,
// hands each datagram to a DatagramSink (the server, which decodes and
// decides), calls the sink's tick about every kTickMs so timers fire, and
// sends what the sink produced in batches. Two implementations:
//   * run_socket_loop: poll + recvmmsg / sendmmsg;
//   * UringLoop: io_uring with a multishot recvmsg on a provided-buffer ring
//     (one submission receives until the buffers run out) and sendmsg SQEs
//     submitted together with the next wait.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "shardlock/lease/wire/internal/peer.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease::internal {

// How often an idle loop wakes to drive timers and notice stop().
inline constexpr int kTickMs = 2;

// Whether a busy-polling loop keeps spinning, and when it last ticked: the
// loops share the rule that timers are driven at most once per millisecond
// while spinning, so a spinning thread does not take every shard lock it
// owns on each empty poll.
class SpinWindow {
 public:
  using Clock = std::chrono::steady_clock;
  explicit SpinWindow(std::chrono::microseconds length) noexcept : length_(length) {}
  // A datagram arrived now: spin for the window's length from here.
  void on_activity(Clock::time_point now) noexcept { until_ = now + length_; }
  [[nodiscard]] bool spinning(Clock::time_point now) const noexcept {
    return length_.count() > 0 && now < until_;
  }
  // Whether to drive the timers now; call after each pass of the loop.
  [[nodiscard]] bool tick_due(Clock::time_point now) noexcept {
    if (now - last_tick_ < std::chrono::milliseconds(1) && spinning(now)) return false;
    last_tick_ = now;
    return true;
  }

 private:
  std::chrono::microseconds length_;
  Clock::time_point until_{};
  Clock::time_point last_tick_{};
};

struct OutDatagram {
  Peer peer;
  std::uint16_t length = 0;
  // It answers a client's request: it may leave before datagrams queued
  // ahead of it (OutgoingView::any_order), so replies of one size to one
  // client go out as one segmented send. Replication datagrams keep order.
  bool any_order = false;
  std::array<std::uint8_t, kMaxDatagramSize> bytes;
};

class DatagramSink {
 public:
  virtual ~DatagramSink() = default;
  // One received datagram from `peer`; appends replies to `out`.
  virtual void on_datagram(unsigned worker, std::span<const std::uint8_t> bytes, const Peer& peer,
                           std::vector<OutDatagram>& out) = 0;
  // A datagram the loop dropped before decoding (too large, truncated).
  virtual void on_oversized() = 0;
  // A reply the loop could not send: no send slot, the socket buffer full
  // (EAGAIN, ENOBUFS) or a failed send completion. Clients retransmit.
  virtual void on_send_drop() = 0;
  // A loop-level failure worth an operator's attention (one line).
  virtual void log(std::string_view line) = 0;
  // Drives the timers this worker owns; appends deferred replies to `out`.
  virtual void on_tick(unsigned worker, std::vector<OutDatagram>& out) = 0;
  // After the datagrams of one received batch, before its replies are sent:
  // what the batch started that goes out at once (the replication stream's
  // new entries, one datagram per backup for the whole batch).
  virtual void on_batch_end(unsigned /*worker*/, std::vector<OutDatagram>& /*out*/) {}
};

// How long a loop keeps polling without sleeping after its last datagram
// (LeaseServerOptions::busy_poll); zero: it sleeps at once.
using BusyPoll = std::chrono::microseconds;

// Serves `fd` until `stop` reads true.
void run_socket_loop(int fd, unsigned worker, DatagramSink& sink, const std::atomic<bool>& stop,
                     BusyPoll busy_poll = BusyPoll::zero());

class UringLoop {
 public:
  // Sets up a ring and a provided-buffer ring for `fd`. Fails (with a
  // one-line `detail`) when io_uring is missing, disabled by
  // kernel.io_uring_disabled, or lacks multishot recvmsg (kernel < 6.0).
  [[nodiscard]] static std::error_code create(int fd, std::unique_ptr<UringLoop>& out,
                                              std::string& detail);
  ~UringLoop();
  UringLoop(const UringLoop&) = delete;
  UringLoop& operator=(const UringLoop&) = delete;

  // Serves the socket until `stop` reads true. Call from one thread.
  void run(unsigned worker, DatagramSink& sink, const std::atomic<bool>& stop,
           BusyPoll busy_poll = BusyPoll::zero());

 private:
  struct State;
  explicit UringLoop(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace shardlock::lease::internal
