// call.h's small parts: the client error category, the client's clock and
// the node-list and owner-id helpers.
#include "shardlock/lease/client/call.h"

#include <sys/random.h>
#include <sys/types.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <string>

namespace shardlock::lease {

namespace {

class LeaseCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "shardlock.lease.client"; }
  std::string message(int value) const override {
    return std::string(to_string(static_cast<LeaseErrc>(value)));
  }
};

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string_view to_string(LeaseErrc e) noexcept {
  switch (e) {
    case LeaseErrc::kOk:
      return "ok";
    case LeaseErrc::kBusy:
      return "busy";
    case LeaseErrc::kTimeout:
      return "timeout";
    case LeaseErrc::kUnreachable:
      return "unreachable";
    case LeaseErrc::kRecovering:
      return "recovering";
    case LeaseErrc::kNotOwner:
      return "not owner";
    case LeaseErrc::kExpired:
      return "expired";
    case LeaseErrc::kServerError:
      return "server error";
    case LeaseErrc::kBadArgument:
      return "bad argument";
    case LeaseErrc::kNotStarted:
      return "client not started";
    case LeaseErrc::kBadAddress:
      return "bad address";
    case LeaseErrc::kLeaseInactive:
      return "lease not held";
    case LeaseErrc::kGrantExpired:
      return "grant expired";
    case LeaseErrc::kCrossNode:
      return "keys owned by different nodes";
    case LeaseErrc::kRedirected:
      return "redirected: the key's owner node was not reached";
  }
  return "unknown";
}

const std::error_category& lease_category() noexcept {
  static const LeaseCategory category;
  return category;
}

LeaseClock::time_point LeaseClock::now() noexcept {
  timespec ts{};
  // CLOCK_BOOTTIME cannot fail on Linux >= 2.6.39 with a valid pointer.
  (void)::clock_gettime(CLOCK_BOOTTIME, &ts);
  return time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

std::vector<std::string> split_node_list(std::string_view text) {
  std::vector<std::string> nodes;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    if (comma > start) nodes.emplace_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return nodes;
}

ClientId random_client_id() noexcept {
  std::array<std::uint64_t, 2> words{};
  if (::getrandom(words.data(), sizeof words, 0) != static_cast<ssize_t>(sizeof words)) return {};
  return ClientId{words[0], words[1]};
}

std::string to_hex(const ClientId& id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text(32, '0');
  for (int i = 0; i < 16; ++i) {
    text[static_cast<std::size_t>(15 - i)] = kDigits[(id.hi >> (4 * i)) & 0xF];
    text[static_cast<std::size_t>(31 - i)] = kDigits[(id.lo >> (4 * i)) & 0xF];
  }
  return text;
}

std::optional<ClientId> parse_client_id(std::string_view hex) noexcept {
  if (hex.size() != 32) return std::nullopt;
  ClientId id;
  for (std::size_t i = 0; i < 32; ++i) {
    const int v = hex_value(hex[i]);
    if (v < 0) return std::nullopt;
    std::uint64_t& half = i < 16 ? id.hi : id.lo;
    half = (half << 4) | static_cast<std::uint64_t>(v);
  }
  return id;
}

}  // namespace shardlock::lease
