package io.shardlock.wire;

/** What {@link Codec#decode} read: a datagram, or why there is none. */
public final class DecodeResult {
  public final ProtocolError error;
  /** The datagram on {@link ProtocolError#OK}; null otherwise. */
  public final Datagram datagram;

  DecodeResult(ProtocolError error, Datagram datagram) {
    this.error = error;
    this.datagram = datagram;
  }

  public boolean ok() {
    return error == ProtocolError.OK;
  }
}
