// proxy.h: a userspace UDP proxy that injects network faults between the
// lease clients and the server (this kernel has no netem).
//
// Clients send to the proxy's port. Each client address gets its own
// upstream socket to the server, so the server still sees one peer per
// client. Every datagram, in either direction, may be lost, duplicated,
// delayed, or held back behind the next one (reordering), with the rates of
// the current ProxyFaults and a seeded generator. The server may die and
// come back on the same port: upstream sockets stay, sends in between fail
// and are dropped as a lost datagram would be.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace shardlock::torture {

struct ProxyFaults {
  double loss = 0.0;       // probability a datagram is dropped
  double duplicate = 0.0;  // probability it is sent twice
  double reorder = 0.0;    // probability it is held back behind the next one
  double delay = 0.0;      // probability it is delayed by up to max_delay_ms
  int max_delay_ms = 0;
  [[nodiscard]] bool any() const noexcept {
    return loss > 0 || duplicate > 0 || reorder > 0 || (delay > 0 && max_delay_ms > 0);
  }
};

struct ProxyCounters {
  std::uint64_t forwarded = 0;
  std::uint64_t dropped = 0;
  std::uint64_t duplicated = 0;
  std::uint64_t reordered = 0;
  std::uint64_t delayed = 0;
};

class UdpProxy {
 public:
  UdpProxy();
  ~UdpProxy();
  UdpProxy(const UdpProxy&) = delete;
  UdpProxy& operator=(const UdpProxy&) = delete;

  // Binds 127.0.0.1:0 and forwards to 127.0.0.1:server_port from a thread.
  // False, with error() set, on failure.
  [[nodiscard]] bool start(std::uint16_t server_port, std::uint64_t seed);
  // Forwards to 127.0.0.1:server_port from now on: for a server that must
  // know the proxy's address before it starts (a cluster node advertises
  // it) and so starts after it. Clients that already have an upstream
  // socket keep it. Thread-safe.
  void set_server_port(std::uint16_t server_port) noexcept;
  void stop();

  // Takes effect for the next datagram. Thread-safe.
  void set_faults(const ProxyFaults& faults);
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
  [[nodiscard]] ProxyCounters counters() const;
  [[nodiscard]] const std::string& error() const noexcept { return error_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::uint16_t port_ = 0;
  std::string error_;
};

}  // namespace shardlock::torture
