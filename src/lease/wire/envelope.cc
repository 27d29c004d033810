// Sealing for a tenant with libsodium. See include/shardlock/lease/wire/envelope.h.
#include "shardlock/lease/wire/envelope.h"

#include <pthread.h>
#include <sodium.h>

#include <array>
#include <atomic>
#include <cassert>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>

#include "shardlock/lease/wire/auth.h"
#include "shardlock/lease/wire/protocol.h"
#include "wire/aes_testing.h"
#include "wire/sodium.h"

namespace shardlock::lease {
namespace {

using internal::ensure_sodium;

constexpr std::uint8_t kEnvelopeFlags = kFlagKeyId | kFlagEncrypted | kFlagAes;
// Magic, version and flags stay readable: a receiver needs them to know what
// it holds. Encryption starts at the type byte.
constexpr std::size_t kCipherOffset = kHeaderFlagsOffset + 1;
// Those readable bytes and then the key id.
constexpr std::size_t kAssociatedSize = kCipherOffset + kKeyIdSize;
// crypto_kdf's context names what the subkey is for, in exactly 8 bytes.
constexpr char kCipherKeyContext[] = "SLKaead1";
constexpr char kAesKeyContext[] = "SLKaesg1";
constexpr std::uint64_t kCipherSubkeyId = 1;

static_assert(sizeof(kCipherKeyContext) == crypto_kdf_CONTEXTBYTES + 1);
static_assert(sizeof(kAesKeyContext) == crypto_kdf_CONTEXTBYTES + 1);
static_assert(kAuthKeySize == crypto_aead_aes256gcm_KEYBYTES);
static_assert(kAuthTagSize == crypto_aead_aes256gcm_ABYTES);
static_assert(crypto_aead_aes256gcm_NPUBBYTES == sizeof(std::uint64_t) + 4);
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

void store_u64(std::uint8_t* p, std::uint64_t v) noexcept {
  for (std::size_t i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

std::uint64_t load_u64(const std::uint8_t* p) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

// The testing switch of wire/aes_testing.h. Relaxed: a test flips it
// between phases it orders itself (joins, a server's start).
constinit std::atomic<bool> aes_hidden_for_testing{false};

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

// Whether fork_generation counts forks. Registered before this process
// draws its first prefix (every stream's start asks), so every fork after
// it bumps the generation.
bool fork_safe() noexcept {
  static const bool registered = ::pthread_atfork(nullptr, nullptr, on_fork_child) == 0;
  return registered;
}

// Writes the next nonce for `key_id` to nonce[0, kEnvelopeNonceSize).
void next_nonce(std::uint32_t key_id, std::uint8_t* nonce) noexcept {
  if (!fork_safe()) {
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
  store_u64(nonce + kNoncePrefixSize, stream.counter++);
}

// ------------------------------------------------------------ AES streams
//
// AES-256-GCM's nonce is 12 bytes: too short to draw at random at this
// rate (2^32 random nonces under one key is the usual limit, a few hours of
// one busy server), and one GCM nonce repeated under one key gives away the
// authentication key. So each stream seals under a key of its own: a stream
// is a 16-byte prefix drawn as above (per thread, per key id, fork
// generation checked), its key is keyed BLAKE2b-256 of the prefix under
// EnvelopeKey::aes_key, and GCM's nonce is the stream's counter
// (little-endian) and 4 zero bytes. The wire carries prefix and counter in
// the nonce field. Why no (GCM key, GCM nonce) pair ever repeats:
//   - One stream: its counter only grows, whichever key it seals under
//     (a thread that seals under a tenant's current and next key in turn
//     keeps the prefix and re-derives), and a stream ends after
//     kAesStreamSeals seals, long before the counter could wrap. Under any
//     one (aes_key, prefix) the counters it used are distinct.
//   - Two streams (threads, key ids sharing a slot in turn, a stream
//     restarted at its limit, processes, restarts, hosts): their prefixes
//     are 128 independent random bits each, so two streams under one
//     aes_key share a GCM key with probability below n^2 / 2^129 (n
//     streams ever started under that key), the XChaCha bound above.
//     Different aes_keys give independent GCM keys (BLAKE2b as a PRF).
//   - fork(), clone(2), VM snapshots: exactly as for the XChaCha streams.
//     Without the fork handler, every AES seal draws a prefix of its own
//     and counts 0 under it.
// kAesStreamSeals (2^24) bounds what one GCM key encrypts: at most 2^24
// datagrams of at most 1444 bytes, about 24 GB, under libsodium's advice of
// ~350 GB per AES-GCM key, and a stream's start (a getrandom(2), a BLAKE2b
// and a key expansion, about 1 us) is paid once per 16 M seals.
//
// Opening: a receiver must use the stream's key too. Deriving it costs a
// BLAKE2b and a key expansion (about 0.4 us, more than the GCM call), so
// each thread keeps the expanded states of the streams it opened, in a
// direct-mapped cache of kAesOpenSlots slots indexed by the prefix's bytes
// (public: the index leaks nothing of a key) and tagged with the aes_key
// and the prefix, compared in full (the key in constant time). A hit is
// exactly the state a derivation would give, so caching can never accept
// what deriving would refuse. A miss derives into a scratch state and
// files it only once the tag verified: a forged datagram (one that names a
// key id the receiver has a key for, or it is dropped before opening)
// costs one derivation and never evicts a real stream. A server with more busy streams
// than slots derives on the streams that collide; it never fails one.
constexpr std::size_t kAesStreams = 16;
constexpr std::size_t kAesOpenSlots = 256;
constexpr std::uint64_t kAesStreamSeals = std::uint64_t{1} << 24;
static_assert((kAesOpenSlots & (kAesOpenSlots - 1)) == 0);
constexpr std::size_t kGcmNonceSize = crypto_aead_aes256gcm_NPUBBYTES;

// All-zero is a stream that has not started (generation 0) and an empty
// slot (full false), so a calloc'd cache starts out valid.
struct AesStream {
  crypto_aead_aes256gcm_state state;  // expanded key of (root, prefix); 16-byte aligned
  AuthKey root;                       // the EnvelopeKey::aes_key it seals under
  std::array<std::uint8_t, kNoncePrefixSize> prefix;
  std::uint64_t generation;  // the fork generation it started in; 0: not started
  std::uint64_t counter;     // the next seal's
  std::uint32_t key_id;
};

struct AesOpenSlot {
  crypto_aead_aes256gcm_state state;  // expanded key of (root, prefix)
  AuthKey root;
  std::array<std::uint8_t, kNoncePrefixSize> prefix;
  bool full;
};

struct AesThreadCache {
  std::array<AesStream, kAesStreams> streams;
  std::array<AesOpenSlot, kAesOpenSlots> slots;
};
static_assert(std::is_trivially_copyable_v<AesThreadCache> &&
                  std::is_trivially_default_constructible_v<AesThreadCache>,
              "calloc's zero bytes are a valid cache (an implicit-lifetime type)");
static_assert(alignof(AesThreadCache) == 16);

// Owns a thread's cache: allocated at its first AES seal or open, wiped
// (the slots in use: they hold expanded keys) and freed when the thread
// exits.
struct AesCacheOwner {
  AesThreadCache* cache = nullptr;
  bool failed = false;

  AesCacheOwner() = default;
  AesCacheOwner(const AesCacheOwner&) = delete;
  AesCacheOwner& operator=(const AesCacheOwner&) = delete;
  ~AesCacheOwner() {
    if (cache == nullptr) return;
    for (AesStream& stream : cache->streams) {
      if (stream.generation != 0) sodium_memzero(&stream, sizeof stream);
    }
    for (AesOpenSlot& slot : cache->slots) {
      if (slot.full) sodium_memzero(&slot, sizeof slot);
    }
    std::free(cache);
  }
};

// This thread's cache, or null where it could not be allocated (then every
// AES seal and open derives afresh).
AesThreadCache* thread_aes_cache() noexcept {
  thread_local AesCacheOwner owner;
  if (owner.cache == nullptr && !owner.failed) {
    // calloc, not new: zero pages from the kernel stay untouched until a
    // slot fills. glibc aligns to 16; anything less counts as a failure.
    void* memory = std::calloc(1, sizeof(AesThreadCache));
    if (memory != nullptr &&
        reinterpret_cast<std::uintptr_t>(memory) % alignof(AesThreadCache) != 0) {
      std::free(memory);
      memory = nullptr;
    }
    owner.cache = static_cast<AesThreadCache*>(memory);
    owner.failed = memory == nullptr;
  }
  return owner.cache;
}

// Constant time: how much of two of our keys agree is nobody's business.
// sodium_memcmp() is that too, but a byte at a time through volatile
// loads: 2% of a tenant run's CPU when every seal and open compared with it.
bool same_key(const AuthKey& a, const AuthKey& b) noexcept {
  static_assert(sizeof(AuthKey) % sizeof(std::uint64_t) == 0);
  std::uint64_t differ = 0;
  for (std::size_t i = 0; i < a.size(); i += sizeof(std::uint64_t)) {
    std::uint64_t x = 0;
    std::uint64_t y = 0;
    std::memcpy(&x, a.data() + i, sizeof x);  // one load each, any byte order
    std::memcpy(&y, b.data() + i, sizeof y);
    differ |= x ^ y;
  }
  return differ == 0;
}

// The expanded GCM state of stream `prefix` under `root`.
void derive_stream(const AuthKey& root, const std::uint8_t* prefix,
                   crypto_aead_aes256gcm_state& state) noexcept {
  std::array<std::uint8_t, crypto_aead_aes256gcm_KEYBYTES> subkey;
  // Keyed BLAKE2b-256; fails only for sizes outside its bounds (constants).
  (void)crypto_generichash(subkey.data(), subkey.size(), prefix, kNoncePrefixSize, root.data(),
                           root.size());
  (void)crypto_aead_aes256gcm_beforenm(&state, subkey.data());
  sodium_memzero(subkey.data(), subkey.size());
}

// GCM's nonce for the wire's nonce field: the counter, then 4 zero bytes.
std::array<std::uint8_t, kGcmNonceSize> gcm_nonce(const std::uint8_t* nonce_field) noexcept {
  std::array<std::uint8_t, kGcmNonceSize> n{};
  std::memcpy(n.data(), nonce_field + kNoncePrefixSize, sizeof(std::uint64_t));
  return n;
}

// Writes the next AES nonce field for `key_id` under `root` to
// nonce[0, kEnvelopeNonceSize) and returns the state to seal it with: the
// stream's, or `scratch` filled with a one-seal stream's (the caller wipes
// it).
const crypto_aead_aes256gcm_state& next_aes_stream(std::uint32_t key_id, const AuthKey& root,
                                                   std::uint8_t* nonce,
                                                   crypto_aead_aes256gcm_state& scratch) noexcept {
  AesThreadCache* cache = fork_safe() ? thread_aes_cache() : nullptr;
  if (cache == nullptr) {
    randombytes_buf(nonce, kNoncePrefixSize);
    store_u64(nonce + kNoncePrefixSize, 0);
    derive_stream(root, nonce, scratch);
    return scratch;
  }
  AesStream& stream = cache->streams[key_id % kAesStreams];
  const std::uint64_t generation = fork_generation.load(std::memory_order_relaxed);
  if (stream.generation != generation || stream.key_id != key_id ||
      stream.counter == kAesStreamSeals) {
    randombytes_buf(stream.prefix.data(), stream.prefix.size());
    stream.generation = generation;
    stream.key_id = key_id;
    stream.counter = 0;
    stream.root = root;
    derive_stream(root, stream.prefix.data(), stream.state);
  } else if (!same_key(stream.root, root)) {
    // The key id's other key (a rotation): the same prefix and counter,
    // the state of this key.
    stream.root = root;
    derive_stream(root, stream.prefix.data(), stream.state);
  }
  std::memcpy(nonce, stream.prefix.data(), kNoncePrefixSize);
  store_u64(nonce + kNoncePrefixSize, stream.counter++);
  return stream.state;
}

// Where an opening thread finds the state for stream `prefix` under `root`.
struct OpeningState {
  const crypto_aead_aes256gcm_state* state = nullptr;
  AesOpenSlot* file_into = nullptr;  // a miss: the slot to file `scratch` in once it verified
};

OpeningState opening_state(const AuthKey& root, const std::uint8_t* prefix,
                           crypto_aead_aes256gcm_state& scratch) noexcept {
  OpeningState found;
  AesThreadCache* cache = thread_aes_cache();
  if (cache != nullptr) {
    AesOpenSlot& slot = cache->slots[load_u64(prefix) % kAesOpenSlots];
    if (slot.full && std::memcmp(slot.prefix.data(), prefix, kNoncePrefixSize) == 0 &&
        same_key(slot.root, root)) {
      found.state = &slot.state;
      return found;
    }
    found.file_into = &slot;
  }
  derive_stream(root, prefix, scratch);
  found.state = &scratch;
  return found;
}

void file_opened(AesOpenSlot& slot, const AuthKey& root, const std::uint8_t* prefix,
                 const crypto_aead_aes256gcm_state& state) noexcept {
  slot.state = state;
  slot.root = root;
  std::memcpy(slot.prefix.data(), prefix, kNoncePrefixSize);
  slot.full = true;
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

// Verifies (and decrypts, `encrypt`) an AES form whose trailer starts at
// in + plain, writing bytes 6.. to out + kCipherOffset. True when the tag
// verified.
bool open_aes(const std::uint8_t* in, std::size_t plain, bool encrypt, const EnvelopeKey& key,
              std::uint8_t* out) noexcept {
  const std::uint8_t* trailer = in + plain;
  const std::uint8_t* nonce = trailer + kKeyIdSize;
  const std::uint8_t* tag = nonce + kEnvelopeNonceSize;
  const auto gcm = gcm_nonce(nonce);
  crypto_aead_aes256gcm_state scratch;
  const OpeningState found = opening_state(key.aes_key, nonce, scratch);
  int verified = -1;
  if (encrypt) {
    const auto ad = associated_data(in, trailer);
    // The tag is checked in constant time; c and m may be the same bytes.
    // libsodium 1.0.18 decrypts as it authenticates and clears m when the
    // tag does not verify, so nothing unverified is left there.
    verified = crypto_aead_aes256gcm_decrypt_detached_afternm(
        out + kCipherOffset, nullptr, in + kCipherOffset, plain - kCipherOffset, tag, ad.data(),
        ad.size(), gcm.data(), found.state);
  } else {
    // GMAC: no ciphertext, everything before the tag associated. m and c
    // are never touched at length 0; they only need to be valid pointers.
    verified = crypto_aead_aes256gcm_decrypt_detached_afternm(
        out + kCipherOffset, nullptr, tag, 0, tag, in, plain + kKeyIdSize + kEnvelopeNonceSize,
        gcm.data(), found.state);
  }
  if (found.state == &scratch) {
    if (verified == 0 && found.file_into != nullptr) {
      file_opened(*found.file_into, key.aes_key, nonce, scratch);
    }
    sodium_memzero(&scratch, sizeof scratch);
  }
  return verified == 0;
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
  const bool encrypted = envelope_encrypts(id->mode);
  if (envelope_uses_aes(id->mode)) {
    if (!aes_gcm_available()) return 0;
    if (!open_aes(in, plain, encrypted, key, out.data())) return 0;
  } else if (encrypted) {
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
  }
  if (!in_place) {
    // What no cipher wrote: the readable header, and all of an
    // authenticated form's bytes. memmove: GCC inlines this memcpy as rep
    // movsq, whose start-up was a sixth of an authenticated-AES open.
    std::memmove(out.data(), in, encrypted ? kCipherOffset : plain);
  }
  out[kHeaderFlagsOffset] &= static_cast<std::uint8_t>(~kEnvelopeFlags);
  return plain;
}

// Seals an AES form: the flags are set and the key id is stored already;
// `trailer` is buffer + length.
bool seal_aes(std::uint8_t* buffer, std::size_t length, std::uint32_t key_id,
              const EnvelopeKey& key, bool encrypt) noexcept {
  std::uint8_t* trailer = buffer + length;
  std::uint8_t* nonce = trailer + kKeyIdSize;
  std::uint8_t* tag = nonce + kEnvelopeNonceSize;
  crypto_aead_aes256gcm_state scratch;
  const crypto_aead_aes256gcm_state& state = next_aes_stream(key_id, key.aes_key, nonce, scratch);
  const auto gcm = gcm_nonce(nonce);
  int sealed = -1;
  if (encrypt) {
    const auto ad = associated_data(buffer, trailer);
    // In place (c == m); fails only for messages near 64 GB.
    sealed = crypto_aead_aes256gcm_encrypt_detached_afternm(
        buffer + kCipherOffset, tag, nullptr, buffer + kCipherOffset, length - kCipherOffset,
        ad.data(), ad.size(), nullptr, gcm.data(), &state);
  } else {
    sealed = crypto_aead_aes256gcm_encrypt_detached_afternm(
        tag, tag, nullptr, tag, 0, buffer, length + kKeyIdSize + kEnvelopeNonceSize, nullptr,
        gcm.data(), &state);
  }
  if (&state == &scratch) sodium_memzero(&scratch, sizeof scratch);
  return sealed == 0;
}

}  // namespace

namespace internal {

void hide_aes_gcm_for_testing(bool hidden) noexcept {
  aes_hidden_for_testing.store(hidden, std::memory_order_relaxed);
}

}  // namespace internal

bool aes_gcm_available() noexcept {
  static const bool available = [] {
    ensure_sodium();
    return crypto_aead_aes256gcm_is_available() == 1;
  }();
  return available && !aes_hidden_for_testing.load(std::memory_order_relaxed);
}

std::string_view to_string(EnvelopeCipher cipher) noexcept {
  switch (cipher) {
    case EnvelopeCipher::kAuto:
      return "auto";
    case EnvelopeCipher::kPortable:
      return "portable";
    case EnvelopeCipher::kAes:
      return "aes";
  }
  return "?";
}

std::optional<EnvelopeCipher> parse_envelope_cipher(std::string_view text) noexcept {
  for (const EnvelopeCipher cipher :
       {EnvelopeCipher::kAuto, EnvelopeCipher::kPortable, EnvelopeCipher::kAes}) {
    if (text == to_string(cipher)) return cipher;
  }
  return std::nullopt;
}

std::optional<EnvelopeMode> tenant_envelope_mode(bool encrypt, EnvelopeCipher cipher) noexcept {
  bool aes = cipher == EnvelopeCipher::kAes;
  if (cipher == EnvelopeCipher::kAuto) aes = aes_gcm_available();
  if (aes && !aes_gcm_available()) return std::nullopt;
  if (aes) return encrypt ? EnvelopeMode::kEncryptedAes : EnvelopeMode::kAuthenticatedAes;
  return encrypt ? EnvelopeMode::kEncrypted : EnvelopeMode::kAuthenticated;
}

EnvelopeKey envelope_key(const AuthKey& key) noexcept {
  ensure_sodium();
  EnvelopeKey keys;
  keys.tag_key = key;
  // Fail only for a subkey length outside crypto_kdf's bounds (asserted above).
  (void)crypto_kdf_derive_from_key(keys.cipher_key.data(), keys.cipher_key.size(), kCipherSubkeyId,
                                   kCipherKeyContext, key.data());
  (void)crypto_kdf_derive_from_key(keys.aes_key.data(), keys.aes_key.size(), kCipherSubkeyId,
                                   kAesKeyContext, key.data());
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
    case EnvelopeMode::kAuthenticatedAes:
    case EnvelopeMode::kEncryptedAes: {
      if (!aes_gcm_available()) return 0;
      const bool encrypt = mode == EnvelopeMode::kEncryptedAes;
      const std::uint8_t flags = buffer[kHeaderFlagsOffset];
      buffer[kHeaderFlagsOffset] |= static_cast<std::uint8_t>(
          kFlagAuthenticated | kFlagKeyId | kFlagAes | (encrypt ? kFlagEncrypted : 0));
      store_u32(trailer, key_id);
      if (!seal_aes(buffer.data(), length, key_id, key, encrypt)) {
        buffer[kHeaderFlagsOffset] = flags;  // cannot happen: only the datagram's size fails it
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
    case kFlagKeyId | kFlagAes:
      id.mode = EnvelopeMode::kAuthenticatedAes;
      break;
    case kFlagKeyId | kFlagEncrypted | kFlagAes:
      id.mode = EnvelopeMode::kEncryptedAes;
      break;
    default:  // kFlagEncrypted or kFlagAes without a key id
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
