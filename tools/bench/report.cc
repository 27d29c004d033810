// See report.h.
#include "bench/report.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "common/allocator.h"
#include "shardlock/internal/cpu.h"
#include "shardlock/lease/duration.h"

namespace shardlock::bench {
namespace {

using lease::to_string;
// The JSON result's fields in the order they are set.
using Json = nlohmann::ordered_json;

double us(std::uint64_t ns) { return static_cast<double>(ns) / 1000.0; }

// `x` rounded to `digits` decimals: the precision the numbers always had.
double rounded(double x, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(x * scale) / scale;
}

Json latency_json(const Histogram& h) {
  Json j;
  j["count"] = h.count();
  j["p50"] = rounded(us(h.quantile(0.50)), 1);
  j["p90"] = rounded(us(h.quantile(0.90)), 1);
  j["p99"] = rounded(us(h.quantile(0.99)), 1);
  j["p999"] = rounded(us(h.quantile(0.999)), 1);
  j["max"] = rounded(us(h.max()), 1);
  return j;
}

// {"ttl_out_of_range":123,"unreachable":4}: the error kinds that occurred.
Json errors_by_kind_json(const Totals& t) {
  Json j = Json::object();
  for (std::size_t i = 0; i < kErrorKindCount; ++i) {
    if (t.errors_by_kind[i] != 0) j[std::string(kErrorKindNames[i])] = t.errors_by_kind[i];
  }
  return j;
}

}  // namespace

void print_json(const Config& config, const Result& r) {
  const double s = r.seconds > 0 ? r.seconds : 1;
  Json j;
  j["mode"] = config.mode;
  j["target"] = r.target;
  j["duration_s"] = rounded(r.seconds, 3);
  j["clients"] = config.clients;
  j["keys"] = config.keys;
  j["client_threads"] =
      config.mode == "lease" ? std::min(config.client_threads, config.clients) : 0u;
  j["theta"] = rounded(config.theta, 3);
  j["ttl_ms"] = config.ttl.count();
  j["batch"] = config.batch;
  j["pack"] = config.pack;
  j["ops"] = r.totals.requests;
  j["ops_per_s"] = rounded(static_cast<double>(r.totals.requests) / s, 1);
  j["pairs"] = r.totals.pairs;
  j["pairs_per_s"] = rounded(static_cast<double>(r.totals.pairs) / s, 1);
  j["grants"] = r.totals.grants;
  j["busy"] = r.totals.busy;
  j["errors"] = r.totals.errors;
  j["retransmissions"] = r.retransmissions;
  j["datagrams_sent"] = r.datagrams;
  j["auth"] = config.auth_key.has_value();
  j["security"] = std::string(security_name(config));
  j["tenant"] = config.tenant ? Json(*config.tenant) : Json(nullptr);
  j["cipher"] = config.tenant ? Json(std::string(cipher_name(config))) : Json(nullptr);
  j["allocator"] = tools::kAllocatorName;
  j["busy_poll_us"] = config.busy_poll_us;
  j["cpu_s"] = rounded(r.cpu_seconds, 3);
  j["cpu_cores"] = rounded(r.cpu_seconds / s, 2);
  j["read_fraction"] = rounded(config.read_fraction, 3);
  j["keys_per_op"] = config.keys_per_op;
  j["acquires"] = r.totals.acquires;
  j["shared_acquires"] = r.totals.shared_acquires;
  j["errors_by_kind"] = errors_by_kind_json(r.totals);
  j["first_error"] = r.first_error.empty() ? Json(nullptr) : Json(r.first_error);
  j["ok"] = failure_reason(r).empty();
  j["latency_us"] = latency_json(r.request_latency);
  j["pair_latency_us"] = latency_json(r.pair_latency);
  std::printf("%s\n", j.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
}

void print_table(const Config& config, const Result& r) {
  const double s = r.seconds > 0 ? r.seconds : 1;
  const bool lease = config.mode == "lease";
  std::string security;
  if (config.tenant) {
    security = "  security=" + std::string(security_name(config)) + " (tenant key id " +
               std::to_string(*config.tenant) + ", " + std::string(cipher_name(config)) + ")";
  } else if (config.auth_key) {
    security = "  security=auth";
  }
  std::printf("\nshardlock-bench  mode=%s  target=%s  allocator=%s%s\n", config.mode.c_str(),
              r.target.c_str(), tools::kAllocatorName, security.c_str());
  std::printf("  cpu %s\n", shardlock::internal::cpu_model_name().c_str());
  if (lease) {
    std::printf("  %u clients over %u client thread(s), Zipf theta %.2f over %" PRIu64
                " keys, ttl %s, batch %u, up to %u requests per datagram, %.1f s\n",
                config.clients, std::min(config.client_threads, config.clients), config.theta,
                config.keys, to_string(config.ttl).c_str(), config.batch, config.pack, r.seconds);
    std::printf("  read fraction %.2f (shared acquires), %u key%s per acquire%s\n\n",
                config.read_fraction, config.keys_per_op, config.keys_per_op == 1 ? "" : "s",
                config.keys_per_op > 1 ? " (ACQUIRE_MANY, all or nothing)" : "");
  } else {
    std::printf("  %u threads, Zipf theta %.2f over %" PRIu64 " keys, %.1f s\n\n", config.clients,
                config.theta, config.keys, r.seconds);
  }
  std::printf("  %-28s %14.0f\n", lease ? "ops/s (acquire or release)" : "ops/s (lock+unlock)",
              static_cast<double>(r.totals.requests) / s);
  std::printf("  %-28s %14.0f\n", "acquire+release pairs/s",
              static_cast<double>(r.totals.pairs) / s);
  std::printf("  %-28s %14.2f\n", "CPU cores used (process)", r.cpu_seconds / s);
  std::printf("  %-28s %14" PRIu64 "\n", "grants", r.totals.grants);
  std::printf("  %-28s %14" PRIu64 "\n", lease ? "busy answers" : "busy (try_lock failed)",
              r.totals.busy);
  std::printf("  %-28s %14" PRIu64 "\n", "errors", r.totals.errors);
  for (std::size_t i = 0; i < kErrorKindCount; ++i) {
    if (r.totals.errors_by_kind[i] == 0) continue;
    std::printf("    %-26s %14" PRIu64 "\n", std::string(kErrorKindNames[i]).c_str(),
                r.totals.errors_by_kind[i]);
  }
  if (lease) {
    std::printf("  %-28s %14" PRIu64 "\n", "shared acquires", r.totals.shared_acquires);
    std::printf("  %-28s %14" PRIu64 "\n", "retransmissions", r.retransmissions);
    std::printf("  %-28s %14.1f\n", "requests per datagram",
                r.datagrams > 0 ? static_cast<double>(r.totals.requests + r.retransmissions) /
                                      static_cast<double>(r.datagrams)
                                : 0.0);
  }
  std::printf("\n  %-24s %10s %10s %10s %10s %10s\n", "latency (us)", "p50", "p90", "p99", "p999",
              "max");
  const auto row = [](const char* name, const Histogram& h) {
    std::printf("  %-24s %10.2f %10.2f %10.2f %10.2f %10.2f\n", name, us(h.quantile(0.50)),
                us(h.quantile(0.90)), us(h.quantile(0.99)), us(h.quantile(0.999)), us(h.max()));
  };
  if (lease) {
    row("one request", r.request_latency);
    row("acquire+release pair", r.pair_latency);
  } else {
    row("lock+unlock", r.request_latency);
  }
  std::printf("\n");
}

}  // namespace shardlock::bench
