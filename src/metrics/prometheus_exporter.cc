// /metrics for a LeaseServer. See prometheus_exporter.h.
#include "prometheus_exporter.h"

#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease {
namespace {

prometheus::MetricFamily family(std::string name, std::string help, prometheus::MetricType type) {
  return prometheus::MetricFamily{"shardlock_" + std::move(name), std::move(help), type, {}};
}

// A family of one unlabelled counter or gauge.
prometheus::MetricFamily single(std::string name, std::string help, prometheus::MetricType type,
                                double value) {
  auto f = family(std::move(name), std::move(help), type);
  prometheus::ClientMetric m;
  (type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value) = value;
  f.metric.push_back(std::move(m));
  return f;
}

prometheus::MetricFamily counter(std::string name, std::string help, double value) {
  return single(std::move(name), std::move(help), prometheus::MetricType::Counter, value);
}

prometheus::MetricFamily gauge(std::string name, std::string help, double value) {
  return single(std::move(name), std::move(help), prometheus::MetricType::Gauge, value);
}

prometheus::MetricFamily histogram(std::string name, std::string help, const LatencyHistogram& h) {
  auto f = family(std::move(name), std::move(help), prometheus::MetricType::Histogram);
  prometheus::ClientMetric m;
  m.histogram.sample_count = h.count;
  m.histogram.sample_sum = h.sum_seconds;
  std::uint64_t cumulative = 0;
  for (std::size_t b = 0; b < LatencyHistogram::kUpperBoundsUs.size(); ++b) {
    cumulative += h.counts[b];
    m.histogram.bucket.push_back({cumulative, LatencyHistogram::kUpperBoundsUs[b] / 1e6});
  }
  m.histogram.bucket.push_back({h.count, std::numeric_limits<double>::infinity()});
  f.metric.push_back(std::move(m));
  return f;
}

// What each STATS counter counts, for the HELP line.
std::string counter_help(StatCounter c) {
  switch (c) {
    case StatCounter::kRetransmits:
      return "Requests answered from the dedup cache (retransmissions).";
    case StatCounter::kMalformed:
      return "Datagrams dropped because they did not decode.";
    case StatCounter::kAuthFailures:
      return "Datagrams dropped because their auth tag did not verify.";
    case StatCounter::kAmplificationDrops:
      return "Replies withheld because they would exceed the bytes the source sent.";
    case StatCounter::kSendDrops:
      return "Replies that never left (no send slot, full socket buffer, failed send).";
    case StatCounter::kRedirects:
      return "Requests answered REDIRECT: the cluster map gives the key to another node.";
    default:
      return "The STATS counter " + std::string(to_string(c)) + " (docs/lease-server.md).";
  }
}

class ServerCollector final : public prometheus::Collectable {
 public:
  explicit ServerCollector(const LeaseServer& server) : server_(server) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const ServerStats s = server_.stats();
    std::vector<prometheus::MetricFamily> out;
    for (std::size_t i = 0; i < kStatCounterCount; ++i) {
      const auto c = static_cast<StatCounter>(i);
      out.push_back(counter(std::string(to_string(c)) + "_total", counter_help(c),
                            static_cast<double>(s.counters[i])));
    }
    out.push_back(gauge("leases", "Leases held now (each shared or permit holder counts).",
                        static_cast<double>(s.leases)));
    out.push_back(gauge("keys", "Keys with at least one holder now.", static_cast<double>(s.keys)));
    out.push_back(
        gauge("waiters", "ACQUIREs queued behind holders now.", static_cast<double>(s.waiters)));
    const double delay = static_cast<double>(s.lock_delay_left.count()) * 1e-3;
    out.push_back(gauge("lock_delay_remaining_seconds",
                        "How long ACQUIRE still answers RECOVERING after the server's start.",
                        delay));
    out.push_back(gauge("recovering", "1 while the lock-delay lasts, else 0.", delay > 0 ? 1 : 0));
    out.push_back(counter("token_reservations_total", "Token blocks made durable in the data dir.",
                          static_cast<double>(s.token_reservations)));
    out.push_back(histogram("token_reservation_seconds",
                            "Time to make one token block durable (write, fsync, rename, "
                            "directory fsync).",
                            s.token_reservation_latency));
    out.push_back(histogram("request_seconds",
                            "The server's own time per request datagram, decode to replies "
                            "decided.",
                            s.request_latency));
    return out;
  }

 private:
  const LeaseServer& server_;
};

}  // namespace

struct PrometheusExporter::Impl {
  std::shared_ptr<ServerCollector> collector;
  std::unique_ptr<prometheus::Exposer> exposer;
};

PrometheusExporter::~PrometheusExporter() = default;

std::error_code PrometheusExporter::start(const LeaseServer& server, std::string_view address,
                                          std::unique_ptr<PrometheusExporter>& out,
                                          std::string& detail) {
  // civetweb takes "HOST:PORT" and "[IPv6]:PORT" as given; a bare port would
  // bind every address, which this server never does unless told.
  const std::size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size()) {
    detail = "--metrics wants HOST:PORT (e.g. 127.0.0.1:9464), got '" + std::string(address) + "'";
    return std::make_error_code(std::errc::invalid_argument);
  }
  auto exporter = std::unique_ptr<PrometheusExporter>(new PrometheusExporter());
  auto impl = std::make_unique<Impl>();
  try {
    impl->exposer = std::make_unique<prometheus::Exposer>(std::string(address), 1);
  } catch (const std::exception& e) {
    detail = "cannot serve metrics on " + std::string(address) + ": " + e.what();
    return std::make_error_code(std::errc::address_not_available);
  }
  impl->collector = std::make_shared<ServerCollector>(server);
  impl->exposer->RegisterCollectable(impl->collector);
  const std::vector<int> ports = impl->exposer->GetListeningPorts();
  exporter->port_ = ports.empty() ? 0 : static_cast<std::uint16_t>(ports.front());
  exporter->impl_ = std::move(impl);
  out = std::move(exporter);
  return {};
}

}  // namespace shardlock::lease
