package io.shardlock.wire;

/**
 * One field of a message body, in the order {@link MessageType} lists them; the same table as
 * {@code BodyField} in include/shardlock/lease/wire/protocol.h.
 */
public enum BodyField {
  /** u16 length + bytes. */
  KEY("key", 2),
  TOKEN("token", 8),
  TTL("ttl", 4),
  WAIT("wait", 4),
  RETRY_AFTER("retry_after", 4),
  /** u16, a wire error code. */
  ERROR_CODE("error", 2),
  /** u8, 0 or 1. */
  HELD("held", 1),
  WAITERS("waiters", 4),
  FIRST_SHARD("first_shard", 4),
  SHARD_COUNT("shard_count", 4),
  /** u8 n, n x u64; an encoder writes exactly {@link Protocol#STAT_COUNTER_COUNT}. */
  COUNTERS("counters", 1 + 8 * Protocol.STAT_COUNTER_COUNT),
  /** u16 n, n x u64. */
  SHARD_TOKENS("shard_tokens", 2),
  /** u8, a lease mode (0..2). */
  MODE("mode", 1),
  PERMITS("permits", 4),
  HOLDERS("holders", 4),
  INDEX("index", 1),
  /** u8 n, n x (u16 length + bytes). */
  KEY_LIST("key_list", 1),
  /** u8 n, n x u64. */
  TOKEN_LIST("token_list", 1),
  EPOCH("epoch", 8),
  FIRST_MEMBER("first_member", 4),
  MEMBER_COUNT("member_count", 4),
  /** u8 n, n x (u16 length + id, u16 length + address, u32 weight). */
  MEMBER_LIST("member_list", 1),
  FIRST_HOLDER("first_holder", 4),
  /** u8 n, n x (u128 owner, u64 token, u32 ttl_left_ms, u8 flags, u16 length + value). */
  HOLDER_LIST("holder_list", 1),
  WINDOW("window", 4),
  /** u8 n, n x (u16 length + key, 5 x u32). */
  HOT_KEY_LIST("hot_key_list", 1);

  /** The field's name in the shared test vectors. */
  final String vectorName;
  /** Bytes the field takes besides a key's bytes and variable list contents. */
  final int fixedSize;

  BodyField(String vectorName, int fixedSize) {
    this.vectorName = vectorName;
    this.fixedSize = fixedSize;
  }
}
