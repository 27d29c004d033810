package io.shardlock;

/**
 * A lease ended while its holder still held it: the code that ran under it may have run without
 * mutual exclusion. {@link #reason()} says why; the message says more.
 */
public class LeaseLostException extends ShardLockException {
  private static final long serialVersionUID = 1L;

  /** Why a lease was lost. */
  public enum Reason {
    /** No renewal was confirmed before the lease's expiry (the server was silent or paused). */
    EXPIRED,
    /** The server no longer has the lease (RENEW or RELEASE answered EXPIRED). */
    SERVER_EXPIRED,
    /** Another owner holds the key now (RENEW or RELEASE answered NOT_OWNER). */
    NOT_OWNER,
    /** A cluster node handed the key to another node (RENEW answered REDIRECT). */
    REDIRECTED,
    /** The server refused the renewal (ERROR). */
    SERVER_ERROR,
    /** The lease time given to lock(leaseTime) or tryLock(wait, leaseTime) ran out. */
    LEASE_TIME_ELAPSED,
  }

  private final Reason reason;
  private final String key;

  public LeaseLostException(String key, Reason reason, String message) {
    super("the lease on '" + key + "' was lost: " + message);
    this.key = key;
    this.reason = reason;
  }

  public Reason reason() {
    return reason;
  }

  public String key() {
    return key;
  }
}
