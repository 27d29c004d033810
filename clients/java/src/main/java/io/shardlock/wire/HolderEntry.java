package io.shardlock.wire;

import java.util.ArrayList;
import java.util.List;

/** One holder of a HOLDERS_REPLY: owner, token, time left, flags and attached value. */
public final class HolderEntry {
  public final long ownerLo;
  public final long ownerHi;
  public final long token;
  public final long ttlLeftMs;
  public final int flags;
  public final byte[] value;

  public HolderEntry(long ownerLo, long ownerHi, long token, long ttlLeftMs, int flags,
      byte[] value) {
    this.ownerLo = ownerLo;
    this.ownerHi = ownerHi;
    this.token = token;
    this.ttlLeftMs = ttlLeftMs;
    this.flags = flags;
    this.value = value;
  }

  public boolean pending() {
    return (flags & Protocol.HOLDER_FLAG_PENDING) != 0;
  }

  static boolean valid(int flags, int valueLength) {
    return (flags & ~Protocol.HOLDER_FLAG_PENDING) == 0
        && valueLength <= Protocol.MAX_HOLDER_VALUE_LENGTH;
  }

  /** The entries of a decoded message's holder list (decode() checked them). */
  public static List<HolderEntry> parse(Message m) {
    List<HolderEntry> out = new ArrayList<>(m.holderListCount);
    Codec.Reader r = new Codec.Reader(m.holderList, 0, m.holderList.length);
    for (int i = 0; i < m.holderListCount && r.ok; ++i) {
      long lo = r.u64();
      long hi = r.u64();
      long token = r.u64();
      long ttl = r.u32();
      int flags = r.u8();
      byte[] value = r.key();
      if (r.ok) out.add(new HolderEntry(lo, hi, token, ttl, flags, value));
    }
    return out;
  }
}
