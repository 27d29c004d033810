package io.shardlock.wire;

import java.util.ArrayList;
import java.util.List;

/** A whole datagram: header fields plus 1..{@link Protocol#MAX_BATCH} messages. */
public final class Datagram {
  public int version = Protocol.VERSION;
  /** Header flags; {@link Protocol#FLAG_EPOCH} is written from {@link #hasEpoch} instead. */
  public int flags;
  /** Batch framing even for one message (several messages, an owner or a value force it). */
  public boolean batch;
  /** Single: equals the message's request id; batch: an id for the datagram. */
  public long requestId;
  public long clientLo;
  public long clientHi;
  /** A cluster client's map epoch (FLAG_EPOCH), on requests only. */
  public boolean hasEpoch;
  public long epoch;
  public final List<Message> messages = new ArrayList<>(1);

  public Datagram() {}

  /** A single-message datagram of {@code m} from {@code (lo, hi)}. */
  public static Datagram of(Message m, long clientLo, long clientHi) {
    Datagram d = new Datagram();
    d.requestId = m.requestId;
    d.clientLo = clientLo;
    d.clientHi = clientHi;
    d.messages.add(m);
    return d;
  }

  boolean framedAsBatch() {
    if (batch || messages.size() > 1) return true;
    if (messages.size() == 1) {
      Message m = messages.get(0);
      return m.hasOwner || m.value.length > 0;
    }
    return false;
  }
}
