// The torture run's UDP proxy: forwards both ways, gives each client its own
// upstream socket, and loses or duplicates datagrams as told.
#include "proxy.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

namespace shardlock::torture {
namespace {

// A UDP echo server on loopback that remembers its peers' ports.
class EchoServer {
 public:
  EchoServer() {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 20) <= 0) continue;
        char buf[256];
        sockaddr_in from{};
        socklen_t from_len = sizeof from;
        const ssize_t n =
            ::recvfrom(fd_, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &from_len);
        if (n <= 0) continue;
        {
          std::lock_guard lock(mutex_);
          peers_.insert(ntohs(from.sin_port));
        }
        (void)::sendto(fd_, buf, static_cast<std::size_t>(n), 0, reinterpret_cast<sockaddr*>(&from),
                       from_len);
      }
    });
  }
  ~EchoServer() {
    stop_.store(true);
    thread_.join();
    ::close(fd_);
  }
  std::uint16_t port() const { return port_; }
  std::size_t peers() {
    std::lock_guard lock(mutex_);
    return peers_.size();
  }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mutex_;
  std::set<std::uint16_t> peers_;
};

// A client socket connected to the proxy.
class Client {
 public:
  explicit Client(std::uint16_t proxy_port) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(proxy_port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  }
  ~Client() { ::close(fd_); }
  void send(char c) { ASSERT_EQ(::send(fd_, &c, 1, 0), 1); }
  // Datagrams received until `want` arrived or nothing came for `quiet`.
  int receive(int want, std::chrono::milliseconds quiet) {
    int got = 0;
    while (got < want) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(quiet.count())) <= 0) break;
      char c = 0;
      if (::recv(fd_, &c, 1, 0) == 1) ++got;
    }
    return got;
  }

 private:
  int fd_ = -1;
};

using namespace std::chrono_literals;

TEST(UdpProxyTest, ForwardsBothWaysWithOneUpstreamPerClient) {
  EchoServer echo;
  UdpProxy proxy;
  ASSERT_TRUE(proxy.start(echo.port(), 1)) << proxy.error();
  Client a(proxy.port());
  Client b(proxy.port());
  for (int i = 0; i < 10; ++i) {
    a.send('a');
    b.send('b');
  }
  EXPECT_EQ(a.receive(10, 2000ms), 10);
  EXPECT_EQ(b.receive(10, 2000ms), 10);
  EXPECT_EQ(echo.peers(), 2u) << "the server must see each client as its own peer";
  EXPECT_EQ(proxy.counters().forwarded, 40u);
}

TEST(UdpProxyTest, LosesAndDuplicatesAsTold) {
  EchoServer echo;
  UdpProxy proxy;
  ASSERT_TRUE(proxy.start(echo.port(), 2)) << proxy.error();
  Client c(proxy.port());
  ProxyFaults lose_all;
  lose_all.loss = 1.0;
  proxy.set_faults(lose_all);
  for (int i = 0; i < 5; ++i) c.send('x');
  EXPECT_EQ(c.receive(1, 200ms), 0);
  EXPECT_EQ(proxy.counters().dropped, 5u);

  ProxyFaults duplicate_all;
  duplicate_all.duplicate = 1.0;
  proxy.set_faults(duplicate_all);
  for (int i = 0; i < 5; ++i) c.send('y');
  // Each way doubles: 5 sent, 10 reach the server, 20 come back.
  EXPECT_EQ(c.receive(20, 2000ms), 20);
  EXPECT_EQ(c.receive(1, 100ms), 0);
  EXPECT_EQ(proxy.counters().duplicated, 15u);
}

}  // namespace
}  // namespace shardlock::torture
