// config.h: what one shardlock-bench run was asked to do, read from its
// command line, and the tool's exit codes. Not API.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/command_line.h"
#include "shardlock/lease/wire/auth.h"
#include "shardlock/lease/wire/envelope.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::bench {

using std::chrono::milliseconds;

inline constexpr const char* kTool = "shardlock-bench";

// Exit codes (also in --help).
inline constexpr int kExitRunFailed = 1;
inline constexpr int kExitUsage = tools::kExitUsage;
inline constexpr int kExitNoAnswer = 3;
inline constexpr int kExitErrorsDominate = 4;

struct Config {
  std::string server;
  bool discover =
      false;  // --server lists seeds of a cluster (LeaseClientOptions::discover_cluster)
  bool json = false;
  milliseconds duration{10'000};
  unsigned clients = 50;
  bool clients_given = false;
  std::uint64_t keys = 100'000;
  double theta = 0.99;
  milliseconds ttl{30'000};
  unsigned batch = 1;
  double read_fraction = 0.0;  // lease mode: share of acquires that are shared
  unsigned keys_per_op = 1;    // lease mode: keys per ACQUIRE_MANY (1: plain ACQUIRE)
  unsigned pack = static_cast<unsigned>(lease::kMaxBatch);
  std::string mode = "lease";
  unsigned server_threads = 1;
  std::string server_io = "auto";  // the embedded server's I/O back end
  unsigned client_threads = 1;
  unsigned busy_poll_us = 50;  // lease mode: server and client busy-poll window
  std::uint64_t seed = 42;
  std::optional<lease::AuthKey> auth_key;  // seals every datagram (lease mode)
  // --tenant: the datagrams name this key id and are sealed under auth_key
  // as that tenant's key; the embedded server serves that one tenant.
  std::optional<std::uint32_t> tenant;
  bool encrypt = false;  // --encrypt: with tenant, every datagram encrypted
  // --cipher: with tenant, the suite (LeaseClientOptions::cipher).
  lease::EnvelopeCipher cipher = lease::EnvelopeCipher::kAuto;
};

// How a run's datagrams are sealed, as the report names it ("security"):
//   keyless  not at all
//   auth     the single shared key (--auth, --auth-key): the legacy tag
//   tenant   a tenant's key, the datagrams naming its key id (--tenant)
//   encrypt  that tenant's datagrams encrypted (--tenant --encrypt)
[[nodiscard]] std::string_view security_name(const Config& config) noexcept;
// The suite a --tenant run's datagrams are sealed in on this host, as the
// report names it ("cipher"): "aes" or "portable"; empty without --tenant.
[[nodiscard]] std::string_view cipher_name(const Config& config) noexcept;

// Reads the command line into `config`: the flags, their defaults that
// depend on the machine (--client-threads, table mode's --clients) and the
// checks across flags. Returns the exit status when the tool is done
// already (--help, --version, a usage error, printed), else nullopt.
[[nodiscard]] std::optional<int> read_command_line(int argc, char** argv, Config& config);

}  // namespace shardlock::bench
