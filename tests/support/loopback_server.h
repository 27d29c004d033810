// loopback_server.h: the one in-process LeaseServer starter of the tests:
// 127.0.0.1 on an ephemeral port, no lock-delay, TTLs up to a minute, no
// log. The tests talk to it over real UDP, so the client and server code
// run as they do in production. A test that asks for io_uring is skipped
// where the kernel has none.
//
//   auto server = test_support::start_loopback_server();       // 4 shards
//   LeaseServerOptions o = test_support::loopback_options(8);  // or adjust first
//   o.max_watches = 4;
//   auto other = test_support::start_loopback_server(o);
//   auto client = test_support::start_loopback_client(*server);
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include "shardlock/lease/client/client.h"
#include "shardlock/lease/server/server.h"

namespace shardlock::test_support {

using lease::LeaseClient;
using lease::LeaseClientOptions;
using lease::LeaseServer;
using lease::LeaseServerOptions;

// The options the loopback servers start from.
inline LeaseServerOptions loopback_options(std::uint32_t shards = 4) {
  LeaseServerOptions options;
  options.bind_address = "127.0.0.1:0";
  options.shards = shards;
  options.lock_delay = std::chrono::milliseconds{0};
  options.max_ttl = std::chrono::seconds{60};
  options.log = [](std::string_view) {};
  return options;
}

// The started server, or null: with the test skipped when it asked for
// io_uring (options.io) and the kernel allows none here, with the test
// failed when it cannot bind or start otherwise. An empty options.log is
// silenced.
inline std::unique_ptr<LeaseServer> start_loopback_server(LeaseServerOptions options) {
  if (!options.log) options.log = [](std::string_view) {};
  auto server = std::make_unique<LeaseServer>(options);
  if (const std::error_code ec = server->start()) {
    if (ec == make_error_code(lease::ServerError::kUringUnavailable)) {
      // GTEST_SKIP() returns from where it stands: a lambda of its own.
      [&] { GTEST_SKIP() << "io_uring unavailable: " << server->error_detail(); }();
    } else {
      ADD_FAILURE() << ec.message() << ": " << server->error_detail();
    }
    return nullptr;
  }
  return server;
}

inline std::unique_ptr<LeaseServer> start_loopback_server(std::uint32_t shards = 4) {
  return start_loopback_server(loopback_options(shards));
}

// "127.0.0.1:PORT" of `server`, for LeaseClientOptions::nodes.
inline std::string loopback_address(const LeaseServer& server) {
  return "127.0.0.1:" + std::to_string(server.port());
}

// A started LeaseClient of `server` (a test failure if it cannot start).
inline std::unique_ptr<LeaseClient> start_loopback_client(const LeaseServer& server,
                                                          LeaseClientOptions options = {}) {
  options.nodes = {loopback_address(server)};
  auto client = std::make_unique<LeaseClient>(options);
  const std::error_code ec = client->start();
  EXPECT_FALSE(ec) << ec.message() << ": " << client->error_detail();
  return client;
}

}  // namespace shardlock::test_support
