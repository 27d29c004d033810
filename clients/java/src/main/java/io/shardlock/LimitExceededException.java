package io.shardlock;

import io.shardlock.wire.Protocol;

/**
 * A configured bound of the server is full: keys, waiters per key, or this client's share of the
 * server's state (shardlockd --max-keys, --max-waiters, --max-client-state...), or a bound of
 * this client's tenant ({@link #code()} then names which: Protocol.ERROR_TENANT_*_LIMIT).
 */
public class LimitExceededException extends ServerErrorException {
  private static final long serialVersionUID = 1L;

  public LimitExceededException() {
    super(Protocol.ERROR_LIMIT_EXCEEDED);
  }

  /** {@code code}: one for which {@link Protocol#isLimitExceeded} holds. */
  public LimitExceededException(int code) {
    super(code);
  }
}
