// The lease server's datagram loops (src/lease/io_loop.h) through their sink
// seam, with no server behind them: each loop serves a real loopback UDP
// socket and hands every datagram to a recording sink, which echoes it. The
// tests check datagrams reach the sink whole with the sender's address,
// replies reach the sender, oversized datagrams are reported not delivered,
// timers tick while idle, and stop() ends the loop.
#include "server/io_loop.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
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
#include <utility>
#include <vector>

#include "poll_until.h"

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

INSTANTIATE_TEST_SUITE_P(Loops, IoLoopTest, ::testing::Values(Loop::kSocket, Loop::kUring),
                         [](const ::testing::TestParamInfo<Loop>& param) {
                           return param.param == Loop::kSocket ? "Socket" : "Uring";
                         });

}  // namespace
}  // namespace shardlock::lease::internal
