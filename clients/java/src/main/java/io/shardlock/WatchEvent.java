package io.shardlock;

import io.shardlock.wire.HolderEntry;
import java.util.List;

/**
 * A key's state as a watch reports it. Its version is (the newest holder's token, the holder
 * count), (0, 0) while nobody holds the key: every grant gives a new token and between grants
 * the count only falls, so two different holder sets never share a version. Renewals and
 * waiters do not change it. {@link #holders()} are the newest holders, oldest grant first.
 */
public final class WatchEvent {
  private final long versionToken;
  private final long holderCount;
  private final LeaseMode mode;
  private final long waiters;
  private final long permits;
  private final List<HolderEntry> holders;

  WatchEvent(long versionToken, long holderCount, LeaseMode mode, long waiters, long permits,
      List<HolderEntry> holders) {
    this.versionToken = versionToken;
    this.holderCount = holderCount;
    this.mode = mode;
    this.waiters = waiters;
    this.permits = permits;
    this.holders = List.copyOf(holders);
  }

  /** The newest holder's token; 0 while free. */
  public long versionToken() {
    return versionToken;
  }

  /** How many hold the key (listed or not). */
  public long holderCount() {
    return holderCount;
  }

  public boolean held() {
    return holderCount > 0;
  }

  /** How it is held; null while free. */
  public LeaseMode mode() {
    return mode;
  }

  public long waiters() {
    return waiters;
  }

  /** A semaphore key's limit, else 0. */
  public long permits() {
    return permits;
  }

  public List<HolderEntry> holders() {
    return holders;
  }

  @Override
  public String toString() {
    return "WatchEvent(version=" + Long.toUnsignedString(versionToken) + "/" + holderCount
        + ", mode=" + mode + ", waiters=" + waiters + ")";
  }
}
