package io.shardlock;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;

/**
 * Several keys locked all or nothing, as Redisson's {@code RedissonMultiLock} and Curator's
 * {@code InterProcessMultiLock}, in one ACQUIRE_MANY: the server takes the keys in its global key
 * order, so two multi-locks over overlapping keys never deadlock, and a holder never has some of
 * its keys without the others. The keys must live on one server (2..16 of them). Reentrant per
 * thread; each key keeps a lease and a fence of its own ({@link #getFences()}), renewed by the
 * watchdog. A lost key makes {@link #isHeldByCurrentThread()} false and the last {@link
 * #unlock()} throw {@link LeaseLostException}.
 */
public final class FencedMultiLock implements Lock {
  private final ShardLockClient client;
  private final List<String> names;
  private final ConcurrentHashMap<Thread, Hold> holds = new ConcurrentHashMap<>();

  private static final class Hold {
    final List<Lease> leases;
    int count = 1;

    Hold(List<Lease> leases) {
      this.leases = leases;
    }
  }

  FencedMultiLock(ShardLockClient client, List<String> names) {
    this.client = client;
    this.names = List.copyOf(names);
  }

  public List<String> getNames() {
    return names;
  }

  @Override
  public void lock() {
    boolean interrupted = Thread.interrupted();
    try {
      while (true) {
        try {
          acquire(-1, false);
          return;
        } catch (InterruptedException e) {
          interrupted = true;
        }
      }
    } finally {
      if (interrupted) Thread.currentThread().interrupt();
    }
  }

  @Override
  public void lockInterruptibly() throws InterruptedException {
    if (Thread.interrupted()) throw new InterruptedException();
    acquire(-1, true);
  }

  @Override
  public boolean tryLock() {
    try {
      return acquire(0, false);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    }
  }

  @Override
  public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
    if (Thread.interrupted()) throw new InterruptedException();
    return acquire(Math.max(0, unit.toNanos(time)), true);
  }

  /** Drops one hold; the last releases every key. As {@link FencedLock#unlock()}. */
  @Override
  public void unlock() {
    Thread me = Thread.currentThread();
    Hold hold = holds.get(me);
    if (hold == null) {
      throw new IllegalMonitorStateException(names + " are not held by thread " + me.getName());
    }
    if (--hold.count > 0) return;
    holds.remove(me, hold);
    RuntimeException first = null;
    for (Lease lease : hold.leases) {
      try {
        lease.release();
      } catch (RuntimeException e) {
        if (first == null) first = e;
      }
    }
    if (first != null) throw first;
  }

  @Override
  public Condition newCondition() {
    throw new UnsupportedOperationException("FencedMultiLock has no conditions: a distributed "
        + "lock cannot release and re-take itself atomically at the server");
  }

  /** Whether the current thread holds every key with a valid lease. */
  public boolean isHeldByCurrentThread() {
    Hold hold = holds.get(Thread.currentThread());
    if (hold == null) return false;
    for (Lease lease : hold.leases) {
      if (!lease.isValid()) return false;
    }
    return true;
  }

  /** The current thread's fence per key, in {@link #getNames()} order. */
  public List<Long> getFences() {
    Hold hold = holds.get(Thread.currentThread());
    if (hold == null) {
      throw new IllegalMonitorStateException(names + " are not held by thread "
          + Thread.currentThread().getName());
    }
    List<Long> fences = new ArrayList<>(hold.leases.size());
    for (Lease lease : hold.leases) fences.add(lease.token());
    return fences;
  }

  private boolean acquire(long waitNanos, boolean interruptible) throws InterruptedException {
    Thread me = Thread.currentThread();
    Hold held = holds.get(me);
    if (held != null) {
      for (Lease lease : held.leases) {
        LeaseLostException lost = lease.lostReason();
        if (lost != null) throw lost;
      }
      held.count++;
      return true;
    }
    long ttl = client.config().lockWatchdogTimeout().toNanos();
    List<Lease> leases;
    try {
      leases = ShardLockClient.await(client.acquireManyAsync(names, LeaseMode.EXCLUSIVE, ttl,
          waitNanos, TimeUnit.NANOSECONDS, true), interruptible);
    } catch (LockBusyException | WaitTimeoutException e) {
      return false;
    }
    holds.put(me, new Hold(leases));
    return true;
  }
}
