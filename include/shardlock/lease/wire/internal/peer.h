// Peer: the UDP address a datagram came from and its answer goes to, stored
// inline (no allocation). Shared by the I/O loops, the dispatcher and the
// shards' waiter queues, so none of them needs another's header. Not API.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>

namespace shardlock::lease::internal {

// How the answers to a peer's datagram are sealed (envelope.h): the form
// and key id it came in, and whether its tenant's next key opened it. Kept
// with the address, so an answer sent later (a waiter's grant, a watch's
// wake-up) is sealed as its request was.
struct PeerSeal {
  std::uint32_t key_id = 0;
  std::uint8_t mode = 0;      // 0: not sealed; else 1 + the EnvelopeMode
  std::uint8_t next_key = 0;  // 1: opened under the tenant's next key
};

// A UDP peer address (IPv4 or IPv6), and how to seal what goes to it.
struct Peer {
  union {
    sockaddr sa;
    sockaddr_in v4;
    sockaddr_in6 v6;
  } addr{};
  socklen_t len = 0;
  PeerSeal seal{};
};

}  // namespace shardlock::lease::internal
