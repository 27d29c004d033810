// Datagram authentication with libsodium. See include/shardlock/lease/auth.h.
#include "shardlock/lease/wire/auth.h"

#include <sodium.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "shardlock/lease/wire/protocol.h"
#include "wire/sodium.h"

namespace shardlock::lease {

// sodium_init() is thread-safe and idempotent; it only has to run before the
// first call into libsodium, which every function here and in envelope.cc
// reaches through this.
void internal::ensure_sodium() noexcept {
  static const bool ready = sodium_init() >= 0;
  if (!ready) {
    // Only fails when the system cannot provide randomness at all.
    std::abort();
  }
}

namespace {

using internal::ensure_sodium;

void tag_of(std::span<const std::uint8_t> bytes, const AuthKey& key,
            std::array<std::uint8_t, kAuthTagSize>& tag) noexcept {
  static_assert(kAuthTagSize >= crypto_generichash_BYTES_MIN);
  static_assert(kAuthKeySize >= crypto_generichash_KEYBYTES_MIN &&
                kAuthKeySize <= crypto_generichash_KEYBYTES_MAX);
  crypto_generichash(tag.data(), tag.size(), bytes.data(), bytes.size(), key.data(), key.size());
}

}  // namespace

AuthKey generate_auth_key() {
  ensure_sodium();
  AuthKey key;
  randombytes_buf(key.data(), key.size());
  return key;
}

std::string format_auth_key(const AuthKey& key) {
  std::array<char, 2 * kAuthKeySize + 1> hex;
  sodium_bin2hex(hex.data(), hex.size(), key.data(), key.size());
  return {hex.data(), 2 * kAuthKeySize};
}

std::optional<AuthKey> parse_auth_key(std::string_view text) noexcept {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  if (text.size() != 2 * kAuthKeySize) return std::nullopt;
  AuthKey key;
  std::size_t decoded = 0;
  const char* end = nullptr;
  if (sodium_hex2bin(key.data(), key.size(), text.data(), text.size(), nullptr, &decoded, &end) !=
          0 ||
      decoded != key.size() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return key;
}

AuthKeyFile load_auth_key(const std::string& path) {
  AuthKeyFile result;
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    result.error = "cannot read key file " + path + ": " + std::strerror(errno);
    return result;
  }
  // A key file is 64 digits and a newline; anything much longer is not one.
  std::string text(256, '\0');
  file.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(file.gcount()));
  result.key = parse_auth_key(text);
  if (!result.key) {
    result.error = "key file " + path + " does not hold a key (64 hex digits; make one with " +
                   "`shardlockctl keygen`)";
  }
  return result;
}

std::size_t seal_datagram(std::span<std::uint8_t> buffer, std::size_t length,
                          const AuthKey& key) noexcept {
  if (length < kHeaderSize || length > buffer.size() || buffer.size() - length < kAuthTagSize) {
    return 0;
  }
  ensure_sodium();
  buffer[kHeaderFlagsOffset] |= kFlagAuthenticated;
  std::array<std::uint8_t, kAuthTagSize> tag;
  tag_of(buffer.first(length), key, tag);
  std::memcpy(buffer.data() + length, tag.data(), tag.size());
  return length + kAuthTagSize;
}

std::span<const std::uint8_t> open_datagram(std::span<const std::uint8_t> datagram,
                                            const AuthKey& key) noexcept {
  if (datagram.size() < kHeaderSize + kAuthTagSize) return {};
  if ((datagram[kHeaderFlagsOffset] & kFlagAuthenticated) == 0) return {};
  ensure_sodium();
  const std::span<const std::uint8_t> body = datagram.first(datagram.size() - kAuthTagSize);
  std::array<std::uint8_t, kAuthTagSize> expected;
  tag_of(body, key, expected);
  static_assert(kAuthTagSize == 16, "crypto_verify_16 compares 16 bytes");
  if (crypto_verify_16(expected.data(), datagram.data() + body.size()) != 0) return {};
  return body;
}

}  // namespace shardlock::lease
