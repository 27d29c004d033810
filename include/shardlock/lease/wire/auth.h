// auth.h: optional datagram authentication for the lease protocol.
//
// Use it when the network between clients and servers is not trusted. Server
// and clients then share a 32-byte key. Every datagram, in both directions,
// carries a 16-byte tag: keyed BLAKE2b (libsodium's crypto_generichash) over
// all its bytes, with the header's kFlagAuthenticated bit set. A receiver
// that has a key drops, and counts, any datagram whose tag does not verify.
// That includes unauthenticated datagrams and datagrams sealed under another
// key. So nobody without the key can take, renew or release a lease, or forge
// a GRANTED to a client.
//
// Replays: an attacker who records a datagram can send it again. The server
// answers a repeated request id from its dedup cache, and a RENEW or RELEASE
// of a lease that has since changed hands gets EXPIRED, so a replay cannot
// release someone else's lease. A replayed ACQUIRE whose dedup entry has been
// evicted can take a free key for the original client until its TTL runs
// out. docs/lease-server.md has the details.
//
//   Wire: datagram bytes (header flags |= kFlagAuthenticated) + u8 tag[16]
//
// That is one key for everybody. envelope.h seals for one of many keys,
// named on the wire by a key id, and can encrypt; this form is its legacy
// form, key id 0.
//
// Key files hold the key as 64 hex digits. Surrounding whitespace is ignored.
// `shardlockctl keygen` writes one.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease {

inline constexpr std::size_t kAuthKeySize = 32;
inline constexpr std::size_t kAuthTagSize = 16;

using AuthKey = std::array<std::uint8_t, kAuthKeySize>;

// A fresh key from the operating system's random source.
[[nodiscard]] AuthKey generate_auth_key();
// The 64 lowercase hex digits of `key`.
[[nodiscard]] std::string format_auth_key(const AuthKey& key);
// Parses 64 hex digits (either case) with optional surrounding whitespace;
// nullopt for anything else.
[[nodiscard]] std::optional<AuthKey> parse_auth_key(std::string_view text) noexcept;

struct AuthKeyFile {
  std::optional<AuthKey> key;
  std::string error;  // why `key` is empty: the file cannot be read, or is not a key
};
// Reads and parses a key file.
[[nodiscard]] AuthKeyFile load_auth_key(const std::string& path);

// Seals the datagram in buffer[0, length): sets kFlagAuthenticated in its
// header and appends the tag. Returns the new length, length + kAuthTagSize,
// or 0 when the datagram is shorter than a header or the tag does not fit in
// `buffer`.
[[nodiscard]] std::size_t seal_datagram(std::span<std::uint8_t> buffer, std::size_t length,
                                        const AuthKey& key) noexcept;

// The datagram without its tag if it is sealed under `key` (flag set, tag
// verified in constant time); an empty span otherwise.
[[nodiscard]] std::span<const std::uint8_t> open_datagram(std::span<const std::uint8_t> datagram,
                                                          const AuthKey& key) noexcept;

}  // namespace shardlock::lease
