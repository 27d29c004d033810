// parse_membership(): the membership file format shared by shardlock-route
// and any service that reads its node list from a file.
#include <charconv>
#include <set>
#include <string>
#include <string_view>

#include "shardlock/router.h"

namespace shardlock {
namespace {

bool is_space(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

// Splits off the next whitespace-separated field of `rest`.
std::string_view next_field(std::string_view& rest) noexcept {
  std::size_t begin = 0;
  while (begin < rest.size() && is_space(rest[begin])) ++begin;
  std::size_t end = begin;
  while (end < rest.size() && !is_space(rest[end])) ++end;
  const std::string_view field = rest.substr(begin, end - begin);
  rest.remove_prefix(end);
  return field;
}

}  // namespace

MembershipParseResult parse_membership(std::string_view text) {
  MembershipParseResult result;
  std::set<std::string_view> seen;
  const auto fail = [&](std::size_t line, std::string message) {
    result.nodes.clear();
    result.error_line = line;
    result.error = std::move(message);
    return result;
  };
  std::size_t line_number = 0;
  while (!text.empty()) {
    ++line_number;
    const std::size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text.remove_prefix(newline == std::string_view::npos ? text.size() : newline + 1);
    if (const std::size_t hash = line.find('#'); hash != std::string_view::npos) {
      line = line.substr(0, hash);
    }
    const std::string_view id = next_field(line);
    if (id.empty()) continue;
    const std::string_view weight_text = next_field(line);
    if (!next_field(line).empty()) {
      return fail(line_number, "expected \"node [weight]\", found more than two fields");
    }
    std::uint32_t weight = 1;
    if (!weight_text.empty()) {
      const auto [end, error] =
          std::from_chars(weight_text.data(), weight_text.data() + weight_text.size(), weight);
      if (error != std::errc() || end != weight_text.data() + weight_text.size() || weight == 0 ||
          weight > RouterSnapshot::kMaxWeight) {
        return fail(line_number, "weight \"" + std::string(weight_text) +
                                     "\" is not an integer from 1 to " +
                                     std::to_string(RouterSnapshot::kMaxWeight));
      }
    }
    if (!seen.insert(id).second) {
      return fail(line_number, "duplicate node \"" + std::string(id) + "\"");
    }
    if (result.nodes.size() == RouterSnapshot::kMaxNodes) {
      return fail(line_number,
                  "too many nodes (at most " + std::to_string(RouterSnapshot::kMaxNodes) + ")");
    }
    result.nodes.push_back(Node{std::string(id), weight});
  }
  return result;
}

}  // namespace shardlock
