#include "shardlock/lease/wire/duration.h"

#include <array>
#include <cstdint>
#include <limits>

namespace shardlock::lease {
namespace {

struct Unit {
  std::string_view name;
  std::int64_t ms;
};
// Longest names first so "ms" is not read as "m" followed by garbage.
constexpr std::array<Unit, 4> kUnits = {{{"ms", 1}, {"h", 3'600'000}, {"m", 60'000}, {"s", 1'000}}};

}  // namespace

std::optional<std::chrono::milliseconds> parse_duration(std::string_view text) noexcept {
  if (text == "0") return std::chrono::milliseconds{0};
  if (text.empty()) return std::nullopt;
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  std::int64_t total = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    std::int64_t value = 0;
    const std::size_t digits_start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      const std::int64_t digit = text[i] - '0';
      if (value > (kMax - digit) / 10) return std::nullopt;
      value = value * 10 + digit;
      ++i;
    }
    if (i == digits_start) return std::nullopt;
    const Unit* unit = nullptr;
    for (const Unit& u : kUnits) {
      if (text.substr(i, u.name.size()) == u.name) {
        unit = &u;
        break;
      }
    }
    if (unit == nullptr) return std::nullopt;
    i += unit->name.size();
    if (value > kMax / unit->ms) return std::nullopt;
    const std::int64_t part = value * unit->ms;
    if (total > kMax - part) return std::nullopt;
    total += part;
  }
  return std::chrono::milliseconds{total};
}

std::string to_string(std::chrono::milliseconds d) {
  std::int64_t ms = d.count();
  if (ms == 0) return "0";
  std::string out;
  if (ms < 0) {
    out = "-";
    ms = -ms;
  }
  for (const std::int64_t scale :
       {std::int64_t{3'600'000}, std::int64_t{60'000}, std::int64_t{1'000}, std::int64_t{1}}) {
    const std::int64_t n = ms / scale;
    ms %= scale;
    if (n == 0) continue;
    out += std::to_string(n);
    out += scale == 3'600'000 ? "h" : scale == 60'000 ? "m" : scale == 1'000 ? "s" : "ms";
  }
  return out;
}

}  // namespace shardlock::lease
