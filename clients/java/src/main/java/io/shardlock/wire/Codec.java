package io.shardlock.wire;

import java.util.Arrays;

/**
 * The lease codec: {@link #decode} turns bytes into a {@link Datagram} or a {@link
 * ProtocolError}, {@link #encode} the reverse. Pure: no socket, no clock, no shared state; it
 * never throws on untrusted input and never reads outside the range it is given. The same rules
 * as src/lease/wire/protocol.cc, checked against that codec's vectors
 * (tools/shardlock_wire_vectors.cc).
 */
public final class Codec {
  private Codec() {}

  // ---- reading -----------------------------------------------------------------------------

  /** Reads little-endian fields; a read past the end latches {@code ok = false} and yields 0. */
  static final class Reader {
    private final byte[] in;
    private int pos;
    private final int end;
    boolean ok = true;

    Reader(byte[] in, int from, int end) {
      this.in = in;
      this.pos = from;
      this.end = end;
    }

    int remaining() {
      return end - pos;
    }

    int position() {
      return pos;
    }

    private boolean take(int n) {
      if (!ok || end - pos < n) {
        ok = false;
        return false;
      }
      return true;
    }

    long uint(int width) {
      if (!take(width)) return 0;
      long v = 0;
      for (int i = 0; i < width; ++i) v |= (in[pos + i] & 0xFFL) << (8 * i);
      pos += width;
      return v;
    }

    int u8() {
      return (int) uint(1);
    }

    int u16() {
      return (int) uint(2);
    }

    long u32() {
      return uint(4);
    }

    long u64() {
      return uint(8);
    }

    byte[] bytes(int n) {
      if (!take(n)) return Message.EMPTY;
      byte[] out = Arrays.copyOfRange(in, pos, pos + n);
      pos += n;
      return out;
    }

    /** Skips {@code n} bytes; false (latched) when they are not there. */
    boolean skip(int n) {
      if (!take(n)) return false;
      pos += n;
      return true;
    }

    /** A u16 length and that many bytes. */
    byte[] key() {
      int n = u16();
      return bytes(n);
    }

    /** The bytes from {@code from} to here. */
    byte[] since(int from) {
      return Arrays.copyOfRange(in, from, pos);
    }
  }

  static long loadU64(byte[] b, int at) {
    long v = 0;
    for (int i = 0; i < 8; ++i) v |= (b[at + i] & 0xFFL) << (8 * i);
    return v;
  }

  /** Decodes a whole datagram: {@code in[0, in.length)}. */
  public static DecodeResult decode(byte[] in) {
    return decode(in, 0, in.length);
  }

  /** Decodes the datagram in {@code in[offset, offset + length)}. */
  public static DecodeResult decode(byte[] in, int offset, int length) {
    if (length > Protocol.MAX_DATAGRAM_SIZE) return fail(ProtocolError.TOO_LARGE);
    Reader r = new Reader(in, offset, offset + length);
    long magic = r.u32();
    if (!r.ok) return fail(ProtocolError.TRUNCATED);
    if (magic != (Protocol.MAGIC & 0xFFFFFFFFL)) return fail(ProtocolError.BAD_MAGIC);
    Datagram d = new Datagram();
    d.version = r.u8();
    d.flags = r.u8();
    int type = r.u8();
    int count = r.u8();
    d.requestId = r.u64();
    d.clientLo = r.u64();
    d.clientHi = r.u64();
    if (!r.ok) return fail(ProtocolError.TRUNCATED);
    if (d.version != Protocol.VERSION) return fail(ProtocolError.UNSUPPORTED_VERSION);
    if ((d.flags & ~(Protocol.FLAG_AUTHENTICATED | Protocol.FLAG_EPOCH)) != 0) {
      return fail(ProtocolError.BAD_FLAGS);
    }
    if ((d.flags & Protocol.FLAG_EPOCH) != 0) {
      d.hasEpoch = true;
      d.epoch = r.u64();
      if (!r.ok) return fail(ProtocolError.TRUNCATED);
    }
    if (type != MessageType.BATCH) {
      MessageType t = MessageType.fromCode(type);
      if (t == null) return fail(ProtocolError.BAD_TYPE);
      if (count != 1) return fail(ProtocolError.BAD_COUNT);
      Message m = new Message(t, d.requestId);
      ProtocolError e = readBody(r, m);
      if (e != ProtocolError.OK) return fail(e);
      d.messages.add(m);
    } else {
      if (count == 0 || count > Protocol.MAX_BATCH) return fail(ProtocolError.BAD_COUNT);
      d.batch = true;
      for (int i = 0; i < count; ++i) {
        int itemType = r.u8();
        int itemFlags = r.u8();
        int bodyLength = r.u16();
        long requestId = r.u64();
        if (!r.ok) return fail(ProtocolError.TRUNCATED);
        if ((itemFlags & ~(Protocol.ITEM_FLAG_OWNER | Protocol.ITEM_FLAG_VALUE)) != 0) {
          return fail(ProtocolError.BAD_FLAGS);
        }
        Message m = new Message(null, requestId);
        if ((itemFlags & Protocol.ITEM_FLAG_OWNER) != 0) {
          m.hasOwner = true;
          m.ownerLo = r.u64();
          m.ownerHi = r.u64();
          if (!r.ok) return fail(ProtocolError.TRUNCATED);
        }
        if ((itemFlags & Protocol.ITEM_FLAG_VALUE) != 0) {
          m.value = r.key();
          if (!r.ok) return fail(ProtocolError.TRUNCATED);
        }
        MessageType t = MessageType.fromCode(itemType);
        if (t == null) return fail(ProtocolError.BAD_TYPE);
        m.type = t;
        if ((itemFlags & Protocol.ITEM_FLAG_VALUE) != 0
            && (!takesValue(t) || m.value.length == 0
                || m.value.length > Protocol.MAX_HOLDER_VALUE_LENGTH)) {
          return fail(ProtocolError.BAD_FIELD);
        }
        int bodyAt = r.position();
        if (!r.skip(bodyLength)) return fail(ProtocolError.TRUNCATED);
        Reader body = new Reader(in, bodyAt, bodyAt + bodyLength);
        ProtocolError e = readBody(body, m);
        if (e != ProtocolError.OK) {
          return fail(e == ProtocolError.TRUNCATED ? ProtocolError.BAD_LENGTH : e);
        }
        if (body.remaining() != 0) return fail(ProtocolError.BAD_LENGTH);
        d.messages.add(m);
      }
    }
    for (int i = r.position(); i < offset + length; ++i) {
      if (in[i] != 0) return fail(ProtocolError.NON_ZERO_PADDING);
    }
    return new DecodeResult(ProtocolError.OK, d);
  }

  private static DecodeResult fail(ProtocolError e) {
    return new DecodeResult(e, null);
  }

  static boolean takesValue(MessageType t) {
    return t == MessageType.ACQUIRE || t == MessageType.ACQUIRE_SHARED
        || t == MessageType.ACQUIRE_PERMIT;
  }

  /** Reads every field, then judges: a short input is TRUNCATED even after an invalid field. */
  private static ProtocolError readBody(Reader r, Message m) {
    boolean valid = true;
    for (BodyField f : m.type.fields) {
      switch (f) {
        case KEY: m.key = r.key(); break;
        case TOKEN: m.token = r.u64(); break;
        case TTL: m.ttlMs = r.u32(); break;
        case WAIT: m.waitMs = r.u32(); break;
        case RETRY_AFTER: m.retryAfterMs = r.u32(); break;
        case ERROR_CODE: m.error = r.u16(); break;
        case HELD: {
          int held = r.u8();
          m.held = held == 1;
          valid &= held <= 1;
          break;
        }
        case WAITERS: m.waiters = r.u32(); break;
        case FIRST_SHARD: m.firstShard = r.u32(); break;
        case SHARD_COUNT: m.shardCount = r.u32(); break;
        case COUNTERS: m.counters = r.bytes(8 * r.u8()); break;
        case SHARD_TOKENS: m.shardTokens = r.bytes(8 * r.u16()); break;
        case MODE: {
          m.mode = r.u8();
          valid &= m.mode <= Protocol.MODE_PERMIT;
          break;
        }
        case PERMITS: m.permits = r.u32(); break;
        case HOLDERS: m.holders = r.u32(); break;
        case INDEX: m.index = r.u8(); break;
        case KEY_LIST: {
          m.keyCount = r.u8();
          int from = r.position();
          for (int i = 0; i < m.keyCount && r.ok; ++i) r.key();
          if (r.ok) m.keyList = r.since(from);
          break;
        }
        case TOKEN_LIST: m.tokenList = r.bytes(8 * r.u8()); break;
        case EPOCH: m.epoch = r.u64(); break;
        case FIRST_MEMBER: m.firstMember = r.u32(); break;
        case MEMBER_COUNT: m.memberCount = r.u32(); break;
        case MEMBER_LIST: {
          m.memberListCount = r.u8();
          int from = r.position();
          for (int i = 0; i < m.memberListCount && r.ok; ++i) {
            int id = r.key().length;
            int address = r.key().length;
            long weight = r.u32();
            valid &= MemberEntry.valid(id, address, weight);
          }
          if (r.ok) m.memberList = r.since(from);
          break;
        }
        case FIRST_HOLDER: m.firstHolder = r.u32(); break;
        case HOLDER_LIST: {
          m.holderListCount = r.u8();
          int from = r.position();
          for (int i = 0; i < m.holderListCount && r.ok; ++i) {
            r.skip(16 + 8 + 4);
            int flags = r.u8();
            int valueLength = r.key().length;
            valid &= HolderEntry.valid(flags, valueLength);
          }
          if (r.ok) m.holderList = r.since(from);
          break;
        }
        case WINDOW: m.windowMs = r.u32(); break;
        case HOT_KEY_LIST: {
          m.hotKeyCount = r.u8();
          int from = r.position();
          for (int i = 0; i < m.hotKeyCount && r.ok; ++i) {
            int keyLength = r.key().length;
            long requests = r.u32();
            long error = r.u32();
            r.skip(12);
            valid &= keyLength >= Protocol.MIN_KEY_LENGTH
                && keyLength <= Protocol.MAX_KEY_LENGTH && error <= requests;
          }
          if (r.ok) m.hotKeyList = r.since(from);
          break;
        }
        default: throw new AssertionError(f);
      }
    }
    if (!r.ok) return ProtocolError.TRUNCATED;
    return valid ? ProtocolError.OK : ProtocolError.BAD_FIELD;
  }

  // ---- writing -----------------------------------------------------------------------------

  /** The body size of {@code m}, or -1 when it cannot be encoded (a length past its prefix). */
  static int bodySize(Message m) {
    if (m.type == null) return -1;
    int n = m.type.fixedSize();
    for (BodyField f : m.type.fields) {
      switch (f) {
        case KEY:
          if (m.key.length > 0xFFFF) return -1;
          n += m.key.length;
          break;
        case COUNTERS:
          if (m.counters.length != 8 * Protocol.STAT_COUNTER_COUNT) return -1;
          break;
        case SHARD_TOKENS:
          if (m.shardTokens.length % 8 != 0 || m.shardTokens.length / 8 > 0xFFFF) return -1;
          n += m.shardTokens.length;
          break;
        case TOKEN_LIST:
          if (m.tokenList.length % 8 != 0 || m.tokenList.length / 8 > 0xFF) return -1;
          n += m.tokenList.length;
          break;
        case KEY_LIST: n += m.keyList.length; break;
        case MEMBER_LIST: n += m.memberList.length; break;
        case HOLDER_LIST: n += m.holderList.length; break;
        case HOT_KEY_LIST: n += m.hotKeyList.length; break;
        default: break;
      }
    }
    return n;
  }

  private static int itemPrefixSize(Message m) {
    int n = Protocol.BATCH_ITEM_HEADER_SIZE + (m.hasOwner ? Protocol.BATCH_ITEM_OWNER_SIZE : 0);
    if (m.value.length == 0) return n;
    if (!takesValue(m.type) || m.value.length > Protocol.MAX_HOLDER_VALUE_LENGTH) return -1;
    return n + 2 + m.value.length;
  }

  /** The encoded size of {@code d} without padding; -1 if it cannot be encoded. */
  public static int encodedSize(Datagram d) {
    int count = d.messages.size();
    if (count == 0 || count > Protocol.MAX_BATCH) return -1;
    int n = Protocol.HEADER_SIZE + (d.hasEpoch ? Protocol.EPOCH_SIZE : 0);
    boolean batch = d.framedAsBatch();
    for (Message m : d.messages) {
      int b = bodySize(m);
      if (b < 0 || (batch && b > 0xFFFF)) return -1;
      if (batch) {
        int prefix = itemPrefixSize(m);
        if (prefix < 0) return -1;
        n += prefix;
      }
      n += b;
    }
    return n;
  }

  /** Little-endian writes into a buffer known to be large enough. */
  private static final class Writer {
    final byte[] out;
    int pos;

    Writer(byte[] out) {
      this.out = out;
    }

    void uint(long v, int width) {
      for (int i = 0; i < width; ++i) out[pos++] = (byte) (v >>> (8 * i));
    }

    void bytes(byte[] b) {
      System.arraycopy(b, 0, out, pos, b.length);
      pos += b.length;
    }

    void key(byte[] k) {
      uint(k.length, 2);
      bytes(k);
    }
  }

  /**
   * Encodes {@code d}, zero-padded up to {@code padTo} bytes when that is larger. Throws
   * IllegalArgumentException for a datagram that cannot be encoded or is larger than {@link
   * Protocol#MAX_DATAGRAM_SIZE}: what it encodes is the caller's own, never untrusted input.
   */
  public static byte[] encode(Datagram d, int padTo) {
    int size = encodedSize(d);
    if (size < 0) throw new IllegalArgumentException("a datagram the format cannot carry");
    int total = Math.max(size, padTo);
    if (total > Protocol.MAX_DATAGRAM_SIZE) {
      throw new IllegalArgumentException("datagram of " + total + " bytes, above "
          + Protocol.MAX_DATAGRAM_SIZE);
    }
    boolean batch = d.framedAsBatch();
    Writer w = new Writer(new byte[total]);
    w.uint(Protocol.MAGIC, 4);
    w.uint(d.version, 1);
    w.uint((d.flags & ~Protocol.FLAG_EPOCH) | (d.hasEpoch ? Protocol.FLAG_EPOCH : 0), 1);
    w.uint(batch ? MessageType.BATCH : d.messages.get(0).type.code, 1);
    w.uint(d.messages.size(), 1);
    w.uint(batch ? d.requestId : d.messages.get(0).requestId, 8);
    w.uint(d.clientLo, 8);
    w.uint(d.clientHi, 8);
    if (d.hasEpoch) w.uint(d.epoch, 8);
    for (Message m : d.messages) {
      if (batch) {
        w.uint(m.type.code, 1);
        w.uint((m.hasOwner ? Protocol.ITEM_FLAG_OWNER : 0)
            | (m.value.length == 0 ? 0 : Protocol.ITEM_FLAG_VALUE), 1);
        w.uint(bodySize(m), 2);
        w.uint(m.requestId, 8);
        if (m.hasOwner) {
          w.uint(m.ownerLo, 8);
          w.uint(m.ownerHi, 8);
        }
        if (m.value.length > 0) w.key(m.value);
      }
      writeBody(w, m);
    }
    if (w.pos != size) throw new AssertionError("encoded " + w.pos + " of " + size);
    return w.out;
  }

  public static byte[] encode(Datagram d) {
    return encode(d, 0);
  }

  private static void writeBody(Writer w, Message m) {
    for (BodyField f : m.type.fields) {
      switch (f) {
        case KEY: w.key(m.key); break;
        case TOKEN: w.uint(m.token, 8); break;
        case TTL: w.uint(m.ttlMs, 4); break;
        case WAIT: w.uint(m.waitMs, 4); break;
        case RETRY_AFTER: w.uint(m.retryAfterMs, 4); break;
        case ERROR_CODE: w.uint(m.error, 2); break;
        case HELD: w.uint(m.held ? 1 : 0, 1); break;
        case WAITERS: w.uint(m.waiters, 4); break;
        case FIRST_SHARD: w.uint(m.firstShard, 4); break;
        case SHARD_COUNT: w.uint(m.shardCount, 4); break;
        case COUNTERS:
          w.uint(Protocol.STAT_COUNTER_COUNT, 1);
          w.bytes(m.counters);
          break;
        case SHARD_TOKENS:
          w.uint(m.shardTokens.length / 8, 2);
          w.bytes(m.shardTokens);
          break;
        case MODE: w.uint(m.mode, 1); break;
        case PERMITS: w.uint(m.permits, 4); break;
        case HOLDERS: w.uint(m.holders, 4); break;
        case INDEX: w.uint(m.index, 1); break;
        case KEY_LIST:
          w.uint(m.keyCount, 1);
          w.bytes(m.keyList);
          break;
        case TOKEN_LIST:
          w.uint(m.tokenList.length / 8, 1);
          w.bytes(m.tokenList);
          break;
        case EPOCH: w.uint(m.epoch, 8); break;
        case FIRST_MEMBER: w.uint(m.firstMember, 4); break;
        case MEMBER_COUNT: w.uint(m.memberCount, 4); break;
        case MEMBER_LIST:
          w.uint(m.memberListCount, 1);
          w.bytes(m.memberList);
          break;
        case FIRST_HOLDER: w.uint(m.firstHolder, 4); break;
        case HOLDER_LIST:
          w.uint(m.holderListCount, 1);
          w.bytes(m.holderList);
          break;
        case WINDOW: w.uint(m.windowMs, 4); break;
        case HOT_KEY_LIST:
          w.uint(m.hotKeyCount, 1);
          w.bytes(m.hotKeyList);
          break;
        default: throw new AssertionError(f);
      }
    }
  }

  // ---- anti-amplification padding ----------------------------------------------------------

  private static int maxReplyBody(Message m) {
    return m.type.maxReplyBody(m.key.length, m.keyCount);
  }

  private static boolean mayAnswerLater(Message m) {
    return m.type.queuesWhenWaiting() && m.waitMs > 0;
  }

  /** The largest immediate reply datagram for {@code request} (max_immediate_reply_size()). */
  public static int maxImmediateReplySize(Datagram request) {
    boolean batch = request.framedAsBatch();
    int n = Protocol.HEADER_SIZE;
    for (Message m : request.messages) {
      n += maxReplyBody(m) + (batch ? Protocol.BATCH_ITEM_HEADER_SIZE : 0);
    }
    return n;
  }

  /** The size a request must be padded to so that no answer is refused for size. */
  public static int maxReplySize(Datagram request) {
    int n = maxImmediateReplySize(request);
    if (!request.framedAsBatch()) return n;
    for (Message m : request.messages) {
      if (mayAnswerLater(m)) n += Protocol.HEADER_SIZE - Protocol.BATCH_ITEM_HEADER_SIZE;
    }
    return n;
  }

  /** {@link #encode} padded to {@link #maxReplySize}: encode_request() of protocol.h. */
  public static byte[] encodeRequest(Datagram d) {
    return encode(d, maxReplySize(d));
  }
}
