// shardlock-wire-vectors: prints the lease codec's test vectors, datagrams
// the C++ codec encoded, for the clients written in other languages.
//
//   shardlock-wire-vectors > clients/java/src/test/resources/wire_vectors.tsv
//
// Every message type of kMessageBodies with every field set (single and
// batched, with and without the epoch flag), each request as
// encode_request() pads it, datagrams sealed under a fixed auth key, and
// datagrams sealed for a tenant in envelope.h's key-id forms. One vector a
// line, tab-separated:
//
//   KIND  NAME  HEX  DESCRIPTION
//
// KIND: "plain" (encode(), no padding), "request" (encode_request()) or
// "sealed" (encode_request() or encode(), then seal_datagram() under the key
// of the "authkey" line). DESCRIPTION: the header, then each message, "|"
// between them, as space-separated name=value words walked from
// kMessageBodies in wire order: integers in decimal, bytes (keys, values,
// raw lists) in hex, entry lists as COUNT:HEX. A client's codec decodes HEX,
// describes what it read the same way and compares; then encodes the
// description back and compares the bytes.
//
// The envelope (envelope.h), under the same key: the lines "cipherkey" and
// "aeskey" hold envelope_key(key).cipher_key and .aes_key, libsodium's
// crypto_kdf subkeys, so a client that derives them itself checks its
// derivation directly. KIND "keyid" (EnvelopeMode::kAuthenticated),
// "encrypted" (kEncrypted), "keyid-aes" (kAuthenticatedAes) and
// "encrypted-aes" (kEncryptedAes) lines hold the sealed datagram as HEX,
// and as DESCRIPTION "key_id=N plain=HEX": the key id it names and the
// plain datagram open_with() gives back (its kFlagAuthenticated set, as
// opened datagrams keep it). A client opens HEX and compares, then seals
// the plain datagram (kFlagAuthenticated cleared) back to HEX, with the
// nonce field HEX carries for the nonce forms (XChaCha's nonce; an AES
// stream's prefix and counter). The nonces and prefixes come from a
// fixed-seed generator installed into libsodium before its first use
// (randombytes_set_implementation), and each AES stream counts from 0 in
// the order below, so this output is the same every run; servers and
// clients use the system's random source.
//
// The ctest wire_vectors_tool_test checks that the checked-in file is this
// tool's output.
//
// Exit codes: 0 success, 1 a vector the codec refused (a bug here), 2 this
// CPU has no AES-GCM (AES-NI), so the AES vectors cannot be made here
// (nothing printed).
#include <sodium.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardlock/lease/wire/auth.h"
#include "shardlock/lease/wire/envelope.h"
#include "shardlock/lease/wire/protocol.h"

namespace {

namespace lease = shardlock::lease;
using lease::BodyField;
using lease::Datagram;
using lease::Message;
using lease::MessageType;

std::string hex(const std::uint8_t* data, std::size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * size);
  for (std::size_t i = 0; i < size; ++i) {
    out += kDigits[data[i] >> 4];
    out += kDigits[data[i] & 0xF];
  }
  return out;
}
std::string hex(std::span<const std::uint8_t> s) { return hex(s.data(), s.size()); }
std::string hex(std::string_view s) {
  return hex(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
}

std::string field_text(BodyField f, const Message& m) {
  const auto n = [](std::uint64_t v) { return std::to_string(v); };
  switch (f) {
    case BodyField::kKey:
      return "key=" + hex(m.key);
    case BodyField::kToken:
      return "token=" + n(m.token);
    case BodyField::kTtl:
      return "ttl=" + n(m.ttl_ms);
    case BodyField::kWait:
      return "wait=" + n(m.wait_ms);
    case BodyField::kRetryAfter:
      return "retry_after=" + n(m.retry_after_ms);
    case BodyField::kErrorCode:
      return "error=" + n(static_cast<std::uint16_t>(m.error));
    case BodyField::kHeld:
      return "held=" + n(m.held ? 1 : 0);
    case BodyField::kWaiters:
      return "waiters=" + n(m.waiters);
    case BodyField::kFirstShard:
      return "first_shard=" + n(m.first_shard);
    case BodyField::kShardCount:
      return "shard_count=" + n(m.shard_count);
    case BodyField::kCounters:
      return "counters=" + hex(m.counters_le);
    case BodyField::kShardTokens:
      return "shard_tokens=" + hex(m.shard_tokens_le);
    case BodyField::kMode:
      return "mode=" + n(static_cast<std::uint8_t>(m.mode));
    case BodyField::kPermits:
      return "permits=" + n(m.permits);
    case BodyField::kHolders:
      return "holders=" + n(m.holders);
    case BodyField::kIndex:
      return "index=" + n(m.index);
    case BodyField::kKeyList:
      return "key_list=" + n(m.key_count) + ":" + hex(m.key_list);
    case BodyField::kTokenList:
      return "token_list=" + hex(m.tokens_le);
    case BodyField::kEpoch:
      return "epoch=" + n(m.epoch);
    case BodyField::kFirstMember:
      return "first_member=" + n(m.first_member);
    case BodyField::kMemberCount:
      return "member_count=" + n(m.member_count);
    case BodyField::kMemberList:
      return "member_list=" + n(m.member_list_count) + ":" + hex(m.member_list);
    case BodyField::kFirstHolder:
      return "first_holder=" + n(m.first_holder);
    case BodyField::kHolderList:
      return "holder_list=" + n(m.holder_list_count) + ":" + hex(m.holder_list);
    case BodyField::kWindow:
      return "window=" + n(m.window_ms);
    case BodyField::kHotKeyList:
      return "hot_key_list=" + n(m.hot_key_count) + ":" + hex(m.hot_key_list);
  }
  return "?";
}

std::string describe(const Datagram& d) {
  std::string out = "header flags=" + std::to_string(d.flags) + " batch=" + (d.batch ? "1" : "0") +
                    " rid=" + std::to_string(d.request_id) +
                    " lo=" + std::to_string(d.client_id.lo) +
                    " hi=" + std::to_string(d.client_id.hi);
  if (d.epoch) out += " epoch=" + std::to_string(*d.epoch);
  for (const Message& m : d.items()) {
    out += " | ";
    out += lease::to_string(m.type);
    out += " rid=" + std::to_string(m.request_id);
    if (m.owner) out += " owner=" + std::to_string(m.owner->lo) + ":" + std::to_string(m.owner->hi);
    if (!m.value.empty()) out += " value=" + hex(m.value);
    const lease::MessageBody* body = lease::message_body(m.type);
    for (std::size_t i = 0; i < body->field_count; ++i) out += " " + field_text(body->fields[i], m);
  }
  return out;
}

// Backing storage for the views a Message holds; lives as long as main().
struct Store {
  std::vector<std::vector<std::uint8_t>> buffers;
  std::span<const std::uint8_t> keep(std::vector<std::uint8_t> bytes) {
    buffers.push_back(std::move(bytes));
    return buffers.back();
  }
};

std::vector<std::uint8_t> u64s(std::initializer_list<std::uint64_t> values) {
  std::vector<std::uint8_t> out;
  for (const std::uint64_t v : values) {
    for (int b = 0; b < 8; ++b) out.push_back(static_cast<std::uint8_t>(v >> (8 * b)));
  }
  return out;
}

// A message of `type` with every field of its body set to a value of its own.
Message sample(MessageType type, Store& store) {
  Message m;
  m.type = type;
  m.request_id = 0x0102030405060708ULL + static_cast<std::uint8_t>(type);
  m.key = "orders/42";
  m.token = 0xFEDCBA9876543210ULL;
  m.ttl_ms = 30000;
  m.wait_ms = 1500;
  m.retry_after_ms = 2500;
  m.error = lease::WireError::kLimitExceeded;
  m.held = true;
  m.waiters = 3;
  m.first_shard = 2;
  m.shard_count = 4;
  m.mode = lease::LeaseMode::kShared;
  m.permits = 5;
  m.holders = 7;
  m.index = 1;
  m.epoch = 0x1122334455667788ULL;
  m.first_member = 1;
  m.member_count = 3;
  m.first_holder = 0;
  m.window_ms = 60000;
  if (!lease::message_body(type)->has(BodyField::kKey)) m.key = {};
  std::vector<std::uint8_t> counters;
  for (std::size_t i = 0; i < lease::kStatCounterCount; ++i) {
    const auto c = u64s({1000 + i});
    counters.insert(counters.end(), c.begin(), c.end());
  }
  m.counters_le = store.keep(counters);
  m.shard_tokens_le = store.keep(u64s({11, 22}));
  m.tokens_le = store.keep(u64s({41, 42, 0xFFFFFFFFFFFFFFF0ULL}));
  {
    const std::array<std::string_view, 3> keys = {"a", "orders/1", "\xc3\xa9t\xc3\xa9"};
    std::vector<std::uint8_t> list;
    if (!lease::encode_key_list(keys, list)) std::abort();
    m.key_count = 3;
    m.key_list = store.keep(list);
  }
  {
    const std::array<lease::MemberEntry, 2> members = {
        lease::MemberEntry{.id = "n2", .address = "127.0.0.1:7421", .weight = 1},
        lease::MemberEntry{.id = "n3", .address = "[::1]:7422", .weight = 3}};
    std::vector<std::uint8_t> list;
    if (!lease::encode_member_list(members, list)) std::abort();
    m.member_list_count = 2;
    m.member_list = store.keep(list);
  }
  {
    std::vector<std::uint8_t> list;
    const lease::HolderEntry a{.owner = {.lo = 0xAAAA000000000001ULL, .hi = 0xBBBB},
                               .token = 99,
                               .ttl_left_ms = 1234,
                               .flags = 0,
                               .value = "leader@host:80"};
    const lease::HolderEntry b{.owner = {.lo = 2, .hi = 3},
                               .token = 100,
                               .ttl_left_ms = 0,
                               .flags = lease::kHolderFlagPending,
                               .value = ""};
    if (!lease::append_holder_entry(a, list) || !lease::append_holder_entry(b, list)) std::abort();
    m.holder_list_count = 2;
    m.holder_list = store.keep(list);
  }
  {
    std::vector<std::uint8_t> list;
    const lease::HotKeyEntry h{
        .key = "hot", .requests = 500, .error = 20, .busy = 100, .holders = 1, .waiters = 4};
    if (!lease::append_hot_key_entry(h, list)) std::abort();
    m.hot_key_count = 1;
    m.hot_key_list = store.keep(list);
  }
  return m;
}

Datagram single(const Message& m) {
  Datagram d;
  d.request_id = m.request_id;
  d.client_id = {.lo = 0x1111222233334444ULL, .hi = 0x5555666677778888ULL};
  (void)d.push(m);
  return d;
}

const lease::AuthKey kAuthKey = [] {
  lease::AuthKey key{};
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<std::uint8_t>(0xA0 + i);
  return key;
}();

bool failed = false;

void emit(const char* kind, const std::string& name, const Datagram& d, bool request, bool sealed) {
  std::array<std::uint8_t, lease::kMaxDatagramSize> buffer{};
  std::size_t written = 0;
  const lease::ProtocolError e =
      request ? lease::encode_request(d, buffer, written) : lease::encode(d, buffer, written);
  if (e != lease::ProtocolError::kOk) {
    std::fprintf(stderr, "shardlock-wire-vectors: %s: %s\n", name.c_str(),
                 std::string(lease::to_string(e)).c_str());
    failed = true;
    return;
  }
  if (sealed) {
    written = lease::seal_datagram(buffer, written, kAuthKey);
    if (written == 0) {
      std::fprintf(stderr, "shardlock-wire-vectors: %s: does not fit sealed\n", name.c_str());
      failed = true;
      return;
    }
  }
  // Describe what decode() reads back (a sealed one less its tag), so the
  // description is the codec's, not this tool's intent.
  Datagram back;
  const std::span<const std::uint8_t> bytes(buffer.data(), written);
  const std::span<const std::uint8_t> opened =
      sealed ? lease::open_datagram(bytes, kAuthKey) : bytes;
  if (opened.empty() || lease::decode(opened, back) != lease::ProtocolError::kOk) {
    std::fprintf(stderr, "shardlock-wire-vectors: %s: does not decode\n", name.c_str());
    failed = true;
    return;
  }
  std::printf("%s\t%s\t%s\t%s\n", kind, name.c_str(), hex(bytes).c_str(), describe(back).c_str());
}

// The envelope vectors' nonces: libsodium's random source replaced by
// ChaCha20 over a fixed seed and a running counter, so the output file
// stays byte for byte the same. Installed before libsodium is first used.
std::uint64_t random_draws = 0;

void fixed_seed_buf(void* const out, const std::size_t size) {
  std::array<unsigned char, randombytes_SEEDBYTES> seed{};
  for (std::size_t i = 0; i < 8; ++i) seed[i] = static_cast<unsigned char>(random_draws >> (8 * i));
  ++random_draws;
  randombytes_buf_deterministic(out, size, seed.data());
}

std::uint32_t fixed_seed_random() {
  std::uint32_t v = 0;
  fixed_seed_buf(&v, sizeof v);
  return v;
}

const char* fixed_seed_name() { return "shardlock-wire-vectors fixed seed"; }

randombytes_implementation fixed_seed_random_source = {
    .implementation_name = fixed_seed_name,
    .random = fixed_seed_random,
    .stir = nullptr,
    .uniform = nullptr,
    .buf = fixed_seed_buf,
    .close = nullptr,
};

void emit_envelope(const std::string& name, const Datagram& d, bool request, std::uint32_t key_id,
                   lease::EnvelopeMode mode) {
  const char* kind = "keyid";
  switch (mode) {
    case lease::EnvelopeMode::kEncrypted:
      kind = "encrypted";
      break;
    case lease::EnvelopeMode::kAuthenticatedAes:
      kind = "keyid-aes";
      break;
    case lease::EnvelopeMode::kEncryptedAes:
      kind = "encrypted-aes";
      break;
    default:
      break;
  }
  std::array<std::uint8_t, lease::kMaxDatagramSize> buffer{};
  std::size_t written = 0;
  const std::span<std::uint8_t> room =
      std::span(buffer).first(lease::kMaxDatagramSize - lease::envelope_overhead(mode));
  const lease::ProtocolError e =
      request ? lease::encode_request(d, room, written) : lease::encode(d, room, written);
  const lease::EnvelopeKey key = lease::envelope_key(kAuthKey);
  if (e == lease::ProtocolError::kOk) written = lease::seal_for(buffer, written, key_id, key, mode);
  std::array<std::uint8_t, lease::kMaxDatagramSize> plain{};
  const std::span<const std::uint8_t> sealed(buffer.data(), written);
  const std::span<const std::uint8_t> opened = lease::open_with(sealed, key, plain);
  Datagram back;
  if (e != lease::ProtocolError::kOk || written == 0 || opened.empty() ||
      lease::decode(opened, back) != lease::ProtocolError::kOk) {
    std::fprintf(stderr, "shardlock-wire-vectors: %s %s: does not seal and open\n", kind,
                 name.c_str());
    failed = true;
    return;
  }
  std::printf("%s\t%s\t%s\tkey_id=%u plain=%s\n", kind, name.c_str(), hex(sealed).c_str(), key_id,
              hex(opened).c_str());
}

}  // namespace

int main() {
  // Before anything calls into libsodium (sodium_init() reads it).
  if (randombytes_set_implementation(&fixed_seed_random_source) != 0) return 1;
  if (!lease::aes_gcm_available()) {
    std::fprintf(stderr,
                 "shardlock-wire-vectors: this CPU has no AES-GCM (AES-NI and PCLMULQDQ): the "
                 "AES vectors cannot be made here\n");
    return 2;
  }
  Store store;
  std::printf(
      "# generated by shardlock-wire-vectors (tools/shardlock_wire_vectors.cc); do not edit\n");
  std::printf("authkey\t%s\n", hex(kAuthKey).c_str());
  // Every type alone.
  for (const lease::MessageBody& body : lease::kMessageBodies) {
    emit("plain", std::string(body.name), single(sample(body.type, store)), false, false);
  }
  // Every request padded as a client sends it, with and without the epoch.
  for (const lease::RequestReplies& row : lease::kRequestReplies) {
    Datagram d = single(sample(row.request, store));
    const std::string name(lease::to_string(row.request));
    emit("request", name, d, true, false);
    d.epoch = 42;
    emit("request", name + "+epoch", d, true, false);
  }
  // A waiting ACQUIRE with no wait (its pad differs), and the longest key.
  {
    Message m = sample(MessageType::kAcquire, store);
    m.wait_ms = 0;
    emit("request", "ACQUIRE+try", single(m), true, false);
    const std::string longest(lease::kMaxKeyLength, 'k');
    m.key = longest;
    emit("request", "ACQUIRE+longest_key", single(m), true, false);
  }
  // Single-key ACQUIREs with a holder value: a batch of one.
  for (const MessageType t :
       {MessageType::kAcquire, MessageType::kAcquireShared, MessageType::kAcquirePermit}) {
    Message m = sample(t, store);
    m.value = "host-1:pid 77";
    Datagram d = single(m);
    emit("request", std::string(lease::to_string(t)) + "+value", d, true, false);
    d.epoch = 9;
    emit("request", std::string(lease::to_string(t)) + "+value+epoch", d, true, false);
  }
  // Batches: a reply batch of three, a request batch with an item owner.
  {
    Datagram d = single(sample(MessageType::kGranted, store));
    d.request_id = 77;
    (void)d.push(sample(MessageType::kBusy, store));
    (void)d.push(sample(MessageType::kReleased, store));
    emit("plain", "BATCH+replies", d, false, false);
    Datagram r = single(sample(MessageType::kAcquire, store));
    r.request_id = 78;
    r.batch = true;
    r.messages[0].owner = lease::ClientId{.lo = 0xDEAD, .hi = 0xBEEF};
    (void)r.push(sample(MessageType::kRelease, store));
    emit("plain", "BATCH+owner", r, false, false);
    emit("request", "BATCH+owner", r, true, false);
  }
  // Sealed: each request as a client seals it, and a few replies.
  for (const lease::RequestReplies& row : lease::kRequestReplies) {
    emit("sealed", std::string(lease::to_string(row.request)), single(sample(row.request, store)),
         true, true);
  }
  for (const MessageType t : {MessageType::kGranted, MessageType::kHoldersReply,
                              MessageType::kMapReply, MessageType::kRecovering}) {
    emit("sealed", std::string(lease::to_string(t)), single(sample(t, store)), false, true);
  }
  // The envelope's key-id forms: a few requests (one with the epoch flag,
  // which stays beside the envelope's bits) and replies (ERROR
  // permission_denied among them), under key ids whose bytes differ
  // (little-endian on the wire) and key id 0, which may encrypt too.
  // The AES forms come last, so the random draws before them (the XChaCha
  // nonces) stay where they were.
  std::printf("cipherkey\t%s\n", hex(lease::envelope_key(kAuthKey).cipher_key).c_str());
  std::printf("aeskey\t%s\n", hex(lease::envelope_key(kAuthKey).aes_key).c_str());
  for (const lease::EnvelopeMode mode :
       {lease::EnvelopeMode::kAuthenticated, lease::EnvelopeMode::kEncrypted,
        lease::EnvelopeMode::kAuthenticatedAes, lease::EnvelopeMode::kEncryptedAes}) {
    for (const std::uint32_t key_id : {std::uint32_t{7}, std::uint32_t{0xFEDCBA98}}) {
      const std::string id = "+id" + std::to_string(key_id);
      for (const MessageType t :
           {MessageType::kAcquire, MessageType::kRelease, MessageType::kWatch}) {
        emit_envelope(std::string(lease::to_string(t)) + id, single(sample(t, store)), true, key_id,
                      mode);
      }
      Datagram with_epoch = single(sample(MessageType::kAcquire, store));
      with_epoch.epoch = 42;
      emit_envelope("ACQUIRE+epoch" + id, with_epoch, true, key_id, mode);
      for (const MessageType t : {MessageType::kGranted, MessageType::kHoldersReply}) {
        emit_envelope(std::string(lease::to_string(t)) + id, single(sample(t, store)), false,
                      key_id, mode);
      }
      Message denied = sample(MessageType::kError, store);
      denied.error = lease::WireError::kPermissionDenied;
      emit_envelope("ERROR+permission_denied" + id, single(denied), false, key_id, mode);
    }
    emit_envelope("QUERY+id0", single(sample(MessageType::kQuery, store)), true, 0, mode);
  }
  return failed ? 1 : 0;
}
