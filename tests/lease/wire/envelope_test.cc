// The tenant envelope: each form round trips under several key ids, the
// legacy form is seal_datagram()'s byte for byte, every truncation and every
// bit flip is refused, so are wrong keys and wrong key ids, and encryption
// hides keys, values and owner ids behind a fresh nonce per datagram, one
// that no other seal, thread or forked child uses.
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

namespace shardlock::lease {
namespace {

using Bytes = std::vector<std::uint8_t>;

constexpr std::string_view kLeaseKey = "tenant-a/orders/4711";
constexpr std::string_view kValue = "host-17.example.net:8080 pid 4242";
constexpr ClientId kClient{0x1122334455667788, 0x99AABBCCDDEEFF00};
constexpr ClientId kOwner{0x0F1E2D3C4B5A6978, 0x8796A5B4C3D2E1F0};
constexpr std::uint64_t kRequestId = 0x0123456789ABCDEF;
constexpr std::array<std::uint32_t, 5> kKeyIds = {0, 1, 7, 0x01020304, 0xFFFFFFFF};
constexpr std::array<EnvelopeMode, 3> kModes = {EnvelopeMode::kLegacy, EnvelopeMode::kAuthenticated,
                                                EnvelopeMode::kEncrypted};

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
    for (const EnvelopeMode mode : kModes) {
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
    for (const EnvelopeMode mode : kModes) {
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
    for (const EnvelopeMode mode : kModes) {
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

TEST(EnvelopeTest, AWrongKeyOrKeyIdIsRefused) {
  const Bytes plain = plain_acquire_with_value();
  for (const EnvelopeMode mode : kModes) {
    SCOPED_TRACE(static_cast<int>(mode));
    const Bytes by_a = sealed(plain, id_for(mode, 3), tenant_a(), mode);
    EXPECT_TRUE(open_copy(by_a, tenant_b()).empty());
    // Each form uses one half of an EnvelopeKey: the other half being
    // right does not make up for it.
    EnvelopeKey tag_only = tenant_a();
    tag_only.cipher_key = tenant_b().cipher_key;
    EnvelopeKey cipher_only = tenant_a();
    cipher_only.tag_key = tenant_b().tag_key;
    EXPECT_TRUE(open_copy(by_a, mode == EnvelopeMode::kEncrypted ? tag_only : cipher_only).empty());
    if (mode == EnvelopeMode::kLegacy) continue;

    // Another tenant's id on A's datagram: refused under A's key and B's.
    Bytes renamed = by_a;
    const std::size_t key_id_at = plain.size();
    renamed[key_id_at] = 4;
    EXPECT_EQ(peek_key_id(renamed), (EnvelopeKeyId{4, mode}));
    EXPECT_TRUE(open_copy(renamed, tenant_a()).empty());
    EXPECT_TRUE(open_copy(renamed, tenant_b()).empty());
  }
  // Sealed by B under A's id: the id is only a claim.
  const Bytes forged = sealed(plain, 3, tenant_b(), EnvelopeMode::kAuthenticated);
  EXPECT_EQ(peek_key_id(forged), (EnvelopeKeyId{3, EnvelopeMode::kAuthenticated}));
  EXPECT_TRUE(open_copy(forged, tenant_a()).empty());
}

TEST(EnvelopeTest, EncryptionHidesKeysValuesAndOwners) {
  const Bytes plain = plain_acquire_with_value();
  const std::vector<Bytes> secrets = {bytes_of(kLeaseKey), bytes_of(kValue), wire_bytes(kClient),
                                      wire_bytes(kOwner), wire_bytes(kRequestId)};
  // The authenticated form shows them all, so the search below can see them.
  const Bytes readable = sealed(plain, 9, tenant_a(), EnvelopeMode::kAuthenticated);
  for (const Bytes& secret : secrets) EXPECT_TRUE(contains(readable, secret));

  const Bytes hidden = sealed(plain, 9, tenant_a(), EnvelopeMode::kEncrypted);
  for (const Bytes& secret : secrets) {
    EXPECT_FALSE(contains(hidden, secret));
    // Not even half of an id, nor a third of the key or the value.
    for (std::size_t at = 0; at + 8 <= secret.size(); at += 4) {
      EXPECT_FALSE(contains(hidden, std::span(secret).subspan(at, 8))) << at;
    }
  }
  // What stays readable: magic, version and flags, and the key id.
  EXPECT_TRUE(std::equal(plain.begin(), plain.begin() + 5, hidden.begin()));
  EXPECT_EQ(hidden[kHeaderFlagsOffset],
            kFlagAuthenticated | kFlagEpoch | kFlagKeyId | kFlagEncrypted);
  EXPECT_EQ(hidden[plain.size()], 9);
}

// The nonce of an encrypted datagram sealed from `plain_size` plain bytes.
Bytes nonce_of(const Bytes& whole, std::size_t plain_size) {
  const auto at = whole.begin() + static_cast<std::ptrdiff_t>(plain_size + kKeyIdSize);
  return {at, at + kEnvelopeNonceSize};
}

// Encrypted seals of `plain` under key id `key_id` on this thread; their
// nonces, in order. Each one opens.
std::vector<Bytes> nonces_of_seals(const Bytes& plain, std::uint32_t key_id, int seals) {
  std::vector<Bytes> nonces;
  for (int i = 0; i < seals; ++i) {
    const Bytes whole = sealed(plain, key_id, tenant_a(), EnvelopeMode::kEncrypted);
    nonces.push_back(nonce_of(whole, plain.size()));
    EXPECT_EQ(open_copy(whole, tenant_a()), opened_form(plain));
  }
  return nonces;
}

TEST(EnvelopeTest, NoncesDifferAcrossSeals) {
  const Bytes plain = plain_acquire();
  std::set<Bytes> nonces;
  std::set<Bytes> ciphertexts;
  constexpr int kSeals = 256;
  for (int i = 0; i < kSeals; ++i) {
    const Bytes whole = sealed(plain, 5, tenant_a(), EnvelopeMode::kEncrypted);
    nonces.insert(nonce_of(whole, plain.size()));
    ciphertexts.emplace(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(plain.size()));
    EXPECT_EQ(open_copy(whole, tenant_a()), opened_form(plain));
  }
  EXPECT_EQ(nonces.size(), static_cast<std::size_t>(kSeals));
  EXPECT_EQ(ciphertexts.size(), static_cast<std::size_t>(kSeals));
}

// Threads seal at once, under key ids of their own and under one they
// share, two of them taking the same per-thread nonce slot in turn (5 and
// 21): no nonce is ever sealed twice.
TEST(EnvelopeTest, NoncesDifferAcrossThreadsAndSeals) {
  const Bytes plain = plain_acquire();
  constexpr int kThreads = 8;
  constexpr int kRounds = 64;
  std::vector<std::vector<Bytes>> per_thread(kThreads);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&plain, &nonces = per_thread[t], t] {
      for (int round = 0; round < kRounds; ++round) {
        for (const std::uint32_t key_id : {5U, 21U, 100U + static_cast<std::uint32_t>(t)}) {
          for (Bytes& nonce : nonces_of_seals(plain, key_id, 4)) nonces.push_back(std::move(nonce));
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

// A nonce is a 16-byte prefix and a little-endian counter (envelope.h): one
// thread's seals under one key id share the prefix and count up by one;
// another thread starts a prefix of its own.
TEST(EnvelopeTest, OneThreadsNoncesCountUnderOnePrefix) {
  const Bytes plain = plain_acquire();
  const auto counter_of = [](const Bytes& nonce) {
    std::uint64_t counter = 0;
    for (std::size_t i = 0; i < 8; ++i) counter |= std::uint64_t{nonce[16 + i]} << (8 * i);
    return counter;
  };
  const std::vector<Bytes> mine = nonces_of_seals(plain, 77, 16);
  for (std::size_t i = 1; i < mine.size(); ++i) {
    EXPECT_TRUE(std::equal(mine[i].begin(), mine[i].begin() + 16, mine[0].begin()));
    EXPECT_EQ(counter_of(mine[i]), counter_of(mine[i - 1]) + 1);
  }
  std::vector<Bytes> theirs;
  std::thread([&] { theirs = nonces_of_seals(plain, 77, 1); }).join();
  ASSERT_EQ(theirs.size(), 1U);
  EXPECT_FALSE(std::equal(theirs[0].begin(), theirs[0].begin() + 16, mine[0].begin()));
}

// A forked child goes on from its parent's copy of the sealing thread; its
// nonces must not be the ones the parent seals next.
TEST(EnvelopeTest, AForkedChildNeverRepeatsItsParentsNonces) {
  const Bytes plain = plain_acquire();
  (void)nonces_of_seals(plain, 9, 2);  // the stream the child inherits
  int pipe_ends[2];
  ASSERT_EQ(::pipe(pipe_ends), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Bytes buffer(plain.size() + kMaxEnvelopeOverhead);
    std::copy(plain.begin(), plain.end(), buffer.begin());
    const std::size_t n = seal_for(buffer, plain.size(), 9, tenant_a(), EnvelopeMode::kEncrypted);
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
  const std::vector<Bytes> parents = nonces_of_seals(plain, 9, 1);
  EXPECT_NE(childs, parents[0]);
  EXPECT_FALSE(std::equal(childs.begin(), childs.begin() + 16, parents[0].begin()))
      << "the child drew a prefix of its own";
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

  Bytes other_magic = whole;
  other_magic[0] ^= 0xFF;
  EXPECT_FALSE(peek_key_id(other_magic));

  // A header and a trailer, not one byte less.
  EXPECT_TRUE(peek_key_id(std::span(whole).first(kHeaderSize + kMaxEnvelopeOverhead)));
  EXPECT_FALSE(peek_key_id(std::span(whole).first(kHeaderSize + kMaxEnvelopeOverhead - 1)));
}

TEST(EnvelopeTest, SealRefusesWhatItCannotSealAndLeavesItUntouched) {
  const Bytes plain = plain_acquire();
  for (const EnvelopeMode mode : kModes) {
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
    for (const std::uint8_t bit : {kFlagKeyId, kFlagEncrypted}) {
      Bytes twice = roomy;
      twice[kHeaderFlagsOffset] |= bit;
      EXPECT_TRUE(refused(twice, plain.size()));
    }
  }
}

TEST(EnvelopeTest, OpenNeedsRoomForThePlainDatagram) {
  const Bytes plain = plain_acquire();
  for (const EnvelopeMode mode : kModes) {
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
       {kFlagKeyId, kFlagEncrypted, static_cast<std::uint8_t>(kFlagKeyId | kFlagEncrypted)}) {
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
}

TEST(EnvelopeTest, EnvelopeKeyKeepsTheKeyForTagsAndDerivesTheCipherKey) {
  const EnvelopeKey key = envelope_key(key_from(1));
  EXPECT_EQ(key.tag_key, key_from(1));
  EXPECT_NE(key.cipher_key, key_from(1));
  EXPECT_EQ(envelope_key(key_from(1)).cipher_key, key.cipher_key);  // deterministic
  EXPECT_NE(envelope_key(key_from(2)).cipher_key, key.cipher_key);
}

}  // namespace
}  // namespace shardlock::lease
