#include "shardlock/lease/fencing.h"

namespace shardlock::lease {

FencingValidator::FencingValidator(std::size_t stripes)
    : table_(stripes), stripes_(std::make_unique<StripeTokens[]>(table_.stripe_count())) {}

FencingValidator::~FencingValidator() = default;

bool FencingValidator::check_and_advance(std::string_view key, std::uint64_t token) {
  const auto guard = table_.lock(key);
  auto& highest = stripes_[guard.stripe()].highest;
  const auto it = highest.find(key);
  if (it == highest.end()) {
    highest.emplace(std::string(key), token);
    return true;
  }
  if (token < it->second) return false;
  it->second = token;
  return true;
}

std::optional<std::uint64_t> FencingValidator::highest(std::string_view key) const {
  const auto guard = table_.lock(key);
  const auto& highest = stripes_[guard.stripe()].highest;
  const auto it = highest.find(key);
  if (it == highest.end()) return std::nullopt;
  return it->second;
}

void FencingValidator::forget(std::string_view key) {
  const auto guard = table_.lock(key);
  auto& highest = stripes_[guard.stripe()].highest;
  if (const auto it = highest.find(key); it != highest.end()) highest.erase(it);
}

}  // namespace shardlock::lease
