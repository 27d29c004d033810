// Sealing for a tenant with libsodium. See include/shardlock/lease/wire/envelope.h.
#include "shardlock/lease/wire/envelope.h"

#include <pthread.h>
#include <sodium.h>

#include <array>
#include <atomic>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>

#include "shardlock/lease/wire/auth.h"
#include "shardlock/lease/wire/protocol.h"
#include "wire/sodium.h"

namespace shardlock::lease {
namespace {

using internal::ensure_sodium;

constexpr std::uint8_t kEnvelopeFlags = kFlagKeyId | kFlagEncrypted;
// Magic, version and flags stay readable: a receiver needs them to know what
// it holds. Encryption starts at the type byte.
constexpr std::size_t kCipherOffset = kHeaderFlagsOffset + 1;
// Those readable bytes and then the key id.
constexpr std::size_t kAssociatedSize = kCipherOffset + kKeyIdSize;
// crypto_kdf's context names what the subkey is for, in exactly 8 bytes.
constexpr char kCipherKeyContext[] = "SLKaead1";
constexpr std::uint64_t kCipherSubkeyId = 1;

static_assert(sizeof(kCipherKeyContext) == crypto_kdf_CONTEXTBYTES + 1);
static_assert(kAuthKeySize == crypto_kdf_KEYBYTES);
static_assert(kAuthKeySize >= crypto_kdf_BYTES_MIN && kAuthKeySize <= crypto_kdf_BYTES_MAX);
static_assert(kAuthKeySize == crypto_aead_xchacha20poly1305_ietf_KEYBYTES);
static_assert(kEnvelopeNonceSize == crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
static_assert(kAuthTagSize == crypto_aead_xchacha20poly1305_ietf_ABYTES);
static_assert(kCipherOffset < kHeaderSize, "a header always leaves plaintext to encrypt");

std::uint32_t load_u32(const std::uint8_t* p) noexcept {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

void store_u32(std::uint8_t* p, std::uint32_t v) noexcept {
  for (std::size_t i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

// ----------------------------------------------------------------- nonces
//
// XChaCha20-Poly1305 must never see a nonce twice under one key. A nonce is
// a 16-byte prefix followed by a 64-bit little-endian counter. Each thread
// keeps a few streams of them, one per key id it seals for (direct-mapped
// by key id, kNonceStreams slots); a stream draws its prefix from the
// system's random source (randombytes_buf(), one getrandom(2)) when it
// starts, then counts. Why no nonce repeats under one key:
//   - One stream: the counter only grows, and a fresh prefix is drawn
//     before it could wrap, so (prefix, counter) never repeats.
//   - Two streams (threads, key ids that share a slot in turn, processes,
//     restarts, other hosts): each starts with a prefix of its own, 128
//     random bits. Two of n prefixes are equal with probability below
//     n^2 / 2^129 (2^-65 for 2^32 streams ever started under one key), and
//     even two equal prefixes repeat a nonce only where their counters meet.
//   - fork(): the child's copy of the forking thread would go on with the
//     parent's prefixes and counters, as the parent does. A pthread_atfork()
//     child handler bumps the fork generation before fork() returns in the
//     child; a stream of an older generation draws a new prefix before it
//     seals. Where the handler could not be registered, every nonce is drawn
//     whole as before. A child of a raw clone(2), which skips the handlers,
//     must not seal (vfork and posix_spawn children exec first).
//   - Key rotation: current and next key share a key id and so a stream;
//     its nonces are unique across both.
// Not covered: a VM snapshot resumed twice repeats the streams' state, as
// any state in memory; getrandom per nonce had the kernel reseed on resume.
// XChaCha20 turns the first 16 nonce bytes into a subkey (HChaCha20) and
// gives ChaCha20 the last 8, so this is a counter under a random subkey per
// stream. It replaces one getrandom(2) per datagram (about 0.4 us, near
// half of an encrypted seal). What it shows on the wire: which datagrams of
// one tenant a thread sealed, how many it had sealed for that key id
// before, and (by a fresh prefix) that a key id sharing the slot came in
// between. Streams per key id keep one tenant from counting another's
// datagrams in the server's replies.
constexpr std::size_t kNoncePrefixSize = 16;
constexpr std::size_t kNonceStreams = 16;
static_assert(kNoncePrefixSize + sizeof(std::uint64_t) == kEnvelopeNonceSize);

struct NonceStream {
  std::uint64_t generation = 0;  // the fork generation it started in; 0: not started
  std::uint64_t counter = 0;     // the next nonce's
  std::uint32_t key_id = 0;
  std::array<std::uint8_t, kNoncePrefixSize> prefix{};
};

// Starts at 1, so that a zeroed stream is one of no generation. Relaxed
// everywhere: it changes only in a child, in the handler that runs on its
// only thread before fork() returns there, so that thread's later loads are
// sequenced after the store; in a parent it never changes.
constinit std::atomic<std::uint64_t> fork_generation{1};

void on_fork_child() noexcept { fork_generation.fetch_add(1, std::memory_order_relaxed); }

// Writes the next nonce for `key_id` to nonce[0, kEnvelopeNonceSize).
void next_nonce(std::uint32_t key_id, std::uint8_t* nonce) noexcept {
  // Registered before this process draws its first prefix, so every fork
  // after it bumps the generation.
  static const bool fork_safe = ::pthread_atfork(nullptr, nullptr, on_fork_child) == 0;
  if (!fork_safe) {
    randombytes_buf(nonce, kEnvelopeNonceSize);
    return;
  }
  thread_local constinit std::array<NonceStream, kNonceStreams> streams{};
  NonceStream& stream = streams[key_id % kNonceStreams];
  const std::uint64_t generation = fork_generation.load(std::memory_order_relaxed);
  if (stream.generation != generation || stream.key_id != key_id ||
      stream.counter == std::numeric_limits<std::uint64_t>::max()) {
    randombytes_buf(stream.prefix.data(), stream.prefix.size());
    stream.generation = generation;
    stream.key_id = key_id;
    stream.counter = 0;
  }
  std::memcpy(nonce, stream.prefix.data(), kNoncePrefixSize);
  const std::uint64_t counter = stream.counter++;
  for (std::size_t i = 0; i < sizeof counter; ++i) {
    nonce[kNoncePrefixSize + i] = static_cast<std::uint8_t>(counter >> (8 * i));
  }
}

// The AEAD's associated data: the readable header bytes, then the key id.
// They are not adjacent on the wire, so they are gathered here.
std::array<std::uint8_t, kAssociatedSize> associated_data(const std::uint8_t* header,
                                                          const std::uint8_t* key_id) noexcept {
  std::array<std::uint8_t, kAssociatedSize> ad;
  std::memcpy(ad.data(), header, kCipherOffset);
  std::memcpy(ad.data() + kCipherOffset, key_id, kKeyIdSize);
  return ad;
}

// Opens `datagram` into out[0, plain length); `out` is either apart from
// `datagram` or starts at its first byte (in place). Returns the plain
// length, or 0.
std::size_t open_into(std::span<const std::uint8_t> datagram, const EnvelopeKey& key,
                      std::span<std::uint8_t> out) noexcept {
  const std::optional<EnvelopeKeyId> id = peek_key_id(datagram);
  if (!id) return 0;
  const std::size_t plain = datagram.size() - envelope_overhead(id->mode);
  if (out.size() < plain) return 0;
  const std::uint8_t* in = datagram.data();
  const bool in_place = out.data() == in;
  assert(in_place || std::less<>{}(in + datagram.size(), out.data() + 1) ||
         std::less<>{}(out.data() + out.size(), in + 1));
  if (id->mode == EnvelopeMode::kEncrypted) {
    ensure_sodium();
    const std::uint8_t* trailer = in + plain;
    const std::uint8_t* nonce = trailer + kKeyIdSize;
    const std::uint8_t* tag = nonce + kEnvelopeNonceSize;
    const auto ad = associated_data(in, trailer);
    // Verifies the tag (in constant time) before it decrypts; c and m may be
    // the same bytes. A tag that does not verify leaves m cleared.
    if (crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
            out.data() + kCipherOffset, nullptr, in + kCipherOffset, plain - kCipherOffset, tag,
            ad.data(), ad.size(), nonce, key.cipher_key.data()) != 0) {
      return 0;
    }
  } else {
    // Both BLAKE2b forms tag all bytes before the tag, the key id included:
    // open_datagram()'s check (constant time) for either.
    if (open_datagram(datagram, key.tag_key).empty()) return 0;
    if (!in_place)
      std::memcpy(out.data() + kCipherOffset, in + kCipherOffset, plain - kCipherOffset);
  }
  if (!in_place) std::memcpy(out.data(), in, kCipherOffset);
  out[kHeaderFlagsOffset] &= static_cast<std::uint8_t>(~kEnvelopeFlags);
  return plain;
}

}  // namespace

EnvelopeKey envelope_key(const AuthKey& key) noexcept {
  ensure_sodium();
  EnvelopeKey keys;
  keys.tag_key = key;
  // Fails only for a subkey length outside crypto_kdf's bounds (asserted above).
  (void)crypto_kdf_derive_from_key(keys.cipher_key.data(), keys.cipher_key.size(), kCipherSubkeyId,
                                   kCipherKeyContext, key.data());
  return keys;
}

std::size_t seal_for(std::span<std::uint8_t> buffer, std::size_t length, std::uint32_t key_id,
                     const EnvelopeKey& key, EnvelopeMode mode) noexcept {
  const std::size_t overhead = envelope_overhead(mode);
  if (length < kHeaderSize || length > buffer.size() || buffer.size() - length < overhead) {
    return 0;
  }
  if (load_u32(buffer.data()) != kMagic || (buffer[kHeaderFlagsOffset] & kEnvelopeFlags) != 0) {
    return 0;
  }
  std::uint8_t* trailer = buffer.data() + length;
  switch (mode) {
    case EnvelopeMode::kLegacy:
      if (key_id != 0) return 0;
      return seal_datagram(buffer, length, key.tag_key);
    case EnvelopeMode::kAuthenticated:
      buffer[kHeaderFlagsOffset] |= kFlagKeyId;
      store_u32(trailer, key_id);
      // Sets kFlagAuthenticated and tags all before the tag, key id included.
      return seal_datagram(buffer, length + kKeyIdSize, key.tag_key);
    case EnvelopeMode::kEncrypted: {
      ensure_sodium();
      buffer[kHeaderFlagsOffset] |= kFlagAuthenticated | kFlagKeyId | kFlagEncrypted;
      store_u32(trailer, key_id);
      std::uint8_t* nonce = trailer + kKeyIdSize;
      std::uint8_t* tag = nonce + kEnvelopeNonceSize;
      next_nonce(key_id, nonce);
      const auto ad = associated_data(buffer.data(), trailer);
      // In place (c == m). It fails only for messages near 2^64 bytes.
      if (crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
              buffer.data() + kCipherOffset, tag, nullptr, buffer.data() + kCipherOffset,
              length - kCipherOffset, ad.data(), ad.size(), nullptr, nonce,
              key.cipher_key.data()) != 0) {
        return 0;
      }
      return length + overhead;
    }
  }
  return 0;
}

std::optional<EnvelopeKeyId> peek_key_id(std::span<const std::uint8_t> datagram) noexcept {
  if (datagram.size() < kHeaderSize || load_u32(datagram.data()) != kMagic) return std::nullopt;
  const std::uint8_t flags = datagram[kHeaderFlagsOffset];
  if ((flags & kFlagAuthenticated) == 0) return std::nullopt;
  EnvelopeKeyId id;
  switch (flags & kEnvelopeFlags) {
    case 0:
      id.mode = EnvelopeMode::kLegacy;
      break;
    case kFlagKeyId:
      id.mode = EnvelopeMode::kAuthenticated;
      break;
    case kFlagKeyId | kFlagEncrypted:
      id.mode = EnvelopeMode::kEncrypted;
      break;
    default:  // kFlagEncrypted without a key id
      return std::nullopt;
  }
  const std::size_t overhead = envelope_overhead(id.mode);
  if (datagram.size() < kHeaderSize + overhead) return std::nullopt;
  if (id.mode != EnvelopeMode::kLegacy) {
    id.key_id = load_u32(datagram.data() + datagram.size() - overhead);
  }
  return id;
}

std::span<const std::uint8_t> open_with(std::span<const std::uint8_t> datagram,
                                        const EnvelopeKey& key,
                                        std::span<std::uint8_t> out) noexcept {
  return out.first(open_into(datagram, key, out));
}

std::span<const std::uint8_t> open_in_place(std::span<std::uint8_t> datagram,
                                            const EnvelopeKey& key) noexcept {
  return datagram.first(open_into(datagram, key, datagram));
}

}  // namespace shardlock::lease
