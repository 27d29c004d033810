// shardlock-bench: the hot-key load generator and the project's main job.
//
//   shardlock-bench                         embedded server, 10 s, Zipf 0.99
//   shardlock-bench --server 127.0.0.1:7420 --clients 50 --duration 30s
//   shardlock-bench --mode table --json     the in-process LockTable instead
//
// Lease mode: --clients independent owners (each its own random 128-bit
// client id), each running acquire+release pairs back to back on
// Zipf-distributed keys (ACQUIRE with wait 0, then RELEASE of what was
// granted), one request in flight per owner. The owners are multiplexed over
// --client-threads LeaseClients (sockets and I/O threads), as redis-benchmark
// multiplexes its connections over one event loop. With --batch B an owner
// asks for B distinct keys per datagram and releases them in one.
// --read-fraction F makes that fraction of the acquires shared
// (ACQUIRE_SHARED) instead of exclusive; --keys-per-op K makes each acquire
// one ACQUIRE_MANY over K distinct keys (all or nothing), released key by
// key, and a pair one such acquire with its K releases.
// Table mode: --clients threads locking LockTable stripes by Zipf key.
// Output: a live progress line on stderr, then a table (or --json).
//
// A run fails loudly (exit 4, the reason on stderr) when no acquire was
// granted or when errors are more than half of the answered requests: a
// throughput of refusals is not a result. An error is any answer that is
// neither a grant, a release nor BUSY (BUSY is contention, the workload's
// normal outcome): ERROR replies by their wire code, unreachable,
// recovering, timeout, refused releases.
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/allocator.h"
#include "common/command_line.h"
#include "shardlock/internal/cpu.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/server/server.h"
#include "shardlock/lease/wire/duration.h"
#include "shardlock/lock_table.h"
#include "shardlock/workload/zipf.h"

namespace {

using namespace shardlock;
using namespace shardlock::lease;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
// The JSON result's fields in the order they are set.
using Json = nlohmann::ordered_json;

constexpr const char* kTool = "shardlock-bench";

// Exit codes (also in --help).
constexpr int kExitRunFailed = 1;
constexpr int kExitUsage = tools::kExitUsage;
constexpr int kExitNoAnswer = 3;
constexpr int kExitErrorsDominate = 4;

// A run fails when more than this fraction of its answered requests were
// errors (or when nothing was granted at all).
constexpr double kMaxErrorFraction = 0.5;

// Why an answer was an error, as a stable snake_case name: the key of its
// count in the JSON's "errors_by_kind". The first kWireErrorSlots are the
// ERROR reply's WireError code (0: a code this build does not know).
constexpr std::size_t kWireErrorSlots = 16;
constexpr std::array<std::string_view, kWireErrorSlots + 6> kErrorKindNames = {
    "unknown_server_error",
    "unsupported_version",
    "bad_key",
    "key_too_long",
    "ttl_out_of_range",
    "wait_out_of_range",
    "request_too_small",
    "not_a_request",
    "internal_server_error",
    "request_id_reused",
    "limit_exceeded",
    "resource_exhausted",
    "lease_kind_mismatch",
    "permits_out_of_range",
    "bad_key_list",
    "bad_mode",
    "unreachable",
    "recovering",
    "timeout",
    "not_owner",
    "expired",
    "client_error"};
static_assert(static_cast<std::size_t>(WireError::kBadMode) == kWireErrorSlots - 1,
              "a new WireError needs its name in kErrorKindNames");
constexpr std::size_t kErrorKindCount = kErrorKindNames.size();

// The kErrorKindNames index of a failed call's error (not BUSY).
std::size_t error_kind(const CallResult& r) noexcept {
  if (r.error == LeaseErrc::kServerError) {
    const auto code = static_cast<std::size_t>(r.wire_error);
    return code < kWireErrorSlots ? code : 0;
  }
  if (r.error == LeaseErrc::kUnreachable) return kWireErrorSlots;
  if (r.error == LeaseErrc::kRecovering) return kWireErrorSlots + 1;
  if (r.error == LeaseErrc::kTimeout) return kWireErrorSlots + 2;
  if (r.error == LeaseErrc::kNotOwner) return kWireErrorSlots + 3;
  if (r.error == LeaseErrc::kExpired) return kWireErrorSlots + 4;
  return kWireErrorSlots + 5;
}

// Log-linear latency histogram in nanoseconds: 32 sub-buckets per power of
// two (~3% resolution). One writer; merged after the run.
class Histogram {
 public:
  void record(std::uint64_t ns) noexcept {
    ++counts_[index(ns)];
    ++total_;
    max_ = std::max(max_, ns);
  }
  void merge(const Histogram& other) noexcept {
    for (std::size_t i = 0; i < kBuckets; ++i) counts_[i] += other.counts_[i];
    total_ += other.total_;
    max_ = std::max(max_, other.max_);
  }
  std::uint64_t count() const noexcept { return total_; }
  std::uint64_t max() const noexcept { return max_; }
  // The upper bound of the bucket holding quantile q.
  std::uint64_t quantile(double q) const noexcept {
    if (total_ == 0) return 0;
    const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(total_)));
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < kBuckets; ++i) {
      seen += counts_[i];
      if (seen >= std::max<std::uint64_t>(rank, 1)) return std::min(upper(i), max_);
    }
    return max_;
  }

 private:
  static constexpr int kSubBits = 5;
  static constexpr std::size_t kBuckets = (64 - kSubBits + 1) << kSubBits;
  static std::size_t index(std::uint64_t v) noexcept {
    if (v < (1u << kSubBits)) return static_cast<std::size_t>(v);
    const int exponent = 63 - std::countl_zero(v);
    const int shift = exponent - kSubBits;
    return static_cast<std::size_t>(((shift + 1) << kSubBits) +
                                    ((v >> shift) & ((1u << kSubBits) - 1)));
  }
  static std::uint64_t upper(std::size_t i) noexcept {
    if (i < (1u << kSubBits)) return i;
    const int shift = static_cast<int>(i >> kSubBits) - 1;
    const std::uint64_t sub = i & ((1u << kSubBits) - 1);
    return (((1ULL << kSubBits) | sub) << shift) + ((1ULL << shift) - 1);
  }
  std::array<std::uint64_t, kBuckets> counts_{};
  std::uint64_t total_ = 0;
  std::uint64_t max_ = 0;
};

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
  unsigned pack = static_cast<unsigned>(shardlock::lease::kMaxBatch);
  std::string mode = "lease";
  unsigned server_threads = 1;
  std::string server_io = "auto";  // the embedded server's I/O back end
  unsigned client_threads = 1;
  unsigned busy_poll_us = 50;  // lease mode: server and client busy-poll window
  std::uint64_t seed = 42;
  std::optional<shardlock::lease::AuthKey> auth_key;  // seals every datagram (lease mode)
};

// Counters a worker updates and the progress line reads.
struct alignas(128) LiveCounters {
  // Relaxed everywhere: statistics, read approximately by the progress line
  // and exactly after the workers have stopped (thread join / the idle flag).
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::uint64_t> pairs{0};
  std::atomic<std::uint64_t> grants{0};
  std::atomic<std::uint64_t> busy{0};
  std::atomic<std::uint64_t> errors{0};
  std::atomic<std::uint64_t> acquires{0};         // acquire answers (any outcome)
  std::atomic<std::uint64_t> shared_acquires{0};  // ... of shared acquires
  std::array<std::atomic<std::uint64_t>, kErrorKindCount> errors_by_kind{};  // sums to errors
};

struct Totals {
  std::uint64_t requests = 0, pairs = 0, grants = 0, busy = 0, errors = 0;
  std::uint64_t acquires = 0, shared_acquires = 0;
  std::array<std::uint64_t, kErrorKindCount> errors_by_kind{};
  void add(const LiveCounters& c) {
    for (std::size_t i = 0; i < kErrorKindCount; ++i) {
      errors_by_kind[i] += c.errors_by_kind[i].load(std::memory_order_relaxed);
    }
    acquires += c.acquires.load(std::memory_order_relaxed);
    shared_acquires += c.shared_acquires.load(std::memory_order_relaxed);
    requests += c.requests.load(std::memory_order_relaxed);
    pairs += c.pairs.load(std::memory_order_relaxed);
    grants += c.grants.load(std::memory_order_relaxed);
    busy += c.busy.load(std::memory_order_relaxed);
    errors += c.errors.load(std::memory_order_relaxed);
  }
};

struct Result {
  std::string target;
  double seconds = 0;
  Totals totals;
  Histogram request_latency;  // one ACQUIRE or RELEASE round trip (lease); a pair (table)
  Histogram pair_latency;     // ACQUIRE sent -> RELEASE answered, granted pairs
  std::uint64_t retransmissions = 0;
  std::uint64_t datagrams = 0;
  double cpu_seconds = 0;   // user + system CPU of this process during the run
  std::string first_error;  // what the first error answer said; empty if none
};

// Why the run failed (errors dominate, or nothing was granted); empty when
// it did not.
std::string failure_reason(const Result& r) {
  const Totals& t = r.totals;
  const bool errors_dominate =
      t.requests > 0 &&
      static_cast<double>(t.errors) > kMaxErrorFraction * static_cast<double>(t.requests);
  if (t.grants > 0 && !errors_dominate) return {};
  std::string why = std::to_string(t.errors) + " of " + std::to_string(t.requests) +
                    " answered requests were errors, " + std::to_string(t.grants) +
                    " acquires granted";
  if (!r.first_error.empty()) {
    why += "; first error: " + r.first_error;
  } else if (t.requests == 0) {
    why += "; no request was answered";
  } else if (t.busy > 0) {
    why += "; every acquire was answered busy (is another client holding every key?)";
  }
  return why;
}

// User + system CPU time this process has used so far.
double process_cpu_seconds() {
  rusage u{};
  (void)::getrusage(RUSAGE_SELF, &u);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

// Progress on stderr: on a terminal, one line rewritten each second; else a
// plain line every 5 s, so logs stay short.
class Progress {
 public:
  explicit Progress(bool quiet) : tty_(!quiet && ::isatty(STDERR_FILENO) == 1), quiet_(quiet) {}
  void tick(double elapsed, double total, const Totals& now) {
    if (quiet_) return;
    const double dt = elapsed - last_time_;
    if (dt <= 0) return;
    const double rate = static_cast<double>(now.requests - last_.requests) / dt;
    const double pair_rate = static_cast<double>(now.pairs - last_.pairs) / dt;
    if (tty_) {
      std::fprintf(stderr,
                   "\r  %5.1f/%.0fs  %10.0f ops/s  %9.0f pairs/s  grants %" PRIu64 "  busy %" PRIu64
                   "  errors %" PRIu64 "   ",
                   elapsed, total, rate, pair_rate, now.grants, now.busy, now.errors);
      std::fflush(stderr);
      last_ = now;
      last_time_ = elapsed;
    } else if (elapsed - last_print_ >= 5.0) {
      std::fprintf(stderr, "  %5.1f/%.0fs  %.0f ops/s  %.0f pairs/s\n", elapsed, total, rate,
                   pair_rate);
      last_print_ = elapsed;
      last_ = now;
      last_time_ = elapsed;
    }
  }
  void finish() {
    if (tty_) std::fprintf(stderr, "\n");
  }

 private:
  bool tty_;
  bool quiet_;
  Totals last_;
  double last_time_ = 0;
  double last_print_ = 0;
};

// Runs for config.duration; returns the seconds it ran and sets
// result.cpu_seconds to the CPU time the process used meanwhile.
template <class Collect>
double run_for(const Config& config, Progress& progress, std::atomic<bool>& stop, Collect collect,
               Result& result) {
  const double cpu_begin = process_cpu_seconds();
  const auto begin = Clock::now();
  const auto end = begin + config.duration;
  while (Clock::now() < end) {
    std::this_thread::sleep_for(std::min<Clock::duration>(milliseconds(200), end - Clock::now()));
    const double elapsed = std::chrono::duration<double>(Clock::now() - begin).count();
    if (elapsed - std::floor(elapsed) < 0.2 || Clock::now() >= end) {
      progress.tick(elapsed, std::chrono::duration<double>(config.duration).count(), collect());
    }
  }
  stop.store(true, std::memory_order_relaxed);  // workers poll it; no data rides on it
  result.cpu_seconds = process_cpu_seconds() - cpu_begin;
  return std::chrono::duration<double>(Clock::now() - begin).count();
}

// ------------------------------------------------------------------ lease

// One owner and its completion chain.
struct BenchClient {
  LeaseClient* client = nullptr;
  ClientId owner;
  workload::ZipfGenerator zipf;
  LiveCounters live;
  // I/O thread only (completions of this client run there, one at a time).
  Histogram request_latency;
  Histogram pair_latency;
  std::vector<std::string> keys;
  std::vector<std::uint64_t> tokens;
  std::vector<bool> granted;
  std::vector<bool> shared;   // per acquire of the round: ACQUIRE_SHARED
  workload::SplitMix64 coin;  // draws shared or exclusive
  unsigned outstanding = 0;
  unsigned granted_count = 0;
  unsigned released_count = 0;  // multi-key rounds: RELEASEs answered yes
  Clock::time_point round_start;
  Clock::time_point release_start;
  // Set by the I/O thread when it stops issuing; release pairs with the
  // acquire load in the main thread, which then reads the histograms.
  std::atomic<bool> idle{false};

  BenchClient(workload::ZipfGenerator generator, std::uint64_t coin_seed)
      : zipf(std::move(generator)), coin(coin_seed) {}
};

class LeaseBench {
 public:
  LeaseBench(const Config& config, std::atomic<bool>& stop) : config_(config), stop_(stop) {}

  // What the first error answer said (for the failure message); empty if
  // there was none. Call after the owners are idle.
  std::string first_error() const {
    std::lock_guard lock(first_error_mutex_);
    return first_error_;
  }

  void start_round(BenchClient& c) {
    if (stop_.load(std::memory_order_relaxed)) {
      c.idle.store(true, std::memory_order_release);
      return;
    }
    if (config_.keys_per_op > 1) {
      start_multi_key_round(c);
      return;
    }
    const unsigned b = config_.batch;
    c.round_start = Clock::now();
    c.outstanding = b;
    c.granted_count = 0;
    for (unsigned i = 0; i < b; ++i) {
      // Distinct keys within a round: a repeated key would be granted twice
      // to the same owner (same token) and released twice.
      std::string key;
      for (int attempt = 0; attempt < 64; ++attempt) {
        key = "k:" + std::to_string(c.zipf.next());
        if (std::find(c.keys.begin(), c.keys.begin() + i, key) == c.keys.begin() + i) break;
      }
      c.keys[i] = std::move(key);
      c.shared[i] = draw_shared(c);
    }
    for (unsigned i = 0; i < b; ++i) {
      c.client->acquire_async(
          c.keys[i], c.shared[i] ? LeaseMode::kShared : LeaseMode::kExclusive, 0, config_.ttl,
          milliseconds(0), [this, &c, i](const CallResult& r) { on_acquired(c, i, r); }, c.owner);
    }
  }

  void on_acquired(BenchClient& c, unsigned i, const CallResult& r) {
    const auto now = Clock::now();
    c.request_latency.record(static_cast<std::uint64_t>((now - c.round_start).count()));
    count_acquire(c, c.shared[i], c.keys[i], r);
    c.granted[i] = !r.error;
    if (!r.error) {
      c.tokens[i] = r.token;
      ++c.granted_count;
    }
    if (--c.outstanding != 0) return;
    if (c.granted_count == 0) {
      start_round(c);
      return;
    }
    c.outstanding = c.granted_count;
    c.release_start = Clock::now();
    for (unsigned k = 0; k < config_.batch; ++k) {
      if (!c.granted[k]) continue;
      c.client->release_async(
          c.keys[k], c.tokens[k], [this, &c, k](const CallResult& rr) { on_released(c, k, rr); },
          c.owner);
    }
  }

  // One ACQUIRE_MANY over keys_per_op distinct keys of one node.
  void start_multi_key_round(BenchClient& c) {
    const unsigned k = config_.keys_per_op;
    c.round_start = Clock::now();
    c.outstanding = 1;
    std::size_t node = 0;
    for (unsigned i = 0; i < k; ++i) {
      // Distinct (the server refuses a key twice) and, over several nodes,
      // owned by the first key's node (one node grants all or nothing).
      std::string key;
      for (int attempt = 0; attempt < 256; ++attempt) {
        key = "k:" + std::to_string(c.zipf.next());
        if (std::find(c.keys.begin(), c.keys.begin() + i, key) != c.keys.begin() + i) continue;
        if (i == 0 || c.client->node_for(key) == node) break;
      }
      if (i == 0) node = c.client->node_for(key);
      c.keys[i] = std::move(key);
    }
    c.shared[0] = draw_shared(c);
    std::vector<std::string_view> keys(c.keys.begin(), c.keys.begin() + k);
    c.client->acquire_many_async(
        keys, c.shared[0] ? LeaseMode::kShared : LeaseMode::kExclusive, config_.ttl,
        milliseconds(0), [this, &c](const CallResult& r) { on_acquired_many(c, r); }, c.owner);
  }

  void on_acquired_many(BenchClient& c, const CallResult& r) {
    const auto now = Clock::now();
    c.request_latency.record(static_cast<std::uint64_t>((now - c.round_start).count()));
    count_acquire(c, c.shared[0], c.keys[0], r);
    if (r.error) {
      start_round(c);
      return;
    }
    // The engine takes a GRANTED_MANY only with a token per key asked.
    c.outstanding = config_.keys_per_op;
    c.released_count = 0;
    c.release_start = Clock::now();
    for (unsigned i = 0; i < config_.keys_per_op; ++i) {
      c.client->release_async(
          c.keys[i], r.tokens[i], [this, &c, i](const CallResult& rr) { on_released(c, i, rr); },
          c.owner);
    }
  }

  void on_released(BenchClient& c, unsigned i, const CallResult& r) {
    const auto now = Clock::now();
    c.request_latency.record(static_cast<std::uint64_t>((now - c.release_start).count()));
    c.live.requests.fetch_add(1, std::memory_order_relaxed);
    const bool multi_key = config_.keys_per_op > 1;
    if (r.error) {
      count_error(c, c.keys[i], r);
    } else if (multi_key) {
      ++c.released_count;
    } else {
      c.live.pairs.fetch_add(1, std::memory_order_relaxed);
      c.pair_latency.record(static_cast<std::uint64_t>((now - c.round_start).count()));
    }
    if (--c.outstanding != 0) return;
    // A multi-key pair: the ACQUIRE_MANY and every one of its RELEASEs.
    if (multi_key && c.released_count == config_.keys_per_op) {
      c.live.pairs.fetch_add(1, std::memory_order_relaxed);
      c.pair_latency.record(static_cast<std::uint64_t>((now - c.round_start).count()));
    }
    start_round(c);
  }

 private:
  // Whether the next acquire is shared: true with probability read_fraction.
  bool draw_shared(BenchClient& c) const noexcept {
    if (config_.read_fraction <= 0.0) return false;
    return static_cast<double>(c.coin.next() >> 11) * 0x1.0p-53 < config_.read_fraction;
  }

  // Counts one acquire answer (relaxed: statistics, see LiveCounters).
  void count_acquire(BenchClient& c, bool shared, std::string_view key, const CallResult& r) {
    c.live.requests.fetch_add(1, std::memory_order_relaxed);
    c.live.acquires.fetch_add(1, std::memory_order_relaxed);
    if (shared) c.live.shared_acquires.fetch_add(1, std::memory_order_relaxed);
    if (!r.error) {
      c.live.grants.fetch_add(1, std::memory_order_relaxed);
    } else if (r.error == LeaseErrc::kBusy) {
      c.live.busy.fetch_add(1, std::memory_order_relaxed);
    } else {
      count_error(c, key, r);
    }
  }

  // Counts one error answer by kind (relaxed: statistics) and keeps the
  // first one's text.
  void count_error(BenchClient& c, std::string_view key, const CallResult& r) {
    c.live.errors.fetch_add(1, std::memory_order_relaxed);
    c.live.errors_by_kind[error_kind(r)].fetch_add(1, std::memory_order_relaxed);
    // Relaxed: only skips the lock once some error was kept; the text
    // itself is read and written under first_error_mutex_.
    if (have_first_error_.load(std::memory_order_relaxed)) return;
    std::string text = describe_error(*c.client, key, r);
    std::lock_guard lock(first_error_mutex_);
    if (first_error_.empty()) first_error_ = std::move(text);
    have_first_error_.store(true, std::memory_order_relaxed);
  }

  // The failure message's account of one error answer: the server's own
  // words where it gave some.
  std::string describe_error(LeaseClient& client, std::string_view key, const CallResult& r) const {
    if (r.error == LeaseErrc::kServerError) {
      std::string text = "the server answered ERROR: " + std::string(to_string(r.wire_error));
      if (r.wire_error == WireError::kTtlOutOfRange) {
        text += " (--ttl " + to_string(config_.ttl) + " is above the server's --max-ttl)";
      }
      return text;
    }
    if (r.error == LeaseErrc::kUnreachable) {
      const std::string node = client.address_for(key);
      return "unreachable: no answer from " + (node.empty() ? std::string("the server") : node);
    }
    if (r.error == LeaseErrc::kRecovering) {
      return "recovering: the server is in its lock-delay (retry after " +
             std::to_string(r.retry_after_ms) + " ms)";
    }
    if (r.error.category() == lease_category()) {
      return std::string(to_string(static_cast<LeaseErrc>(r.error.value())));
    }
    return r.error.message();
  }

  const Config& config_;
  std::atomic<bool>& stop_;
  mutable std::mutex first_error_mutex_;
  std::string first_error_;  // guarded by first_error_mutex_
  std::atomic<bool> have_first_error_{false};
};

int run_lease(const Config& config, Result& result) {
  std::unique_ptr<LeaseServer> server;
  std::vector<std::string> nodes;
  if (config.server.empty()) {
    LeaseServerOptions options;
    options.bind_address = "127.0.0.1:0";
    // A fresh in-process server has granted nothing before, so the lock-delay
    // that protects leases from before a restart has nothing to protect.
    options.lock_delay = milliseconds(0);
    options.max_ttl = std::max<milliseconds>(options.max_ttl, config.ttl);
    options.io_threads = config.server_threads;
    options.io = config.server_io == "uring"    ? IoBackend::kUring
                 : config.server_io == "socket" ? IoBackend::kSocket
                                                : IoBackend::kAuto;
    options.log = [](std::string_view) {};  // its lock-delay warning is ours to explain
    options.auth_key = config.auth_key;
    options.busy_poll = std::chrono::microseconds(config.busy_poll_us);
    server = std::make_unique<LeaseServer>(options);
    if (std::error_code ec = server->start()) {
      std::fprintf(stderr, "shardlock-bench: embedded server failed: %s (%s)\n",
                   ec.message().c_str(), server->error_detail().c_str());
      return kExitRunFailed;
    }
    nodes.push_back(server->listen_address());
    result.target = "embedded " + nodes[0];
    if (!config.json) {
      std::fprintf(
          stderr,
          "shardlock-bench: embedded LeaseServer on %s (%s I/O, %u thread%s), lock-delay 0: "
          "a fresh server with no earlier leases to protect\n",
          nodes[0].c_str(), std::string(to_string(server->backend())).c_str(),
          config.server_threads, config.server_threads == 1 ? "" : "s");
    }
  } else {
    nodes = split_node_list(config.server);
    result.target = config.server;
  }

  std::atomic<bool> stop{false};
  LeaseBench bench(config, stop);
  const workload::ZipfGenerator base(config.keys, config.theta, config.seed);
  std::vector<std::unique_ptr<LeaseClient>> connections;
  for (unsigned t = 0; t < std::min(config.client_threads, config.clients); ++t) {
    LeaseClientOptions options;
    options.nodes = nodes;
    options.discover_cluster = config.discover;
    // Requests of different owners share datagrams (kItemFlagOwner) up to
    // --pack per datagram; each owner still has one request in flight.
    options.max_batch = config.pack;
    options.auth_key = config.auth_key;
    options.busy_poll = std::chrono::microseconds(config.busy_poll_us);
    auto connection = std::make_unique<LeaseClient>(options);
    if (std::error_code ec = connection->start()) {
      std::fprintf(stderr, "shardlock-bench: client failed: %s (%s)\n", ec.message().c_str(),
                   connection->error_detail().c_str());
      if (ec == LeaseErrc::kBadAddress) return kExitUsage;
      // --discover: no seed answered with the cluster's map.
      return ec == LeaseErrc::kUnreachable ? kExitNoAnswer : kExitRunFailed;
    }
    connections.push_back(std::move(connection));
  }
  std::vector<std::unique_ptr<BenchClient>> clients;
  for (unsigned i = 0; i < config.clients; ++i) {
    auto c = std::make_unique<BenchClient>(base.fork(config.seed * 1'000'003 + i),
                                           config.seed * 7'000'003 + i);
    c->client = connections[i % connections.size()].get();
    c->owner = random_client_id();
    const unsigned slots = std::max(config.batch, config.keys_per_op);
    c->keys.resize(slots);
    c->tokens.resize(slots);
    c->granted.resize(slots);
    c->shared.resize(slots);
    clients.push_back(std::move(c));
  }
  // Fail fast on a wrong --server rather than benchmarking timeouts.
  {
    const CallResult probe = connections[0]->query("k:0");
    if (probe.error) {
      std::fprintf(stderr, "shardlock-bench: %s does not answer: %s\n", result.target.c_str(),
                   probe.error.message().c_str());
      return kExitNoAnswer;
    }
  }
  for (auto& c : clients) {
    BenchClient* raw = c.get();
    c->client->post([&bench, raw] { bench.start_round(*raw); });
  }
  Progress progress(config.json);
  const auto collect = [&] {
    Totals t;
    for (const auto& c : clients) t.add(c->live);
    return t;
  };
  result.seconds = run_for(config, progress, stop, collect, result);
  result.totals = collect();  // throughput counts what finished inside the run
  progress.finish();
  // Drain: every round ends within its calls' deadlines.
  const auto drain_until =
      Clock::now() + LeaseClientOptions{}.request_timeout * 2 + milliseconds(500);
  for (auto& c : clients) {
    while (!c->idle.load(std::memory_order_acquire) && Clock::now() < drain_until) {
      std::this_thread::sleep_for(milliseconds(2));
    }
  }
  for (auto& c : clients) {
    if (!c->idle.load(std::memory_order_acquire)) {
      std::fprintf(stderr, "shardlock-bench: a client did not drain in time\n");
      return kExitRunFailed;
    }
    result.request_latency.merge(c->request_latency);
    result.pair_latency.merge(c->pair_latency);
  }
  result.first_error = bench.first_error();
  for (const auto& connection : connections) {
    result.retransmissions += connection->retransmissions();
    result.datagrams += connection->datagrams_sent();
  }
  connections.clear();  // stops the I/O threads before the owners go
  clients.clear();
  if (server) server->stop();
  return 0;
}

// ------------------------------------------------------------------ table

int run_table(const Config& config, Result& result) {
  LockTable<> table;
  result.target =
      "in-process LockTable<SpinLock>, " + std::to_string(table.stripe_count()) + " stripes";
  std::atomic<bool> stop{false};
  const workload::ZipfGenerator base(config.keys, config.theta, config.seed);
  std::vector<std::unique_ptr<LiveCounters>> live;
  std::vector<Histogram> histograms(config.clients);
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < config.clients; ++i) live.push_back(std::make_unique<LiveCounters>());
  for (unsigned i = 0; i < config.clients; ++i) {
    threads.emplace_back([&, i] {
      workload::ZipfGenerator zipf = base.fork(config.seed * 1'000'003 + i);
      LiveCounters& c = *live[i];
      Histogram& h = histograms[i];
      while (!stop.load(std::memory_order_relaxed)) {
        const std::uint64_t key = zipf.next();
        const auto begin = Clock::now();
        auto guard = table.try_lock(key);
        if (!guard) {
          c.busy.fetch_add(1, std::memory_order_relaxed);
          guard = table.lock(key);
        }
        guard.unlock();
        h.record(static_cast<std::uint64_t>((Clock::now() - begin).count()));
        c.grants.fetch_add(1, std::memory_order_relaxed);
        c.pairs.fetch_add(1, std::memory_order_relaxed);
        c.requests.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  Progress progress(config.json);
  const auto collect = [&] {
    Totals t;
    for (const auto& c : live) t.add(*c);
    return t;
  };
  result.seconds = run_for(config, progress, stop, collect, result);
  for (auto& t : threads) t.join();
  result.totals = collect();
  progress.finish();
  for (const auto& h : histograms) {
    result.request_latency.merge(h);
    result.pair_latency.merge(h);
  }
  return 0;
}

// ------------------------------------------------------------------ output

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

// One JSON object, made with nlohmann-json: valid whatever the target's
// name or the first error holds (bytes that are not UTF-8 become U+FFFD).
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
  std::printf("\nshardlock-bench  mode=%s  target=%s  allocator=%s%s\n", config.mode.c_str(),
              r.target.c_str(), tools::kAllocatorName, config.auth_key ? "  auth=on" : "");
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

int run(int argc, char** argv) {
  Config config;
  CLI::App app{
      "shardlock-bench: hot-key lock workload. With no flags it starts an embedded LeaseServer on "
      "127.0.0.1:0 and runs Zipf 0.99 acquire+release pairs over 100k keys for 10 s."};
  tools::add_version_flag(app, kTool);
  app.footer(
      "Exit codes: 0 ok; 1 the run failed (embedded server, client set-up, drain); 2 usage; "
      "3 the --server does not answer; 4 errors dominated: no acquire was granted, or more than "
      "half of the answered requests were errors (not BUSY) - stderr names the first error, the "
      "JSON has ok:false and errors_by_kind.");
  std::string duration_text = "10s";
  std::string ttl_text = "30s";
  app.add_option("--server", config.server,
                 "Target an external shardlockd: HOST:PORT[,HOST:PORT...]");
  app.add_flag("--discover", config.discover,
               "Lease mode, with --server: the servers are seeds of a cluster (docs/cluster.md); "
               "the clients ask them for the cluster's map and send each key to its owner node");
  tools::OutputFlags output;
  tools::add_output_flags(app, output);  // json: one object instead of the table, no progress line
  app.add_option("--duration", duration_text, "How long to run, e.g. 10s, 500ms, 1m")
      ->capture_default_str();
  app.add_option(
         "--clients", config.clients,
         "Concurrent clients: LeaseClients (lease mode) or threads (table mode; default: CPUs)")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  app.add_option("--keys", config.keys, "Key space size")
      ->check(CLI::Range(1ULL, 1ULL << 32))
      ->capture_default_str();
  app.add_option("--theta", config.theta, "Zipf skew (0 = uniform)")
      ->check(CLI::Range(0.0, 10.0))
      ->capture_default_str();
  app.add_option("--ttl", ttl_text, "Lease TTL (lease mode)")->capture_default_str();
  app.add_option("--batch", config.batch, "Keys per datagram per client (lease mode)")
      ->check(CLI::Range(1u, static_cast<unsigned>(kMaxBatch)))
      ->capture_default_str();
  app.add_option("--read-fraction", config.read_fraction,
                 "Lease mode: the fraction of acquires that are shared (ACQUIRE_SHARED) instead "
                 "of exclusive, 0..1")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            double value = 0;
            const char* end = text.data() + text.size();
            const auto parsed = std::from_chars(text.data(), end, value);
            if (parsed.ec != std::errc{} || parsed.ptr != end || !(value >= 0.0 && value <= 1.0))
              return "want a fraction from 0 to 1 (e.g. 0.9), got '" + text + "'";
            return {};
          },
          "0..1"))
      ->capture_default_str();
  app.add_option("--keys-per-op", config.keys_per_op,
                 "Lease mode: each acquire is one ACQUIRE_MANY over this many distinct keys "
                 "(all or nothing, one node), released key by key; 1..16 (1: plain ACQUIRE)")
      ->check(CLI::Range(1u, static_cast<unsigned>(kMaxKeysPerRequest)))
      ->capture_default_str();
  app.add_option("--pack", config.pack,
                 "Most requests per datagram, across owners (1: one request per datagram)")
      ->check(CLI::Range(1u, static_cast<unsigned>(kMaxBatch)))
      ->capture_default_str();
  app.add_option("--mode", config.mode,
                 "lease: over UDP to a LeaseServer; table: in-process LockTable")
      ->check(CLI::IsMember({"lease", "table"}))
      ->capture_default_str();
  app.add_option("--server-threads", config.server_threads, "I/O threads of the embedded server")
      ->check(CLI::Range(1u, 64u))
      ->capture_default_str();
  app.add_option(
         "--server-io", config.server_io,
         "I/O back end of the embedded server: auto (io_uring if available), uring or socket")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "uring", "socket"}));
  app.add_option("--client-threads", config.client_threads,
                 "LeaseClients (sockets and I/O threads) the lease-mode clients are spread over "
                 "(default: CPUs / 2, 1..4)")
      ->check(CLI::Range(1u, 256u));
  app.add_option("--busy-poll-us", config.busy_poll_us,
                 "Lease mode: microseconds the embedded server's and the clients' I/O threads "
                 "keep polling before they sleep (lower latency for CPU); 0 = off")
      ->capture_default_str()
      ->check(CLI::Range(0u, 10'000u));
  app.add_option("--seed", config.seed, "Workload seed")->capture_default_str();
  std::string auth_key_file;
  bool auth = false;
  app.add_option("--auth-key", auth_key_file,
                 "Key file shared with --server (shardlockctl keygen): seal every datagram");
  app.add_flag("--auth", auth,
               "Seal every datagram with a fresh random key (embedded server): measures the "
               "cost of authentication");
  if (const auto status = tools::parse_command_line(app, argc, argv, kTool)) return *status;
  config.json = output.json();
  // --duration never goes on the wire: no bound but the clock's.
  const auto duration = tools::parse_duration_flag(
      "--duration", duration_text, tools::ZeroDuration::kRejected, milliseconds::max());
  if (!duration.error.empty()) return tools::usage_error(kTool, duration.error);
  const auto ttl = tools::parse_duration_flag("--ttl", ttl_text, tools::ZeroDuration::kRejected);
  if (!ttl.error.empty()) return tools::usage_error(kTool, ttl.error);
  config.duration = duration.value;
  config.ttl = ttl.value;
  config.clients_given = app.count("--clients") > 0;
  if (app.count("--client-threads") == 0) {
    // One client I/O thread per two CPUs, 1..4: on a 2-CPU machine the
    // embedded server's thread and one client thread each get a CPU.
    config.client_threads = std::clamp(std::thread::hardware_concurrency() / 2, 1u, 4u);
  }
  if (config.mode == "table" && !config.clients_given) {
    config.clients = std::max(1u, std::thread::hardware_concurrency());
  }
  const auto auth_key = tools::load_auth_key_flag(auth_key_file);
  if (!auth_key.error.empty()) return tools::usage_error(kTool, auth_key.error);
  config.auth_key = auth_key.key;
  if (auth && !config.auth_key) {
    if (!config.server.empty()) {
      return tools::usage_error(kTool, "--auth needs the embedded server; use --auth-key");
    }
    config.auth_key = shardlock::lease::generate_auth_key();
  }
  if (config.mode == "table" && !config.server.empty()) {
    return tools::usage_error(kTool, "--server applies to --mode lease only");
  }
  if (config.discover && config.server.empty()) {
    return tools::usage_error(kTool, "--discover needs --server: the seeds of the cluster");
  }
  if (config.mode == "table" && (config.read_fraction > 0.0 || config.keys_per_op > 1)) {
    return tools::usage_error(kTool,
                              "--read-fraction and --keys-per-op apply to --mode lease only");
  }
  if (config.keys_per_op > 1 && config.batch > 1) {
    return tools::usage_error(
        kTool,
        "--keys-per-op and --batch exclude each other: an ACQUIRE_MANY already carries "
        "several keys");
  }
  if (config.keys_per_op > config.keys) {
    return tools::usage_error(kTool, "--keys-per-op " + std::to_string(config.keys_per_op) +
                                         " needs at least as many --keys");
  }

  Result result;
  const int rc = config.mode == "lease" ? run_lease(config, result) : run_table(config, result);
  if (rc != 0) return rc;
  if (config.json) {
    print_json(config, result);
  } else {
    print_table(config, result);
  }
  if (const std::string why = failure_reason(result); !why.empty()) {
    std::fprintf(stderr, "shardlock-bench: the run failed: %s\n", why.c_str());
    return kExitErrorsDominate;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return shardlock::tools::run_main(kTool, kExitRunFailed, run, argc, argv);
}
