// /metrics for a LeaseServer. See prometheus_exporter.h.
#include "prometheus_exporter.h"

#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>

#include <array>
#include <exception>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardlock/lease/wire/protocol.h"
#include "shardlock_version.h"

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

// The STATS counters as metric families: one per kind of event, with a
// label where the counters are alternatives of one another (a reply's
// result, a drop's reason), so sum() and rate() work across them.
struct CounterFamily {
  std::string_view name;  // after "shardlock_"
  std::string_view help;
  std::string_view label;  // "" for an unlabelled counter
};
constexpr std::array<CounterFamily, 9> kCounterFamilies = {{
    {"requests_total",
     "Requests the server processed, every message type (a datagram may carry several).", ""},
    {"replies_total",
     "Answers the server decided, by result: granted, busy, timeout, not_owner, renewed, "
     "released, expired, recovering (in the lock-delay), error or redirect.",
     "result"},
    {"acquires_queued_total", "ACQUIREs that waited in a key's queue behind a holder.", ""},
    {"lease_expirations_total",
     "Leases that ran out without a release (their holder stopped renewing).", ""},
    {"retransmits_total", "Requests answered again from the dedup cache (client retransmissions).",
     ""},
    {"stale_requests_total",
     "RENEWs and ACQUIREs older than their lease's last applied request; they had no effect.", ""},
    {"dropped_datagrams_total",
     "Request datagrams dropped unanswered: malformed (they did not decode) or auth_failure (no "
     "valid tag for this server's key, or a sealed datagram to a server without one).",
     "reason"},
    {"rejected_requests_total",
     "Requests answered ERROR for want of room: limit_exceeded (a configured bound such as "
     "--max-keys) or out_of_memory.",
     "reason"},
    {"unsent_replies_total",
     "Replies that never left: amplification (larger than their request) or send_failed (no "
     "send slot, full socket buffer, failed send).",
     "reason"},
}};

// Where each STATS counter goes: its family (index above) and label value.
struct CounterSample {
  StatCounter counter;
  std::size_t family;
  std::string_view label_value;
};
// STATS' gauges (is_gauge()) are exported from ServerStats' own fields below.
constexpr std::array<CounterSample, kStatCounterCountWithoutGauges> kCounterSamples = {{
    {StatCounter::kRequests, 0, ""},
    {StatCounter::kGrants, 1, "granted"},
    {StatCounter::kBusy, 1, "busy"},
    {StatCounter::kTimeouts, 1, "timeout"},
    {StatCounter::kNotOwner, 1, "not_owner"},
    {StatCounter::kRenewed, 1, "renewed"},
    {StatCounter::kReleased, 1, "released"},
    {StatCounter::kExpiredReplies, 1, "expired"},
    {StatCounter::kRecovering, 1, "recovering"},
    {StatCounter::kErrors, 1, "error"},
    {StatCounter::kRedirects, 1, "redirect"},
    {StatCounter::kQueued, 2, ""},
    {StatCounter::kExpirations, 3, ""},
    {StatCounter::kRetransmits, 4, ""},
    {StatCounter::kStaleRequests, 5, ""},
    {StatCounter::kMalformed, 6, "malformed"},
    {StatCounter::kAuthFailures, 6, "auth_failure"},
    {StatCounter::kLimitRejections, 7, "limit_exceeded"},
    {StatCounter::kAllocationFailures, 7, "out_of_memory"},
    {StatCounter::kAmplificationDrops, 8, "amplification"},
    {StatCounter::kSendDrops, 8, "send_failed"},
}};

// Every STATS counter exported exactly once, and no gauge as a counter.
constexpr bool every_counter_once() {
  std::array<int, kStatCounterCount> seen{};
  for (const CounterSample& sample : kCounterSamples) {
    if (sample.family >= kCounterFamilies.size()) return false;
    if ((kCounterFamilies[sample.family].label.empty()) != sample.label_value.empty()) return false;
    ++seen[static_cast<std::size_t>(sample.counter)];
  }
  for (std::size_t i = 0; i < seen.size(); ++i) {
    if (seen[i] != (is_gauge(static_cast<StatCounter>(i)) ? 0 : 1)) return false;
  }
  return true;
}
static_assert(every_counter_once(), "a STATS counter is missing from, or doubled in, /metrics");

std::vector<prometheus::MetricFamily> counter_families(const ServerStats& s) {
  std::vector<prometheus::MetricFamily> out;
  out.reserve(kCounterFamilies.size() + 8);  // and the gauges and histograms Collect() adds
  for (const CounterFamily& f : kCounterFamilies) {
    out.push_back(
        family(std::string(f.name), std::string(f.help), prometheus::MetricType::Counter));
  }
  for (const CounterSample& sample : kCounterSamples) {
    prometheus::ClientMetric m;
    m.counter.value = static_cast<double>(s.counter(sample.counter));
    const std::string_view label = kCounterFamilies[sample.family].label;
    if (!label.empty()) {
      m.label.push_back({std::string(label), std::string(sample.label_value)});
    }
    out[sample.family].metric.push_back(std::move(m));
  }
  return out;
}

// Per tenant (docs/security.md), labelled by its name: none without tenants.
void tenant_families(const std::vector<TenantStats>& tenants,
                     std::vector<prometheus::MetricFamily>& out) {
  if (tenants.empty()) return;
  auto requests = family("tenant_requests_total",
                         "Requests admitted under each tenant's key, since it was loaded.",
                         prometheus::MetricType::Counter);
  auto denied = family("tenant_permission_denied_total",
                       "Requests answered ERROR permission_denied: outside the tenant's "
                       "prefixes or rights.",
                       prometheus::MetricType::Counter);
  auto leases = family("tenant_leases", "Leases the tenant holds now, over every shard.",
                       prometheus::MetricType::Gauge);
  auto waiters = family("tenant_waiters", "ACQUIREs the tenant has queued now.",
                        prometheus::MetricType::Gauge);
  auto watches =
      family("tenant_watches", "WATCHes the tenant has parked now.", prometheus::MetricType::Gauge);
  const auto add = [](prometheus::MetricFamily& f, const TenantStats& t, std::uint64_t value) {
    prometheus::ClientMetric m;
    m.label.push_back({"tenant", t.name});
    if (f.type == prometheus::MetricType::Counter) {
      m.counter.value = static_cast<double>(value);
    } else {
      m.gauge.value = static_cast<double>(value);
    }
    f.metric.push_back(std::move(m));
  };
  for (const TenantStats& t : tenants) {
    add(requests, t, t.requests);
    add(denied, t, t.permission_denied);
    add(leases, t, t.leases);
    add(waiters, t, t.waiters);
    add(watches, t, t.watches);
  }
  for (auto* f : {&requests, &denied, &leases, &waiters, &watches}) out.push_back(std::move(*f));
}

class ServerCollector final : public prometheus::Collectable {
 public:
  explicit ServerCollector(const LeaseServer& server) : server_(server) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const ServerStats s = server_.stats();
    std::vector<prometheus::MetricFamily> out = counter_families(s);
    // The version as a label on a constant 1, the convention of
    // prometheus_build_info and node_exporter_build_info, so a query can join
    // it onto any series.
    auto build_info =
        gauge("build_info", "The running shardlockd's version, as a label; always 1.", 1);
    build_info.metric.front().label.push_back({"version", std::string(kVersion)});
    out.push_back(std::move(build_info));
    out.push_back(gauge("leases", "Leases held now; each shared or permit holder counts.",
                        static_cast<double>(s.leases)));
    out.push_back(gauge("keys", "Keys with at least one holder now.", static_cast<double>(s.keys)));
    out.push_back(gauge("waiters", "ACQUIREs waiting now in key queues behind holders.",
                        static_cast<double>(s.waiters)));
    const double delay = static_cast<double>(s.lock_delay_left.count()) * 1e-3;
    out.push_back(gauge("lock_delay_remaining_seconds",
                        "Seconds until the lock-delay after the server's start ends and ACQUIRE "
                        "stops being answered RECOVERING; 0 once it has.",
                        delay));
    out.push_back(gauge("recovering",
                        "1 while the server is in its lock-delay (ACQUIRE answered RECOVERING), "
                        "else 0.",
                        delay > 0 ? 1 : 0));
    out.push_back(counter("token_reservations_total",
                          "Token blocks made durable in the data dir (--data-dir).",
                          static_cast<double>(s.token_reservations)));
    out.push_back(histogram("token_reservation_duration_seconds",
                            "Time to make one token block durable: write, fsync, rename, "
                            "directory fsync.",
                            s.token_reservation_latency));
    out.push_back(histogram("request_duration_seconds",
                            "The server's own time per request datagram, from its arrival at "
                            "the dispatcher to its replies decided (no socket time).",
                            s.request_latency));
    tenant_families(server_.tenant_stats(), out);
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
