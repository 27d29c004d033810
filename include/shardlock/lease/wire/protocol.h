// protocol.h: the shardlock lease wire format (UDP, version 1) and its pure
// codec.
//
// Use it to build or read lease datagrams. The codec never touches a socket,
// never allocates, never throws and never reads or writes outside the spans it
// is given; every failure is a ProtocolError value. Decoded keys are views into
// the input buffer, so a decoded Datagram lives no longer than its bytes.
//
// Wire format (all integers little-endian)
//
//   Header, 32 bytes:
//     0  u32  magic        0x4B4C4853 ("SHLK" on the wire)
//     4  u8   version      1
//     5  u8   flags        bit 0: kFlagAuthenticated, the datagram is sealed
//                          (auth.h, envelope.h: the trailer is removed
//                          before decode());
//                          bit 1: kFlagEpoch, a map epoch follows the header;
//                          bit 2: kFlagKeyId, a sealed datagram names its
//                          key: a u32 key id comes before the tag;
//                          bit 3: kFlagEncrypted, with bits 0 and 2: bytes
//                          6 onward are encrypted and a nonce follows the
//                          key id (envelope.h);
//                          bit 4: kFlagAes, with bits 0 and 2: the key-id
//                          form is AES-256-GCM's, not BLAKE2b's or
//                          XChaCha20-Poly1305's (envelope.h);
//                          opening clears bits 2 to 4, so decode() rejects
//                          them, as it rejects the other bits, which are
//                          reserved
//     6  u8   type         a MessageType, or kBatch
//     7  u8   count        1 for a single message; 1..kMaxBatch for a batch
//     8  u64  request_id   single: the message's request id;
//                          batch: an id for the datagram, echoed in the reply
//    16  u128 client_id    lo u64 then hi u64: random per client instance,
//                          the owner identity of every lease it takes
//
//   A sealed datagram ends in a trailer, which opening removes (auth.h,
//   envelope.h); flags, trailer and what the tag covers:
//     0x01  [tag 16]                        keyed BLAKE2b of all before it
//                                           (key id 0: the single key)
//     0x05  [u32 key_id][tag 16]            keyed BLAKE2b of all before it
//     0x0D  [u32 key_id][nonce 24][tag 16]  XChaCha20-Poly1305: bytes 6 to
//                                           the trailer encrypted; bytes
//                                           0..5 and the key id associated
//     0x15  [u32 key_id][nonce 24][tag 16]  AES-256-GCM (GMAC) of all before
//                                           the tag, nothing encrypted
//     0x1D  [u32 key_id][nonce 24][tag 16]  AES-256-GCM: as 0x0D
//   (kFlagEpoch may be set beside any of them. The AES forms' nonce is a
//   stream's 16-byte prefix, which selects the stream's key, and its u64
//   counter; envelope.h.)
//
//   With kFlagEpoch, a u64 map epoch follows the header (Datagram::epoch):
//   a cluster client's map epoch (docs/cluster.md), on requests only; the
//   body or the batch items come after it. Replies never carry it.
//
//   Single message (type != kBatch): the body of `type` follows the header.
//   Batch (type == kBatch): `count` items follow, each
//     u8 type, u8 item_flags, u16 body_length, u64 request_id,
//     [u128 owner: lo u64 then hi u64, only with kItemFlagOwner],
//     [u16 value_length + value, only with kItemFlagValue], body.
//   item_flags bit 0 (kItemFlagOwner): the item acts for `owner` instead of
//   the header's client_id, so one datagram can carry the requests of many
//   owners (a load generator, a proxy). Bit 1 (kItemFlagValue): a single-key
//   ACQUIRE (exclusive, shared or permit) attaches a value of
//   1..kMaxHolderValueLength bytes to the holder it makes (a
//   leader's address, a host name and pid), which HOLDERS_REPLY returns and
//   renewals keep; on another type, empty or longer, it is kBadField. A
//   request with a value is framed as a batch (of one, alone). The other
//   bits are reserved and decoders reject them, so a server that predates
//   values drops such a datagram. Replies never carry an owner or a value:
//   the client matches them by request id.
//   After the last message the datagram may carry zero padding (see below).
//   Any non-zero byte there is malformed.
//
//   Every decoded Message carries its own request_id whichever framing
//   carried it, so a client matches replies by (request_id) alone and may mix
//   single and batched requests freely. The server answers the items of a
//   batch in one reply batch (request ids preserved); answers that come later
//   (a queued ACQUIRE granted or timed out) arrive as single messages.
//
//   Bodies (key = u16 length + bytes; the codec accepts any length that fits,
//   the server answers ERROR for keys outside 1..kMaxKeyLength). The codec
//   reads and writes them from kMessageBodies below, field by field:
//     ACQUIRE     key, u32 ttl_ms, u32 wait_ms               (exclusive)
//     ACQUIRE_SHARED  key, u32 ttl_ms, u32 wait_ms           (shared)
//     ACQUIRE_PERMIT  key, u32 ttl_ms, u32 wait_ms, u32 permits
//     ACQUIRE_MANY    u8 mode, u32 ttl_ms, u32 wait_ms, keys
//                     (keys = u8 n, n x (u16 length + bytes); mode 0
//                     exclusive, 1 shared)
//     RENEW       key, u64 token, u32 ttl_ms
//     RELEASE     key, u64 token
//     QUERY       key
//     STATS       u32 first_shard
//     MAP         u32 first_member
//     QUERY_HOLDERS  key, u32 first_holder
//     HOT_KEYS    (empty)
//     WATCH       key, u64 token, u32 holders, u32 wait_ms
//                 (a blocking QUERY_HOLDERS: answered when the key's
//                 version differs from (token, holders), or once wait_ms
//                 has passed; see "Watches" below)
//     GRANTED     key, u64 token, u32 ttl_ms
//     BUSY        key, u32 ttl_left_ms
//     TIMEOUT     key
//     RENEWED     key, u32 ttl_ms
//     RELEASED, NOT_OWNER, EXPIRED   (empty)
//     RECOVERING  u32 retry_after_ms
//     ERROR       u16 code (a WireError)
//     GRANTED_MANY  u32 ttl_ms, tokens (u8 n, n x u64: one per key, in
//                   the request's key order)
//     BUSY_MANY     u8 index (the first busy key, in the request's order),
//                   u32 ttl_left_ms of that key
//     REDIRECT    u64 epoch: a cluster node whose map (of that epoch) gives
//                 the key to another node; the client refreshes its map if
//                 it is older and goes to the owner
//     MAP_REPLY   u64 epoch, u32 member_count, u32 first_member, members
//                 (members = u8 n, n x (u16 id_length + id, u16
//                 address_length + address, u32 weight): the map's members
//                 first_member onward; member_count: all of them; ids of
//                 1..kMaxMemberIdLength bytes, addresses of
//                 1..kMaxMemberAddressLength bytes, weight >= 1. Epoch 0
//                 and no members: the server is no cluster node)
//     QUERY_REPLY key, u8 held, u64 token, u32 ttl_left_ms, u32 waiters,
//                 u8 mode, u32 holders, u32 permits
//                 (token and ttl_left: the newest grant's, and the longest
//                 any holder has left; permits: the limit of a semaphore key,
//                 else 0)
//     STATS_REPLY u32 shard_count, u32 first_shard, u8 counter_count,
//                 counter_count x u64, u16 token_count, token_count x u64
//     HOLDERS_REPLY  key, u8 mode, u32 permits, u32 waiters, u32 holders,
//                 u32 first_holder, holder list
//                 (holder list = u8 n, n x (u128 owner: lo u64 then hi u64,
//                 u64 token, u32 ttl_left_ms, u8 holder_flags, u16
//                 value_length + value): the key's holders first_holder
//                 onward, oldest grant first; holders: all of them (0: the
//                 key is free, and mode means nothing); holder_flags bit 0
//                 (kHolderFlagPending): taken by an ACQUIRE_MANY that has
//                 not completed, no lease yet; the other bits are reserved
//                 and decoders reject them; value: what the holder's
//                 acquire attached, 0..kMaxHolderValueLength bytes (longer:
//                 kBadField))
//     HOT_KEYS_REPLY  u32 window_ms, hot-key list
//                 (hot-key list = u8 n, n x (u16 key_length + key, u32
//                 requests, u32 error, u32 busy, u32 holders, u32 waiters):
//                 the server's busiest keys, most requests first, from its
//                 bounded per-shard sketches (docs/lease-server.md, "Hot
//                 keys"). requests: the key's decayed request count, an
//                 upper bound; requests - error: a lower bound (error >
//                 requests, or a key outside 1..kMaxKeyLength bytes:
//                 kBadField); busy: BUSY answers counted alike; holders and
//                 waiters: the key's now. window_ms: the decayed time the
//                 counts cover, so requests * 1000 / window_ms is a rate per
//                 second)
//
//   Which reply answers which request (kRequestReplies below):
//     request   the server sends                          a client also takes
//     ACQUIRE   GRANTED BUSY TIMEOUT RECOVERING ERROR     -
//               REDIRECT
//       (also ACQUIRE_SHARED and ACQUIRE_PERMIT)
//     ACQUIRE_MANY  GRANTED_MANY BUSY_MANY TIMEOUT RECOVERING ERROR
//                   REDIRECT
//     RENEW     RENEWED NOT_OWNER EXPIRED ERROR REDIRECT  -
//               RECOVERING (a cluster node not ready to grant the key)
//     RELEASE   RELEASED NOT_OWNER EXPIRED ERROR          RECOVERING
//     QUERY     QUERY_REPLY ERROR REDIRECT RECOVERING     -
//     STATS     STATS_REPLY ERROR                         RECOVERING
//     MAP       MAP_REPLY ERROR                           RECOVERING
//     QUERY_HOLDERS  HOLDERS_REPLY ERROR REDIRECT          -
//                    RECOVERING
//     HOT_KEYS  HOT_KEYS_REPLY ERROR                      RECOVERING
//     WATCH     HOLDERS_REPLY ERROR REDIRECT RECOVERING   -
//   A reply type sent as a request is answered ERROR(kNotARequest). An
//   ACQUIRE of any kind that waits (wait_ms > 0) may be answered later, on
//   its own (GRANTED or GRANTED_MANY, TIMEOUT or ERROR), and so may a WATCH
//   that waits (HOLDERS_REPLY, REDIRECT or ERROR). A TIMEOUT answering
//   ACQUIRE_MANY carries an empty key: the request's key field, which
//   ACQUIRE_MANY does not have. A client ignores a reply that does not
//   answer its request (reply_answers()), and one that carries a key
//   (reply_carries_key(): GRANTED, BUSY, TIMEOUT, RENEWED, QUERY_REPLY,
//   HOLDERS_REPLY)
//   other than its request's.
//
// Anti-amplification: the reply bytes a request datagram causes, deferred
// answers included, never exceed its own size. Some replies are larger than
// their requests (GRANTED carries a token, QUERY_REPLY several fields), so a
// request must be padded up to max_reply_size(); encode_request() does that.
// The bound of one request is the largest body among the replies the server
// sends it (max_reply_body_bound()), a key counted at the request's length.
// The server answers a request shorter than max_immediate_reply_size() with
// ERROR(kRequestTooSmall) items when they fit, and otherwise not at all. A
// queued ACQUIRE's later answer (a single message) is sent only if it fits
// the bytes the request left for it (deferred_reply_credit()); a withheld
// one is counted (kAmplificationDrops) and a retransmission of the ACQUIRE
// (same request id) learns the outcome. STATS_REPLY returns as many shard
// tokens as the request's padding leaves room for, starting at first_shard;
// page through with first_shard. MAP_REPLY likewise: its bound counts no
// members, and it carries as many as the padding leaves room for, starting
// at first_member. HOLDERS_REPLY likewise (its bound counts no holders,
// first_holder pages); a page past the last holder is empty and still
// carries the totals. A server that predates QUERY_HOLDERS drops it as an
// unknown type (no answer); a client then falls back to QUERY.
// HOT_KEYS_REPLY likewise: its bound counts no keys, and it carries as many
// of the busiest as the padding leaves room for (up to 255). A server that
// predates HOT_KEYS drops it (no answer). REDIRECT (8 bytes) never changes how
// far a request is padded: the request's own body, or another reply it may get, is at least as
// large for any valid key. The epoch of kFlagEpoch makes a request 8 bytes longer and its reply no
// longer.
//
// Watches (docs/lease-server.md, "Watches")
//   A key's version is (the token of its newest holder, in the holder
//   list's order, and its holder count), (0, 0) while nobody holds it:
//   every grant gives a new token, and between grants the count only falls,
//   so two different holder sets never share a version as long as one
//   follows the other. Renewals and waiters do not change it. WATCH carries
//   the version its sender last saw; the server answers HOLDERS_REPLY at
//   once when the key's version differs (or wait_ms is 0), else parks the
//   request and answers when a grant, release or expiry changes the
//   version, or when wait_ms has passed (the same version again). The
//   answer lists the key's NEWEST holders (a tail page: first_holder is
//   where it starts, and it always ends at the last holder when the request
//   was padded to a whole datagram), so the client reads the version off it:
//   the last entry's token and the holders total. A version no key can have
//   (kNoVersionToken) asks for the state at once. A parked WATCH is a
//   deferred answer like a waiting ACQUIRE: bounded per client, per key and
//   per shard (ERROR kLimitExceeded past a bound), its answer within the
//   bytes its datagram left (deferred_reply_credit()), and a retransmission
//   (same request id) of a parked WATCH is not parked twice. During the
//   lock-delay the holders are unknown: WATCH is answered RECOVERING.
//
// Lease kinds (the shard's rules; docs/lease-server.md has the details)
//   * exclusive (ACQUIRE): one holder. shared (ACQUIRE_SHARED): any number of
//     shared holders, no exclusive one. Waiters are FIFO per key across both
//     modes: a shared ACQUIRE behind a queued exclusive one waits for it.
//   * permit (ACQUIRE_PERMIT, a counting semaphore): at most `permits`
//     holders. The first acquirer's limit holds until the key is idle;
//     another limit, or a lock ACQUIRE on a semaphore key (or the reverse),
//     is ERROR(kLeaseKindMismatch) while the key is in use.
//   * Every holder has its own token, expiry, RENEW and RELEASE (by key and
//     token, as for an exclusive lease).
//   * ACQUIRE_MANY takes up to kMaxKeysPerRequest distinct keys of one node
//     all-or-nothing, in one mode: GRANTED_MANY with a token per key, or
//     nothing held (BUSY_MANY names the first busy key). With a wait, keys are
//     taken in the server's global key order, so two such requests never
//     wait for each other in a cycle.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace shardlock::lease {

inline constexpr std::uint32_t kMagic = 0x4B4C4853;  // "SHLK" little-endian
inline constexpr std::uint8_t kProtocolVersion = 1;
inline constexpr std::size_t kHeaderSize = 32;
inline constexpr std::size_t kBatchItemHeaderSize = 12;
inline constexpr std::size_t kBatchItemOwnerSize = 16;  // with kItemFlagOwner
inline constexpr std::size_t kMaxDatagramSize = 1400;
inline constexpr std::size_t kMaxBatch = 64;
inline constexpr std::size_t kMinKeyLength = 1;
inline constexpr std::size_t kMaxKeyLength = 256;
// Keys of one ACQUIRE_MANY.
inline constexpr std::size_t kMaxKeysPerRequest = 16;
// The largest permit limit of ACQUIRE_PERMIT.
inline constexpr std::uint32_t kMaxPermits = 65535;
// Offset of the flags byte in the header.
inline constexpr std::size_t kHeaderFlagsOffset = 5;
// Header flags bit of a datagram sealed with an auth key (auth.h).
inline constexpr std::uint8_t kFlagAuthenticated = 0x01;
// Header flags bit of a datagram with a u64 map epoch after the header.
inline constexpr std::uint8_t kFlagEpoch = 0x02;
// Header flags bit of a sealed datagram that names its key: a u32 key id
// precedes its tag (envelope.h). Opening clears it; decode() rejects it.
inline constexpr std::uint8_t kFlagKeyId = 0x04;
// Header flags bit of an encrypted datagram, always beside kFlagKeyId
// (envelope.h). Opening clears it; decode() rejects it.
inline constexpr std::uint8_t kFlagEncrypted = 0x08;
// Header flags bit of a key-id form sealed with AES-256-GCM, always beside
// kFlagKeyId (envelope.h). Opening clears it; decode() rejects it.
inline constexpr std::uint8_t kFlagAes = 0x10;
// The size of that epoch.
inline constexpr std::size_t kEpochSize = 8;
// The bounds of a MAP_REPLY member's id and address (decode() checks them).
// They are membership's own bounds (cluster::valid_node_id(),
// valid_member_address() read these), so every member a map can hold can be
// served: an advertise address may be a long DNS name (a Kubernetes pod's
// FQDN is often over 64 bytes).
inline constexpr std::size_t kMaxMemberIdLength = 128;
inline constexpr std::size_t kMaxMemberAddressLength = 300;
// Batch item flags bit: the item carries its own owner (see above).
inline constexpr std::uint8_t kItemFlagOwner = 0x01;
// Batch item flags bit: the item carries a holder value (see above).
inline constexpr std::uint8_t kItemFlagValue = 0x02;
// HOLDERS_REPLY entry flags bit: a pending holder (see above).
inline constexpr std::uint8_t kHolderFlagPending = 0x01;
// The longest value a holder may carry (a HOLDERS_REPLY entry's value).
inline constexpr std::size_t kMaxHolderValueLength = 256;
// A WATCH token no key's version has (tokens never reach it): the sender
// has seen nothing yet and wants the key's state at once.
inline constexpr std::uint64_t kNoVersionToken = ~std::uint64_t{0};

enum class MessageType : std::uint8_t {
  // Requests.
  kAcquire = 0x01,
  kRenew = 0x02,
  kRelease = 0x03,
  kQuery = 0x04,
  kStats = 0x05,
  kAcquireShared = 0x06,
  kAcquirePermit = 0x07,
  kAcquireMany = 0x08,
  kMap = 0x09,
  kQueryHolders = 0x0A,
  kHotKeys = 0x0B,
  kWatch = 0x0C,
  // Replies.
  kGranted = 0x81,
  kBusy = 0x82,
  kTimeout = 0x83,
  kRenewed = 0x84,
  kReleased = 0x85,
  kNotOwner = 0x86,
  kExpired = 0x87,
  kRecovering = 0x88,
  kError = 0x89,
  kQueryReply = 0x8A,
  kStatsReply = 0x8B,
  kGrantedMany = 0x8C,
  kBusyMany = 0x8D,
  kRedirect = 0x8E,
  kMapReply = 0x8F,
  kHoldersReply = 0x90,
  kHotKeysReply = 0x91,
  // Header type of a batch datagram; never the type of a Message.
  kBatch = 0xFF,
};

// "ACQUIRE", "GRANTED", ... (kMessageBodies), "BATCH"; "UNKNOWN" for other
// values.
[[nodiscard]] std::string_view to_string(MessageType type) noexcept;

// The code carried by an ERROR reply: the request parsed but was refused.
enum class WireError : std::uint16_t {
  kUnsupportedVersion = 1,  // header version is not kProtocolVersion
  kBadKey = 2,              // key shorter than kMinKeyLength
  kKeyTooLong = 3,          // key longer than kMaxKeyLength
  kTtlOutOfRange = 4,       // ttl_ms is 0 or above the server's maximum TTL
  kWaitOutOfRange = 5,      // wait_ms above the server's maximum wait
  kRequestTooSmall = 6,     // request datagram not padded to max_reply_size()
  kNotARequest = 7,         // a reply type sent to the server
  kInternal = 8,            // the server failed (e.g. could not persist tokens)
  kRequestIdReused = 9,     // this client already used the request id for another type or key
  kLimitExceeded = 10,      // a configured bound (keys, waiters, per-client state) is full
  kResourceExhausted = 11,  // the server could not allocate memory for the request
  kLeaseKindMismatch = 12,  // the key is in use as another kind (lock vs semaphore, another limit)
  kPermitsOutOfRange = 13,  // ACQUIRE_PERMIT with permits 0 or above kMaxPermits
  kBadKeyList = 14,         // ACQUIRE_MANY with 0 or too many keys, or one key twice
  kBadMode = 15,            // ACQUIRE_MANY with a mode other than exclusive or shared
  kPermissionDenied = 16,   // the sender's tenant has no right to the key or the request
  // A bound of the sender's tenant (its tenant file line) is full, over all
  // of its keys on the server: the limit_exceeded of one tenant, named.
  kTenantLeaseLimit = 17,   // max-leases: leases the tenant holds
  kTenantWaiterLimit = 18,  // max-waiters: ACQUIREs the tenant has queued
  kTenantWatchLimit = 19,   // max-watches: WATCHes the tenant has parked
};
// Whether `e` says a configured bound is full: kLimitExceeded (the server's
// or the client's) or one of the tenant's.
[[nodiscard]] constexpr bool is_limit_exceeded(WireError e) noexcept {
  return e == WireError::kLimitExceeded || e == WireError::kTenantLeaseLimit ||
         e == WireError::kTenantWaiterLimit || e == WireError::kTenantWatchLimit;
}

// How a lease holds its key (ACQUIRE_MANY's mode, QUERY_REPLY's mode).
enum class LeaseMode : std::uint8_t {
  kExclusive = 0,  // ACQUIRE: the only holder
  kShared = 1,     // ACQUIRE_SHARED: with other shared holders
  kPermit = 2,     // ACQUIRE_PERMIT: one of at most `permits` holders
};
// "exclusive", "shared", "permit"; "unknown" for other values.
[[nodiscard]] std::string_view to_string(LeaseMode mode) noexcept;
// The acquire request of each single-key mode.
[[nodiscard]] constexpr MessageType acquire_type(LeaseMode mode) noexcept {
  switch (mode) {
    case LeaseMode::kShared:
      return MessageType::kAcquireShared;
    case LeaseMode::kPermit:
      return MessageType::kAcquirePermit;
    case LeaseMode::kExclusive:
      break;
  }
  return MessageType::kAcquire;
}
// True for ACQUIRE, ACQUIRE_SHARED, ACQUIRE_PERMIT and ACQUIRE_MANY.
[[nodiscard]] constexpr bool is_acquire(MessageType type) noexcept {
  return type == MessageType::kAcquire || type == MessageType::kAcquireShared ||
         type == MessageType::kAcquirePermit || type == MessageType::kAcquireMany;
}
[[nodiscard]] std::string_view to_string(WireError code) noexcept;

// STATS_REPLY counters, in wire order. Decoders ignore counters past the ones
// they know, and read missing ones as 0, so new counters can be appended.
enum class StatCounter : std::uint8_t {
  kGrants = 0,          // GRANTED answers (immediate and handed off to waiters)
  kBusy,                // BUSY answers
  kQueued,              // ACQUIREs queued behind a holder
  kTimeouts,            // TIMEOUT answers
  kExpirations,         // leases that expired without release
  kNotOwner,            // NOT_OWNER answers
  kMalformed,           // datagrams dropped by the codec
  kRenewed,             // RENEWED answers
  kReleased,            // RELEASED answers
  kExpiredReplies,      // EXPIRED answers
  kRecovering,          // RECOVERING answers
  kErrors,              // ERROR answers
  kRetransmits,         // requests answered from the dedup cache
  kRequests,            // requests processed (all types)
  kAuthFailures,        // datagrams dropped because their auth tag did not verify
  kStaleRequests,       // RENEW/ACQUIRE older than the lease's last applied request: no effect
  kAmplificationDrops,  // replies not sent: they would exceed the bytes the source sent
  kLimitRejections,     // requests refused by a configured bound (ERROR kLimitExceeded)
  kAllocationFailures,  // requests refused because memory ran out (ERROR kResourceExhausted)
  kSendDrops,           // replies that never left: no send slot, socket buffer full, failed send
  kRedirects,           // REDIRECT answers: the cluster map gives the key to another node
  // Gauges: a reading at the time of the reply, not a running total. A
  // server that predates them sends 21 values, so they read as 0.
  kLeases,           // leases held (each shared or permit holder counts)
  kKeys,             // keys with a holder or a waiter
  kWaiters,          // queued ACQUIREs
  kUptimeMs,         // milliseconds since the server started
  kLockDelayLeftMs,  // milliseconds until ACQUIRE stops answering RECOVERING; 0 once over
  kVersion,          // the server's version, pack_version() of "MAJOR.MINOR.PATCH"
};
inline constexpr std::size_t kStatCounterCount = 27;
// The values a server that predates the gauges sends.
inline constexpr std::size_t kStatCounterCountWithoutGauges = 21;
// Whether `counter` is a gauge (kLeases onward), not a running total.
[[nodiscard]] constexpr bool is_gauge(StatCounter counter) noexcept {
  return counter >= StatCounter::kLeases;
}
// The counter's name in STATS output ("grants", "send_drops", ...).
[[nodiscard]] std::string_view to_string(StatCounter counter) noexcept;
// "MAJOR.MINOR.PATCH" as one u64 (major << 32 | minor << 16 | patch), the
// kVersion gauge; 0 for text of another shape or a part out of range.
[[nodiscard]] constexpr std::uint64_t pack_version(std::string_view text) noexcept {
  std::uint64_t parts[3] = {0, 0, 0};
  std::size_t part = 0;
  bool digit_seen = false;
  for (const char c : text) {
    if (c == '.' && digit_seen && part < 2) {
      ++part;
      digit_seen = false;
    } else if (c >= '0' && c <= '9' && parts[part] < 0x10000) {
      parts[part] = parts[part] * 10 + static_cast<std::uint64_t>(c - '0');
      digit_seen = true;
    } else {
      return 0;
    }
  }
  if (part != 2 || !digit_seen || parts[0] > 0xFFFFFFFF || parts[1] > 0xFFFF || parts[2] > 0xFFFF) {
    return 0;
  }
  return parts[0] << 32 | parts[1] << 16 | parts[2];
}
// The text of a pack_version() value: "1.2.3"; "" for 0 (not known).
[[nodiscard]] std::string version_text(std::uint64_t packed);

// ---- The message body table ---------------------------------------------

// A body field: the Message member it carries and its wire codec.
enum class BodyField : std::uint8_t {
  kKey,          // u16 length + bytes                Message::key
  kToken,        // u64                               Message::token
  kTtl,          // u32                               Message::ttl_ms
  kWait,         // u32                               Message::wait_ms
  kRetryAfter,   // u32                               Message::retry_after_ms
  kErrorCode,    // u16, a WireError                  Message::error
  kHeld,         // u8, 0 or 1 (else kBadField)       Message::held
  kWaiters,      // u32                               Message::waiters
  kFirstShard,   // u32                               Message::first_shard
  kShardCount,   // u32                               Message::shard_count
  kCounters,     // u8 n, n x u64 (see StatCounter)   Message::counters_le
  kShardTokens,  // u16 n, n x u64                    Message::shard_tokens_le
  kMode,         // u8, a LeaseMode (else kBadField)   Message::mode
  kPermits,      // u32                               Message::permits
  kHolders,      // u32                               Message::holders
  kIndex,        // u8                                Message::index
  kKeyList,      // u8 n, n x (u16 length + bytes)    Message::key_count, key_list
  kTokenList,    // u8 n, n x u64                     Message::tokens_le
  kEpoch,        // u64                               Message::epoch
  kFirstMember,  // u32                               Message::first_member
  kMemberCount,  // u32                               Message::member_count
  // u8 n, n x (u16 length + id, u16 length + address, u32 weight); ids,
  // addresses or weights out of bounds: kBadField.
  kMemberList,   //                                   Message::member_list_count, member_list
  kFirstHolder,  // u32                               Message::first_holder
  // u8 n, n x (u128 owner, u64 token, u32 ttl_left_ms, u8 flags, u16 length
  // + value); reserved flags or a value too long: kBadField.
  kHolderList,  //                                    Message::holder_list_count, holder_list
  kWindow,      // u32                                  Message::window_ms
  // u8 n, n x (u16 length + key, u32 requests, u32 error, u32 busy, u32
  // holders, u32 waiters); a key outside 1..kMaxKeyLength or error >
  // requests: kBadField.
  kHotKeyList,  //                                    Message::hot_key_count, hot_key_list
};

// The bytes `field` takes besides a key's bytes and the shard tokens: the
// whole field, or its length prefix. kCounters: the kStatCounterCount
// counters an encoder writes.
[[nodiscard]] constexpr std::size_t body_field_size(BodyField field) noexcept {
  switch (field) {
    case BodyField::kKey:
    case BodyField::kErrorCode:
    case BodyField::kShardTokens:
      return 2;
    case BodyField::kMode:
    case BodyField::kIndex:
    case BodyField::kKeyList:
    case BodyField::kTokenList:
    case BodyField::kMemberList:
    case BodyField::kHolderList:
    case BodyField::kHotKeyList:
      return 1;
    case BodyField::kPermits:
    case BodyField::kHolders:
      return 4;
    case BodyField::kToken:
    case BodyField::kEpoch:
      return 8;
    case BodyField::kTtl:
    case BodyField::kWait:
    case BodyField::kRetryAfter:
    case BodyField::kWaiters:
    case BodyField::kFirstShard:
    case BodyField::kShardCount:
    case BodyField::kFirstMember:
    case BodyField::kMemberCount:
    case BodyField::kFirstHolder:
    case BodyField::kWindow:
      return 4;
    case BodyField::kHeld:
      return 1;
    case BodyField::kCounters:
      return 1 + 8 * kStatCounterCount;
  }
  return 0;
}

inline constexpr std::size_t kMaxBodyFields = 8;

// One message type: its name and its body, field by field in wire order.
struct MessageBody {
  MessageType type;
  std::string_view name;
  std::array<BodyField, kMaxBodyFields> fields{};
  std::size_t field_count = 0;

  constexpr MessageBody(MessageType t, std::string_view n,
                        std::initializer_list<BodyField> body) noexcept
      : type(t), name(n) {
    for (const BodyField f : body) fields[field_count++] = f;  // > kMaxBodyFields: not constant
  }
  [[nodiscard]] constexpr bool has(BodyField field) const noexcept {
    for (std::size_t i = 0; i < field_count; ++i) {
      if (fields[i] == field) return true;
    }
    return false;
  }
  // The body's size with an empty key and no shard tokens.
  [[nodiscard]] constexpr std::size_t fixed_size() const noexcept {
    std::size_t n = 0;
    for (std::size_t i = 0; i < field_count; ++i) n += body_field_size(fields[i]);
    return n;
  }
};

// Every message type's body. encoded_size(), encode() and decode() walk this
// table; the body list at the top of this file says the same in prose.
// Columns: clang-format would run them together.
// clang-format off
inline constexpr auto kMessageBodies = [] {
  using enum MessageType;
  using enum BodyField;
  return std::array{
      //          type         name           body, in wire order
      MessageBody{kAcquire,    "ACQUIRE",     {kKey, kTtl, kWait}},
      MessageBody{kRenew,      "RENEW",       {kKey, kToken, kTtl}},
      MessageBody{kRelease,    "RELEASE",     {kKey, kToken}},
      MessageBody{kQuery,      "QUERY",       {kKey}},
      MessageBody{kStats,      "STATS",       {kFirstShard}},
      MessageBody{kAcquireShared, "ACQUIRE_SHARED", {kKey, kTtl, kWait}},
      MessageBody{kAcquirePermit, "ACQUIRE_PERMIT", {kKey, kTtl, kWait, kPermits}},
      MessageBody{kAcquireMany,   "ACQUIRE_MANY",   {kMode, kTtl, kWait, kKeyList}},
      MessageBody{kGranted,    "GRANTED",     {kKey, kToken, kTtl}},
      MessageBody{kBusy,       "BUSY",        {kKey, kTtl}},
      MessageBody{kTimeout,    "TIMEOUT",     {kKey}},
      MessageBody{kRenewed,    "RENEWED",     {kKey, kTtl}},
      MessageBody{kReleased,   "RELEASED",    {}},
      MessageBody{kNotOwner,   "NOT_OWNER",   {}},
      MessageBody{kExpired,    "EXPIRED",     {}},
      MessageBody{kRecovering, "RECOVERING",  {kRetryAfter}},
      MessageBody{kError,      "ERROR",       {kErrorCode}},
      MessageBody{kQueryReply, "QUERY_REPLY", {kKey, kHeld, kToken, kTtl, kWaiters, kMode,
                                               kHolders, kPermits}},
      MessageBody{kStatsReply, "STATS_REPLY", {kShardCount, kFirstShard, kCounters, kShardTokens}},
      MessageBody{kGrantedMany, "GRANTED_MANY", {kTtl, kTokenList}},
      MessageBody{kBusyMany,    "BUSY_MANY",    {kIndex, kTtl}},
      MessageBody{kMap,         "MAP",          {kFirstMember}},
      MessageBody{kRedirect,    "REDIRECT",     {kEpoch}},
      MessageBody{kMapReply,    "MAP_REPLY",    {kEpoch, kMemberCount, kFirstMember, kMemberList}},
      MessageBody{kQueryHolders, "QUERY_HOLDERS", {kKey, kFirstHolder}},
      MessageBody{kHoldersReply, "HOLDERS_REPLY", {kKey, kMode, kPermits, kWaiters, kHolders,
                                                   kFirstHolder, kHolderList}},
      MessageBody{kHotKeys,      "HOT_KEYS",       {}},
      MessageBody{kHotKeysReply, "HOT_KEYS_REPLY", {kWindow, kHotKeyList}},
      MessageBody{kWatch,        "WATCH",          {kKey, kToken, kHolders, kWait}},
  };
}();
// clang-format on

// The row of kMessageBodies for `type`; nullptr for kBatch and unknown values.
[[nodiscard]] constexpr const MessageBody* message_body(MessageType type) noexcept {
  for (const MessageBody& body : kMessageBodies) {
    if (body.type == type) return &body;
  }
  return nullptr;
}

// ---- The request -> reply table ------------------------------------------

// A few message types: the replies of one request.
struct MessageTypeList {
  std::array<MessageType, 6> types{};
  std::size_t count = 0;

  constexpr MessageTypeList(std::initializer_list<MessageType> list) noexcept {
    for (const MessageType t : list) types[count++] = t;  // more than 6: not constant
  }
  [[nodiscard]] constexpr const MessageType* begin() const noexcept { return types.data(); }
  [[nodiscard]] constexpr const MessageType* end() const noexcept { return types.data() + count; }
  [[nodiscard]] constexpr bool contains(MessageType type) const noexcept {
    for (const MessageType t : *this) {
      if (t == type) return true;
    }
    return false;
  }
};

// Which replies answer one request type.
struct RequestReplies {
  MessageType request;
  // What the server sends it, at once or later. ERROR is in every row: any
  // request can be refused. The reply bound (max_reply_body_bound()) counts
  // exactly these.
  MessageTypeList replies;
  // Replies a client also takes as the answer, though the server never sends
  // them for this request: RECOVERING, which a client reads as the lock-delay
  // whatever it asked. Outside the reply bound, so the server must not start
  // sending them without moving them to `replies`.
  MessageTypeList also_accepted;
  // Whether the answer may come later, as a datagram of its own: a request
  // that waits (wait_ms > 0) is queued behind the holder.
  bool queues_when_waiting = false;
};

// Columns: clang-format would run them together.
// clang-format off
inline constexpr auto kRequestReplies = [] {
  using enum MessageType;
  using Row = RequestReplies;
  return std::array{
      //  request   replies the server sends                                    also accepted  queues
      Row{kAcquire, {kGranted, kBusy, kTimeout, kRecovering, kError, kRedirect}, {},            true},
      Row{kAcquireShared, {kGranted, kBusy, kTimeout, kRecovering, kError, kRedirect}, {},      true},
      Row{kAcquirePermit, {kGranted, kBusy, kTimeout, kRecovering, kError, kRedirect}, {},      true},
      Row{kAcquireMany, {kGrantedMany, kBusyMany, kTimeout, kRecovering, kError, kRedirect}, {}, true},
      Row{kRenew,   {kRenewed, kNotOwner, kExpired, kError, kRedirect, kRecovering}, {}, false},
      Row{kRelease, {kReleased, kNotOwner, kExpired, kError},                   {kRecovering}, false},
      Row{kQuery,   {kQueryReply, kError, kRedirect, kRecovering},              {},            false},
      Row{kStats,   {kStatsReply, kError},                                      {kRecovering}, false},
      Row{kMap,     {kMapReply, kError},                                        {kRecovering}, false},
      Row{kQueryHolders, {kHoldersReply, kError, kRedirect, kRecovering},       {},            false},
      Row{kHotKeys, {kHotKeysReply, kError},                                    {kRecovering}, false},
      Row{kWatch,   {kHoldersReply, kError, kRedirect, kRecovering},            {},            true},
  };
}();
// clang-format on

// True for the request types: the rows of kRequestReplies.
[[nodiscard]] constexpr bool is_request(MessageType type) noexcept {
  for (const RequestReplies& row : kRequestReplies) {
    if (row.request == type) return true;
  }
  return false;
}

// True for the reply types: those that answer some request.
[[nodiscard]] constexpr bool is_reply(MessageType type) noexcept {
  for (const RequestReplies& row : kRequestReplies) {
    if (row.replies.contains(type) || row.also_accepted.contains(type)) return true;
  }
  return false;
}

// Whether a client takes `reply` as the answer to `request`; anything else
// is ignored (a stray or forged datagram must not complete a call).
[[nodiscard]] constexpr bool reply_answers(MessageType request, MessageType reply) noexcept {
  for (const RequestReplies& row : kRequestReplies) {
    if (row.request == request) {
      return row.replies.contains(reply) || row.also_accepted.contains(reply);
    }
  }
  return false;
}

// Whether `reply` carries its request's key, which a client then checks.
[[nodiscard]] constexpr bool reply_carries_key(MessageType reply) noexcept {
  for (const MessageBody& body : kMessageBodies) {
    if (body.type == reply) return is_reply(reply) && body.has(BodyField::kKey);
  }
  return false;
}

// The largest reply body the server sends to a request, as a function of the
// request's key length and its key-list length (ACQUIRE_MANY): the largest of
// `keyed` plus the key length (the replies that carry the key, if any),
// `listed` plus 8 bytes per listed key (those that carry a token per key),
// and `unkeyed` (the others).
struct ReplyBodyBound {
  bool carries_key = false;
  bool carries_tokens = false;
  std::size_t keyed = 0;    // largest body of a reply with the key, less the key's bytes
  std::size_t listed = 0;   // largest body of a reply with a token list, less its tokens
  std::size_t unkeyed = 0;  // largest body of a reply with neither

  [[nodiscard]] constexpr std::size_t operator()(std::size_t key_length,
                                                 std::size_t listed_keys = 0) const noexcept {
    std::size_t n = unkeyed;
    if (carries_key && keyed + key_length > n) n = keyed + key_length;
    if (carries_tokens && listed + 8 * listed_keys > n) n = listed + 8 * listed_keys;
    return n;
  }
};

// The reply body bound of `request` from its row of kRequestReplies, a
// STATS_REPLY counted with no shard tokens, a MAP_REPLY with no members and a
// HOLDERS_REPLY with no holders. A type that is no
// request is answered ERROR(kNotARequest).
[[nodiscard]] constexpr ReplyBodyBound max_reply_body_bound(MessageType request) noexcept {
  ReplyBodyBound bound;
  const auto add = [&bound](MessageType reply) {
    for (const MessageBody& body : kMessageBodies) {
      if (body.type != reply) continue;
      const bool keyed = body.has(BodyField::kKey);
      const bool listed = body.has(BodyField::kTokenList);
      std::size_t& largest = keyed ? bound.keyed : listed ? bound.listed : bound.unkeyed;
      if (body.fixed_size() > largest) largest = body.fixed_size();
      bound.carries_key = bound.carries_key || keyed;
      bound.carries_tokens = bound.carries_tokens || listed;
    }
  };
  if (!is_request(request)) add(MessageType::kError);
  for (const RequestReplies& row : kRequestReplies) {
    if (row.request != request) continue;
    for (const MessageType reply : row.replies) add(reply);
  }
  return bound;
}

// 128-bit owner identity. A client picks a random one for itself and gives
// each lease handle its own owner, which shares the client's upper 96 bits
// (handle_owner() in client/call.h; the Python client does the same).
struct ClientId {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  friend constexpr bool operator==(const ClientId&, const ClientId&) = default;
};

// The client an owner belongs to: its upper 96 bits. The server counts its
// per-client bounds over it, so the handles of one client share one quota.
// Two unrelated random ids share it with probability 2^-96.
[[nodiscard]] constexpr ClientId owner_client(ClientId owner) noexcept {
  return ClientId{.lo = owner.lo & ~std::uint64_t{0xFFFF'FFFF}, .hi = owner.hi};
}

// One request or reply. Only the fields of its type are meaningful (see the
// body table above); the others keep their defaults and are not encoded.
struct Message {
  MessageType type = MessageType::kQuery;
  std::uint64_t request_id = 0;
  // A batch item's own owner (kItemFlagOwner); nullopt: the datagram's
  // client_id. encode() frames a datagram whose message has one as a batch.
  std::optional<ClientId> owner{};
  // A single-key ACQUIRE's holder value (kItemFlagValue); empty: none. A
  // view, like the key. encode() frames a datagram whose message has one as
  // a batch.
  std::string_view value{};
  std::string_view key;       // all keyed types; a view, never owned
  std::uint64_t token = 0;    // RENEW, RELEASE, GRANTED, QUERY_REPLY, WATCH
  std::uint32_t ttl_ms = 0;   // ACQUIRE, RENEW, GRANTED, RENEWED; ttl left for BUSY, QUERY_REPLY
  std::uint32_t wait_ms = 0;  // ACQUIRE, WATCH
  std::uint32_t retry_after_ms = 0;        // RECOVERING
  WireError error = WireError::kInternal;  // ERROR
  bool held = false;                       // QUERY_REPLY
  std::uint32_t waiters = 0;               // QUERY_REPLY
  LeaseMode mode = LeaseMode::kExclusive;  // ACQUIRE_MANY, QUERY_REPLY, HOLDERS_REPLY
  std::uint32_t permits = 0;               // ACQUIRE_PERMIT, QUERY_REPLY, HOLDERS_REPLY
  std::uint32_t holders = 0;               // QUERY_REPLY, HOLDERS_REPLY: all of the key's; WATCH
  std::uint8_t index = 0;                  // BUSY_MANY
  // ACQUIRE_MANY: key_count keys as their wire entries (u16 length + bytes
  // each, without the count byte); read them with KeyList, build them with
  // encode_key_list().
  std::uint8_t key_count = 0;
  std::span<const std::uint8_t> key_list{};
  // GRANTED_MANY tokens as raw little-endian u64s; read with listed_token().
  std::span<const std::uint8_t> tokens_le{};
  std::uint32_t first_shard = 0;  // STATS, STATS_REPLY
  std::uint32_t shard_count = 0;  // STATS_REPLY
  // STATS_REPLY counters as raw little-endian u64s, in StatCounter order; read
  // them with counter(). An encoder writes exactly kStatCounterCount. A view,
  // like the key: a Message stays small (it is copied and zeroed per item).
  std::span<const std::uint8_t> counters_le{};
  // STATS_REPLY shard tokens as raw little-endian u64s (first_shard onward);
  // read them with shard_token().
  std::span<const std::uint8_t> shard_tokens_le{};
  std::uint64_t epoch = 0;         // REDIRECT, MAP_REPLY: the sender's map epoch
  std::uint32_t first_member = 0;  // MAP, MAP_REPLY
  std::uint32_t member_count = 0;  // MAP_REPLY: the map's members, all pages
  // MAP_REPLY: member_list_count members as their wire entries (without the
  // count byte); read them with MemberList, build them with
  // encode_member_list().
  std::uint8_t member_list_count = 0;
  std::span<const std::uint8_t> member_list{};
  std::uint32_t first_holder = 0;  // QUERY_HOLDERS, HOLDERS_REPLY
  // HOLDERS_REPLY: holder_list_count holders as their wire entries (without
  // the count byte); read them with HolderList, build them with
  // append_holder_entry().
  std::uint8_t holder_list_count = 0;
  std::span<const std::uint8_t> holder_list{};
  std::uint32_t window_ms = 0;  // HOT_KEYS_REPLY
  // HOT_KEYS_REPLY: hot_key_count keys as their wire entries (without the
  // count byte); read them with HotKeyList, build them with
  // append_hot_key_entry().
  std::uint8_t hot_key_count = 0;
  std::span<const std::uint8_t> hot_key_list{};

  [[nodiscard]] std::size_t shard_token_count() const noexcept {
    return shard_tokens_le.size() / 8;
  }
  // Precondition: i < shard_token_count().
  [[nodiscard]] std::uint64_t shard_token(std::size_t i) const noexcept;
  [[nodiscard]] std::uint64_t counter(StatCounter c) const noexcept {
    return counter_at(static_cast<std::size_t>(c));
  }
  // Counter `i`, or 0 past the ones the datagram carries.
  [[nodiscard]] std::uint64_t counter_at(std::size_t i) const noexcept;
  [[nodiscard]] std::size_t listed_token_count() const noexcept { return tokens_le.size() / 8; }
  // Precondition: i < listed_token_count().
  [[nodiscard]] std::uint64_t listed_token(std::size_t i) const noexcept;
};

// The keys of an ACQUIRE_MANY (Message::key_count and key_list), in order.
// A decoded message's list is well formed (decode() checked it); walking a
// hand-built malformed one stops early.
class KeyList {
 public:
  KeyList(std::uint8_t count, std::span<const std::uint8_t> entries) noexcept
      : count_(count), entries_(entries) {}
  explicit KeyList(const Message& m) noexcept : KeyList(m.key_count, m.key_list) {}

  class iterator {
   public:
    using value_type = std::string_view;
    using difference_type = std::ptrdiff_t;
    iterator() noexcept = default;
    iterator(std::span<const std::uint8_t> rest, std::size_t left) noexcept;
    [[nodiscard]] std::string_view operator*() const noexcept { return current_; }
    iterator& operator++() noexcept;
    iterator operator++(int) noexcept {
      iterator old = *this;
      ++*this;
      return old;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept {
      return a.left_ == b.left_;
    }

   private:
    void load() noexcept;
    std::span<const std::uint8_t> rest_{};
    std::size_t left_ = 0;
    std::string_view current_{};
  };
  [[nodiscard]] iterator begin() const noexcept { return {entries_, count_}; }
  [[nodiscard]] iterator end() const noexcept { return {}; }
  [[nodiscard]] std::size_t size() const noexcept { return count_; }

 private:
  std::uint8_t count_;
  std::span<const std::uint8_t> entries_;
};

// Writes `keys` as key-list entries into `out` (resized), for
// Message::key_list; false when there are more than 255 keys or a key is
// longer than 65535 bytes.
[[nodiscard]] bool encode_key_list(std::span<const std::string_view> keys,
                                   std::vector<std::uint8_t>& out);

// One member of a MAP_REPLY: views into the datagram.
struct MemberEntry {
  std::string_view id;
  std::string_view address;  // "host:port"
  std::uint32_t weight = 1;
};

// One holder of a HOLDERS_REPLY: its value is a view into the datagram.
struct HolderEntry {
  ClientId owner;
  std::uint64_t token = 0;
  std::uint32_t ttl_left_ms = 0;
  std::uint8_t flags = 0;  // kHolderFlagPending
  std::string_view value;  // at most kMaxHolderValueLength bytes
};

// One key of a HOT_KEYS_REPLY: its key is a view into the datagram.
struct HotKeyEntry {
  std::string_view key;
  std::uint32_t requests = 0;  // decayed count, an upper bound
  std::uint32_t error = 0;     // requests - error: a lower bound
  std::uint32_t busy = 0;      // BUSY answers, counted alike
  std::uint32_t holders = 0;   // now
  std::uint32_t waiters = 0;   // now
};

// The wire size of one hot-key-list entry.
[[nodiscard]] constexpr std::size_t hot_key_entry_size(const HotKeyEntry& h) noexcept {
  return 2 + h.key.size() + 5 * sizeof(std::uint32_t);
}

// Appends `entry` as a hot-key-list entry to `out`, for
// Message::hot_key_list; false, appending nothing, for one that decode()
// would refuse (a key outside 1..kMaxKeyLength bytes, error > requests).
[[nodiscard]] bool append_hot_key_entry(const HotKeyEntry& entry, std::vector<std::uint8_t>& out);

// The wire size of one holder-list entry.
[[nodiscard]] constexpr std::size_t holder_entry_size(const HolderEntry& h) noexcept {
  return 16 + 8 + 4 + 1 + 2 + h.value.size();
}

// Appends `holder` as a holder-list entry to `out`, for Message::holder_list;
// false, appending nothing, for one that decode() would refuse (reserved
// flags, a value longer than kMaxHolderValueLength).
[[nodiscard]] bool append_holder_entry(const HolderEntry& holder, std::vector<std::uint8_t>& out);

// Reads one entry of a wire list at the front of `in` into `out`; returns
// its wire size, or 0 when `in` does not start with a whole entry. A view:
// `out` points into `in`.
[[nodiscard]] std::size_t parse_entry(std::span<const std::uint8_t> in, MemberEntry& out) noexcept;
[[nodiscard]] std::size_t parse_entry(std::span<const std::uint8_t> in, HolderEntry& out) noexcept;
[[nodiscard]] std::size_t parse_entry(std::span<const std::uint8_t> in, HotKeyEntry& out) noexcept;

// The `count` entries of a list field (MAP_REPLY's members, HOLDERS_REPLY's
// holders), in order. A decoded message's list is well formed (decode()
// checked it); walking a hand-built malformed one stops early.
template <class Entry>
class EntryList {
 public:
  EntryList(std::uint8_t count, std::span<const std::uint8_t> entries) noexcept
      : count_(count), entries_(entries) {}

  class iterator {
   public:
    using value_type = Entry;
    using difference_type = std::ptrdiff_t;
    iterator() noexcept = default;
    iterator(std::span<const std::uint8_t> rest, std::size_t left) noexcept
        : rest_(rest), left_(left) {
      load();
    }
    [[nodiscard]] const Entry& operator*() const noexcept { return current_; }
    [[nodiscard]] const Entry* operator->() const noexcept { return &current_; }
    iterator& operator++() noexcept {
      if (left_ == 0) return *this;
      rest_ = rest_.subspan(entry_size_);
      --left_;
      load();
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator old = *this;
      ++*this;
      return old;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept {
      return a.left_ == b.left_;
    }

   private:
    void load() noexcept {
      if (left_ == 0) return;
      entry_size_ = parse_entry(rest_, current_);
      if (entry_size_ == 0) left_ = 0;  // malformed: stop
    }
    std::span<const std::uint8_t> rest_{};
    std::size_t left_ = 0;
    std::size_t entry_size_ = 0;  // wire bytes of current_
    Entry current_{};
  };
  [[nodiscard]] iterator begin() const noexcept { return {entries_, count_}; }
  [[nodiscard]] iterator end() const noexcept { return {}; }
  [[nodiscard]] std::size_t size() const noexcept { return count_; }

 private:
  std::uint8_t count_;
  std::span<const std::uint8_t> entries_;
};

// The members of a MAP_REPLY (Message::member_list_count and member_list).
class MemberList : public EntryList<MemberEntry> {
 public:
  using EntryList::EntryList;
  explicit MemberList(const Message& m) noexcept : EntryList(m.member_list_count, m.member_list) {}
};

// The holders of a HOLDERS_REPLY (Message::holder_list_count and
// holder_list).
class HolderList : public EntryList<HolderEntry> {
 public:
  using EntryList::EntryList;
  explicit HolderList(const Message& m) noexcept : EntryList(m.holder_list_count, m.holder_list) {}
};

// The keys of a HOT_KEYS_REPLY (Message::hot_key_count and hot_key_list).
class HotKeyList : public EntryList<HotKeyEntry> {
 public:
  using EntryList::EntryList;
  explicit HotKeyList(const Message& m) noexcept : EntryList(m.hot_key_count, m.hot_key_list) {}
};

// The wire size of one member-list entry.
[[nodiscard]] constexpr std::size_t member_entry_size(const MemberEntry& m) noexcept {
  return 2 + m.id.size() + 2 + m.address.size() + 4;
}

// A MAP_REPLY page of one member of the longest id and address (header,
// the epoch flag's u64, epoch + member_count + first_member + list count,
// the entry, a 16-byte auth tag) fits a datagram, so a client that pads MAP
// to a whole datagram always gets a page with at least one member.
static_assert(kHeaderSize + kEpochSize + (8 + 4 + 4 + 1) +
                      member_entry_size(MemberEntry{
                          .id = std::string_view(), .address = std::string_view(), .weight = 1}) +
                      kMaxMemberIdLength + kMaxMemberAddressLength + 16 <=
                  kMaxDatagramSize,
              "a MAP_REPLY page must hold one member of the longest id and address");

// A HOLDERS_REPLY page of one holder with the longest value (header, the
// body's fixed part with the longest key, the entry, a 16-byte auth tag)
// fits a datagram, so a client that pads QUERY_HOLDERS to a whole datagram
// always gets a page with at least one holder.
static_assert(kHeaderSize + (2 + kMaxKeyLength + 1 + 4 + 4 + 4 + 4 + 1) +
                      holder_entry_size(HolderEntry{}) + kMaxHolderValueLength + 16 <=
                  kMaxDatagramSize,
              "a HOLDERS_REPLY page must hold one holder of the longest value");

// Writes `members` as member-list entries into `out` (resized), for
// Message::member_list; false when there are more than 255 members or one
// that decode() would refuse (id or address empty or too long, weight 0).
[[nodiscard]] bool encode_member_list(std::span<const MemberEntry> members,
                                      std::vector<std::uint8_t>& out);

// Whether the answer to `request` may come later, as a datagram of its own
// (RequestReplies::queues_when_waiting): a waiting ACQUIRE.
[[nodiscard]] constexpr bool may_answer_later(const Message& request) noexcept {
  for (const RequestReplies& row : kRequestReplies) {
    if (row.request == request.type) return row.queues_when_waiting && request.wait_ms > 0;
  }
  return false;
}

// A whole datagram: header fields plus 1..kMaxBatch messages.
struct Datagram {
  std::uint8_t version = kProtocolVersion;
  std::uint8_t flags = 0;
  // Batch framing. encode() uses it whenever count > 1; with count == 1 it
  // frames a batch of one only when `batch` is true.
  bool batch = false;
  std::uint64_t request_id = 0;  // single: equals messages[0].request_id
  ClientId client_id;
  // The sender's map epoch (kFlagEpoch): encode() writes it and sets the flag
  // iff it is set (whatever `flags` says of that bit); decode() reads it iff
  // the flag is set. Cluster clients set it on requests; replies never carry
  // it.
  std::optional<std::uint64_t> epoch{};
  std::uint8_t count = 0;
  std::array<Message, kMaxBatch> messages{};

  [[nodiscard]] std::span<Message> items() noexcept { return {messages.data(), count}; }
  [[nodiscard]] std::span<const Message> items() const noexcept { return {messages.data(), count}; }
  // Appends a message; returns false when the datagram already has kMaxBatch.
  [[nodiscard]] bool push(const Message& m) noexcept {
    if (count >= kMaxBatch) return false;
    messages[count++] = m;
    return true;
  }
};

// Why the codec refused bytes or a datagram. Also a std::error_code category.
enum class ProtocolError : std::uint8_t {
  kOk = 0,
  kTruncated,           // input ends inside a field
  kBadMagic,            // not a shardlock datagram
  kUnsupportedVersion,  // magic fine, version unknown (header is still decoded)
  kBadFlags,            // reserved header/item bits set
  kBadType,             // unknown message type
  kBadCount,            // count 0, above kMaxBatch, or != 1 for a single message
  kBadLength,           // a batch item's body_length disagrees with its body
  kNonZeroPadding,      // trailing bytes that are not zero
  kTooLarge,            // datagram above kMaxDatagramSize, or output span too small
  kBadField,            // a field value the format forbids (e.g. held not 0/1)
};
[[nodiscard]] std::string_view to_string(ProtocolError e) noexcept;
[[nodiscard]] const std::error_category& protocol_category() noexcept;
[[nodiscard]] inline std::error_code make_error_code(ProtocolError e) noexcept {
  return {static_cast<int>(e), protocol_category()};
}

// Decodes one datagram. On kOk `out` holds every message (keys and STATS
// tokens are views into `in`). On kUnsupportedVersion the header fields of
// `out` (version, request_id, client_id) are filled so the caller can answer
// ERROR(kUnsupportedVersion); nothing else is. On other errors `out` is
// unspecified. Never reads outside `in`.
[[nodiscard]] ProtocolError decode(std::span<const std::uint8_t> in, Datagram& out) noexcept;

// The encoded size of `d` without padding; 0 if `d` cannot be encoded (count
// out of range, unknown type, key or STATS tokens too long for a u16 length).
[[nodiscard]] std::size_t encoded_size(const Datagram& d) noexcept;

// Encodes `d` into `out`, then zero-pads it up to `pad_to` bytes when that is
// larger. Returns kOk and sets `written`, or kTooLarge when the result would
// exceed kMaxDatagramSize or out.size(), or kBadCount/kBadType/kBadField for a
// datagram that cannot be encoded. Writes nothing outside `out`.
[[nodiscard]] ProtocolError encode(const Datagram& d, std::span<std::uint8_t> out,
                                   std::size_t& written, std::size_t pad_to = 0) noexcept;

// The reply bytes the server may send for request datagram `request`: its
// immediate reply (every message answered, framed as the request is, with no
// epoch; a STATS reply counted with no shard tokens, a MAP reply with no
// members) plus, in a batch, 20 bytes more per
// waiting ACQUIRE (wait_ms > 0), whose answer may come later as a single
// message. A request datagram at least this long gets every answer.
[[nodiscard]] std::size_t max_reply_size(const Datagram& request) noexcept;

// The largest immediate reply datagram for `request` (see above). The server
// refuses a shorter request (kRequestTooSmall).
[[nodiscard]] std::size_t max_immediate_reply_size(const Datagram& request) noexcept;

// The reply bytes item `item` of `request` (received as `request_size`
// bytes) may use later, if the server queues it: 0 unless it is a waiting
// ACQUIRE; the whole datagram for a single message; in a batch, the item's
// share of the immediate bound plus an equal share of the bytes beyond that
// bound among the waiting ACQUIREs. The immediate reply and every deferred
// answer within these credits together never exceed `request_size` (the
// server then sends no shard tokens in a STATS reply of that datagram).
[[nodiscard]] std::size_t deferred_reply_credit(const Datagram& request, std::size_t request_size,
                                                std::size_t item) noexcept;

// encode() padded to max_reply_size(d), so no answer is refused for size.
[[nodiscard]] ProtocolError encode_request(const Datagram& d, std::span<std::uint8_t> out,
                                           std::size_t& written) noexcept;

}  // namespace shardlock::lease

template <>
struct std::is_error_code_enum<shardlock::lease::ProtocolError> : std::true_type {};

template <>
struct std::hash<shardlock::lease::ClientId> {
  std::size_t operator()(const shardlock::lease::ClientId& id) const noexcept {
    // Client ids are random, so folding the halves is a good enough hash.
    return static_cast<std::size_t>(id.lo ^ (id.hi * 0x9E3779B97F4A7C15ULL));
  }
};
