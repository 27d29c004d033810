package io.shardlock.wire;

/**
 * One request or reply. Only the fields of its type's body are meaningful (see
 * {@link MessageType}); the others keep their defaults and are not encoded. Unsigned 32-bit wire
 * fields are held in {@code long}s (0..2^32-1), 64-bit ones in {@code long}s read as unsigned.
 * Lists are kept as their wire entries (without the count byte) plus a count, as the C++ codec
 * keeps them: {@link HolderEntry#parse} and {@link MemberEntry#parse} read them.
 */
public final class Message {
  public MessageType type;
  public long requestId;
  /** A batch item's own owner (ITEM_FLAG_OWNER): frames the datagram as a batch. */
  public boolean hasOwner;
  public long ownerLo;
  public long ownerHi;
  /** A single-key ACQUIRE's holder value (ITEM_FLAG_VALUE); empty: none. */
  public byte[] value = EMPTY;
  public byte[] key = EMPTY;
  public long token;
  public long ttlMs;
  public long waitMs;
  public long retryAfterMs;
  public int error;
  public boolean held;
  public long waiters;
  public long firstShard;
  public long shardCount;
  public byte[] counters = EMPTY;
  public byte[] shardTokens = EMPTY;
  public int mode;
  public long permits;
  public long holders;
  public int index;
  public int keyCount;
  public byte[] keyList = EMPTY;
  public byte[] tokenList = EMPTY;
  public long epoch;
  public long firstMember;
  public long memberCount;
  public int memberListCount;
  public byte[] memberList = EMPTY;
  public long firstHolder;
  public int holderListCount;
  public byte[] holderList = EMPTY;
  public long windowMs;
  public int hotKeyCount;
  public byte[] hotKeyList = EMPTY;

  static final byte[] EMPTY = new byte[0];

  public Message() {}

  public Message(MessageType type, long requestId) {
    this.type = type;
    this.requestId = requestId;
  }

  /** GRANTED_MANY's token {@code i}. */
  public long listedToken(int i) {
    return Codec.loadU64(tokenList, 8 * i);
  }

  public int listedTokenCount() {
    return tokenList.length / 8;
  }

  /** STATS_REPLY counter {@code i}, or 0 past the ones the datagram carries. */
  public long counter(int i) {
    return i < counters.length / 8 ? Codec.loadU64(counters, 8 * i) : 0;
  }
}
