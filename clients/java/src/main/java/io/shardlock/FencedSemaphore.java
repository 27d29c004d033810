package io.shardlock;

import java.util.concurrent.TimeUnit;

/**
 * A distributed counting semaphore: at most {@link #permits()} holders of the key at once, as
 * Redisson's {@code RPermitExpirableSemaphore} and Curator's {@code InterProcessSemaphoreV2}.
 * A permit is a {@link Lease} with its own fencing token, renewed by the watchdog until
 * released: give it back with {@link Lease#release()} (or try-with-resources), from any thread.
 */
public final class FencedSemaphore {
  private final ShardLockClient client;
  private final String name;
  private final int permits;

  FencedSemaphore(ShardLockClient client, String name, int permits) {
    this.client = client;
    this.name = name;
    this.permits = permits;
  }

  public String getName() {
    return name;
  }

  public int permits() {
    return permits;
  }

  /** Waits until a permit is free; interruptible (the request is given up). */
  public Lease acquire() throws InterruptedException {
    return take(-1);
  }

  /** A permit if one is free now, else null. */
  public Lease tryAcquire() {
    try {
      return take(0);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return null;
    }
  }

  /** A permit if one frees up within {@code time}, else null. */
  public Lease tryAcquire(long time, TimeUnit unit) throws InterruptedException {
    return take(Math.max(0, unit.toNanos(time)));
  }

  private Lease take(long waitNanos) throws InterruptedException {
    long ttl = client.config().lockWatchdogTimeout().toNanos();
    try {
      return ShardLockClient.await(client.acquireAsync(name, LeaseMode.PERMIT, permits, ttl,
          waitNanos, TimeUnit.NANOSECONDS, true), true);
    } catch (LockBusyException | WaitTimeoutException e) {
      return null;
    }
  }
}
