package io.shardlock;

/** The grant arrived after its own client-side expiry (a wait longer than the TTL); released. */
public class GrantExpiredException extends ShardLockException {
  private static final long serialVersionUID = 1L;

  public GrantExpiredException(String key) {
    super("'" + key + "' was granted, but the grant's ttl had run out by the time it arrived");
  }
}
