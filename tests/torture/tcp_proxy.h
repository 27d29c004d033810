// tcp_proxy.h: a userspace TCP forwarder that can cut every connection
// through it, for partitions between a cluster node and etcd (gRPC over
// TCP, so the UDP proxy will not do, and this needs no root, unlike
// iptables in a network namespace).
//
// Each node talks to etcd through its own TcpProxy. While cut, every open
// connection is reset (RST to both ends, so neither side waits for a TCP
// timeout) and every new one is accepted and reset at once: to the node,
// etcd is unreachable; to etcd, the node is silent, so its lease expires.
// Healing lets new connections through again.
//
// Each direction can also be delayed: every chunk read is held that long
// before it is written on, so the node sees etcd's answers late (a slow
// etcd, a slowed watch) while its connections stay up.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace shardlock::torture {

class TcpProxy {
 public:
  TcpProxy();
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  // Binds 127.0.0.1:0 and forwards each connection to
  // 127.0.0.1:upstream_port from a thread. False, with error() set, on
  // failure.
  [[nodiscard]] bool start(std::uint16_t upstream_port);
  void stop();

  // Cuts (resets every connection, refuses new ones) or heals. Takes effect
  // within the thread's next round (at most ~20 ms). Thread-safe.
  void set_cut(bool cut) noexcept;
  // Holds every chunk going to the upstream (etcd) and to the client (the
  // node) until that long after it was read; 0 for none. Applies within a
  // round to every chunk not yet written, so lowering a delay releases what
  // it held at once, in order. Thread-safe.
  void set_delay(std::chrono::milliseconds to_upstream,
                 std::chrono::milliseconds to_client) noexcept;
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
  // Connections accepted and forwarded, and connections reset by a cut.
  [[nodiscard]] std::uint64_t connections() const noexcept;
  [[nodiscard]] std::uint64_t resets() const noexcept;
  [[nodiscard]] const std::string& error() const noexcept { return error_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::uint16_t port_ = 0;
  std::string error_;
};

}  // namespace shardlock::torture
