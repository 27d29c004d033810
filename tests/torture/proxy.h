// proxy.h: a userspace UDP proxy that injects network faults between the
// lease clients and the server (this kernel has no netem).
//
// Clients send to the proxy's port. Each client address gets its own
// upstream socket to the server, so the server still sees one peer per
// client. Every datagram, in either direction, may be lost, duplicated,
// delayed, or held back behind the next one (reordering), with the rates of
// the current ProxyFaults and a seeded generator.
//
// Cluster nodes (add_node()): a node sends to a peer's advertised address,
// its proxy, from its own server port, and the peer knows it by *its*
// advertised address (replication streams match peers by address). So a
// datagram from a registered node's port is not given an upstream socket:
// it goes to the server from that node's own proxy's socket, and the server
// sees it come from the node's advertised address; its answer reaches the
// node's proxy, which does the same the other way. Every fault applies to
// these datagrams as to a client's. A cut (set_cut()) drops
// the traffic of some sources outright: a cluster node's peers send to its
// proxy from their own server ports, so a cut of those ports partitions the
// nodes while the clients still pass, and the reverse. The server may die and
// come back on the same port: upstream sockets stay, sends in between fail
// and are dropped as a lost datagram would be.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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

// Which sources a cut drops: the ports listed, or every port but them.
enum class CutSources : std::uint8_t { kListed, kAllButListed };

struct ProxyCounters {
  std::uint64_t forwarded = 0;
  std::uint64_t dropped = 0;
  std::uint64_t duplicated = 0;
  std::uint64_t reordered = 0;
  std::uint64_t delayed = 0;
  std::uint64_t cut = 0;  // dropped by a cut (not counted in `dropped`)
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
  // Datagrams from 127.0.0.1:server_port are a cluster node's: they reach
  // this proxy's server from `its_proxy`'s address (which must be started,
  // and outlive this proxy's thread). Thread-safe.
  void add_node(std::uint16_t server_port, const UdpProxy& its_proxy);
  // From the next datagram on, drops every datagram from a 127.0.0.1 source
  // port that `which` selects among `ports`, and every answer to one, before
  // any fault applies. An empty list with kListed (the start) cuts nothing.
  // Thread-safe.
  void set_cut(std::vector<std::uint16_t> ports, CutSources which);
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
