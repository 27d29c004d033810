// The tenant envelope: each form round trips under several key ids, the
// legacy form is seal_datagram()'s byte for byte, every truncation and every
// bit flip is refused, so are wrong keys and wrong key ids, and encryption
// hides keys, values and owner ids behind a fresh nonce per datagram, one
// that no other seal, thread or forked child uses. The AES-GCM forms (run
// where this CPU has AES-NI) also: their streams are unique across seals,
// threads, key ids and forks, a receiver's state cache opens more streams
// than it has slots and never lets one key's state open another's
// datagram, and a host without AES refuses them.
#include "shardlock/lease/wire/envelope.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "shardlock/lease/wire/auth.h"
#include "shardlock/lease/wire/protocol.h"
#include "wire/aes_testing.h"

namespace shardlock::lease {
namespace {

using Bytes = std::vector<std::uint8_t>;

constexpr std::string_view kLeaseKey = "tenant-a/orders/4711";
constexpr std::string_view kValue = "host-17.example.net:8080 pid 4242";
constexpr ClientId kClient{0x1122334455667788, 0x99AABBCCDDEEFF00};
constexpr ClientId kOwner{0x0F1E2D3C4B5A6978, 0x8796A5B4C3D2E1F0};
constexpr std::uint64_t kRequestId = 0x0123456789ABCDEF;
constexpr std::array<std::uint32_t, 5> kKeyIds = {0, 1, 7, 0x01020304, 0xFFFFFFFF};
constexpr std::array<EnvelopeMode, 3> kPortableModes = {
    EnvelopeMode::kLegacy, EnvelopeMode::kAuthenticated, EnvelopeMode::kEncrypted};
constexpr std::array<EnvelopeMode, 2> kAesModes = {EnvelopeMode::kAuthenticatedAes,
                                                   EnvelopeMode::kEncryptedAes};
constexpr std::string_view kNoAes = "this CPU has no AES-NI: the AES forms cannot run here";

// Every form this host seals: the AES ones where the CPU has AES-NI.
std::vector<EnvelopeMode> all_modes() {
  std::vector<EnvelopeMode> modes(kPortableModes.begin(), kPortableModes.end());
  if (aes_gcm_available()) modes.insert(modes.end(), kAesModes.begin(), kAesModes.end());
  return modes;
}
std::vector<EnvelopeMode> nonce_modes() {
  std::vector<EnvelopeMode> modes{EnvelopeMode::kEncrypted};
  if (aes_gcm_available()) modes.insert(modes.end(), kAesModes.begin(), kAesModes.end());
  return modes;
}

AuthKey key_from(std::uint8_t seed) {
  AuthKey key;
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<std::uint8_t>(seed + 7 * i);
  return key;
}

const EnvelopeKey& tenant_a() {
  static const EnvelopeKey key = envelope_key(key_from(1));
  return key;
}
const EnvelopeKey& tenant_b() {
  static const EnvelopeKey key = envelope_key(key_from(2));
  return key;
}

std::uint32_t id_for(EnvelopeMode mode, std::uint32_t key_id) {
  return mode == EnvelopeMode::kLegacy ? 0 : key_id;
}

Bytes encoded(const Datagram& d, bool as_request) {
  Bytes bytes(kMaxDatagramSize);
  std::size_t n = 0;
  const ProtocolError e = as_request ? encode_request(d, bytes, n) : encode(d, bytes, n);
  EXPECT_EQ(e, ProtocolError::kOk);
  bytes.resize(n);
  return bytes;
}

Message acquire(std::uint64_t request_id) {
  Message m;
  m.type = MessageType::kAcquire;
  m.request_id = request_id;
  m.key = kLeaseKey;
  m.ttl_ms = 30'000;
  m.wait_ms = 500;
  return m;
}

// A datagram of kClient's, with kRequestId, holding `m`.
Datagram holding(const Message& m) {
  Datagram d;
  d.client_id = kClient;
  d.request_id = kRequestId;
  EXPECT_TRUE(d.push(m));
  return d;
}

// An ACQUIRE as a client sends it: single, padded to its reply bound.
Bytes plain_acquire() { return encoded(holding(acquire(kRequestId)), true); }

// Every field encryption must hide: a key, a holder value, an owner of its
// own, a map epoch.
Bytes plain_acquire_with_value() {
  Message m = acquire(kRequestId);
  m.value = kValue;
  m.owner = kOwner;
  Datagram d = holding(m);
  d.epoch = 0x5555AAAA5555AAAA;
  return encoded(d, true);
}

// The shortest datagram there is: a header alone (RELEASED has no body).
Bytes plain_released() {
  Message m;
  m.type = MessageType::kReleased;
  m.request_id = kRequestId;
  Bytes bytes = encoded(holding(m), false);
  EXPECT_EQ(bytes.size(), kHeaderSize);
  return bytes;
}

std::vector<Bytes> plain_datagrams() {
  return {plain_acquire(), plain_acquire_with_value(), plain_released()};
}

Bytes sealed(const Bytes& plain, std::uint32_t key_id, const EnvelopeKey& key, EnvelopeMode mode) {
  Bytes buffer(plain.size() + kMaxEnvelopeOverhead);
  std::copy(plain.begin(), plain.end(), buffer.begin());
  const std::size_t n = seal_for(buffer, plain.size(), key_id, key, mode);
  EXPECT_EQ(n, plain.size() + envelope_overhead(mode));
  buffer.resize(n);
  return buffer;
}

// What opening gives back: the plain datagram, marked authenticated.
Bytes opened_form(Bytes plain) {
  plain[kHeaderFlagsOffset] |= kFlagAuthenticated;
  return plain;
}

Bytes open_copy(std::span<const std::uint8_t> datagram, const EnvelopeKey& key) {
  Bytes out(kMaxDatagramSize + kMaxEnvelopeOverhead);
  const auto opened = open_with(datagram, key, out);
  return {opened.begin(), opened.end()};
}

bool contains(std::span<const std::uint8_t> haystack, std::span<const std::uint8_t> needle) {
  return std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end()) !=
         haystack.end();
}
Bytes bytes_of(std::string_view s) { return {s.begin(), s.end()}; }
// A u128 as the wire writes it: lo u64 then hi u64, little-endian.
Bytes wire_bytes(ClientId id) {
  Bytes out;
  for (const std::uint64_t half : {id.lo, id.hi}) {
    for (std::size_t i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(half >> (8 * i)));
  }
  return out;
}
Bytes wire_bytes(std::uint64_t v) {
  Bytes out;
  for (std::size_t i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  return out;
}

TEST(EnvelopeTest, EveryFormRoundTripsUnderSeveralKeyIds) {
  for (const Bytes& plain : plain_datagrams()) {
    for (const EnvelopeMode mode : all_modes()) {
      for (const std::uint32_t requested : kKeyIds) {
        const std::uint32_t key_id = id_for(mode, requested);
        SCOPED_TRACE(testing::Message() << "mode " << static_cast<int>(mode) << " key id " << key_id
                                        << " length " << plain.size());
        const Bytes sealed_bytes = sealed(plain, key_id, tenant_a(), mode);
        const auto peeked = peek_key_id(sealed_bytes);
        ASSERT_TRUE(peeked.has_value());
        EXPECT_EQ(*peeked, (EnvelopeKeyId{key_id, mode}));

        const Bytes opened = open_copy(sealed_bytes, tenant_a());
        EXPECT_EQ(opened, opened_form(plain));

        Bytes in_place = sealed_bytes;
        const auto opened_here = open_in_place(in_place, tenant_a());
        EXPECT_EQ(opened_here.data(), in_place.data());
        EXPECT_EQ(Bytes(opened_here.begin(), opened_here.end()), opened_form(plain));

        Datagram d;
        ASSERT_EQ(decode(opened, d), ProtocolError::kOk);
        EXPECT_EQ(d.flags & ~kFlagEpoch, kFlagAuthenticated);
        EXPECT_EQ(d.client_id, kClient);
        EXPECT_EQ(d.items()[0].request_id, kRequestId);
      }
    }
  }
}

TEST(EnvelopeTest, ALegacySealIsSealDatagramByteForByte) {
  for (const Bytes& plain : plain_datagrams()) {
    Bytes old_seal(plain.size() + kAuthTagSize);
    std::copy(plain.begin(), plain.end(), old_seal.begin());
    ASSERT_EQ(seal_datagram(old_seal, plain.size(), key_from(1)), old_seal.size());

    EXPECT_EQ(sealed(plain, 0, tenant_a(), EnvelopeMode::kLegacy), old_seal);
    EXPECT_EQ(peek_key_id(old_seal), (EnvelopeKeyId{0, EnvelopeMode::kLegacy}));
    const auto old_open = open_datagram(old_seal, key_from(1));
    EXPECT_EQ(open_copy(old_seal, tenant_a()), Bytes(old_open.begin(), old_open.end()));
  }
  // The legacy form has no key id to carry.
  Bytes buffer = plain_acquire();
  const Bytes before = buffer;
  buffer.resize(buffer.size() + kMaxEnvelopeOverhead);
  EXPECT_EQ(seal_for(buffer, before.size(), 1, tenant_a(), EnvelopeMode::kLegacy), 0u);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), buffer.begin()));
}

TEST(EnvelopeTest, EveryTruncationIsRefused) {
  for (const Bytes& plain : plain_datagrams()) {
    for (const EnvelopeMode mode : all_modes()) {
      const Bytes whole = sealed(plain, id_for(mode, 7), tenant_a(), mode);
      for (std::size_t n = 0; n < whole.size(); ++n) {
        const std::span<const std::uint8_t> cut(whole.data(), n);
        EXPECT_TRUE(open_copy(cut, tenant_a()).empty())
            << "mode " << static_cast<int>(mode) << " length " << n;
        Bytes here(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(n));
        EXPECT_TRUE(open_in_place(here, tenant_a()).empty());
      }
    }
  }
}

TEST(EnvelopeTest, EveryBitFlipIsRefused) {
  for (const Bytes& plain : plain_datagrams()) {
    for (const EnvelopeMode mode : all_modes()) {
      const Bytes whole = sealed(plain, id_for(mode, 0x01020304), tenant_a(), mode);
      ASSERT_FALSE(open_copy(whole, tenant_a()).empty());
      for (std::size_t i = 0; i < whole.size(); ++i) {
        for (int bit = 0; bit < 8; ++bit) {
          Bytes flipped = whole;
          flipped[i] ^= static_cast<std::uint8_t>(1U << bit);
          EXPECT_TRUE(open_copy(flipped, tenant_a()).empty())
              << "mode " << static_cast<int>(mode) << " byte " << i << " bit " << bit;
          EXPECT_TRUE(open_in_place(flipped, tenant_a()).empty());
        }
      }
    }
  }
}

// `key` with the part `mode` seals under taken from `other`: the BLAKE2b
// forms' tag key, XChaCha's cipher key, or the AES streams' root key.
EnvelopeKey with_part_of(EnvelopeKey key, const EnvelopeKey& other, EnvelopeMode mode) {
  if (envelope_uses_aes(mode)) {
    key.aes_key = other.aes_key;
  } else if (mode == EnvelopeMode::kEncrypted) {
    key.cipher_key = other.cipher_key;
  } else {
    key.tag_key = other.tag_key;
  }
  return key;
}

TEST(EnvelopeTest, AWrongKeyOrKeyIdIsRefused) {
  const Bytes plain = plain_acquire_with_value();
  for (const EnvelopeMode mode : all_modes()) {
    SCOPED_TRACE(static_cast<int>(mode));
    const Bytes by_a = sealed(plain, id_for(mode, 3), tenant_a(), mode);
    EXPECT_TRUE(open_copy(by_a, tenant_b()).empty());
    // Each form uses one part of an EnvelopeKey: the other parts being
    // right does not make up for it, and the part alone opens it.
    EXPECT_TRUE(open_copy(by_a, with_part_of(tenant_a(), tenant_b(), mode)).empty());
    EXPECT_EQ(open_copy(by_a, with_part_of(tenant_b(), tenant_a(), mode)), opened_form(plain));
    if (mode == EnvelopeMode::kLegacy) continue;

    // Another tenant's id on A's datagram: refused under A's key and B's.
    Bytes renamed = by_a;
    const std::size_t key_id_at = plain.size();
    renamed[key_id_at] = 4;
    EXPECT_EQ(peek_key_id(renamed), (EnvelopeKeyId{4, mode}));
    EXPECT_TRUE(open_copy(renamed, tenant_a()).empty());
    EXPECT_TRUE(open_copy(renamed, tenant_b()).empty());

    // Sealed by B under A's id: the id is only a claim.
    const Bytes forged = sealed(plain, 3, tenant_b(), mode);
    EXPECT_EQ(peek_key_id(forged), (EnvelopeKeyId{3, mode}));
    EXPECT_TRUE(open_copy(forged, tenant_a()).empty());
  }
}

TEST(EnvelopeTest, EncryptionHidesKeysValuesAndOwners) {
  const Bytes plain = plain_acquire_with_value();
  const std::vector<Bytes> secrets = {bytes_of(kLeaseKey), bytes_of(kValue), wire_bytes(kClient),
                                      wire_bytes(kOwner), wire_bytes(kRequestId)};
  // The authenticated forms show them all, so the search below can see them.
  for (const EnvelopeMode mode : all_modes()) {
    if (mode == EnvelopeMode::kLegacy || envelope_encrypts(mode)) continue;
    const Bytes readable = sealed(plain, 9, tenant_a(), mode);
    for (const Bytes& secret : secrets) EXPECT_TRUE(contains(readable, secret));
  }
  for (const EnvelopeMode mode : all_modes()) {
    if (!envelope_encrypts(mode)) continue;
    SCOPED_TRACE(static_cast<int>(mode));
    const Bytes hidden = sealed(plain, 9, tenant_a(), mode);
    for (const Bytes& secret : secrets) {
      EXPECT_FALSE(contains(hidden, secret));
      // Not even half of an id, nor a third of the key or the value.
      for (std::size_t at = 0; at + 8 <= secret.size(); at += 4) {
        EXPECT_FALSE(contains(hidden, std::span(secret).subspan(at, 8))) << at;
      }
    }
    // What stays readable: magic, version and flags, and the key id.
    EXPECT_TRUE(std::equal(plain.begin(), plain.begin() + 5, hidden.begin()));
    EXPECT_EQ(hidden[kHeaderFlagsOffset], kFlagAuthenticated | kFlagEpoch | kFlagKeyId |
                                              kFlagEncrypted |
                                              (envelope_uses_aes(mode) ? kFlagAes : 0));
    EXPECT_EQ(hidden[plain.size()], 9);
  }
}

// The nonce field of a datagram sealed in a nonce form from `plain_size`
// plain bytes: XChaCha's nonce, or an AES stream's prefix and counter.
Bytes nonce_of(const Bytes& whole, std::size_t plain_size) {
  const auto at = whole.begin() + static_cast<std::ptrdiff_t>(plain_size + kKeyIdSize);
  return {at, at + kEnvelopeNonceSize};
}

std::uint64_t counter_of(const Bytes& nonce) {
  std::uint64_t counter = 0;
  for (std::size_t i = 0; i < 8; ++i) counter |= std::uint64_t{nonce[16 + i]} << (8 * i);
  return counter;
}

bool same_prefix(const Bytes& a, const Bytes& b) {
  return std::equal(a.begin(), a.begin() + 16, b.begin());
}

// Seals of `plain` in `mode` under key id `key_id` on this thread; their
// nonce fields, in order. Each one opens.
std::vector<Bytes> nonces_of_seals(const Bytes& plain, std::uint32_t key_id, int seals,
                                   EnvelopeMode mode = EnvelopeMode::kEncrypted,
                                   const EnvelopeKey& key = tenant_a()) {
  std::vector<Bytes> nonces;
  for (int i = 0; i < seals; ++i) {
    const Bytes whole = sealed(plain, key_id, key, mode);
    nonces.push_back(nonce_of(whole, plain.size()));
    EXPECT_EQ(open_copy(whole, key), opened_form(plain));
  }
  return nonces;
}

TEST(EnvelopeTest, NoncesDifferAcrossSeals) {
  const Bytes plain = plain_acquire();
  for (const EnvelopeMode mode : nonce_modes()) {
    SCOPED_TRACE(static_cast<int>(mode));
    std::set<Bytes> nonces;
    std::set<Bytes> tails;  // ciphertexts, or tags
    constexpr int kSeals = 256;
    for (int i = 0; i < kSeals; ++i) {
      const Bytes whole = sealed(plain, 5, tenant_a(), mode);
      nonces.insert(nonce_of(whole, plain.size()));
      if (envelope_encrypts(mode)) {
        tails.emplace(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(plain.size()));
      } else {
        tails.emplace(whole.end() - kAuthTagSize, whole.end());
      }
      EXPECT_EQ(open_copy(whole, tenant_a()), opened_form(plain));
    }
    EXPECT_EQ(nonces.size(), static_cast<std::size_t>(kSeals));
    EXPECT_EQ(tails.size(), static_cast<std::size_t>(kSeals));
  }
}

// Threads seal at once, under key ids of their own and under one they
// share, two of them taking the same per-thread stream slot in turn (5 and
// 21): no nonce field is ever sealed twice, in any nonce form.
TEST(EnvelopeTest, NoncesDifferAcrossThreadsAndSeals) {
  const Bytes plain = plain_acquire();
  for (const EnvelopeMode mode : nonce_modes()) {
    SCOPED_TRACE(static_cast<int>(mode));
    constexpr int kThreads = 8;
    constexpr int kRounds = 64;
    std::vector<std::vector<Bytes>> per_thread(kThreads);
    std::vector<std::thread> threads;
    threads.reserve(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&plain, &nonces = per_thread[t], t, mode] {
        for (int round = 0; round < kRounds; ++round) {
          for (const std::uint32_t key_id : {5U, 21U, 100U + static_cast<std::uint32_t>(t)}) {
            for (Bytes& nonce : nonces_of_seals(plain, key_id, 4, mode)) {
              nonces.push_back(std::move(nonce));
            }
          }
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    std::set<Bytes> all;
    std::size_t count = 0;
    for (const std::vector<Bytes>& nonces : per_thread) {
      count += nonces.size();
      all.insert(nonces.begin(), nonces.end());
    }
    EXPECT_EQ(count, std::size_t{kThreads} * kRounds * 3 * 4);
    EXPECT_EQ(all.size(), count);
  }
}

// A nonce field is a 16-byte prefix and a little-endian counter
// (envelope.h): one thread's seals under one key id share the prefix and
// count up by one; another thread starts a prefix of its own.
TEST(EnvelopeTest, OneThreadsNoncesCountUnderOnePrefix) {
  const Bytes plain = plain_acquire();
  for (const EnvelopeMode mode : nonce_modes()) {
    SCOPED_TRACE(static_cast<int>(mode));
    const std::vector<Bytes> mine = nonces_of_seals(plain, 77, 16, mode);
    for (std::size_t i = 1; i < mine.size(); ++i) {
      EXPECT_TRUE(same_prefix(mine[i], mine[0]));
      EXPECT_EQ(counter_of(mine[i]), counter_of(mine[i - 1]) + 1);
    }
    std::vector<Bytes> theirs;
    std::thread([&] { theirs = nonces_of_seals(plain, 77, 1, mode); }).join();
    ASSERT_EQ(theirs.size(), 1U);
    EXPECT_FALSE(same_prefix(theirs[0], mine[0]));
  }
}

// A forked child goes on from its parent's copy of the sealing thread; its
// nonces must not be the ones the parent seals next.
TEST(EnvelopeTest, AForkedChildNeverRepeatsItsParentsNonces) {
  const Bytes plain = plain_acquire();
  for (const EnvelopeMode mode : nonce_modes()) {
    SCOPED_TRACE(static_cast<int>(mode));
    (void)nonces_of_seals(plain, 9, 2, mode);  // the stream the child inherits
    int pipe_ends[2];
    ASSERT_EQ(::pipe(pipe_ends), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      Bytes buffer(plain.size() + kMaxEnvelopeOverhead);
      std::copy(plain.begin(), plain.end(), buffer.begin());
      const std::size_t n = seal_for(buffer, plain.size(), 9, tenant_a(), mode);
      const bool written =
          n != 0 && ::write(pipe_ends[1], buffer.data() + plain.size() + kKeyIdSize,
                            kEnvelopeNonceSize) == static_cast<ssize_t>(kEnvelopeNonceSize);
      ::_exit(written ? 0 : 1);
    }
    ::close(pipe_ends[1]);
    Bytes childs(kEnvelopeNonceSize);
    const ssize_t got = ::read(pipe_ends[0], childs.data(), childs.size());
    ::close(pipe_ends[0]);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ASSERT_EQ(got, static_cast<ssize_t>(kEnvelopeNonceSize));
    const std::vector<Bytes> parents = nonces_of_seals(plain, 9, 1, mode);
    EXPECT_NE(childs, parents[0]);
    EXPECT_FALSE(same_prefix(childs, parents[0])) << "the child drew a prefix of its own";
  }
}

// ---- the AES forms' streams and the receiver's state cache ----

// The wire layout: flags 0x15 and 0x1D, the trailer [key id][prefix
// 16][counter 8][tag 16]; an authenticated-AES datagram carries the plain
// datagram unchanged but for its flags.
TEST(EnvelopeTest, TheAesFormsLayOutTheirTrailerAsDocumented) {
  if (!aes_gcm_available()) GTEST_SKIP() << kNoAes;
  const Bytes plain = plain_acquire();
  const Bytes readable = sealed(plain, 0x01020304, tenant_a(), EnvelopeMode::kAuthenticatedAes);
  EXPECT_EQ(readable[kHeaderFlagsOffset], 0x15);
  EXPECT_EQ(readable.size(), plain.size() + 4 + 16 + 8 + 16);
  Bytes body(readable.begin(), readable.begin() + static_cast<std::ptrdiff_t>(plain.size()));
  body[kHeaderFlagsOffset] = plain[kHeaderFlagsOffset];
  EXPECT_EQ(body, plain);
  EXPECT_EQ(Bytes(readable.begin() + static_cast<std::ptrdiff_t>(plain.size()),
                  readable.begin() + static_cast<std::ptrdiff_t>(plain.size() + 4)),
            (Bytes{4, 3, 2, 1}));
  const Bytes hidden = sealed(plain, 0x01020304, tenant_a(), EnvelopeMode::kEncryptedAes);
  EXPECT_EQ(hidden[kHeaderFlagsOffset], 0x1D);
  EXPECT_EQ(hidden.size(), readable.size());
  EXPECT_EQ(peek_key_id(hidden), (EnvelopeKeyId{0x01020304, EnvelopeMode::kEncryptedAes}));
}

// A thread seals under a tenant's current and next key in turn (a
// rotation): one stream, whose counter keeps growing across both keys, and
// each datagram opens under its own key only.
TEST(EnvelopeTest, AnAesStreamCountsOnAcrossAKeyIdsTwoKeys) {
  if (!aes_gcm_available()) GTEST_SKIP() << kNoAes;
  const Bytes plain = plain_acquire();
  for (const EnvelopeMode mode : kAesModes) {
    std::vector<Bytes> nonces;
    for (int i = 0; i < 8; ++i) {
      const EnvelopeKey& key = i % 2 == 0 ? tenant_a() : tenant_b();
      const EnvelopeKey& other = i % 2 == 0 ? tenant_b() : tenant_a();
      const Bytes whole = sealed(plain, 31, key, mode);
      nonces.push_back(nonce_of(whole, plain.size()));
      EXPECT_EQ(open_copy(whole, key), opened_form(plain));
      EXPECT_TRUE(open_copy(whole, other).empty());
    }
    for (std::size_t i = 1; i < nonces.size(); ++i) {
      EXPECT_TRUE(same_prefix(nonces[i], nonces[0]));
      EXPECT_EQ(counter_of(nonces[i]), counter_of(nonces[i - 1]) + 1);
    }
  }
}

// More streams than the receiver's cache has slots (streams of many key
// ids, so many prefixes, some sharing slots), opened in another order and
// again: every one opens, every time, on this thread and on a fresh one.
TEST(EnvelopeTest, MoreAesStreamsThanCacheSlotsAllOpen) {
  if (!aes_gcm_available()) GTEST_SKIP() << kNoAes;
  const Bytes plain = plain_acquire();
  for (const EnvelopeMode mode : kAesModes) {
    constexpr std::uint32_t kStreams = 700;  // > 256 slots
    std::vector<Bytes> datagrams;
    std::set<Bytes> prefixes;
    for (std::uint32_t key_id = 0; key_id < kStreams; ++key_id) {
      datagrams.push_back(sealed(plain, key_id, tenant_a(), mode));
      const Bytes nonce = nonce_of(datagrams.back(), plain.size());
      prefixes.emplace(nonce.begin(), nonce.begin() + 16);
    }
    EXPECT_EQ(prefixes.size(), std::size_t{kStreams});
    const auto open_all = [&](bool backwards) {
      std::size_t opened = 0;
      for (std::size_t i = 0; i < datagrams.size(); ++i) {
        const Bytes& whole = datagrams[backwards ? datagrams.size() - 1 - i : i];
        opened += open_copy(whole, tenant_a()) == opened_form(plain) ? 1 : 0;
      }
      return opened;
    };
    for (const bool backwards : {false, true, false}) EXPECT_EQ(open_all(backwards), kStreams);
    std::size_t elsewhere = 0;
    std::thread([&] { elsewhere = open_all(true); }).join();
    EXPECT_EQ(elsewhere, kStreams);
  }
}

// A cached stream state serves only the key it was derived under, the
// key's bytes deciding and not the EnvelopeKey object; a forgery on a
// cached stream is refused and does not evict it; one on an uncached
// stream is refused and leaves nothing behind.
TEST(EnvelopeTest, TheAesStateCacheServesOnlyItsOwnKey) {
  if (!aes_gcm_available()) GTEST_SKIP() << kNoAes;
  const Bytes plain = plain_acquire();
  for (const EnvelopeMode mode : kAesModes) {
    SCOPED_TRACE(static_cast<int>(mode));
    const Bytes by_a = sealed(plain, 12, tenant_a(), mode);
    EXPECT_EQ(open_copy(by_a, tenant_a()), opened_form(plain));  // cached now
    EXPECT_TRUE(open_copy(by_a, tenant_b()).empty());
    // B with A's stream root: the key that matters for this form.
    EXPECT_EQ(open_copy(by_a, with_part_of(tenant_b(), tenant_a(), mode)), opened_form(plain));
    // A again, as another object made from the same key.
    EXPECT_EQ(open_copy(by_a, envelope_key(key_from(1))), opened_form(plain));

    Bytes forged = by_a;
    forged.back() ^= 1;
    EXPECT_TRUE(open_copy(forged, tenant_a()).empty());
    EXPECT_EQ(open_copy(by_a, tenant_a()), opened_form(plain));

    // A forged prefix (a stream never cached), then the real one.
    Bytes stranger = sealed(plain, 13, tenant_a(), mode);
    const Bytes real = stranger;
    stranger[plain.size() + kKeyIdSize] ^= 0x80;
    EXPECT_TRUE(open_copy(stranger, tenant_a()).empty());
    EXPECT_TRUE(open_copy(stranger, tenant_a()).empty());
    EXPECT_EQ(open_copy(real, tenant_a()), opened_form(plain));
  }
}

// Without AES-NI (hidden here): no AES seal, no AES open, kAuto picks the
// portable suite and kAes none; the portable forms are unaffected.
TEST(EnvelopeTest, AHostWithoutAesRefusesTheAesForms) {
  if (!aes_gcm_available()) GTEST_SKIP() << kNoAes;
  const Bytes plain = plain_acquire();
  const Bytes before_aes = sealed(plain, 3, tenant_a(), EnvelopeMode::kEncryptedAes);
  EXPECT_EQ(tenant_envelope_mode(true, EnvelopeCipher::kAuto), EnvelopeMode::kEncryptedAes);
  EXPECT_EQ(tenant_envelope_mode(false, EnvelopeCipher::kAes), EnvelopeMode::kAuthenticatedAes);
  EXPECT_EQ(tenant_envelope_mode(false, EnvelopeCipher::kPortable), EnvelopeMode::kAuthenticated);
  internal::hide_aes_gcm_for_testing(true);
  EXPECT_FALSE(aes_gcm_available());
  for (const EnvelopeMode mode : kAesModes) {
    Bytes buffer = plain;
    buffer.resize(plain.size() + kMaxEnvelopeOverhead);
    const Bytes untouched = buffer;
    EXPECT_EQ(seal_for(buffer, plain.size(), 3, tenant_a(), mode), 0U);
    EXPECT_EQ(buffer, untouched);
  }
  EXPECT_EQ(peek_key_id(before_aes), (EnvelopeKeyId{3, EnvelopeMode::kEncryptedAes}));
  EXPECT_TRUE(open_copy(before_aes, tenant_a()).empty());
  EXPECT_EQ(tenant_envelope_mode(true, EnvelopeCipher::kAuto), EnvelopeMode::kEncrypted);
  EXPECT_EQ(tenant_envelope_mode(false, EnvelopeCipher::kAuto), EnvelopeMode::kAuthenticated);
  EXPECT_EQ(tenant_envelope_mode(true, EnvelopeCipher::kAes), std::nullopt);
  const Bytes portable = sealed(plain, 3, tenant_a(), EnvelopeMode::kEncrypted);
  EXPECT_EQ(open_copy(portable, tenant_a()), opened_form(plain));
  internal::hide_aes_gcm_for_testing(false);
  EXPECT_EQ(open_copy(before_aes, tenant_a()), opened_form(plain));
}

TEST(EnvelopeTest, CipherNamesReadBack) {
  for (const EnvelopeCipher cipher :
       {EnvelopeCipher::kAuto, EnvelopeCipher::kPortable, EnvelopeCipher::kAes}) {
    EXPECT_EQ(parse_envelope_cipher(to_string(cipher)), cipher);
  }
  EXPECT_EQ(parse_envelope_cipher("AES"), std::nullopt);
  EXPECT_EQ(parse_envelope_cipher(""), std::nullopt);
}

TEST(EnvelopeTest, PeekReadsOnlySealedClientDatagrams) {
  const Bytes plain = plain_acquire();
  EXPECT_FALSE(peek_key_id(plain));  // never sealed
  EXPECT_FALSE(peek_key_id({}));

  const Bytes whole = sealed(plain, 11, tenant_a(), EnvelopeMode::kEncrypted);
  Bytes bits = whole;
  bits[kHeaderFlagsOffset] = kFlagAuthenticated | kFlagEncrypted;  // no key id
  EXPECT_FALSE(peek_key_id(bits));
  bits[kHeaderFlagsOffset] = kFlagKeyId | kFlagEncrypted;  // not authenticated
  EXPECT_FALSE(peek_key_id(bits));
  bits[kHeaderFlagsOffset] = kFlagKeyId;
  EXPECT_FALSE(peek_key_id(bits));
  for (const int aes_bits :
       {kFlagAuthenticated | kFlagAes, kFlagAuthenticated | kFlagAes | kFlagEncrypted,
        kFlagKeyId | kFlagAes}) {
    bits[kHeaderFlagsOffset] = static_cast<std::uint8_t>(aes_bits);  // no key id, or no seal
    EXPECT_FALSE(peek_key_id(bits)) << aes_bits;
  }
  bits[kHeaderFlagsOffset] = kFlagAuthenticated | kFlagKeyId | kFlagAes;
  EXPECT_EQ(peek_key_id(bits), (EnvelopeKeyId{11, EnvelopeMode::kAuthenticatedAes}));

  Bytes other_magic = whole;
  other_magic[0] ^= 0xFF;
  EXPECT_FALSE(peek_key_id(other_magic));

  // A header and a trailer, not one byte less.
  EXPECT_TRUE(peek_key_id(std::span(whole).first(kHeaderSize + kMaxEnvelopeOverhead)));
  EXPECT_FALSE(peek_key_id(std::span(whole).first(kHeaderSize + kMaxEnvelopeOverhead - 1)));
}

TEST(EnvelopeTest, SealRefusesWhatItCannotSealAndLeavesItUntouched) {
  const Bytes plain = plain_acquire();
  for (const EnvelopeMode mode : all_modes()) {
    SCOPED_TRACE(static_cast<int>(mode));
    const auto refused = [&](Bytes buffer, std::size_t length) {
      const Bytes before = buffer;
      const std::size_t n = seal_for(buffer, length, 0, tenant_a(), mode);
      return n == 0 && buffer == before;
    };
    Bytes roomy = plain;
    roomy.resize(plain.size() + envelope_overhead(mode));
    EXPECT_FALSE(refused(roomy, plain.size()));
    Bytes tight = plain;
    tight.resize(plain.size() + envelope_overhead(mode) - 1);
    EXPECT_TRUE(refused(tight, plain.size()));
    EXPECT_TRUE(refused(roomy, kHeaderSize - 1));
    EXPECT_TRUE(refused(roomy, roomy.size() + 1));
    Bytes replication = roomy;
    replication[0] ^= 0xFF;  // another magic
    EXPECT_TRUE(refused(replication, plain.size()));
    for (const std::uint8_t bit : {kFlagKeyId, kFlagEncrypted, kFlagAes}) {
      Bytes twice = roomy;
      twice[kHeaderFlagsOffset] |= bit;
      EXPECT_TRUE(refused(twice, plain.size()));
    }
  }
}

TEST(EnvelopeTest, OpenNeedsRoomForThePlainDatagram) {
  const Bytes plain = plain_acquire();
  for (const EnvelopeMode mode : all_modes()) {
    const Bytes whole = sealed(plain, id_for(mode, 2), tenant_a(), mode);
    Bytes out(plain.size() - 1);
    EXPECT_TRUE(open_with(whole, tenant_a(), out).empty());
    out.resize(plain.size());
    const auto opened = open_with(whole, tenant_a(), out);
    EXPECT_EQ(opened.data(), out.data());
    EXPECT_EQ(Bytes(opened.begin(), opened.end()), opened_form(plain));
  }
}

TEST(EnvelopeTest, DecodeRefusesTheEnvelopeBitsThatOpeningClears) {
  Bytes plain = plain_acquire();
  Datagram d;
  for (const std::uint8_t bits :
       {kFlagKeyId, kFlagEncrypted, kFlagAes,
        static_cast<std::uint8_t>(kFlagKeyId | kFlagEncrypted),
        static_cast<std::uint8_t>(kFlagKeyId | kFlagAes),
        static_cast<std::uint8_t>(kFlagKeyId | kFlagEncrypted | kFlagAes)}) {
    Bytes marked = plain;
    marked[kHeaderFlagsOffset] |= kFlagAuthenticated | bits;
    EXPECT_EQ(decode(marked, d), ProtocolError::kBadFlags) << static_cast<int>(bits);
  }
  // A server that knows only the legacy form: open_datagram() under the same
  // key accepts the authenticated form's tag, but what it returns keeps
  // kFlagKeyId, so decode() refuses it. The encrypted form's tag is no BLAKE2b
  // tag at all.
  const Bytes with_id = sealed(plain, 0, tenant_a(), EnvelopeMode::kAuthenticated);
  const auto misread = open_datagram(with_id, key_from(1));
  ASSERT_FALSE(misread.empty());
  EXPECT_EQ(decode(misread, d), ProtocolError::kBadFlags);
  const Bytes encrypted = sealed(plain, 0, tenant_a(), EnvelopeMode::kEncrypted);
  EXPECT_TRUE(open_datagram(encrypted, key_from(1)).empty());
  if (aes_gcm_available()) {
    for (const EnvelopeMode mode : kAesModes) {
      EXPECT_TRUE(open_datagram(sealed(plain, 0, tenant_a(), mode), key_from(1)).empty());
    }
  }
}

TEST(EnvelopeTest, EnvelopeKeyKeepsTheKeyForTagsAndDerivesTheCipherKeys) {
  const EnvelopeKey key = envelope_key(key_from(1));
  EXPECT_EQ(key.tag_key, key_from(1));
  EXPECT_NE(key.cipher_key, key_from(1));
  EXPECT_NE(key.aes_key, key_from(1));
  EXPECT_NE(key.aes_key, key.cipher_key);                           // a subkey per cipher
  EXPECT_EQ(envelope_key(key_from(1)).cipher_key, key.cipher_key);  // deterministic
  EXPECT_EQ(envelope_key(key_from(1)).aes_key, key.aes_key);
  EXPECT_NE(envelope_key(key_from(2)).cipher_key, key.cipher_key);
  EXPECT_NE(envelope_key(key_from(2)).aes_key, key.aes_key);
}

}  // namespace
}  // namespace shardlock::lease
