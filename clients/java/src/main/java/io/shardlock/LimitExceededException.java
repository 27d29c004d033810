package io.shardlock;

import io.shardlock.wire.Protocol;

/**
 * A configured bound of the server is full: keys, waiters per key, or this client's share of the
 * server's state (shardlockd --max-keys, --max-waiters, --max-client-state...).
 */
public class LimitExceededException extends ServerErrorException {
  private static final long serialVersionUID = 1L;

  public LimitExceededException() {
    super(Protocol.ERROR_LIMIT_EXCEEDED);
  }
}
