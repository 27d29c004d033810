// The io_uring datagram loop (liburing).
//
//   * Receive: one multishot IORING_OP_RECVMSG with IOSQE_BUFFER_SELECT keeps
//     producing a CQE per datagram into buffers the kernel picks from a
//     provided-buffer ring (kBufferCount buffers). Each buffer holds an
//     io_uring_recvmsg_out header, the peer address, then the payload. A
//     buffer goes back to the ring as soon as its datagram is handled (the
//     replies are encoded by then). The multishot request is re-armed when a
//     CQE arrives without IORING_CQE_F_MORE (e.g. after -ENOBUFS).
//   * Send: each reply is copied into a send slot; replies of one size to
//     one client go out as one sendmsg SQE with UDP_SEGMENT (SendPlan in
//     wire/udp.h: the kernel cuts it into the same datagrams), the others
//     one SQE each. All of a wake-up's SQEs go to the kernel in the single
//     io_uring_submit_and_wait_timeout() that also waits for the next CQEs.
//   * Wake-ups: at least every kTickMs (the wait's timeout) to drive timers.
#include <liburing.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "server/io_loop.h"
#include "shardlock/lease/server/server.h"
#include "wire/udp.h"

namespace shardlock::lease::internal {
namespace {

constexpr unsigned kRingEntries = 512;
constexpr unsigned kBufferCount = 256;  // power of two (buffer ring requirement)
constexpr unsigned kBufferGroup = 1;
constexpr std::size_t kPayloadRoom = 2048;  // > kMaxDatagramSize: oversize is seen, then dropped
constexpr std::size_t kBufferSize =
    sizeof(io_uring_recvmsg_out) + sizeof(sockaddr_in6) + kPayloadRoom;
constexpr unsigned kSendSlots = 256;
constexpr std::uint64_t kRecvTag = ~std::uint64_t{0};
constexpr std::uint64_t kCancelTag = kRecvTag - 1;

// What the loop needs from the ring, asked of the kernel rather than read
// from its version (distribution kernels backport io_uring). EXT_ARG:
// io_uring_submit_and_wait_timeout() waits without a timeout SQE. FAST_POLL:
// a recvmsg on an empty socket is polled, not parked on a kernel worker.
// Multishot recvmsg has no opcode or feature bit of its own; it came in 6.0
// with IORING_OP_SEND_ZC, so that opcode stands for it in the probe. The
// provided-buffer ring is checked when it is registered.
constexpr unsigned kRequiredFeatures = IORING_FEAT_EXT_ARG | IORING_FEAT_FAST_POLL;
constexpr std::pair<int, const char*> kRequiredOps[] = {
    {IORING_OP_RECVMSG, "RECVMSG"},
    {IORING_OP_SENDMSG, "SENDMSG"},
    {IORING_OP_SEND_ZC, "SEND_ZC (multishot recvmsg)"}};

// Empty when `ring` (created with `features`) can run the loop; otherwise
// what it lacks.
std::string missing_support(io_uring& ring, unsigned features) {
  if ((features & kRequiredFeatures) != kRequiredFeatures) {
    return "io_uring lacks IORING_FEAT_EXT_ARG or IORING_FEAT_FAST_POLL";
  }
  io_uring_probe* probe = io_uring_get_probe_ring(&ring);
  if (probe == nullptr) return "io_uring_get_probe_ring failed (no opcode probe)";
  std::string missing;
  for (const auto& [op, name] : kRequiredOps) {
    if (!io_uring_opcode_supported(probe, op)) missing += std::string(" ") + name;
  }
  io_uring_free_probe(probe);
  return missing.empty() ? missing : "io_uring lacks opcodes:" + missing;
}

}  // namespace

struct UringLoop::State {
  int fd = -1;
  io_uring ring{};
  bool ring_ready = false;
  io_uring_buf_ring* buffer_ring = nullptr;
  std::size_t buffer_ring_bytes = 0;
  bool buffer_ring_registered = false;
  std::unique_ptr<std::uint8_t[]> buffers;
  msghdr recv_template{};  // tells the kernel how much name/control room each buffer reserves

  // One datagram; the first of a segmented run also carries the run's
  // message, whose other datagrams sit in `followers`' slots.
  struct SendSlot {
    msghdr msg{};
    std::array<iovec, kMaxSegments> iovs{};
    SegmentControl control;
    std::array<std::uint32_t, kMaxSegments - 1> followers{};
    std::size_t follower_count = 0;
    OutDatagram datagram;
  };
  std::vector<SendSlot> send_slots;
  std::vector<std::uint32_t> free_slots;
  bool segment = false;  // UDP_SEGMENT works on this socket (segmentation_supported())

  ~State() {
    if (buffer_ring_registered) io_uring_unregister_buf_ring(&ring, kBufferGroup);
    if (ring_ready) io_uring_queue_exit(&ring);
    if (buffer_ring != nullptr) ::munmap(buffer_ring, buffer_ring_bytes);
  }

  std::uint8_t* buffer(unsigned id) { return buffers.get() + std::size_t{id} * kBufferSize; }

  void recycle(unsigned id) {
    io_uring_buf_ring_add(buffer_ring, buffer(id), kBufferSize, static_cast<unsigned short>(id),
                          io_uring_buf_ring_mask(kBufferCount), 0);
    io_uring_buf_ring_advance(buffer_ring, 1);
  }

  io_uring_sqe* sqe() {
    io_uring_sqe* s = io_uring_get_sqe(&ring);
    if (s == nullptr) {
      io_uring_submit(&ring);  // the SQ is full: hand it to the kernel
      s = io_uring_get_sqe(&ring);
    }
    return s;
  }

  bool arm_receive() {
    io_uring_sqe* s = sqe();
    if (s == nullptr) return false;
    io_uring_prep_recvmsg_multishot(s, fd, &recv_template, 0);
    s->flags |= IOSQE_BUFFER_SELECT;
    s->buf_group = kBufferGroup;
    io_uring_sqe_set_data64(s, kRecvTag);
    return true;
  }

  // Ends every request on the socket and waits (bounded) for their last
  // completions. A request still armed when the ring is torn down keeps the
  // socket open until the kernel's asynchronous ring clean-up runs, so a
  // server restarted at once found its port still bound (EADDRINUSE).
  void drain() {
    if (io_uring_sqe* s = sqe(); s != nullptr) {
      io_uring_prep_cancel_fd(s, fd, IORING_ASYNC_CANCEL_ALL);
      io_uring_sqe_set_data64(s, kCancelTag);
    }
    bool receive_ended = false;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while ((!receive_ended || free_slots.size() < kSendSlots) &&
           std::chrono::steady_clock::now() < give_up) {
      __kernel_timespec timeout{0, 10'000'000};
      io_uring_cqe* first = nullptr;
      (void)io_uring_submit_and_wait_timeout(&ring, &first, 1, &timeout, nullptr);
      unsigned head = 0;
      unsigned seen = 0;
      io_uring_cqe* cqe = nullptr;
      io_uring_for_each_cqe(&ring, head, cqe) {
        ++seen;
        const std::uint64_t tag = io_uring_cqe_get_data64(cqe);
        if (tag == kRecvTag) {
          if ((cqe->flags & IORING_CQE_F_MORE) == 0) receive_ended = true;
        } else if (tag != kCancelTag) {
          release(static_cast<std::uint32_t>(tag));
        }
      }
      io_uring_cq_advance(&ring, seen);
    }
  }

  // Queues the sendmsg of the run that starts in slot `head` (its
  // followers set), tagged with `head`.
  bool queue_message(std::uint32_t head) {
    io_uring_sqe* s = sqe();
    if (s == nullptr) return false;
    SendSlot& slot = send_slots[head];
    slot.iovs[0] = {slot.datagram.bytes.data(), slot.datagram.length};
    for (std::size_t f = 0; f < slot.follower_count; ++f) {
      OutDatagram& d = send_slots[slot.followers[f]].datagram;
      slot.iovs[f + 1] = {d.bytes.data(), d.length};
    }
    slot.msg = {};
    slot.msg.msg_name = &slot.datagram.peer.addr;
    slot.msg.msg_namelen = slot.datagram.peer.len;
    slot.msg.msg_iov = slot.iovs.data();
    slot.msg.msg_iovlen = slot.follower_count + 1;
    if (slot.follower_count > 0) set_segment_size(slot.msg, slot.control, slot.datagram.length);
    io_uring_prep_sendmsg(s, fd, &slot.msg, 0);
    io_uring_sqe_set_data64(s, head);
    return true;
  }

  // Returns the slots of the run that started in `head`.
  void release(std::uint32_t head) {
    SendSlot& slot = send_slots[head];
    for (std::size_t f = 0; f < slot.follower_count; ++f) free_slots.push_back(slot.followers[f]);
    slot.follower_count = 0;
    free_slots.push_back(head);
  }

  // A send finished with `result`. A failed one is lost (-ENOBUFS: the
  // client retransmits), unless a segmented run failed for want of
  // segmentation (no checksum offload, a path MTU below the size): then
  // segmentation stops and its datagrams go again one by one.
  void on_sent(std::uint32_t head, int result, DatagramSink& sink) {
    SendSlot& slot = send_slots[head];
    if (result < 0 && slot.follower_count > 0 && !transient_send_error(-result)) {
      segment = false;
      const std::size_t count = slot.follower_count;
      slot.follower_count = 0;
      const std::array<std::uint32_t, kMaxSegments - 1> followers = slot.followers;
      if (!queue_message(head)) release_lost(head, sink);
      for (std::size_t f = 0; f < count; ++f) {
        if (!queue_message(followers[f])) release_lost(followers[f], sink);
      }
      return;
    }
    if (result < 0) {
      for (std::size_t i = 0; i <= slot.follower_count; ++i) sink.on_send_drop();
    }
    release(head);
  }

  void release_lost(std::uint32_t head, DatagramSink& sink) {
    for (std::size_t i = 0; i <= send_slots[head].follower_count; ++i) sink.on_send_drop();
    release(head);
  }

  // Queues `out` as sendmsg SQEs, a run of one size to one client per SQE;
  // a run without enough free slots or an SQE is dropped and counted (the
  // client retransmits).
  void queue_sends(std::vector<OutDatagram>& out, DatagramSink& sink) {
    constexpr std::size_t kBatch = 64;
    std::array<OutgoingView, kBatch> views;
    SendPlan<kBatch> plan;
    for (std::size_t next = 0; next < out.size();) {
      const std::size_t n = std::min(kBatch, out.size() - next);
      for (std::size_t i = 0; i < n; ++i) {
        const OutDatagram& d = out[next + i];
        views[i] = {&d.peer.addr, d.peer.len, {d.bytes.data(), d.length}, d.any_order};
      }
      const std::size_t runs = plan.plan(views, n, segment);
      for (std::size_t r = 0; r < runs; ++r) {
        const auto run = plan.run(r);
        if (free_slots.size() < run.size()) {
          for (std::size_t i = 0; i < run.size(); ++i) sink.on_send_drop();
          continue;
        }
        std::uint32_t head = 0;
        for (std::size_t p = run.begin; p < run.end; ++p) {
          const std::uint32_t index = free_slots.back();
          free_slots.pop_back();
          const OutDatagram& d = out[next + plan.order(p)];
          OutDatagram& copy = send_slots[index].datagram;
          copy.peer = d.peer;
          copy.length = d.length;
          std::memcpy(copy.bytes.data(), d.bytes.data(), d.length);
          send_slots[index].follower_count = 0;
          if (p == run.begin) {
            head = index;
          } else {
            send_slots[head].followers[send_slots[head].follower_count++] = index;
          }
        }
        if (!queue_message(head)) release_lost(head, sink);
      }
      next += n;
    }
    out.clear();
  }
};

UringLoop::UringLoop(std::unique_ptr<State> state) : state_(std::move(state)) {}
UringLoop::~UringLoop() = default;

std::error_code UringLoop::create(int fd, std::unique_ptr<UringLoop>& out, std::string& detail) {
  auto st = std::make_unique<State>();
  st->fd = fd;
  // Cooperative task running (5.19+): completion work for this ring runs
  // when the loop enters the kernel (it does on every pass, waiting or
  // busy-polling), not through an interrupt of the running thread. Kernels
  // without it get a plain ring.
  io_uring_params params{};
  params.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
  int init = io_uring_queue_init_params(kRingEntries, &st->ring, &params);
  if (init == -EINVAL) {
    params = {};
    init = io_uring_queue_init_params(kRingEntries, &st->ring, &params);
  }
  if (const int rc = init; rc < 0) {
    detail = std::string("io_uring_queue_init_params: ") + std::strerror(-rc) +
             (rc == -EPERM ? " (kernel.io_uring_disabled?)" : "");
    return ServerError::kUringUnavailable;
  }
  st->ring_ready = true;
  if (std::string missing = missing_support(st->ring, params.features); !missing.empty()) {
    detail = std::move(missing);
    return ServerError::kUringUnavailable;
  }

  st->buffer_ring_bytes = kBufferCount * sizeof(io_uring_buf);
  void* mem = ::mmap(nullptr, st->buffer_ring_bytes, PROT_READ | PROT_WRITE,
                     MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
  if (mem == MAP_FAILED) {
    detail = std::string("mmap buffer ring: ") + std::strerror(errno);
    return ServerError::kUringUnavailable;
  }
  st->buffer_ring = static_cast<io_uring_buf_ring*>(mem);
  io_uring_buf_ring_init(st->buffer_ring);
  io_uring_buf_reg reg{};
  reg.ring_addr = reinterpret_cast<std::uint64_t>(st->buffer_ring);
  reg.ring_entries = kBufferCount;
  reg.bgid = kBufferGroup;
  if (const int rc = io_uring_register_buf_ring(&st->ring, &reg, 0); rc < 0) {
    detail = std::string("io_uring_register_buf_ring: ") + std::strerror(-rc);
    return ServerError::kUringUnavailable;
  }
  st->buffer_ring_registered = true;
  st->buffers = std::make_unique<std::uint8_t[]>(std::size_t{kBufferCount} * kBufferSize);
  for (unsigned id = 0; id < kBufferCount; ++id) {
    io_uring_buf_ring_add(st->buffer_ring, st->buffer(id), kBufferSize,
                          static_cast<unsigned short>(id), io_uring_buf_ring_mask(kBufferCount),
                          static_cast<int>(id));
  }
  io_uring_buf_ring_advance(st->buffer_ring, kBufferCount);

  st->recv_template.msg_namelen = sizeof(sockaddr_in6);
  st->recv_template.msg_controllen = 0;
  st->send_slots.resize(kSendSlots);
  st->segment = segmentation_supported(fd);
  st->free_slots.reserve(kSendSlots);
  for (std::uint32_t i = kSendSlots; i > 0; --i) st->free_slots.push_back(i - 1);
  out.reset(new UringLoop(std::move(st)));
  return {};
}

void UringLoop::run(unsigned worker, DatagramSink& sink, const std::atomic<bool>& stop,
                    BusyPoll busy_poll) {
  State& st = *state_;
  SpinWindow spin(busy_poll);
  std::vector<OutDatagram> out;
  out.reserve(64);
  bool need_arm = true;
  // Relaxed: see run_socket_loop; LeaseServer::stop() joins this thread.
  while (!stop.load(std::memory_order_relaxed)) {
    if (need_arm) need_arm = !st.arm_receive();
    int rc = 0;
    const bool spinning = spin.spinning(SpinWindow::Clock::now());
    if (spinning) {
      // Hand over queued SQEs and run the ring's pending completion work
      // (a datagram that landed is posted to the CQ here) without waiting.
      rc = io_uring_submit_and_get_events(&st.ring);
    } else {
      __kernel_timespec timeout{0, kTickMs * 1'000'000LL};
      io_uring_cqe* first = nullptr;
      rc = io_uring_submit_and_wait_timeout(&st.ring, &first, 1, &timeout, nullptr);
    }
    if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EBUSY && rc != -EAGAIN) {
      sink.log(std::string("io_uring worker ") + std::to_string(worker) +
               " stopped: io_uring_submit_and_wait_timeout: " + std::strerror(-rc));
      break;
    }

    unsigned head = 0;
    unsigned seen = 0;
    bool received = false;
    io_uring_cqe* cqe = nullptr;
    io_uring_for_each_cqe(&st.ring, head, cqe) {
      ++seen;
      const std::uint64_t tag = io_uring_cqe_get_data64(cqe);
      if (tag != kRecvTag) {
        st.on_sent(static_cast<std::uint32_t>(tag), cqe->res, sink);
        continue;
      }
      if ((cqe->flags & IORING_CQE_F_MORE) == 0) need_arm = true;
      if (cqe->res < 0 || (cqe->flags & IORING_CQE_F_BUFFER) == 0) continue;  // e.g. -ENOBUFS
      const unsigned id = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
      std::uint8_t* buf = st.buffer(id);
      io_uring_recvmsg_out* msg = io_uring_recvmsg_validate(buf, cqe->res, &st.recv_template);
      if (msg == nullptr || (msg->flags & MSG_TRUNC) != 0 || msg->namelen > sizeof(sockaddr_in6)) {
        sink.on_oversized();
      } else {
        Peer peer;
        std::memcpy(&peer.addr, io_uring_recvmsg_name(msg), msg->namelen);
        peer.len = msg->namelen;
        const auto* payload =
            static_cast<const std::uint8_t*>(io_uring_recvmsg_payload(msg, &st.recv_template));
        const unsigned length = io_uring_recvmsg_payload_length(msg, cqe->res, &st.recv_template);
        sink.on_datagram(worker, {payload, length}, peer, out);
        received = true;
      }
      st.recycle(id);
      if (out.size() >= 32) st.queue_sends(out, sink);
    }
    io_uring_cq_advance(&st.ring, seen);
    if (received) {
      // Once per wake-up, not per datagram: the clock read showed in profiles.
      spin.on_activity(SpinWindow::Clock::now());
      sink.on_batch_end(worker, out);
    }
    if (spinning && seen == 0) idle_while_polling();
    if (spin.tick_due(SpinWindow::Clock::now())) sink.on_tick(worker, out);
    st.queue_sends(out, sink);
  }
  st.drain();
}

}  // namespace shardlock::lease::internal
