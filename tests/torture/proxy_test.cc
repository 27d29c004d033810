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
  std::set<std::uint16_t> peer_ports() {
    std::lock_guard lock(mutex_);
    return peers_;
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
  // The port the proxy sees this client send from.
  std::uint16_t port() const {
    sockaddr_in addr{};
    socklen_t len = sizeof addr;
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    return ntohs(addr.sin_port);
  }
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

// Cluster nodes: node X sends to node Y's proxy from X's server port. Y
// must see it come from X's advertised address (X's proxy), and Y's answer,
// sent there, must reach X through X's proxy, from Y's proxy's address.
TEST(UdpProxyTest, NodesReachEachOtherFromTheirProxiesAddresses) {
  EchoServer peer;  // node Y
  UdpProxy peer_proxy;
  ASSERT_TRUE(peer_proxy.start(peer.port(), 4)) << peer_proxy.error();
  Client node(peer_proxy.port());  // node X's server socket
  UdpProxy node_proxy;
  ASSERT_TRUE(node_proxy.start(node.port(), 5)) << node_proxy.error();
  peer_proxy.add_node(node.port(), node_proxy);
  node_proxy.add_node(peer.port(), peer_proxy);
  for (int i = 0; i < 3; ++i) node.send('x');
  // `node` is connected to Y's proxy: it receives only from that address.
  EXPECT_EQ(node.receive(3, 2000ms), 3);
  EXPECT_EQ(peer.peer_ports(), std::set<std::uint16_t>{node_proxy.port()});
  EXPECT_EQ(peer_proxy.counters().forwarded, 3u) << "X to Y, through Y's proxy";
  EXPECT_EQ(node_proxy.counters().forwarded, 3u) << "Y's answers, through X's proxy";
}

// A cluster node's peers reach its proxy from their server ports: a cut of
// those ports is a node-to-node partition that lets the clients through,
// and the reverse cut partitions the clients and spares the nodes.
TEST(UdpProxyTest, CutsTheListedSourcesOrEveryOther) {
  EchoServer echo;
  UdpProxy proxy;
  ASSERT_TRUE(proxy.start(echo.port(), 3)) << proxy.error();
  Client node(proxy.port());
  Client client(proxy.port());
  // The proxy's listen queue is one FIFO: once the client's echoes are
  // back, every datagram the node sent before them has been judged.
  proxy.set_cut({node.port()}, CutSources::kListed);
  for (int i = 0; i < 5; ++i) node.send('n');
  for (int i = 0; i < 5; ++i) client.send('c');
  EXPECT_EQ(client.receive(5, 2000ms), 5);
  EXPECT_EQ(proxy.counters().cut, 5u);
  EXPECT_EQ(node.receive(1, 100ms), 0);

  proxy.set_cut({node.port()}, CutSources::kAllButListed);
  for (int i = 0; i < 5; ++i) client.send('c');
  for (int i = 0; i < 5; ++i) node.send('n');
  EXPECT_EQ(node.receive(5, 2000ms), 5);
  EXPECT_EQ(proxy.counters().cut, 10u);
  EXPECT_EQ(client.receive(1, 100ms), 0);

  // Healed: both pass, and a cut counts nothing as lost.
  proxy.set_cut({}, CutSources::kListed);
  node.send('n');
  client.send('c');
  EXPECT_EQ(node.receive(1, 2000ms), 1);
  EXPECT_EQ(client.receive(1, 2000ms), 1);
  EXPECT_EQ(proxy.counters().cut, 10u);
  EXPECT_EQ(proxy.counters().dropped, 0u);
}

}  // namespace
}  // namespace shardlock::torture
