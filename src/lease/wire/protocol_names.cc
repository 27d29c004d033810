// The names of the lease wire's values (message types, STATS counters, wire
// errors, lease modes, codec errors), the version text and the codec's error
// category: nothing on the encode/decode path. See protocol.h.
#include <array>
#include <string>
#include <string_view>
#include <system_error>

#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease {
namespace {

class ProtocolCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "shardlock.lease.protocol"; }
  std::string message(int e) const override {
    return std::string(to_string(static_cast<ProtocolError>(e)));
  }
};

}  // namespace

std::string_view to_string(MessageType type) noexcept {
  if (type == MessageType::kBatch) return "BATCH";
  const MessageBody* body = message_body(type);
  return body == nullptr ? "UNKNOWN" : body->name;
}

std::string_view to_string(StatCounter counter) noexcept {
  static constexpr std::array<std::string_view, kStatCounterCount> kNames = {"grants",
                                                                             "busy",
                                                                             "queued",
                                                                             "timeouts",
                                                                             "expirations",
                                                                             "not_owner",
                                                                             "malformed",
                                                                             "renewed",
                                                                             "released",
                                                                             "expired_replies",
                                                                             "recovering",
                                                                             "errors",
                                                                             "retransmits",
                                                                             "requests",
                                                                             "auth_failures",
                                                                             "stale_requests",
                                                                             "amplification_drops",
                                                                             "limit_rejections",
                                                                             "allocation_failures",
                                                                             "send_drops",
                                                                             "redirects",
                                                                             "leases",
                                                                             "keys",
                                                                             "waiters",
                                                                             "uptime_ms",
                                                                             "lock_delay_left_ms",
                                                                             "version"};
  static_assert(!kNames.back().empty(), "a STATS value without a name");
  const auto i = static_cast<std::size_t>(counter);
  return i < kNames.size() ? kNames[i] : "unknown";
}

std::string version_text(std::uint64_t packed) {
  if (packed == 0) return {};
  return std::to_string(packed >> 32) + "." + std::to_string((packed >> 16) & 0xFFFF) + "." +
         std::to_string(packed & 0xFFFF);
}

std::string_view to_string(WireError code) noexcept {
  switch (code) {
    case WireError::kUnsupportedVersion:
      return "unsupported protocol version";
    case WireError::kBadKey:
      return "empty key";
    case WireError::kKeyTooLong:
      return "key longer than 256 bytes";
    case WireError::kTtlOutOfRange:
      return "ttl out of range";
    case WireError::kWaitOutOfRange:
      return "wait out of range";
    case WireError::kRequestTooSmall:
      return "request datagram too small for its reply";
    case WireError::kNotARequest:
      return "not a request";
    case WireError::kInternal:
      return "internal server error";
    case WireError::kRequestIdReused:
      return "request id reused for a different request";
    case WireError::kLimitExceeded:
      return "a server limit is reached";
    case WireError::kResourceExhausted:
      return "server out of memory";
    case WireError::kLeaseKindMismatch:
      return "key in use as another lease kind or permit limit";
    case WireError::kPermitsOutOfRange:
      return "permits out of range";
    case WireError::kBadKeyList:
      return "bad key list (none, too many, or a key twice)";
    case WireError::kBadMode:
      return "bad lease mode";
    case WireError::kPermissionDenied:
      return "permission denied (the tenant has no right to this key or request)";
    case WireError::kTenantLeaseLimit:
      return "limit exceeded: the tenant's max-leases (leases it holds on this server)";
    case WireError::kTenantWaiterLimit:
      return "limit exceeded: the tenant's max-waiters (ACQUIREs it has queued on this server)";
    case WireError::kTenantWatchLimit:
      return "limit exceeded: the tenant's max-watches (WATCHes it has parked on this server)";
  }
  return "unknown error";
}

std::string_view to_string(LeaseMode mode) noexcept {
  switch (mode) {
    case LeaseMode::kExclusive:
      return "exclusive";
    case LeaseMode::kShared:
      return "shared";
    case LeaseMode::kPermit:
      return "permit";
  }
  return "unknown";
}

std::string_view to_string(ProtocolError e) noexcept {
  switch (e) {
    case ProtocolError::kOk:
      return "ok";
    case ProtocolError::kTruncated:
      return "truncated datagram";
    case ProtocolError::kBadMagic:
      return "bad magic";
    case ProtocolError::kUnsupportedVersion:
      return "unsupported protocol version";
    case ProtocolError::kBadFlags:
      return "reserved bits set";
    case ProtocolError::kBadType:
      return "unknown message type";
    case ProtocolError::kBadCount:
      return "bad message count";
    case ProtocolError::kBadLength:
      return "batch item length mismatch";
    case ProtocolError::kNonZeroPadding:
      return "non-zero padding";
    case ProtocolError::kTooLarge:
      return "datagram too large";
    case ProtocolError::kBadField:
      return "invalid field value";
  }
  return "unknown protocol error";
}

const std::error_category& protocol_category() noexcept {
  static const ProtocolCategory category;
  return category;
}

}  // namespace shardlock::lease
