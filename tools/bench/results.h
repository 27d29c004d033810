// results.h: what a shardlock-bench run counts and measures (its latency
// histograms, the live counters a worker updates and the progress line
// reads, their totals, the error kinds), and whether the run failed. Not
// API.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "shardlock/lease/client/client.h"

namespace shardlock::bench {

// Why an answer was an error, as a stable snake_case name: the key of its
// count in the JSON's "errors_by_kind". The first kWireErrorSlots are the
// ERROR reply's WireError code (0: a code this build does not know).
inline constexpr std::size_t kWireErrorSlots = 20;
inline constexpr std::array<std::string_view, kWireErrorSlots + 6> kErrorKindNames = {
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
    "permission_denied",
    "tenant_lease_limit",
    "tenant_waiter_limit",
    "tenant_watch_limit",
    "unreachable",
    "recovering",
    "timeout",
    "not_owner",
    "expired",
    "client_error"};
static_assert(static_cast<std::size_t>(lease::WireError::kTenantWatchLimit) == kWireErrorSlots - 1,
              "a new WireError needs its name in kErrorKindNames");
inline constexpr std::size_t kErrorKindCount = kErrorKindNames.size();

// The kErrorKindNames index of a failed call's error (not BUSY).
[[nodiscard]] std::size_t error_kind(const lease::CallResult& r) noexcept;

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
  void add(const LiveCounters& c);
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

// A run fails when more than this fraction of its answered requests were
// errors (or when nothing was granted at all).
inline constexpr double kMaxErrorFraction = 0.5;

// Why the run failed (errors dominate, or nothing was granted); empty when
// it did not.
[[nodiscard]] std::string failure_reason(const Result& r);

}  // namespace shardlock::bench
