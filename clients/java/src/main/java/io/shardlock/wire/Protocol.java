package io.shardlock.wire;

/**
 * Constants of the shardlock lease wire format, version 1 (UDP, little-endian). The format is
 * documented byte by byte at the top of include/shardlock/lease/wire/protocol.h; this package is
 * a pure codec for it: bytes in, a datagram or a {@link ProtocolError} out, never a socket.
 */
public final class Protocol {
  private Protocol() {}

  public static final int MAGIC = 0x4B4C4853;
  public static final int VERSION = 1;
  public static final int HEADER_SIZE = 32;
  public static final int BATCH_ITEM_HEADER_SIZE = 12;
  public static final int BATCH_ITEM_OWNER_SIZE = 16;
  public static final int MAX_DATAGRAM_SIZE = 1400;
  public static final int MAX_BATCH = 64;
  public static final int MIN_KEY_LENGTH = 1;
  public static final int MAX_KEY_LENGTH = 256;
  public static final int MAX_KEYS_PER_REQUEST = 16;
  public static final int MAX_PERMITS = 65535;
  public static final int HEADER_FLAGS_OFFSET = 5;
  public static final int FLAG_AUTHENTICATED = 0x01;
  public static final int FLAG_EPOCH = 0x02;
  public static final int EPOCH_SIZE = 8;
  public static final int MAX_MEMBER_ID_LENGTH = 128;
  public static final int MAX_MEMBER_ADDRESS_LENGTH = 64;
  public static final int ITEM_FLAG_OWNER = 0x01;
  public static final int ITEM_FLAG_VALUE = 0x02;
  public static final int HOLDER_FLAG_PENDING = 0x01;
  public static final int MAX_HOLDER_VALUE_LENGTH = 256;
  /** A WATCH token no key's version has: the sender wants the key's state at once. */
  public static final long NO_VERSION_TOKEN = -1L;
  public static final int STAT_COUNTER_COUNT = 27;
  public static final int AUTH_KEY_SIZE = 32;
  public static final int AUTH_TAG_SIZE = 16;
  /** The envelope's flag bits beside FLAG_AUTHENTICATED (envelope.h; {@link Envelope}). */
  public static final int FLAG_KEY_ID = 0x04;
  public static final int FLAG_ENCRYPTED = 0x08;
  public static final int FLAG_AES = 0x10;
  public static final int KEY_ID_SIZE = 4;
  /** The nonce field of the nonce forms: an AES stream's 16-byte prefix and u64 counter. */
  public static final int ENVELOPE_NONCE_SIZE = 24;
  /** The most any sealed form adds to a datagram (key id, nonce field, tag). */
  public static final int MAX_ENVELOPE_OVERHEAD = 44;

  /** Lease modes (ACQUIRE_MANY's mode, QUERY_REPLY's and HOLDERS_REPLY's). */
  public static final int MODE_EXCLUSIVE = 0;
  public static final int MODE_SHARED = 1;
  public static final int MODE_PERMIT = 2;

  /** Wire error codes an ERROR reply carries (WireError in protocol.h). */
  public static final int ERROR_UNSUPPORTED_VERSION = 1;
  public static final int ERROR_BAD_KEY = 2;
  public static final int ERROR_KEY_TOO_LONG = 3;
  public static final int ERROR_TTL_OUT_OF_RANGE = 4;
  public static final int ERROR_WAIT_OUT_OF_RANGE = 5;
  public static final int ERROR_REQUEST_TOO_SMALL = 6;
  public static final int ERROR_NOT_A_REQUEST = 7;
  public static final int ERROR_INTERNAL = 8;
  public static final int ERROR_REQUEST_ID_REUSED = 9;
  public static final int ERROR_LIMIT_EXCEEDED = 10;
  public static final int ERROR_RESOURCE_EXHAUSTED = 11;
  public static final int ERROR_LEASE_KIND_MISMATCH = 12;
  public static final int ERROR_PERMITS_OUT_OF_RANGE = 13;
  public static final int ERROR_BAD_KEY_LIST = 14;
  public static final int ERROR_BAD_MODE = 15;
  public static final int ERROR_PERMISSION_DENIED = 16;
  /** The tenant's own bounds (its tenant file line's max-leases, max-waiters, max-watches). */
  public static final int ERROR_TENANT_LEASE_LIMIT = 17;
  public static final int ERROR_TENANT_WAITER_LIMIT = 18;
  public static final int ERROR_TENANT_WATCH_LIMIT = 19;

  /** Whether {@code code} says a configured bound is full: the server's or the tenant's. */
  public static boolean isLimitExceeded(int code) {
    return code == ERROR_LIMIT_EXCEEDED || code == ERROR_TENANT_LEASE_LIMIT
        || code == ERROR_TENANT_WAITER_LIMIT || code == ERROR_TENANT_WATCH_LIMIT;
  }

  /** The text protocol.cc gives a wire error code. */
  public static String errorText(int code) {
    switch (code) {
      case ERROR_UNSUPPORTED_VERSION: return "unsupported protocol version";
      case ERROR_BAD_KEY: return "empty key";
      case ERROR_KEY_TOO_LONG: return "key longer than 256 bytes";
      case ERROR_TTL_OUT_OF_RANGE: return "ttl out of range";
      case ERROR_WAIT_OUT_OF_RANGE: return "wait out of range";
      case ERROR_REQUEST_TOO_SMALL: return "request datagram too small for its reply";
      case ERROR_NOT_A_REQUEST: return "not a request";
      case ERROR_INTERNAL: return "internal server error";
      case ERROR_REQUEST_ID_REUSED: return "request id reused for a different request";
      case ERROR_LIMIT_EXCEEDED: return "a server limit is reached";
      case ERROR_RESOURCE_EXHAUSTED: return "server out of memory";
      case ERROR_LEASE_KIND_MISMATCH: return "key in use as another lease kind or permit limit";
      case ERROR_PERMITS_OUT_OF_RANGE: return "permits out of range";
      case ERROR_BAD_KEY_LIST: return "bad key list (none, too many, or a key twice)";
      case ERROR_BAD_MODE: return "bad lease mode";
      case ERROR_PERMISSION_DENIED:
        return "permission denied (the tenant has no right to this key or request)";
      case ERROR_TENANT_LEASE_LIMIT:
        return "limit exceeded: the tenant's max-leases (leases it holds on this server)";
      case ERROR_TENANT_WAITER_LIMIT:
        return "limit exceeded: the tenant's max-waiters (ACQUIREs it has queued on this server)";
      case ERROR_TENANT_WATCH_LIMIT:
        return "limit exceeded: the tenant's max-watches (WATCHes it has parked on this server)";
      default: return "unknown error";
    }
  }
}
