package io.shardlock.wire;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/** One member of a MAP_REPLY: its id, "host:port" address and weight. */
public final class MemberEntry {
  public final byte[] id;
  public final String address;
  public final long weight;

  public MemberEntry(byte[] id, String address, long weight) {
    this.id = id;
    this.address = address;
    this.weight = weight;
  }

  static boolean valid(int idLength, int addressLength, long weight) {
    return idLength >= 1 && idLength <= Protocol.MAX_MEMBER_ID_LENGTH && addressLength >= 1
        && addressLength <= Protocol.MAX_MEMBER_ADDRESS_LENGTH && weight >= 1;
  }

  /** The entries of a decoded message's member list (decode() checked them). */
  public static List<MemberEntry> parse(Message m) {
    List<MemberEntry> out = new ArrayList<>(m.memberListCount);
    Codec.Reader r = new Codec.Reader(m.memberList, 0, m.memberList.length);
    for (int i = 0; i < m.memberListCount && r.ok; ++i) {
      byte[] id = r.key();
      byte[] address = r.key();
      long weight = r.u32();
      if (r.ok) out.add(new MemberEntry(id, new String(address, StandardCharsets.US_ASCII), weight));
    }
    return out;
  }
}
