// server_types.h: the value types LeaseServer answers with (server.h):
// the errors start() returns, the counters and latencies stats() returns, a
// backup's progress. Apart from the facade so the server's internal headers
// (internal/token_store.h, internal/latency_histogram.h, ...) need not
// include it; server.h includes this, so its users need not.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease {

// Errors start() returns besides system errors (std::errc values).
enum class ServerError : std::uint8_t {
  kOk = 0,
  kBadOptions,        // options out of range (error_detail() says which)
  kBadAddress,        // bind_address does not parse
  kDataDirCorrupt,    // a token file is unreadable, truncated or fails its checksum
  kDataDirLocked,     // another server holds the data dir
  kUringUnavailable,  // io = kUring but io_uring cannot be used here
  kAlreadyStarted,
};
[[nodiscard]] const std::error_category& server_category() noexcept;
[[nodiscard]] inline std::error_code make_error_code(ServerError e) noexcept {
  return {static_cast<int>(e), server_category()};
}

// One tenant's counts since it was first loaded (LeaseServer::tenant_stats();
// a reload keeps a tenant's counts while its name stays).
struct TenantStats {
  std::string name;
  std::uint32_t key_id = 0;
  std::uint64_t requests = 0;           // requests admitted under its key
  std::uint64_t permission_denied = 0;  // of them, outside its prefixes or rights
  // What it uses now, over every shard (its file line's max-leases,
  // max-waiters and max-watches bound these).
  std::uint64_t leases = 0;   // leases held
  std::uint64_t waiters = 0;  // ACQUIREs queued
  std::uint64_t watches = 0;  // WATCHes parked
  friend bool operator==(const TenantStats&, const TenantStats&) = default;
};

// A backup's progress over the buckets it backs up in the current layout
// (internal::ClusterControl::replica_progress()).
struct ReplicaProgress {
  std::size_t backed = 0;     // buckets backed up
  std::size_t caught_up = 0;  // of them, caught up on their primary's stream
  // Of those, the ones whose primary has the bucket active: a takeover of
  // one is complete (it holds every live lease) and grants at once.
  std::size_t owner_active = 0;
  friend bool operator==(const ReplicaProgress&, const ReplicaProgress&) = default;
};

// A latency distribution: how many samples fell at or below each bound
// (and above the last), and their sum. Buckets are not cumulative.
struct LatencyHistogram {
  static constexpr std::array<std::uint32_t, 19> kUpperBoundsUs = {
      1,     2,     5,      10,     20,     50,      100,     200,     500,      1'000,
      2'000, 5'000, 10'000, 20'000, 50'000, 100'000, 200'000, 500'000, 1'000'000};
  std::array<std::uint64_t, kUpperBoundsUs.size() + 1> counts{};  // last: above 1 s
  std::uint64_t count = 0;
  double sum_seconds = 0;
};

// A snapshot of the server's counters and gauges (the values STATS returns;
// leases, keys, waiters and lock_delay_left repeat gauges among them), plus
// what metrics export besides them.
struct ServerStats {
  std::array<std::uint64_t, kStatCounterCount> counters{};
  std::vector<std::uint64_t> shard_tokens;  // the last token each shard issued
  std::uint64_t leases = 0;                 // held now (each shared or permit holder counts)
  std::uint64_t keys = 0;                   // keys with a holder (or waiter) now
  std::uint64_t waiters = 0;                // queued ACQUIREs now
  // How long ACQUIRE still answers RECOVERING (the lock-delay); 0 once over.
  std::chrono::milliseconds lock_delay_left{0};
  // Token blocks made durable (--data-dir), and how long each took (write,
  // fsync, rename, fsync of the directory).
  std::uint64_t token_reservations = 0;
  LatencyHistogram token_reservation_latency;
  // From a datagram's arrival at the dispatcher to its replies being decided
  // (the server's own share of a request's latency; not socket time).
  LatencyHistogram request_latency;
  [[nodiscard]] std::uint64_t counter(StatCounter c) const noexcept {
    return counters[static_cast<std::size_t>(c)];
  }
};

}  // namespace shardlock::lease

template <>
struct std::is_error_code_enum<shardlock::lease::ServerError> : std::true_type {};
