// One line per lease event (shardlock/lease/server/internal/grant_log.h).
#include "shardlock/lease/server/internal/grant_log.h"

#include <array>
#include <charconv>
#include <new>
#include <string>
#include <utility>

#include "shardlock/lock_guard.h"

namespace shardlock::lease::internal {
namespace {

void append_number(std::string& out, std::uint64_t value) {
  std::array<char, 24> digits{};
  const auto [end, ec] = std::to_chars(digits.data(), digits.data() + digits.size(), value);
  out.append(digits.data(), end);
}

void append_hex64(std::string& out, std::uint64_t value) {
  constexpr std::string_view kDigits = "0123456789abcdef";
  for (int shift = 60; shift >= 0; shift -= 4) out.push_back(kDigits[(value >> shift) & 0xF]);
}

}  // namespace

std::string_view lease_event_name(LeaseEvent event) noexcept {
  switch (event) {
    case LeaseEvent::kGrant:
      return "grant";
    case LeaseEvent::kHandOff:
      return "handoff";
    case LeaseEvent::kRelease:
      return "release";
    case LeaseEvent::kExpiry:
      return "expiry";
    case LeaseEvent::kAbandon:
      return "abandon";
    case LeaseEvent::kTakeover:
      return "takeover";
  }
  return "event";
}

GrantLog::GrantLog(std::function<void(std::string_view)> sink,
                   std::uint32_t lines_per_second) noexcept
    : sink_(std::move(sink)), lines_per_second_(lines_per_second) {}

void GrantLog::record(LeaseEvent event, std::string_view key, const ClientId& owner,
                      std::uint64_t token, std::uint32_t ttl_ms, bool cluster,
                      std::int64_t now_ms) noexcept {
  LockGuard lock(mu_);
  const std::int64_t second = now_ms / 1000;
  if (second != second_) {
    second_ = second;
    in_second_ = 0;
  }
  if (in_second_ >= lines_per_second_) {
    ++pending_left_out_;
    ++left_out_;
    return;
  }
  try {
    if (pending_left_out_ > 0) {
      std::string note = "grant log: ";
      append_number(note, pending_left_out_);
      note += " events not logged (more than ";
      append_number(note, lines_per_second_);
      note += " a second)";
      sink_(note);
      pending_left_out_ = 0;
    }
    std::string line;
    line.reserve(64 + key.size());
    line += lease_event_name(event);
    line += " key=";
    line += key;
    line += " owner=";
    append_hex64(line, owner.hi);
    append_hex64(line, owner.lo);
    line += " token=";
    append_number(line, token);
    if (cluster) {
      line += " epoch=";
      append_number(line, token >> 32);
    }
    if (event == LeaseEvent::kGrant || event == LeaseEvent::kHandOff ||
        event == LeaseEvent::kTakeover) {
      line += " ttl_ms=";
      append_number(line, ttl_ms);
    }
    sink_(line);
    ++in_second_;
    ++logged_;
  } catch (...) {
    // No memory for the line, or the sink threw: left out, never fatal.
    ++left_out_;
  }
}

std::uint64_t GrantLog::logged() const {
  LockGuard lock(mu_);
  return logged_;
}

std::uint64_t GrantLog::left_out() const {
  LockGuard lock(mu_);
  return left_out_;
}

}  // namespace shardlock::lease::internal
