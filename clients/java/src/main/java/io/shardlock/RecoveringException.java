package io.shardlock;

/**
 * The server is in its lock-delay after a start (it grants nothing until the leases it may have
 * held before have run out), and the call's wait did not reach past it.
 */
public class RecoveringException extends ShardLockException {
  private static final long serialVersionUID = 1L;
  private final long retryAfterMillis;

  public RecoveringException(long retryAfterMillis) {
    super("the server is recovering (its lock-delay after a start): it grants in "
        + retryAfterMillis + " ms");
    this.retryAfterMillis = retryAfterMillis;
  }

  /** When the server said it grants again. */
  public long retryAfterMillis() {
    return retryAfterMillis;
  }
}
