package io.shardlock.wire;

import static io.shardlock.wire.BodyField.*;

import java.util.EnumSet;
import java.util.Set;

/**
 * Every message type and its body, field by field in wire order: kMessageBodies of
 * include/shardlock/lease/wire/protocol.h. The codec walks this table, so a body that differs
 * from the C++ one shows up in the shared vectors.
 */
public enum MessageType {
  ACQUIRE(0x01, KEY, TTL, WAIT),
  RENEW(0x02, KEY, TOKEN, TTL),
  RELEASE(0x03, KEY, TOKEN),
  QUERY(0x04, KEY),
  STATS(0x05, FIRST_SHARD),
  ACQUIRE_SHARED(0x06, KEY, TTL, WAIT),
  ACQUIRE_PERMIT(0x07, KEY, TTL, WAIT, PERMITS),
  ACQUIRE_MANY(0x08, MODE, TTL, WAIT, KEY_LIST),
  MAP(0x09, FIRST_MEMBER),
  QUERY_HOLDERS(0x0A, KEY, FIRST_HOLDER),
  HOT_KEYS(0x0B),
  WATCH(0x0C, KEY, TOKEN, HOLDERS, WAIT),
  GRANTED(0x81, KEY, TOKEN, TTL),
  BUSY(0x82, KEY, TTL),
  TIMEOUT(0x83, KEY),
  RENEWED(0x84, KEY, TTL),
  RELEASED(0x85),
  NOT_OWNER(0x86),
  EXPIRED(0x87),
  RECOVERING(0x88, RETRY_AFTER),
  ERROR(0x89, ERROR_CODE),
  QUERY_REPLY(0x8A, KEY, HELD, TOKEN, TTL, WAITERS, MODE, HOLDERS, PERMITS),
  STATS_REPLY(0x8B, SHARD_COUNT, FIRST_SHARD, COUNTERS, SHARD_TOKENS),
  GRANTED_MANY(0x8C, TTL, TOKEN_LIST),
  BUSY_MANY(0x8D, INDEX, TTL),
  REDIRECT(0x8E, EPOCH),
  MAP_REPLY(0x8F, EPOCH, MEMBER_COUNT, FIRST_MEMBER, MEMBER_LIST),
  HOLDERS_REPLY(0x90, KEY, MODE, PERMITS, WAITERS, HOLDERS, FIRST_HOLDER, HOLDER_LIST),
  HOT_KEYS_REPLY(0x91, WINDOW, HOT_KEY_LIST);

  /** The header type byte of a batch datagram; never a message's type. */
  public static final int BATCH = 0xFF;

  public final int code;
  final BodyField[] fields;
  final boolean keyed;
  // The request -> reply table (kRequestReplies); null for reply types.
  private Set<MessageType> replies;
  private Set<MessageType> alsoAccepted;
  private boolean queuesWhenWaiting;
  // The largest reply body (max_reply_body_bound()): keyed replies plus the key's length,
  // listed ones plus 8 bytes a key, the others.
  private int boundKeyed;
  private int boundListed;
  private int boundUnkeyed;
  private boolean boundCarriesKey;
  private boolean boundCarriesTokens;

  private static final MessageType[] BY_CODE = new MessageType[256];

  MessageType(int code, BodyField... fields) {
    this.code = code;
    this.fields = fields;
    boolean k = false;
    for (BodyField f : fields) k |= f == KEY;
    this.keyed = k;
  }

  private static void row(MessageType request, boolean queues, MessageType[] replies,
      MessageType... also) {
    request.replies = EnumSet.noneOf(MessageType.class);
    request.alsoAccepted = EnumSet.noneOf(MessageType.class);
    for (MessageType r : replies) request.replies.add(r);
    for (MessageType r : also) request.alsoAccepted.add(r);
    request.queuesWhenWaiting = queues;
  }

  private static MessageType[] of(MessageType... types) {
    return types;
  }

  static {
    for (MessageType t : values()) BY_CODE[t.code] = t;
    MessageType[] acquireReplies = of(GRANTED, BUSY, TIMEOUT, RECOVERING, ERROR, REDIRECT);
    row(ACQUIRE, true, acquireReplies);
    row(ACQUIRE_SHARED, true, acquireReplies);
    row(ACQUIRE_PERMIT, true, acquireReplies);
    row(ACQUIRE_MANY, true, of(GRANTED_MANY, BUSY_MANY, TIMEOUT, RECOVERING, ERROR, REDIRECT));
    row(RENEW, false, of(RENEWED, NOT_OWNER, EXPIRED, ERROR, REDIRECT, RECOVERING));
    row(RELEASE, false, of(RELEASED, NOT_OWNER, EXPIRED, ERROR), RECOVERING);
    row(QUERY, false, of(QUERY_REPLY, ERROR, REDIRECT, RECOVERING));
    row(STATS, false, of(STATS_REPLY, ERROR), RECOVERING);
    row(MAP, false, of(MAP_REPLY, ERROR), RECOVERING);
    row(QUERY_HOLDERS, false, of(HOLDERS_REPLY, ERROR, REDIRECT, RECOVERING));
    row(HOT_KEYS, false, of(HOT_KEYS_REPLY, ERROR), RECOVERING);
    row(WATCH, true, of(HOLDERS_REPLY, ERROR, REDIRECT, RECOVERING));
    for (MessageType t : values()) {
      if (t.replies == null) continue;
      for (MessageType r : t.replies) t.addToBound(r);
    }
  }

  private void addToBound(MessageType reply) {
    boolean listed = false;
    for (BodyField f : reply.fields) listed |= f == TOKEN_LIST;
    int size = reply.fixedSize();
    if (reply.keyed) {
      boundKeyed = Math.max(boundKeyed, size);
      boundCarriesKey = true;
    } else if (listed) {
      boundListed = Math.max(boundListed, size);
      boundCarriesTokens = true;
    } else {
      boundUnkeyed = Math.max(boundUnkeyed, size);
    }
  }

  /** The type of a type byte, or null for an unknown one (and for {@link #BATCH}). */
  public static MessageType fromCode(int code) {
    return code >= 0 && code < 256 ? BY_CODE[code] : null;
  }

  /** The body's size with an empty key and empty lists. */
  int fixedSize() {
    int n = 0;
    for (BodyField f : fields) n += f.fixedSize;
    return n;
  }

  public boolean isRequest() {
    return replies != null;
  }

  public boolean isReply() {
    return code >= 0x80;
  }

  public boolean carriesKey() {
    return keyed;
  }

  /** Whether a client takes {@code reply} as the answer to a request of this type. */
  public boolean answeredBy(MessageType reply) {
    return replies != null && (replies.contains(reply) || alsoAccepted.contains(reply));
  }

  /** Whether a reply of this type carries its request's key, which a client checks. */
  public boolean replyCarriesKey() {
    return isReply() && keyed;
  }

  /** Whether a request of this type that waits may be answered later, on its own. */
  public boolean queuesWhenWaiting() {
    return queuesWhenWaiting;
  }

  /** The largest reply body the server sends this request (max_reply_body_bound()). */
  int maxReplyBody(int keyLength, int listedKeys) {
    if (replies == null) return ERROR.fixedSize();  // answered ERROR(kNotARequest)
    int n = boundUnkeyed;
    if (boundCarriesKey) n = Math.max(n, boundKeyed + keyLength);
    if (boundCarriesTokens) n = Math.max(n, boundListed + 8 * listedKeys);
    return n;
  }
}
