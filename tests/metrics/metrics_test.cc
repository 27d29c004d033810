// shardlockd's /metrics: a real LeaseServer, a real PrometheusExporter, and
// scrapes over plain HTTP on loopback; counters must move with traffic, and
// names, types and HELP follow the Prometheus conventions.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "prometheus_exporter.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/server/server.h"
#include "shardlock_version.h"
#include "support/loopback_server.h"

namespace shardlock::lease {
namespace {

using namespace std::chrono_literals;

// GET http://127.0.0.1:port/path; the body, or "" on any failure.
std::string http_get_once(std::uint16_t port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  std::string response;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request =
        "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) response.append(buffer, n);
    }
  }
  ::close(fd);
  const std::size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.1 200", 0) != 0 && response.rfind("HTTP/1.0 200", 0) != 0) return {};
  return body == std::string::npos ? std::string{} : response.substr(body + 4);
}

// The body of a 200 answer to GET `path`, asked up to 5 times 100 ms apart:
// on two shared cores beside the rest of the suite, one exchange has been
// seen to come back short (a connection-level hiccup, not an answer). A
// wrong or missing page still fails the test: what it checks is the body.
std::string http_get(std::uint16_t port, const std::string& path) {
  for (int attempt = 0;; ++attempt) {
    std::string body = http_get_once(port, path);
    if (!body.empty() || attempt == 4) return body;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// "name value" samples of a text exposition (labels kept in the name).
std::map<std::string, double> samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const std::size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_dir_ = std::filesystem::temp_directory_path() /
                ("shardlock-metrics-" + std::to_string(::getpid()));
    std::filesystem::remove_all(data_dir_);
    LeaseServerOptions options = shardlock::test_support::loopback_options();
    options.data_dir = data_dir_.string();
    options.token_block = 1;  // a durable reservation for every grant past the first
    server_ = shardlock::test_support::start_loopback_server(options);
    ASSERT_TRUE(server_);
    std::string detail;
    ASSERT_FALSE(PrometheusExporter::start(*server_, "127.0.0.1:0", exporter_, detail)) << detail;
    ASSERT_NE(exporter_->port(), 0);
  }
  void TearDown() override {
    exporter_.reset();
    if (server_) server_->stop();
    std::filesystem::remove_all(data_dir_);
  }
  std::map<std::string, double> scrape() {
    const std::string body = http_get(exporter_->port(), "/metrics");
    EXPECT_FALSE(body.empty());
    return samples(body);
  }

  std::filesystem::path data_dir_;
  std::unique_ptr<LeaseServer> server_;
  std::unique_ptr<PrometheusExporter> exporter_;
};

TEST_F(MetricsTest, CountersAndGaugesMoveWithTraffic) {
  auto before = scrape();
  ASSERT_TRUE(before.contains("shardlock_replies_total{result=\"granted\"}"));
  EXPECT_EQ(before["shardlock_replies_total{result=\"granted\"}"], 0);
  EXPECT_EQ(before["shardlock_leases"], 0);
  EXPECT_EQ(before["shardlock_recovering"], 0);

  LeaseClientOptions options;
  options.nodes = {"127.0.0.1:" + std::to_string(server_->port())};
  LeaseClient client(options);
  ASSERT_FALSE(client.start()) << client.error_detail();
  auto a = client.acquire("metrics/a", 30s, 0ms);
  auto b = client.acquire("metrics/b", 30s, 0ms);
  auto shared = client.acquire_shared("metrics/c", 30s, 0ms);
  ASSERT_TRUE(a && b && shared);
  LeaseClient other(options);
  ASSERT_FALSE(other.start());
  EXPECT_EQ(other.try_acquire("metrics/a", 30s).error, LeaseErrc::kBusy);
  // Keys land on shards by a secret hash: several grants of one key make its
  // shard reserve token blocks whatever the others do.
  for (int i = 0; i < 4; ++i) {
    auto again = other.try_acquire("metrics/loop", 30s);
    ASSERT_TRUE(again);
    ASSERT_FALSE(again.lease.release());
  }

  auto during = scrape();
  EXPECT_EQ(during["shardlock_replies_total{result=\"granted\"}"], 7);
  EXPECT_EQ(during["shardlock_replies_total{result=\"busy\"}"], 1);
  EXPECT_EQ(during["shardlock_leases"], 3);
  EXPECT_EQ(during["shardlock_keys"], 3);
  EXPECT_GE(during["shardlock_requests_total"], 12);
  // Every grant came out of a durable block: at least one reservation, each
  // timed in the histogram.
  EXPECT_GE(during["shardlock_token_reservations_total"], 1);
  EXPECT_EQ(during["shardlock_token_reservation_duration_seconds_count"],
            during["shardlock_token_reservations_total"]);
  EXPECT_EQ(during["shardlock_token_reservation_duration_seconds_bucket{le=\"+Inf\"}"],
            during["shardlock_token_reservations_total"]);
  EXPECT_GE(during["shardlock_request_duration_seconds_count"], 4);
  EXPECT_GT(during["shardlock_request_duration_seconds_sum"], 0);

  ASSERT_FALSE(a.lease.release());
  ASSERT_FALSE(b.lease.release());
  ASSERT_FALSE(shared.lease.release());
  auto after = scrape();
  EXPECT_EQ(after["shardlock_replies_total{result=\"released\"}"], 7);
  EXPECT_EQ(after["shardlock_leases"], 0);
  EXPECT_GT(after["shardlock_request_duration_seconds_count"],
            during["shardlock_request_duration_seconds_count"]);
}

// Every STATS counter is one sample of a conventional family: a counter
// named *_total, the alternatives of one event as values of one label, each
// family with a HELP line that says what it counts (not a placeholder).
TEST_F(MetricsTest, NamesFollowThePrometheusConventions) {
  const std::string body = http_get(exporter_->port(), "/metrics");
  ASSERT_FALSE(body.empty());
  std::map<std::string, std::string> help;
  std::map<std::string, std::string> type;
  std::istringstream lines(body);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string hash, kind, name;
    words >> hash >> kind >> name;
    if (hash != "#") continue;
    std::string rest;
    std::getline(words, rest);
    (kind == "HELP" ? help : type)[name] = rest;
  }
  for (const auto& [name, kind] : type) {
    if (!name.starts_with("shardlock_")) continue;  // prometheus-cpp's own exposer_*
    EXPECT_EQ(kind == " counter", name.ends_with("_total")) << name << kind;
    ASSERT_TRUE(help.contains(name)) << name;
    EXPECT_GT(help[name].size(), 25u) << name << ":" << help[name];
    EXPECT_EQ(help[name].find("STATS counter"), std::string::npos) << name << ":" << help[name];
  }
  // No family per counter any more.
  for (const char* gone : {"shardlock_grants_total", "shardlock_busy_total",
                           "shardlock_auth_failures_total", "shardlock_send_drops_total"}) {
    EXPECT_FALSE(type.contains(gone)) << gone;
  }
  const auto m = samples(body);
  std::size_t counter_samples = 0;
  for (const char* family :
       {"shardlock_requests_total", "shardlock_replies_total", "shardlock_acquires_queued_total",
        "shardlock_lease_expirations_total", "shardlock_retransmits_total",
        "shardlock_stale_requests_total", "shardlock_dropped_datagrams_total",
        "shardlock_rejected_requests_total", "shardlock_unsent_replies_total"}) {
    ASSERT_EQ(type[family], " counter") << family;
    for (const auto& [sample, value] : m) {
      if (sample == family || sample.rfind(std::string(family) + "{", 0) == 0) ++counter_samples;
    }
  }
  EXPECT_EQ(counter_samples, kStatCounterCountWithoutGauges);  // the gauges are gauges
  for (const char* sample : {"shardlock_dropped_datagrams_total{reason=\"auth_failure\"}",
                             "shardlock_dropped_datagrams_total{reason=\"malformed\"}",
                             "shardlock_rejected_requests_total{reason=\"limit_exceeded\"}",
                             "shardlock_unsent_replies_total{reason=\"send_failed\"}",
                             "shardlock_replies_total{result=\"recovering\"}"}) {
    EXPECT_TRUE(m.contains(sample)) << sample;
  }
}

// Refused traffic lands in its family under its reason: a datagram that does
// not decode, and one sealed for a server that has no key.
TEST_F(MetricsTest, DroppedDatagramsAreCountedByReason) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server_->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const unsigned char garbage[] = {0xde, 0xad, 0xbe, 0xef};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(::sendto(fd, garbage, sizeof garbage, 0, reinterpret_cast<const sockaddr*>(&addr),
                       sizeof addr),
              static_cast<ssize_t>(sizeof garbage));
  }
  ::close(fd);
  // The server counts what it reads; look until all three are in.
  std::map<std::string, double> m;
  for (int attempt = 0; attempt < 200; ++attempt) {
    m = scrape();
    if (m["shardlock_dropped_datagrams_total{reason=\"malformed\"}"] >= 3) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(m["shardlock_dropped_datagrams_total{reason=\"malformed\"}"], 3);
  EXPECT_EQ(m["shardlock_dropped_datagrams_total{reason=\"auth_failure\"}"], 0);
}

TEST_F(MetricsTest, BuildInfoCarriesTheVersion) {
  const std::string body = http_get(exporter_->port(), "/metrics");
  const std::string sample = "shardlock_build_info{version=\"" + std::string(kVersion) + "\"} 1";
  EXPECT_NE(body.find(sample), std::string::npos) << body;
  EXPECT_NE(body.find("# TYPE shardlock_build_info gauge"), std::string::npos) << body;
}

TEST_F(MetricsTest, TheLockDelayIsVisible) {
  LeaseServerOptions options;
  options.bind_address = "127.0.0.1:0";
  options.lock_delay = 30s;
  options.log = [](std::string_view) {};
  LeaseServer delayed(options);
  ASSERT_FALSE(delayed.start()) << delayed.error_detail();
  std::unique_ptr<PrometheusExporter> exporter;
  std::string detail;
  ASSERT_FALSE(PrometheusExporter::start(delayed, "127.0.0.1:0", exporter, detail)) << detail;
  auto m = samples(http_get(exporter->port(), "/metrics"));
  EXPECT_EQ(m["shardlock_recovering"], 1);
  EXPECT_GT(m["shardlock_lock_delay_remaining_seconds"], 20);
  EXPECT_LE(m["shardlock_lock_delay_remaining_seconds"], 30);
  exporter.reset();
  delayed.stop();
}

TEST_F(MetricsTest, BadAddressesAreClearErrors) {
  std::unique_ptr<PrometheusExporter> exporter;
  std::string detail;
  EXPECT_TRUE(PrometheusExporter::start(*server_, "9464", exporter, detail));
  EXPECT_NE(detail.find("HOST:PORT"), std::string::npos) << detail;
  // The port this test's exporter already holds.
  const std::string taken = "127.0.0.1:" + std::to_string(exporter_->port());
  EXPECT_TRUE(PrometheusExporter::start(*server_, taken, exporter, detail));
  EXPECT_NE(detail.find(taken), std::string::npos) << detail;
  EXPECT_EQ(exporter, nullptr);
}

}  // namespace
}  // namespace shardlock::lease
