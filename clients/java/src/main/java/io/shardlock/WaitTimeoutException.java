package io.shardlock;

/** The wait ran out before the holder let go (the server's TIMEOUT). */
public class WaitTimeoutException extends ShardLockException {
  private static final long serialVersionUID = 1L;

  public WaitTimeoutException(String key) {
    super("not acquired: '" + key + "' was still held when the wait ran out");
  }
}
