// Message's raw list fields after decode(): the token and counter accessors,
// the key-list walk, and the key-list builder. Entry parsing and building stay
// in protocol.cc beside the Reader, the Writer and the entry rules decode()
// applies. See protocol.h for the format.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease {

namespace {

std::uint64_t load_u64_le(std::span<const std::uint8_t> bytes, std::size_t i) noexcept {
  std::uint64_t v = 0;
  for (std::size_t b = 0; b < 8; ++b) v |= std::uint64_t{bytes[i * 8 + b]} << (8 * b);
  return v;
}

}  // namespace

std::uint64_t Message::shard_token(std::size_t i) const noexcept {
  return load_u64_le(shard_tokens_le, i);
}

std::uint64_t Message::counter_at(std::size_t i) const noexcept {
  return i < counters_le.size() / 8 ? load_u64_le(counters_le, i) : 0;
}

std::uint64_t Message::listed_token(std::size_t i) const noexcept {
  return load_u64_le(tokens_le, i);
}

KeyList::iterator::iterator(std::span<const std::uint8_t> rest, std::size_t left) noexcept
    : rest_(rest), left_(left) {
  load();
}

void KeyList::iterator::load() noexcept {
  if (left_ == 0) return;
  if (rest_.size() < 2) {
    left_ = 0;  // malformed: stop
    return;
  }
  const std::size_t n = rest_[0] | (std::size_t{rest_[1]} << 8);
  if (rest_.size() - 2 < n) {
    left_ = 0;
    return;
  }
  current_ = {reinterpret_cast<const char*>(rest_.data() + 2), n};
}

KeyList::iterator& KeyList::iterator::operator++() noexcept {
  if (left_ == 0) return *this;
  rest_ = rest_.subspan(2 + current_.size());
  --left_;
  load();
  return *this;
}

bool encode_key_list(std::span<const std::string_view> keys, std::vector<std::uint8_t>& out) {
  out.clear();
  if (keys.size() > 0xFF) return false;
  for (const std::string_view k : keys) {
    if (k.size() > 0xFFFF) return false;
    out.push_back(static_cast<std::uint8_t>(k.size()));
    out.push_back(static_cast<std::uint8_t>(k.size() >> 8));
    out.insert(out.end(), k.begin(), k.end());
  }
  return true;
}
}  // namespace shardlock::lease
