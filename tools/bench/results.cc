// See results.h.
#include "bench/results.h"

namespace shardlock::bench {

using lease::LeaseErrc;

std::size_t error_kind(const lease::CallResult& r) noexcept {
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

void Totals::add(const LiveCounters& c) {
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

}  // namespace shardlock::bench
