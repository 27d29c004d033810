// daemon.h: the one shardlockd-process starter of the tests and the torture
// harness: start it, wait for its ready line, read its address.
//
//   ChildProcess process;
//   std::string why;
//   const std::string address = start_daemon(
//       process, {SHARDLOCK_TOOL_SHARDLOCKD, "--listen", "127.0.0.1:0"}, {}, 30s, why);
//   if (address.empty()) ... why ...
//
// shardlockd prints one JSON line on stdout once it answers datagrams:
// {"event":"ready","listen":"HOST:PORT","port":PORT,...}.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "support/process.h"

namespace shardlock::test_support {

// The "listen" address of a ready line; empty when `line` is not one.
[[nodiscard]] std::string ready_listen_address(const std::string& line);
// The "port" of a ready line; 0 when `line` is not one.
[[nodiscard]] std::uint16_t ready_port(const std::string& line);

// Starts `argv` (the daemon and its flags) on `process` with stdout
// captured (whatever `options` says of it) and waits up to `timeout` for
// its ready line. Returns the listen address, or empty with `why` set (the
// process is left as it is: running, or exited).
[[nodiscard]] std::string start_daemon(ChildProcess& process, const std::vector<std::string>& argv,
                                       ChildOptions options, std::chrono::milliseconds timeout,
                                       std::string& why);

}  // namespace shardlock::test_support
