// envelope.h: sealing lease datagrams for a tenant, authenticated or
// encrypted.
//
// Use it where several tenants, each with its own 32-byte key, share one
// server, or where keys, values and owner ids must not be readable on the
// wire. A sealed datagram names the key that sealed it by a u32 key id, which
// the receiver maps to a key (a tenant table), so opening takes two steps:
// peek_key_id() reads the id, then open_with() or open_in_place() verifies
// (and decrypts) under the key found for it. What they return is a plain
// datagram that decode() reads. Like the codec, this never touches a socket,
// never allocates and never throws; bad input is an empty result.
//
// Wire (integers little-endian; n is the plain datagram's length):
//
//   form           flags  bytes
//   legacy         0x01   [datagram n][tag 16]
//   authenticated  0x05   [datagram n][u32 key_id][tag 16]
//   encrypted      0x0D   [bytes 0..5][ciphertext n-6][u32 key_id][nonce 24][tag 16]
//
//   legacy: auth.h's seal_datagram(), unchanged: kFlagAuthenticated and a
//     keyed BLAKE2b tag (crypto_generichash, 16 bytes) over all bytes before
//     it. It carries no key id and counts as key id 0, the single key of a
//     deployment without tenants (--auth-key).
//   authenticated: kFlagAuthenticated | kFlagKeyId; the same tag, over all
//     bytes before it, so the key id and the flags are covered.
//   encrypted: kFlagAuthenticated | kFlagKeyId | kFlagEncrypted;
//     XChaCha20-Poly1305-IETF (crypto_aead_xchacha20poly1305_ietf_*_detached).
//     The plaintext is bytes 6..n-1: type, count, request id, client id, the
//     map epoch, every body with its keys, values and owners, and the
//     padding; the ciphertext is as long and sits where they were. The
//     associated data is bytes 0..5 (magic, version, flags) followed by the
//     key id. The nonce is a 16-byte random prefix and a 64-bit
//     little-endian counter: each thread draws a prefix per key id it seals
//     for (again after a fork) and counts from 0, so nonces never repeat
//     under one key (envelope.cc says why); the tag is Poly1305's. A
//     receiver reads the nonce as 24 opaque bytes.
//   kFlagEpoch (0x02) may be set beside any form: it belongs to the plain
//   datagram and is covered like the rest of the header. Any other use of
//   bits 2 and 3 (kFlagEncrypted without kFlagKeyId, either without
//   kFlagAuthenticated) is not a sealed datagram.
//
// Key ids: id 0 names the same key as the legacy form, so a single-key
// deployment can encrypt too. An id says whose key to try, nothing more: a
// datagram is the tenant's only once it opens under that tenant's key, and
// because the tag covers the flags and the key id, a datagram that opens was
// sealed in the form and under the id that peek_key_id() read.
//
// What encryption does not hide: that a datagram is a shardlock one, its
// version, its flags (sealed how, with a map epoch or not), the key id, its
// length, and through the nonce which datagrams of a key id one thread
// sealed and how many it had sealed for that key id before (never how many
// for another key id). Request lengths are padded to their reply bound
// (encode_request()), which depends on the request's type and key length.
// Replays are not stopped here: the server's dedup cache and the lease
// state machine answer a replayed datagram as auth.h describes.
//
// Only client datagrams (kMagic) are sealed and opened here. Node-to-node
// datagrams give flag bits 2 and 3 other meanings and keep seal_datagram()
// and open_datagram().
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "shardlock/lease/wire/auth.h"

namespace shardlock::lease {

inline constexpr std::size_t kKeyIdSize = 4;
inline constexpr std::size_t kEnvelopeNonceSize = 24;

// How a datagram is sealed; the flags byte says which.
enum class EnvelopeMode : std::uint8_t {
  kLegacy,         // flags 0x01: BLAKE2b tag, no key id (key id 0)
  kAuthenticated,  // flags 0x05: key id, BLAKE2b tag
  kEncrypted,      // flags 0x0D: key id, nonce, Poly1305 tag; bytes 6.. encrypted
};

// The bytes sealing in `mode` adds to a datagram.
[[nodiscard]] constexpr std::size_t envelope_overhead(EnvelopeMode mode) noexcept {
  switch (mode) {
    case EnvelopeMode::kLegacy:
      return kAuthTagSize;
    case EnvelopeMode::kAuthenticated:
      return kKeyIdSize + kAuthTagSize;
    case EnvelopeMode::kEncrypted:
      return kKeyIdSize + kEnvelopeNonceSize + kAuthTagSize;
  }
  return 0;
}
inline constexpr std::size_t kMaxEnvelopeOverhead = envelope_overhead(EnvelopeMode::kEncrypted);

// One 32-byte key made ready for every form, once per key (at start-up, or
// when a tenant table is loaded), so no datagram pays for a derivation.
// The key itself keys the BLAKE2b tag, as in the legacy form; the cipher
// has a subkey of its own (crypto_kdf), so one key never serves two
// primitives.
struct EnvelopeKey {
  AuthKey tag_key;     // keyed BLAKE2b: the key itself
  AuthKey cipher_key;  // XChaCha20-Poly1305: crypto_kdf_derive_from_key(key)
};
[[nodiscard]] EnvelopeKey envelope_key(const AuthKey& key) noexcept;

// What peek_key_id() reads off a sealed datagram: whose key to open it with,
// and in which form it came.
struct EnvelopeKeyId {
  std::uint32_t key_id = 0;  // 0 for kLegacy
  EnvelopeMode mode = EnvelopeMode::kLegacy;

  friend bool operator==(const EnvelopeKeyId&, const EnvelopeKeyId&) = default;
};

// Seals the plain datagram in buffer[0, length) in `mode` under `key`, named
// `key_id`, in place: sets the form's flag bits, encrypts bytes 6.. when
// kEncrypted, appends the trailer. Returns the new length, length +
// envelope_overhead(mode), or 0 and leaves `buffer` unchanged when the
// datagram is shorter than a header, is not a client datagram (kMagic),
// already has kFlagKeyId or kFlagEncrypted set, or the trailer does not fit
// in `buffer`, or when mode is kLegacy and key_id is not 0. kLegacy writes
// exactly what seal_datagram() writes. kEncrypted reads the system's random
// source (one getrandom(2)) for a thread's first seal under a key id, and
// again after a fork or when another key id took its slot; other seals make
// no system call. Never blocks otherwise.
[[nodiscard]] std::size_t seal_for(std::span<std::uint8_t> buffer, std::size_t length,
                                   std::uint32_t key_id, const EnvelopeKey& key,
                                   EnvelopeMode mode) noexcept;

// The key id and form of a sealed client datagram, read from its flags and
// trailer; nullopt when it is not one (not kMagic, kFlagAuthenticated clear,
// an impossible combination of bits 2 and 3, or too short for a header and
// its trailer). Verifies nothing: the result is a claim until open_with()
// succeeds. Legacy datagrams read as {0, kLegacy}.
[[nodiscard]] std::optional<EnvelopeKeyId> peek_key_id(
    std::span<const std::uint8_t> datagram) noexcept;

// Opens `datagram` under `key` into `out`: verifies the tag in constant time
// (and decrypts), then writes the plain datagram to out's front with
// kFlagKeyId and kFlagEncrypted cleared (kFlagAuthenticated stays, as
// open_datagram() leaves it), and returns that prefix of `out`. Empty when
// peek_key_id() would refuse the datagram, the tag does not verify under
// `key`, or `out` is shorter than the plain datagram (at most
// datagram.size() - kAuthTagSize bytes); out's contents are then
// unspecified. `out` must not overlap `datagram` (a per-worker buffer),
// unless it starts at the same byte: that is open_in_place().
[[nodiscard]] std::span<const std::uint8_t> open_with(std::span<const std::uint8_t> datagram,
                                                      const EnvelopeKey& key,
                                                      std::span<std::uint8_t> out) noexcept;

// open_with() with `datagram` as its own output: the result is a prefix of
// `datagram`, decrypted where it lies. When it fails, the bytes after the
// flags may have been overwritten (libsodium clears a plaintext that does
// not verify), so a caller keeps no other use for a datagram it drops.
[[nodiscard]] std::span<const std::uint8_t> open_in_place(std::span<std::uint8_t> datagram,
                                                          const EnvelopeKey& key) noexcept;

}  // namespace shardlock::lease
