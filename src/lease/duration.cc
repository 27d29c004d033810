#include "shardlock/lease/duration.h"

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
// More fraction digits than this cannot be a whole millisecond of any unit
// above (an hour is 3.6e6 ms) unless they are zeros: refused as a typo.
constexpr std::size_t kMaxFractionDigits = 9;

bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }

// Reads "<digits>[.<digits>]" at text[i]: the integer part in `whole`, the
// fraction as `fraction` / `scale` (scale a power of ten, 1 without one).
bool read_number(std::string_view text, std::size_t& i, std::int64_t& whole, std::int64_t& fraction,
                 std::int64_t& scale) noexcept {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  whole = 0;
  fraction = 0;
  scale = 1;
  const std::size_t digits_start = i;
  while (i < text.size() && is_digit(text[i])) {
    const std::int64_t digit = text[i] - '0';
    if (whole > (kMax - digit) / 10) return false;
    whole = whole * 10 + digit;
    ++i;
  }
  if (i == digits_start) return false;
  if (i < text.size() && text[i] == '.') {
    ++i;
    const std::size_t fraction_start = i;
    while (i < text.size() && is_digit(text[i])) {
      if (i - fraction_start >= kMaxFractionDigits) return false;
      fraction = fraction * 10 + (text[i] - '0');
      scale *= 10;
      ++i;
    }
    if (i == fraction_start) return false;  // "1.s"
  }
  return true;
}

// whole.fraction x unit_ms as whole milliseconds; false on overflow or a
// part of a millisecond ("1.5ms", "0.0001s").
bool to_ms(std::int64_t whole, std::int64_t fraction, std::int64_t scale, std::int64_t unit_ms,
           std::int64_t& out) noexcept {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  if (whole > kMax / unit_ms) return false;
  // fraction < scale <= 1e9 and unit_ms <= 3.6e6: the product fits.
  const std::int64_t fraction_units = fraction * unit_ms;
  if (fraction_units % scale != 0) return false;
  const std::int64_t part = fraction_units / scale;
  if (whole * unit_ms > kMax - part) return false;
  out = whole * unit_ms + part;
  return true;
}

}  // namespace

std::optional<std::chrono::milliseconds> parse_duration(std::string_view text) noexcept {
  if (text.empty()) return std::nullopt;
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  std::int64_t total = 0;
  std::size_t i = 0;
  bool first = true;
  while (i < text.size()) {
    std::int64_t whole = 0;
    std::int64_t fraction = 0;
    std::int64_t scale = 1;
    if (!read_number(text, i, whole, fraction, scale)) return std::nullopt;
    const Unit* unit = nullptr;
    if (first && i == text.size()) {
      // A bare number is seconds, as sleep(1) and timeout(1) read it.
      static constexpr Unit kSeconds{"", 1'000};
      unit = &kSeconds;
    } else {
      for (const Unit& u : kUnits) {
        if (text.substr(i, u.name.size()) == u.name) {
          unit = &u;
          break;
        }
      }
    }
    if (unit == nullptr) return std::nullopt;
    i += unit->name.size();
    std::int64_t part = 0;
    if (!to_ms(whole, fraction, scale, unit->ms, part)) return std::nullopt;
    if (total > kMax - part) return std::nullopt;
    total += part;
    first = false;
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
