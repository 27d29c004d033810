package io.shardlock;

/** A cluster node answered REDIRECT: in its map (of {@link #epoch()}) another node owns the key. */
public class RedirectedException extends ShardLockException {
  private static final long serialVersionUID = 1L;
  private final long epoch;

  public RedirectedException(String key, long epoch) {
    super("'" + key + "' belongs to another cluster node (map epoch " + epoch + ")");
    this.epoch = epoch;
  }

  public long epoch() {
    return epoch;
  }
}
