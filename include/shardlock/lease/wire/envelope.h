// envelope.h: sealing lease datagrams for a tenant, authenticated or
// encrypted.
//
// Use it where several tenants, each with its own 32-byte key, share one
// server, or where keys, values and owner ids must not be readable on the
// wire. A sealed datagram names the key that sealed it by a u32 key id, which
// the receiver maps to a key (a tenant table), so opening takes two steps:
// peek_key_id() reads the id, then open_with() or open_in_place() verifies
// (and decrypts) under the key found for it. What they return is a plain
// datagram that decode() reads. Like the codec, this never touches a socket
// and never throws; bad input is an empty result. It allocates only a
// thread's AES state cache, once (see Memory below).
//
// Wire (integers little-endian; n is the plain datagram's length):
//
//   form               flags  bytes
//   legacy             0x01   [datagram n][tag 16]
//   authenticated      0x05   [datagram n][u32 key_id][tag 16]
//   encrypted          0x0D   [bytes 0..5][ciphertext n-6][u32 key_id][nonce 24][tag 16]
//   authenticated-AES  0x15   [datagram n][u32 key_id][nonce 24][tag 16]
//   encrypted-AES      0x1D   [bytes 0..5][ciphertext n-6][u32 key_id][nonce 24][tag 16]
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
//   The AES forms add kFlagAes to the two above and seal with AES-256-GCM
//   (crypto_aead_aes256gcm_*_detached_afternm), much cheaper where the CPU
//   has AES-NI and PCLMULQDQ (aes_gcm_available()), and unavailable where it
//   has not. Their nonce field is a stream's: a 16-byte random prefix and a
//   u64 little-endian counter, drawn and counted as above. The prefix picks
//   the key: GCM runs under the stream's subkey, keyed BLAKE2b-256
//   (crypto_generichash) of the prefix under EnvelopeKey::aes_key, with the
//   counter followed by 4 zero bytes as its 12-byte nonce.
//     authenticated-AES: GCM with no plaintext (GMAC) and all bytes before
//       the tag, nonce field included, as associated data.
//     encrypted-AES: the plaintext, ciphertext and associated data of the
//       encrypted form.
//   A receiver derives a stream's subkey once and keeps it in a small
//   per-thread cache, so its datagrams cost one AES-GCM call each.
//   kFlagEpoch (0x02) may be set beside any form: it belongs to the plain
//   datagram and is covered like the rest of the header. Any other use of
//   bits 2 to 4 (kFlagEncrypted or kFlagAes without kFlagKeyId, any of
//   them without kFlagAuthenticated) is not a sealed datagram.
//
// Suites: the BLAKE2b and XChaCha20-Poly1305 forms are the portable suite,
// for every host; the AES forms need the CPU's AES instructions on both
// ends. A server reads every form its CPU can; one without AES-NI drops AES
// datagrams (counted as auth failures), so clients of such a server seal in
// the portable suite (LeaseClientOptions::cipher, EnvelopeCipher::kPortable).
// A server answers in the form the request came in.
//
// Key ids: id 0 names the same key as the legacy form, so a single-key
// deployment can encrypt too. An id says whose key to try, nothing more: a
// datagram is the tenant's only once it opens under that tenant's key, and
// because the tag covers the flags and the key id, a datagram that opens was
// sealed in the form and under the id that peek_key_id() read.
//
// What encryption does not hide: that a datagram is a shardlock one, its
// version, its flags (sealed how, in which suite, with a map epoch or not), the key id, its
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
//
// Memory: a thread's first AES seal or open allocates its AES state cache
// (envelope.cc: kAesStreams streams and kAesOpenSlots opened streams of
// about 560 bytes each, calloc'd, so pages are touched as slots fill); it
// is wiped and freed when the thread exits. Where that allocation fails,
// every AES seal and open derives its state afresh. Nothing else here
// allocates.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "shardlock/lease/wire/auth.h"

namespace shardlock::lease {

inline constexpr std::size_t kKeyIdSize = 4;
// Both nonce fields: XChaCha20-Poly1305's nonce, and the AES forms' stream
// (prefix 16, counter 8).
inline constexpr std::size_t kEnvelopeNonceSize = 24;

// How a datagram is sealed; the flags byte says which.
enum class EnvelopeMode : std::uint8_t {
  kLegacy,            // flags 0x01: BLAKE2b tag, no key id (key id 0)
  kAuthenticated,     // flags 0x05: key id, BLAKE2b tag
  kEncrypted,         // flags 0x0D: key id, nonce, Poly1305 tag; bytes 6.. encrypted
  kAuthenticatedAes,  // flags 0x15: key id, stream nonce, GMAC tag over all before it
  kEncryptedAes,      // flags 0x1D: key id, stream nonce, GCM tag; bytes 6.. encrypted
};
inline constexpr std::size_t kEnvelopeModes = 5;

// Whether `mode` encrypts bytes 6.. (a tenant's encrypt=yes).
[[nodiscard]] constexpr bool envelope_encrypts(EnvelopeMode mode) noexcept {
  return mode == EnvelopeMode::kEncrypted || mode == EnvelopeMode::kEncryptedAes;
}
// Whether `mode` is one of the AES-256-GCM forms.
[[nodiscard]] constexpr bool envelope_uses_aes(EnvelopeMode mode) noexcept {
  return mode == EnvelopeMode::kAuthenticatedAes || mode == EnvelopeMode::kEncryptedAes;
}

// The bytes sealing in `mode` adds to a datagram.
[[nodiscard]] constexpr std::size_t envelope_overhead(EnvelopeMode mode) noexcept {
  switch (mode) {
    case EnvelopeMode::kLegacy:
      return kAuthTagSize;
    case EnvelopeMode::kAuthenticated:
      return kKeyIdSize + kAuthTagSize;
    case EnvelopeMode::kEncrypted:
    case EnvelopeMode::kAuthenticatedAes:
    case EnvelopeMode::kEncryptedAes:
      return kKeyIdSize + kEnvelopeNonceSize + kAuthTagSize;
  }
  return 0;
}
// The largest of them, whatever the form: what a reply leaves room for when
// it does not know its seal.
inline constexpr std::size_t kMaxEnvelopeOverhead = [] {
  std::size_t most = 0;
  for (std::size_t m = 0; m < kEnvelopeModes; ++m) {
    most = std::max(most, envelope_overhead(static_cast<EnvelopeMode>(m)));
  }
  return most;
}();
static_assert(kMaxEnvelopeOverhead == 44);

// Whether this CPU runs the AES forms (libsodium's
// crypto_aead_aes256gcm_is_available(): AES-NI and PCLMULQDQ). Where it is
// false, seal_for() refuses the AES forms and open_with() drops them.
[[nodiscard]] bool aes_gcm_available() noexcept;

// Which suite a tenant's datagrams are sealed in (LeaseClientOptions::cipher,
// shardlockctl --cipher).
enum class EnvelopeCipher : std::uint8_t {
  kAuto,      // kAes where aes_gcm_available(), else kPortable
  kPortable,  // the BLAKE2b and XChaCha20-Poly1305 forms: any host, any server
  kAes,       // the AES-256-GCM forms: only where aes_gcm_available()
};
// "auto", "portable", "aes"; parse_envelope_cipher() reads them back.
[[nodiscard]] std::string_view to_string(EnvelopeCipher cipher) noexcept;
[[nodiscard]] std::optional<EnvelopeCipher> parse_envelope_cipher(std::string_view text) noexcept;
// The key-id form a tenant seals in on this host: authenticated, or
// encrypted with `encrypt`, in the suite `cipher` picks (kAuto resolved by
// aes_gcm_available()). nullopt for kAes where this CPU lacks it.
[[nodiscard]] std::optional<EnvelopeMode> tenant_envelope_mode(bool encrypt,
                                                               EnvelopeCipher cipher) noexcept;

// One 32-byte key made ready for every form, once per key (at start-up, or
// when a tenant table is loaded), so no datagram pays for a derivation.
// The key itself keys the BLAKE2b tag, as in the legacy form; each cipher
// has a subkey of its own (crypto_kdf, one context each), so one key never
// serves two primitives. The AES forms' stream subkeys are derived from
// aes_key, and the per-thread caches of their expanded states are keyed by
// aes_key's bytes themselves (and the stream's prefix): whatever EnvelopeKey
// a datagram is opened with, a cached state is used only for exactly the
// key and prefix it was derived from.
struct EnvelopeKey {
  AuthKey tag_key;     // keyed BLAKE2b: the key itself
  AuthKey cipher_key;  // XChaCha20-Poly1305: crypto_kdf_derive_from_key(key, 1, "SLKaead1")
  AuthKey aes_key;     // AES-256-GCM streams: crypto_kdf_derive_from_key(key, 1, "SLKaesg1")
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
// envelope_encrypts(mode), appends the trailer. Returns the new length,
// length + envelope_overhead(mode), or 0 and leaves `buffer` unchanged when
// the datagram is shorter than a header, is not a client datagram (kMagic),
// already has kFlagKeyId, kFlagEncrypted or kFlagAes set, or the trailer
// does not fit in `buffer`, when mode is kLegacy and key_id is not 0, or
// when mode is an AES form and aes_gcm_available() is false. kLegacy writes
// exactly what seal_datagram() writes. The nonce forms (kEncrypted and the
// AES forms) read the system's random source (one getrandom(2)) for a
// thread's first seal under a key id, and again after a fork, when another
// key id took its slot, or (AES) every 2^24 seals of a stream; other seals
// make no system call. An AES stream's start also derives its subkey
// (about 0.5 us). Never blocks otherwise.
[[nodiscard]] std::size_t seal_for(std::span<std::uint8_t> buffer, std::size_t length,
                                   std::uint32_t key_id, const EnvelopeKey& key,
                                   EnvelopeMode mode) noexcept;

// The key id and form of a sealed client datagram, read from its flags and
// trailer; nullopt when it is not one (not kMagic, kFlagAuthenticated clear,
// an impossible combination of bits 2 to 4, or too short for a header and
// its trailer). An AES form reads as one where aes_gcm_available() is false
// too (open_with() then refuses it). Verifies nothing: the result is a claim until open_with()
// succeeds. Legacy datagrams read as {0, kLegacy}.
[[nodiscard]] std::optional<EnvelopeKeyId> peek_key_id(
    std::span<const std::uint8_t> datagram) noexcept;

// Opens `datagram` under `key` into `out`: verifies the tag in constant time
// (and decrypts), then writes the plain datagram to out's front with
// kFlagKeyId, kFlagEncrypted and kFlagAes cleared (kFlagAuthenticated
// stays, as open_datagram() leaves it), and returns that prefix of `out`.
// Empty when peek_key_id() would refuse the datagram, the tag does not
// verify under `key`, the form is AES and aes_gcm_available() is false, or
// `out` is shorter than the plain datagram (at most
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
