package io.shardlock;

/** The key is held by another owner and the call did not wait (or its wait was refused). */
public class LockBusyException extends ShardLockException {
  private static final long serialVersionUID = 1L;
  private final String key;
  private final long holderTtlLeftMillis;

  public LockBusyException(String key, long holderTtlLeftMillis) {
    super("'" + key + "' is busy: another owner holds it, " + holderTtlLeftMillis
        + " ms left on its lease");
    this.key = key;
    this.holderTtlLeftMillis = holderTtlLeftMillis;
  }

  public String key() {
    return key;
  }

  /** How long the holder's lease has left, as the server counted it. */
  public long holderTtlLeftMillis() {
    return holderTtlLeftMillis;
  }
}
