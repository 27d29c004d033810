// cursor.h: what the lease codec's files share. Private to src/lease/wire/.
//
// Reader and Writer are bounds-checked cursors: every read tests the remaining
// length first and latches an error instead of reading past the span, so a
// body is read field after field with one check at the end. The valid_*()
// rules say which list entries decode() accepts; the entry builders
// (protocol_lists.cc) refuse the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease::internal {

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> in) noexcept : in_(in) {}

  [[nodiscard]] bool ok() const noexcept { return ok_; }
  [[nodiscard]] std::size_t remaining() const noexcept { return in_.size() - pos_; }
  [[nodiscard]] std::size_t position() const noexcept { return pos_; }

  std::uint64_t uint(std::size_t bytes) noexcept {
    if (!ok_ || remaining() < bytes) {
      ok_ = false;
      return 0;
    }
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < bytes; ++i) v |= std::uint64_t{in_[pos_ + i]} << (8 * i);
    pos_ += bytes;
    return v;
  }
  std::uint8_t u8() noexcept { return static_cast<std::uint8_t>(uint(1)); }
  std::uint16_t u16() noexcept { return static_cast<std::uint16_t>(uint(2)); }
  std::uint32_t u32() noexcept { return static_cast<std::uint32_t>(uint(4)); }
  std::uint64_t u64() noexcept { return uint(8); }

  std::span<const std::uint8_t> bytes(std::size_t n) noexcept {
    if (!ok_ || remaining() < n) {
      ok_ = false;
      return {};
    }
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  // The bytes read since position `from`.
  [[nodiscard]] std::span<const std::uint8_t> since(std::size_t from) const noexcept {
    return in_.subspan(from, pos_ - from);
  }
  std::string_view key() noexcept {
    const std::size_t n = u16();
    auto s = bytes(n);
    return {reinterpret_cast<const char*>(s.data()), s.size()};
  }

 private:
  std::span<const std::uint8_t> in_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

class Writer {
 public:
  explicit Writer(std::span<std::uint8_t> out) noexcept : out_(out) {}

  [[nodiscard]] bool ok() const noexcept { return ok_; }
  [[nodiscard]] std::size_t position() const noexcept { return pos_; }

  void uint(std::uint64_t v, std::size_t bytes) noexcept {
    if (!ok_ || out_.size() - pos_ < bytes) {
      ok_ = false;
      return;
    }
    for (std::size_t i = 0; i < bytes; ++i)
      out_[pos_ + i] = static_cast<std::uint8_t>(v >> (8 * i));
    pos_ += bytes;
  }
  void u8(std::uint8_t v) noexcept { uint(v, 1); }
  void u16(std::uint16_t v) noexcept { uint(v, 2); }
  void u32(std::uint32_t v) noexcept { uint(v, 4); }
  void u64(std::uint64_t v) noexcept { uint(v, 8); }
  void bytes(const void* p, std::size_t n) noexcept {
    if (!ok_ || out_.size() - pos_ < n) {
      ok_ = false;
      return;
    }
    if (n != 0) std::memcpy(out_.data() + pos_, p, n);
    pos_ += n;
  }
  void key(std::string_view k) noexcept {
    u16(static_cast<std::uint16_t>(k.size()));
    bytes(k.data(), k.size());
  }
  // Overwrites a u16 written earlier (a batch item's body_length).
  void patch_u16(std::size_t at, std::uint16_t v) noexcept {
    out_[at] = static_cast<std::uint8_t>(v);
    out_[at + 1] = static_cast<std::uint8_t>(v >> 8);
  }

 private:
  std::span<std::uint8_t> out_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

// The i-th little-endian u64 of `bytes`. Precondition: 8 * (i + 1) <= size.
inline std::uint64_t load_u64_le(std::span<const std::uint8_t> bytes, std::size_t i) noexcept {
  std::uint64_t v = 0;
  for (std::size_t b = 0; b < 8; ++b) v |= std::uint64_t{bytes[i * 8 + b]} << (8 * b);
  return v;
}

// Whether a member-list entry holds what decode() accepts.
constexpr bool valid_member(std::size_t id_length, std::size_t address_length,
                            std::uint32_t weight) noexcept {
  return id_length >= 1 && id_length <= kMaxMemberIdLength && address_length >= 1 &&
         address_length <= kMaxMemberAddressLength && weight >= 1;
}

// Whether a holder-list entry holds what decode() accepts.
constexpr bool valid_holder(std::uint8_t flags, std::size_t value_length) noexcept {
  return (flags & ~kHolderFlagPending) == 0 && value_length <= kMaxHolderValueLength;
}

// Whether a hot-key-list entry holds what decode() accepts.
constexpr bool valid_hot_key(std::size_t key_length, std::uint32_t requests,
                             std::uint32_t error) noexcept {
  return key_length >= kMinKeyLength && key_length <= kMaxKeyLength && error <= requests;
}

}  // namespace shardlock::lease::internal
