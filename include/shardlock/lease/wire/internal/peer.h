// Peer: the UDP address a datagram came from and its answer goes to, stored
// inline (no allocation). Shared by the I/O loops, the dispatcher and the
// shards' waiter queues, so none of them needs another's header. Not API.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

namespace shardlock::lease::internal {

// A UDP peer address (IPv4 or IPv6).
struct Peer {
  union {
    sockaddr sa;
    sockaddr_in v4;
    sockaddr_in6 v6;
  } addr{};
  socklen_t len = 0;
};

}  // namespace shardlock::lease::internal
