package io.shardlock;

import java.util.concurrent.locks.ReadWriteLock;

/**
 * A distributed read-write lock on one key: any number of readers (shared leases) or one writer
 * (an exclusive lease), as Redisson's {@code RReadWriteLock} and Curator's {@code
 * InterProcessReadWriteLock}. Waiters are FIFO across both modes, so a queued writer is not
 * starved by readers that keep arriving. Each half is a {@link FencedLock}, reentrant per thread,
 * with its own fence and lost-lease listeners. A thread that holds one half cannot take the
 * other (no upgrade, no downgrade): that throws IllegalMonitorStateException instead of waiting
 * for itself.
 */
public final class FencedReadWriteLock implements ReadWriteLock {
  private final FencedLock read;
  private final FencedLock write;

  FencedReadWriteLock(ShardLockClient client, String name) {
    this.read = new FencedLock(client, name, LeaseMode.SHARED);
    this.write = new FencedLock(client, name, LeaseMode.EXCLUSIVE);
    read.setPeer(write);
    write.setPeer(read);
  }

  @Override
  public FencedLock readLock() {
    return read;
  }

  @Override
  public FencedLock writeLock() {
    return write;
  }
}
