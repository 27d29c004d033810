#include "common/traffic_summary.h"

#include <cstdio>
#include <string_view>

namespace shardlock::tools {
namespace {

// What each reported counter counts, in an operator's words.
std::string_view meaning(lease::StatCounter counter) {
  switch (counter) {
    case lease::StatCounter::kAuthFailures:
      return "datagrams without a valid tag for this server's key: a client with a wrong or "
             "missing --auth-key?";
    case lease::StatCounter::kMalformed:
      return "datagrams that did not decode";
    case lease::StatCounter::kErrors:
      return "requests answered ERROR";
    case lease::StatCounter::kLimitRejections:
      return "of those, over a configured bound such as --max-keys";
    case lease::StatCounter::kAllocationFailures:
      return "of those, refused for want of memory";
    case lease::StatCounter::kAmplificationDrops:
      return "replies withheld as larger than their request";
    case lease::StatCounter::kSendDrops:
      return "replies that could not be sent";
    default:
      return "";
  }
}

}  // namespace

std::optional<std::string> TrafficSummary::take(const Counters& counters, Clock::time_point now) {
  std::string parts;
  for (const lease::StatCounter counter : kReported) {
    const auto i = static_cast<std::size_t>(counter);
    // Counters only grow; a smaller value would be a new server, not news.
    if (counters[i] <= since_[i]) continue;
    if (!parts.empty()) parts += ", ";
    parts += std::to_string(counters[i] - since_[i]) + " " + std::string(to_string(counter)) +
             " (" + std::string(meaning(counter)) + ")";
  }
  if (parts.empty()) return std::nullopt;
  std::array<char, 32> seconds{};
  std::snprintf(seconds.data(), seconds.size(), "%.1f",
                std::chrono::duration<double>(now - at_).count());
  since_ = counters;
  at_ = now;
  return "refused or dropped traffic in the last " + std::string(seconds.data()) + " s: " + parts;
}

}  // namespace shardlock::tools
