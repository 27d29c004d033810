// PrometheusExporter: serves a LeaseServer's statistics at /metrics in the
// Prometheus text format, through prometheus-cpp's Exposer (its embedded
// civetweb HTTP server), for `shardlockd --metrics HOST:PORT`.
//
// Every scrape reads LeaseServer::stats() once (each shard lock briefly), so
// nothing is counted twice and the request path pays nothing for metrics it
// does not already keep. Exported (names prefixed shardlock_, following the
// Prometheus naming conventions; the table in docs/lease-server.md maps each
// STATS counter to its sample):
//   * build_info{version="0.1.0"} 1: the version, as prometheus_build_info;
//   * counters: requests_total; replies_total{result} (granted, busy,
//     timeout, not_owner, renewed, released, expired, recovering, error,
//     redirect); acquires_queued_total, lease_expirations_total,
//     retransmits_total, stale_requests_total;
//     dropped_datagrams_total{reason} (malformed, auth_failure),
//     rejected_requests_total{reason} (limit_exceeded, out_of_memory),
//     unsent_replies_total{reason} (amplification, send_failed);
//   * gauges: leases, keys, waiters, lock_delay_remaining_seconds and
//     recovering (1 during the lock-delay);
//   * token_reservations_total and token_reservation_duration_seconds
//     (histogram of the write + fsync + rename + directory fsync of each
//     token block);
//   * request_duration_seconds (histogram of the server's own time per
//     datagram).
//
// Not part of the installed library: shardlockd's building block, kept out of
// shardlock::lease so its consumers do not need prometheus-cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include "shardlock/lease/server/server.h"

namespace shardlock::lease {

class PrometheusExporter {
 public:
  // Serves `server`'s metrics on `address` ("HOST:PORT" or "[IPv6]:PORT";
  // port 0 picks a free one). `server` must outlive the exporter. On error
  // `detail` says why (the address, or the bind failure).
  [[nodiscard]] static std::error_code start(const LeaseServer& server, std::string_view address,
                                             std::unique_ptr<PrometheusExporter>& out,
                                             std::string& detail);
  ~PrometheusExporter();
  PrometheusExporter(const PrometheusExporter&) = delete;
  PrometheusExporter& operator=(const PrometheusExporter&) = delete;

  // The bound port.
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

 private:
  PrometheusExporter() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::uint16_t port_ = 0;
};

}  // namespace shardlock::lease
