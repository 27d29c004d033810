// The torture run's TCP proxy (node <-> etcd partitions): forwards both
// ways, and while cut resets open connections and refuses new ones.
#include "tcp_proxy.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace shardlock::torture {
namespace {

// A TCP echo server on loopback, one thread per connection.
class EchoServer {
 public:
  EchoServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 20) <= 0) continue;
        const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        connections_.emplace_back([this, c] {
          char buf[4096];
          while (!stop_.load()) {
            pollfd q{c, POLLIN, 0};
            if (::poll(&q, 1, 20) <= 0) continue;
            const ssize_t n = ::recv(c, buf, sizeof buf, 0);
            if (n <= 0) break;
            (void)::send(c, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL);
          }
          ::close(c);
        });
      }
    });
  }
  ~EchoServer() {
    stop_.store(true);
    thread_.join();
    for (std::thread& t : connections_) t.join();
    ::close(fd_);
  }
  std::uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<std::thread> connections_;  // the accept thread's only, joined after it
};

int connect_to(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads until `size` bytes came, the connection fails or closes, or 2 s
// passed; what came.
std::string read_up_to(int fd, std::size_t size) {
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (got.size() < size && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return {};
    got.append(buf, static_cast<std::size_t>(n));
  }
  return got;
}

// Sends `text` and reads the echo; "" when the connection fails or closes
// within 2 s.
std::string round_trip(int fd, const std::string& text) {
  if (::send(fd, text.data(), text.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(text.size())) {
    return {};
  }
  return read_up_to(fd, text.size());
}

TEST(TcpProxy, ForwardsBothWays) {
  EchoServer echo;
  TcpProxy proxy;
  ASSERT_TRUE(proxy.start(echo.port())) << proxy.error();
  const int fd = connect_to(proxy.port());
  ASSERT_GE(fd, 0);
  const std::string big(200000, 'x');  // more than one read's worth each way
  EXPECT_EQ(round_trip(fd, "hello"), "hello");
  EXPECT_EQ(round_trip(fd, big), big);
  ::close(fd);
  EXPECT_EQ(proxy.connections(), 1u);
}

TEST(TcpProxy, ACutResetsOpenConnectionsAndRefusesNewOnesUntilHealed) {
  EchoServer echo;
  TcpProxy proxy;
  ASSERT_TRUE(proxy.start(echo.port())) << proxy.error();
  const int open = connect_to(proxy.port());
  ASSERT_GE(open, 0);
  ASSERT_EQ(round_trip(open, "before"), "before");

  proxy.set_cut(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a few proxy rounds
  EXPECT_EQ(round_trip(open, "during"), "");                    // reset
  ::close(open);
  const int refused = connect_to(proxy.port());  // accepted by the kernel, then reset
  if (refused >= 0) {
    EXPECT_EQ(round_trip(refused, "during"), "");
    ::close(refused);
  }
  EXPECT_GE(proxy.resets(), 2u);

  proxy.set_cut(false);
  const int healed = connect_to(proxy.port());
  ASSERT_GE(healed, 0);
  EXPECT_EQ(round_trip(healed, "after"), "after");
  ::close(healed);
}

// A delay holds the bytes back (never less than asked, one direction or the
// other) and loses or reorders none of them; lifting it lets them through
// at once again.
TEST(TcpProxy, ADelayHoldsEachDirectionBackWithoutLosingBytes) {
  using std::chrono::milliseconds;
  EchoServer echo;
  TcpProxy proxy;
  ASSERT_TRUE(proxy.start(echo.port())) << proxy.error();
  const int fd = connect_to(proxy.port());
  ASSERT_GE(fd, 0);
  ASSERT_EQ(round_trip(fd, "warm"), "warm");

  std::string big(200000, 'x');
  for (std::size_t i = 0; i < big.size(); i += 997) big[i] = static_cast<char>('a' + i % 26);
  for (const auto& [up, down] : {std::pair{milliseconds(0), milliseconds(300)},
                                 std::pair{milliseconds(300), milliseconds(0)}}) {
    proxy.set_delay(up, down);
    std::this_thread::sleep_for(milliseconds(50));  // a few proxy rounds
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(round_trip(fd, "slow"), "slow");
    EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(300));
    EXPECT_EQ(round_trip(fd, big), big);
  }
  // Lowering the delay releases what it holds.
  proxy.set_delay(milliseconds(0), milliseconds(60000));
  std::this_thread::sleep_for(milliseconds(50));
  const std::string held = "held";
  ASSERT_EQ(::send(fd, held.data(), held.size(), MSG_NOSIGNAL), static_cast<ssize_t>(held.size()));
  std::this_thread::sleep_for(milliseconds(200));
  proxy.set_delay(milliseconds(0), milliseconds(0));
  EXPECT_EQ(read_up_to(fd, held.size()), held);
  EXPECT_EQ(round_trip(fd, "after"), "after");
  ::close(fd);
}

}  // namespace
}  // namespace shardlock::torture
