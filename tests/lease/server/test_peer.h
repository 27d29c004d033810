// A loopback Peer for the server tests that hand datagrams around by hand
// (dispatcher_test, replicator_test).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdint>

#include "shardlock/lease/wire/internal/peer.h"

namespace shardlock::lease::internal::test_support {

inline Peer peer_on_port(std::uint16_t port) {
  Peer p;
  p.addr.v4.sin_family = AF_INET;
  p.addr.v4.sin_port = htons(port);
  p.addr.v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  p.len = sizeof(sockaddr_in);
  return p;
}

}  // namespace shardlock::lease::internal::test_support
