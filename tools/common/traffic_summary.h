// traffic_summary.h: the log line shardlockd writes about traffic its server
// refused or dropped - datagrams that failed authentication or did not
// decode, requests refused with ERROR, replies withheld or lost - worked out
// from the STATS counters the server keeps anyway, so the request path pays
// nothing for it. The daemon decides how often to ask (at most once per
// --log-summary-interval). Not API.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "shardlock/lease/wire/protocol.h"

namespace shardlock::tools {

class TrafficSummary {
 public:
  using Counters = std::array<std::uint64_t, lease::kStatCounterCount>;
  using Clock = std::chrono::steady_clock;

  // The counters a summary reports, in its order.
  static constexpr std::array<lease::StatCounter, 7> kReported = {
      lease::StatCounter::kAuthFailures,
      lease::StatCounter::kMalformed,
      lease::StatCounter::kErrors,
      lease::StatCounter::kLimitRejections,
      lease::StatCounter::kAllocationFailures,
      lease::StatCounter::kAmplificationDrops,
      lease::StatCounter::kSendDrops};

  // Counts from `counters`, read at `now`: what they hold already is no news.
  TrafficSummary(const Counters& counters, Clock::time_point now) : since_(counters), at_(now) {}

  // How the reported counters moved since the last line (or construction),
  // e.g. "in the last 10.0 s: 12 auth_failures (datagrams without a valid
  // tag for this server's key), 3 malformed (...)"; then counts on from
  // `counters`. nullopt, and nothing changes, when none of them moved.
  [[nodiscard]] std::optional<std::string> take(const Counters& counters, Clock::time_point now);

 private:
  Counters since_;
  Clock::time_point at_;
};

}  // namespace shardlock::tools
