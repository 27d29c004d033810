package io.shardlock;

/**
 * Base of every failure a server or the network causes. Unchecked, as Redisson's and Hazelcast's
 * lock exceptions are: {@link java.util.concurrent.locks.Lock}'s signatures allow no checked
 * ones. Each subclass names one cause, the ones shardlockctl names: {@link LockBusyException}
 * (with the holder's time left), {@link RecoveringException} (with the time until the server
 * grants), {@link UnreachableException} (with the likely reason; {@link
 * AuthenticationFailedException} when replies failed authentication), {@link
 * LimitExceededException}, {@link PermissionDeniedException} (outside the tenant's rights);
 * arguments refused before anything is sent are IllegalArgumentException.
 */
public class ShardLockException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public ShardLockException(String message) {
    super(message);
  }

  public ShardLockException(String message, Throwable cause) {
    super(message, cause);
  }
}
