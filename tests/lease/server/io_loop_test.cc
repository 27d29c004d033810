// The lease server's datagram loops (src/lease/io_loop.h) through their sink
// seam, with no server behind them: each loop serves a real loopback UDP
// socket and hands every datagram to a recording sink, which echoes it. The
// tests check datagrams reach the sink whole with the sender's address,
// replies reach the sender, oversized datagrams are reported not delivered,
// timers tick while idle, and stop() ends the loop. Also the send path both
// loops and the client share (wire/udp.h): how SendPlan orders and groups
// datagrams, and that a segmented send arrives as the same datagrams.
#include "server/io_loop.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "poll_until.h"
#include "wire/udp.h"

namespace shardlock::lease::internal {
namespace {

using test_support::poll_until;

constexpr unsigned kWorker = 3;
constexpr std::string_view kReplyPrefix = "re:";

// Records what the loop delivers and answers each datagram with
// kReplyPrefix + its bytes, to its sender. The loop calls it from its own
// thread; the test reads through the accessors.
class RecordingSink final : public DatagramSink {
 public:
  struct Received {
    unsigned worker;
    std::string bytes;
    Peer peer;
  };

  void on_datagram(unsigned worker, std::span<const std::uint8_t> bytes, const Peer& peer,
                   std::vector<OutDatagram>& out) override {
    std::string payload(bytes.begin(), bytes.end());
    OutDatagram& reply = out.emplace_back();
    // A reply to "unsendable" has no destination: the kernel refuses it.
    if (payload != "unsendable") reply.peer = peer;
    const std::string answer = std::string(kReplyPrefix) + payload;
    reply.length = static_cast<std::uint16_t>(answer.size());
    std::memcpy(reply.bytes.data(), answer.data(), answer.size());
    reply.any_order = true;  // as the dispatcher's answers: same-size ones go out segmented
    std::lock_guard lock(mutex_);
    received_.push_back({worker, std::move(payload), peer});
  }
  void on_oversized() override { oversized_.fetch_add(1, std::memory_order_relaxed); }
  void on_send_drop() override { send_drops_.fetch_add(1, std::memory_order_relaxed); }
  void log(std::string_view line) override {
    std::lock_guard lock(mutex_);
    logged_.emplace_back(line);
  }
  void on_tick(unsigned worker, std::vector<OutDatagram>&) override {
    if (worker == kWorker) ticks_.fetch_add(1, std::memory_order_relaxed);
  }

  std::vector<Received> received() const {
    std::lock_guard lock(mutex_);
    return received_;
  }
  std::size_t received_count() const {
    std::lock_guard lock(mutex_);
    return received_.size();
  }
  std::vector<std::string> logged() const {
    std::lock_guard lock(mutex_);
    return logged_;
  }
  // Relaxed: plain counters, read after polling or after the loop joined.
  int oversized() const { return oversized_.load(std::memory_order_relaxed); }
  int ticks() const { return ticks_.load(std::memory_order_relaxed); }
  int send_drops() const { return send_drops_.load(std::memory_order_relaxed); }

 private:
  mutable std::mutex mutex_;
  std::vector<Received> received_;
  std::vector<std::string> logged_;
  std::atomic<int> oversized_{0};
  std::atomic<int> ticks_{0};
  std::atomic<int> send_drops_{0};
};

// A UDP socket bound to 127.0.0.1 on a kernel-chosen port.
struct LoopbackSocket {
  int fd = -1;
  sockaddr_in address{};

  LoopbackSocket() {
    fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      ADD_FAILURE() << "bind 127.0.0.1:0: " << std::strerror(errno);
      return;
    }
    socklen_t length = sizeof address;
    EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  }
  ~LoopbackSocket() {
    if (fd >= 0) ::close(fd);
  }
  LoopbackSocket(const LoopbackSocket&) = delete;
  LoopbackSocket& operator=(const LoopbackSocket&) = delete;

  void send_to(const LoopbackSocket& to, std::string_view bytes) const {
    const ssize_t sent =
        ::sendto(fd, bytes.data(), bytes.size(), 0, reinterpret_cast<const sockaddr*>(&to.address),
                 sizeof to.address);
    EXPECT_EQ(sent, static_cast<ssize_t>(bytes.size())) << std::strerror(errno);
  }
  // One datagram, or nullopt after `timeout`.
  std::optional<std::string> receive(std::chrono::milliseconds timeout) const {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return std::nullopt;
    char buffer[4096];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n < 0) return std::nullopt;
    return std::string(buffer, static_cast<std::size_t>(n));
  }
};

enum class Loop { kSocket, kUring };

// Runs one loop over a bound loopback socket on its own thread.
class IoLoopTest : public ::testing::TestWithParam<Loop> {
 protected:
  void SetUp() override {
    ASSERT_GE(server_.fd, 0);
    if (GetParam() == Loop::kUring) {
      std::string detail;
      if (const std::error_code ec = UringLoop::create(server_.fd, uring_, detail)) {
        GTEST_SKIP() << "io_uring unavailable: " << ec.message() << ": " << detail;
      }
      // The ring outlives run(): a test can look at the socket after the
      // loop returned and before the ring is torn down.
      thread_ = std::thread([this] { uring_->run(kWorker, sink_, stop_); });
    } else {
      thread_ = std::thread([this] { run_socket_loop(server_.fd, kWorker, sink_, stop_); });
    }
  }
  void TearDown() override { stop(); }

  void stop() {
    // Relaxed, as the loops read it: join() orders everything after.
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
  }

  LoopbackSocket server_;
  std::unique_ptr<UringLoop> uring_;  // the io_uring case's loop
  RecordingSink sink_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::string payload(int i) { return "datagram-" + std::to_string(i); }

TEST_P(IoLoopTest, DeliversEachDatagramWithItsSenderAndSendsTheReplyBack) {
  LoopbackSocket client;
  client.send_to(server_, "hello");
  const std::optional<std::string> reply = client.receive(std::chrono::seconds(10));
  ASSERT_TRUE(reply.has_value()) << "no reply";
  EXPECT_EQ(*reply, std::string(kReplyPrefix) + "hello");

  const std::vector<RecordingSink::Received> received = sink_.received();
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].worker, kWorker);
  EXPECT_EQ(received[0].bytes, "hello");
  const Peer& peer = received[0].peer;
  EXPECT_EQ(peer.len, sizeof(sockaddr_in));
  EXPECT_EQ(peer.addr.sa.sa_family, AF_INET);
  EXPECT_EQ(peer.addr.v4.sin_port, client.address.sin_port);
  EXPECT_EQ(peer.addr.v4.sin_addr.s_addr, client.address.sin_addr.s_addr);
  EXPECT_EQ(sink_.oversized(), 0);
}

// Two senders, interleaved bursts: every datagram arrives once with its
// own sender, and each sender gets exactly its own replies.
TEST_P(IoLoopTest, BurstsFromTwoSendersAreEachAnsweredToTheirSender) {
  // Small enough that the burst fits the socket's default receive buffer
  // even if the loop is slow to start draining it.
  constexpr int kPerSender = 50;
  LoopbackSocket a;
  LoopbackSocket b;
  for (int i = 0; i < kPerSender; ++i) {
    a.send_to(server_, "a/" + payload(i));
    b.send_to(server_, "b/" + payload(i));
  }
  ASSERT_TRUE(poll_until([&] { return sink_.received_count() >= 2 * kPerSender; }))
      << "the sink saw " << sink_.received_count() << " of " << 2 * kPerSender;

  std::vector<std::string> from_a;
  std::vector<std::string> from_b;
  for (const RecordingSink::Received& r : sink_.received()) {
    if (r.peer.addr.v4.sin_port == a.address.sin_port) from_a.push_back(r.bytes);
    if (r.peer.addr.v4.sin_port == b.address.sin_port) from_b.push_back(r.bytes);
  }
  std::vector<std::string> expected_a;
  std::vector<std::string> expected_b;
  for (int i = 0; i < kPerSender; ++i) {
    expected_a.push_back("a/" + payload(i));
    expected_b.push_back("b/" + payload(i));
  }
  // Loopback keeps one sender's datagrams in order, and so do both loops.
  EXPECT_EQ(from_a, expected_a);
  EXPECT_EQ(from_b, expected_b);

  for (auto [socket, prefix] : {std::pair{&a, "a/"}, std::pair{&b, "b/"}}) {
    std::vector<std::string> replies;
    while (replies.size() < kPerSender) {
      std::optional<std::string> reply = socket->receive(std::chrono::seconds(10));
      if (!reply) break;
      replies.push_back(std::move(*reply));
    }
    std::vector<std::string> expected;
    for (int i = 0; i < kPerSender; ++i) {
      expected.push_back(std::string(kReplyPrefix) + prefix + payload(i));
    }
    // Replies may complete out of order (io_uring sends are separate SQEs).
    std::sort(replies.begin(), replies.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(replies, expected) << "replies to " << prefix;
  }
}

// A datagram larger than the loop's receive buffer is reported, never
// handed over cut short; the loop goes on serving.
TEST_P(IoLoopTest, OversizedDatagramIsReportedNotDelivered) {
  LoopbackSocket client;
  client.send_to(server_, std::string(3000, 'x'));
  ASSERT_TRUE(poll_until([&] { return sink_.oversized() == 1; }));
  client.send_to(server_, "after");
  ASSERT_TRUE(client.receive(std::chrono::seconds(10)).has_value());
  const std::vector<RecordingSink::Received> received = sink_.received();
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].bytes, "after");
}

// A reply the kernel refuses is reported as a send drop; the loop goes on.
TEST_P(IoLoopTest, ARefusedReplyIsReportedAsASendDrop) {
  LoopbackSocket client;
  client.send_to(server_, "unsendable");
  ASSERT_TRUE(poll_until([&] { return sink_.send_drops() == 1; }))
      << "send drops: " << sink_.send_drops();
  client.send_to(server_, "after");
  const std::optional<std::string> reply = client.receive(std::chrono::seconds(10));
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(*reply, std::string(kReplyPrefix) + "after");
  EXPECT_EQ(sink_.send_drops(), 1);
}

// When run() returns, the loop holds nothing on its socket: closing the
// socket frees the port at once, even while the ring still exists. An
// io_uring receive left armed kept the socket bound until the ring's
// asynchronous clean-up, so a restarted server found its port taken.
TEST_P(IoLoopTest, AStoppedLoopLeavesItsPortFree) {
  LoopbackSocket client;
  client.send_to(server_, "before stop");
  ASSERT_TRUE(client.receive(std::chrono::seconds(10)).has_value());
  stop();
  ::close(server_.fd);
  server_.fd = -1;
  const int again = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(again, 0);
  const int rc =
      ::bind(again, reinterpret_cast<const sockaddr*>(&server_.address), sizeof server_.address);
  const int error = errno;
  ::close(again);
  EXPECT_EQ(rc, 0) << "port " << ntohs(server_.address.sin_port) << ": " << std::strerror(error);
}

TEST_P(IoLoopTest, TicksWhileIdleAndStopsWhenAsked) {
  ASSERT_TRUE(poll_until([&] { return sink_.ticks() >= 3; })) << "no timer ticks";
  stop();  // returns only once the loop has seen stop and its thread ended
  const int ticks = sink_.ticks();
  LoopbackSocket client;
  client.send_to(server_, "too late");
  EXPECT_FALSE(client.receive(std::chrono::milliseconds(50)).has_value());
  EXPECT_EQ(sink_.received_count(), 0u);
  EXPECT_EQ(sink_.ticks(), ticks);
  EXPECT_TRUE(sink_.logged().empty());
}

// SendPlan: datagrams that must keep their order (the replication stream's)
// do, whatever their sizes; the others are grouped by address and size,
// largest first; and every run obeys the kernel's rule for segments (all of
// the first's size but a shorter last one, one address, at most
// kMaxSegments).
TEST(SendPlan, KeepsOrderedDatagramsInOrderAndGroupsTheOthersIntoRuns) {
  constexpr std::size_t kN = 64;
  sockaddr_in one{};
  one.sin_family = AF_INET;
  one.sin_port = htons(1);
  sockaddr_in two = one;
  two.sin_port = htons(2);
  static const std::array<std::uint8_t, 100> bytes{};
  std::array<OutgoingView, kN> views;
  // (address, size, any_order), in queue order.
  const std::vector<std::tuple<const sockaddr_in*, std::size_t, bool>> queued = {
      {&one, 30, false}, {&one, 50, true}, {&two, 40, true}, {&one, 10, false},
      {&one, 50, true},  {&one, 20, true}, {&two, 40, true}, {&one, 30, false},
      {&one, 50, true},  {&two, 35, true}, {&one, 20, true}};
  for (std::size_t i = 0; i < queued.size(); ++i) {
    const auto [to, size, any_order] = queued[i];
    views[i] = {to, sizeof *to, std::span(bytes).first(size), any_order};
  }
  SendPlan<kN> plan;
  const std::size_t runs = plan.plan(views, queued.size(), /*segment=*/true);
  std::vector<std::size_t> order;
  for (std::size_t p = 0; p < queued.size(); ++p) order.push_back(plan.order(p));
  // The ordered three first, as queued; then to `one` by size (50, 50, 50,
  // 20, 20), then to `two` (40, 40, 35); equal ones as queued.
  EXPECT_EQ(order, (std::vector<std::size_t>{0, 3, 7, 1, 4, 8, 5, 10, 2, 6, 9}));
  std::vector<std::pair<std::size_t, std::size_t>> cuts;
  for (std::size_t r = 0; r < runs; ++r) cuts.emplace_back(plan.run(r).begin, plan.run(r).end);
  // Ordered 30 + 10 (a shorter last one ends a run), 30 alone (the next is
  // larger), then 50 50 50 + 20, 20 alone (the next goes elsewhere), and
  // 40 40 + 35.
  EXPECT_EQ(cuts, (std::vector<std::pair<std::size_t, std::size_t>>{
                      {0, 2}, {2, 3}, {3, 7}, {7, 8}, {8, 11}}));

  // Without segmentation: one run per datagram, in queue order.
  EXPECT_EQ(plan.plan(views, queued.size(), /*segment=*/false), queued.size());
  for (std::size_t p = 0; p < queued.size(); ++p) {
    EXPECT_EQ(plan.order(p), p);
    EXPECT_EQ(plan.run(p).size(), 1u);
  }

  // A run stops at kMaxSegments datagrams.
  for (std::size_t i = 0; i < kN; ++i) views[i] = {&one, sizeof one, bytes, true};
  ASSERT_EQ(kN, kMaxSegments);
  EXPECT_EQ(plan.plan(views, kN, true), 1u);
  EXPECT_EQ(plan.run(0).size(), kMaxSegments);

  // Datagrams above kMaxSegmentSize go alone.
  static const std::array<std::uint8_t, kMaxSegmentSize + 1> large{};
  for (std::size_t i = 0; i < 4; ++i) views[i] = {&one, sizeof one, large, true};
  EXPECT_EQ(plan.plan(views, 4, true), 4u);
  views[3].bytes = std::span(large).first(kMaxSegmentSize);
  views[2].bytes = std::span(large).first(kMaxSegmentSize);
  EXPECT_EQ(plan.plan(views, 4, true), 3u);  // the two large alone, the two others together
}

// A segmented send reaches the receiver as the very datagrams it was made
// of, each whole, in order; and a send_batched() that mixes sizes and
// addresses delivers every datagram once.
TEST(SendBatched, SegmentedRunsArriveAsTheSameDatagrams) {
  LoopbackSocket sender;
  LoopbackSocket a;
  LoopbackSocket b;
  bool segment = segmentation_supported(sender.fd);
  if (!segment) GTEST_SKIP() << "the kernel has no UDP_SEGMENT";
  struct Datagram {
    const LoopbackSocket* to;
    std::string bytes;
  };
  std::vector<Datagram> datagrams;
  for (int i = 0; i < 100; ++i) {
    // Four sizes (10, 11, 12 and 13 bytes) to two receivers.
    datagrams.push_back(
        {i % 3 == 0 ? &b : &a, "d" + std::string(i % 4, '+') + "-" + std::to_string(1000000 + i)});
  }
  const std::size_t lost = send_batched(
      sender.fd, datagrams.size(),
      [&](std::size_t i) {
        const Datagram& d = datagrams[i];
        return OutgoingView{&d.to->address,
                            sizeof d.to->address,
                            {reinterpret_cast<const std::uint8_t*>(d.bytes.data()), d.bytes.size()},
                            /*any_order=*/true};
      },
      segment);
  EXPECT_EQ(lost, 0u);
  EXPECT_TRUE(segment) << "a segmented send failed on loopback";
  for (const LoopbackSocket* receiver : {&a, &b}) {
    std::vector<std::string> got;
    while (std::optional<std::string> d = receiver->receive(std::chrono::milliseconds(200))) {
      got.push_back(std::move(*d));
    }
    std::vector<std::string> expected;
    for (const Datagram& d : datagrams) {
      if (d.to == receiver) expected.push_back(d.bytes);
    }
    std::sort(got.begin(), got.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(got, expected);
  }
}

INSTANTIATE_TEST_SUITE_P(Loops, IoLoopTest, ::testing::Values(Loop::kSocket, Loop::kUring),
                         [](const ::testing::TestParamInfo<Loop>& param) {
                           return param.param == Loop::kSocket ? "Socket" : "Uring";
                         });

}  // namespace
}  // namespace shardlock::lease::internal
