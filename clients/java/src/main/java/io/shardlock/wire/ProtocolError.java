package io.shardlock.wire;

/** Why the codec refused bytes or a datagram (ProtocolError in protocol.h). */
public enum ProtocolError {
  OK("ok"),
  TRUNCATED("truncated datagram"),
  BAD_MAGIC("bad magic"),
  UNSUPPORTED_VERSION("unsupported protocol version"),
  BAD_FLAGS("reserved bits set"),
  BAD_TYPE("unknown message type"),
  BAD_COUNT("bad message count"),
  BAD_LENGTH("batch item length mismatch"),
  NON_ZERO_PADDING("non-zero padding"),
  TOO_LARGE("datagram too large"),
  BAD_FIELD("invalid field value"),
  /** Sealed under another key, or not sealed while a key is in use (auth.h). */
  NOT_AUTHENTIC("not sealed under this key");

  private final String text;

  ProtocolError(String text) {
    this.text = text;
  }

  @Override
  public String toString() {
    return text;
  }
}
