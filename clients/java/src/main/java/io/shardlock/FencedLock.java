package io.shardlock;

import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;

/**
 * A distributed lock with a fencing token: {@link java.util.concurrent.locks.Lock}, reentrant
 * per thread as Redisson's {@code RLock} is, with Redisson's lease-time overloads and
 * Hazelcast's {@link #getFence()}.
 *
 * <p>Who holds it: a thread. The first {@code lock()} of a thread takes a lease on the server as
 * an owner of its own; the same thread's further {@code lock()}s only count holds, and only its
 * last {@code unlock()} releases. Another thread of the same client is a contender like another
 * process: it waits at the server, FIFO, or its {@code tryLock()} fails. So two threads of one
 * client never both hold.
 *
 * <p>How long: {@code lock()} and {@code tryLock(...)} without a lease time hold for the
 * client's {@link ShardLockConfig#lockWatchdogTimeout()} (default 30 s) and the watchdog renews
 * at a third of it, as Redisson's does; with a lease time there is no watchdog and the lock
 * ends when the time runs out. Unlike Redisson, an end the holder did not ask for is never
 * silent: the {@link LostLeaseListener}s run once with the reason, {@link
 * #isHeldByCurrentThread()} turns false, and the holder's last {@code unlock()} throws {@link
 * LeaseLostException}.
 *
 * <p>{@link #newCondition()} is not supported: a condition would need the lock's holder to
 * release and re-take it atomically at the server, which the protocol does not offer.
 */
public final class FencedLock implements Lock {
  private final ShardLockClient client;
  private final String name;
  private final ConcurrentHashMap<Thread, Hold> holds = new ConcurrentHashMap<>();
  private final List<LostLeaseListener> listeners = new CopyOnWriteArrayList<>();
  private final LeaseMode mode;
  // A read-write lock's other half: a thread that holds it cannot take this one (its own hold
  // would queue it at the server behind itself).
  private volatile FencedLock peer;

  /** One thread's grant and how many times it holds it. Touched by its thread alone. */
  private static final class Hold {
    final Lease lease;
    int count = 1;

    Hold(Lease lease) {
      this.lease = lease;
    }
  }

  FencedLock(ShardLockClient client, String name) {
    this(client, name, LeaseMode.EXCLUSIVE);
  }

  FencedLock(ShardLockClient client, String name, LeaseMode mode) {
    this.client = client;
    this.name = name;
    this.mode = mode;
  }

  void setPeer(FencedLock peer) {
    this.peer = peer;
  }

  /** EXCLUSIVE for a lock or a write lock, SHARED for a read lock. */
  public LeaseMode getMode() {
    return mode;
  }

  /** The lock's name: the key it takes. */
  public String getName() {
    return name;
  }

  /** Adds a listener told once per hold that is lost (see {@link LostLeaseListener}). */
  public void addLostListener(LostLeaseListener listener) {
    listeners.add(listener);
  }

  public void removeLostListener(LostLeaseListener listener) {
    listeners.remove(listener);
  }

  /** Waits until granted, without end; interrupts are kept for later, as Lock.lock() says. */
  @Override
  public void lock() {
    boolean interrupted = Thread.interrupted();
    try {
      while (true) {
        try {
          acquire(-1, -1, false);
          return;
        } catch (InterruptedException e) {
          interrupted = true;
        }
      }
    } finally {
      if (interrupted) Thread.currentThread().interrupt();
    }
  }

  /** As {@link #lock()}, the lock held for {@code leaseTime} with no watchdog (Redisson's). */
  public void lock(long leaseTime, TimeUnit unit) {
    long leaseMs = leaseMillis(leaseTime, unit);
    boolean interrupted = Thread.interrupted();
    try {
      while (true) {
        try {
          acquire(-1, leaseMs, false);
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
    acquire(-1, -1, true);
  }

  /**
   * One try: true if granted (or already held by this thread), false if another owner holds
   * it. Throws {@link RecoveringException}, {@link UnreachableException} and the rest for the
   * causes that are not "busy".
   */
  @Override
  public boolean tryLock() {
    try {
      return acquire(0, -1, false);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();  // a try does not wait: cannot happen
      return false;
    }
  }

  /** Waits up to {@code time} for the holder to let go; false if the wait ran out. */
  @Override
  public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
    if (Thread.interrupted()) throw new InterruptedException();
    return acquire(Math.max(0, unit.toNanos(time)), -1, true);
  }

  /**
   * Redisson's {@code tryLock(waitTime, leaseTime, unit)}: waits up to {@code waitTime}, then
   * holds for {@code leaseTime} with no watchdog ({@code leaseTime} -1: the watchdog's TTL,
   * renewed).
   */
  public boolean tryLock(long waitTime, long leaseTime, TimeUnit unit)
      throws InterruptedException {
    if (Thread.interrupted()) throw new InterruptedException();
    return acquire(Math.max(0, unit.toNanos(waitTime)), leaseMillis(leaseTime, unit), true);
  }

  /**
   * Drops one hold of the current thread; the last one releases the lease, waiting for the
   * server's answer. Throws IllegalMonitorStateException if the current thread does not hold
   * the lock (as ReentrantLock does); {@link LeaseLostException} at the last unlock of a hold
   * that was lost (the code under it may have run without exclusion); {@link
   * UnreachableException} when the release was not answered (the lease then expires on the
   * server). The hold is gone in every case.
   */
  @Override
  public void unlock() {
    Thread me = Thread.currentThread();
    Hold hold = holds.get(me);
    if (hold == null) {
      throw new IllegalMonitorStateException("'" + name + "' is not held by thread "
          + me.getName());
    }
    if (--hold.count > 0) return;
    holds.remove(me, hold);
    hold.lease.release();
  }

  /** Always throws: see the class comment. */
  @Override
  public Condition newCondition() {
    throw new UnsupportedOperationException("FencedLock has no conditions: a distributed lock "
        + "cannot release and re-take itself atomically at the server; use a watch, or a "
        + "java.util.concurrent lock inside the process");
  }

  /** Whether the current thread holds the lock and its lease is still valid. */
  public boolean isHeldByCurrentThread() {
    Hold hold = holds.get(Thread.currentThread());
    return hold != null && hold.lease.isValid();
  }

  /** Whether any thread of this client holds it (validly) now. */
  public boolean isLocked() {
    for (Hold hold : holds.values()) {
      if (hold.lease.isValid()) return true;
    }
    return false;
  }

  /** How many holds the current thread has (0: none). */
  public int getHoldCount() {
    Hold hold = holds.get(Thread.currentThread());
    return hold == null ? 0 : hold.count;
  }

  /**
   * The fencing token of the current thread's hold: strictly larger than any earlier grant of
   * this key. Pass it to the resource, which rejects lower ones. Throws
   * IllegalMonitorStateException if the current thread does not hold the lock.
   */
  public long getFence() {
    Hold hold = holds.get(Thread.currentThread());
    if (hold == null) {
      throw new IllegalMonitorStateException("'" + name + "' is not held by thread "
          + Thread.currentThread().getName());
    }
    return hold.lease.token();
  }

  /** The current thread's lease (key, token, time left), or null. */
  public Lease getLease() {
    Hold hold = holds.get(Thread.currentThread());
    return hold == null ? null : hold.lease;
  }

  @Override
  public String toString() {
    return "FencedLock(" + name + ")";
  }

  private static long leaseMillis(long leaseTime, TimeUnit unit) {
    if (leaseTime == -1) return -1;
    long ms = unit.toMillis(leaseTime);
    if (ms < 1) throw new IllegalArgumentException("leaseTime must be positive or -1");
    return ms;
  }

  /**
   * Takes the lock for the current thread: reentry if it holds it; else a lease waiting {@code
   * waitNanos} (-1: without end; 0: a try). {@code leaseMs} -1: the watchdog's TTL, renewed.
   * False when busy or the wait ran out.
   */
  private boolean acquire(long waitNanos, long leaseMs, boolean interruptible)
      throws InterruptedException {
    Thread me = Thread.currentThread();
    Hold held = holds.get(me);
    if (held != null) {
      LeaseLostException lost = held.lease.lostReason();
      if (lost != null) throw lost;  // reentry into a hold that no longer excludes anyone
      if (held.count == Integer.MAX_VALUE) throw new Error("maximum lock count exceeded");
      held.count++;
      return true;
    }
    FencedLock other = peer;
    if (other != null && other.holds.containsKey(me)) {
      throw new IllegalMonitorStateException("thread " + me.getName() + " holds the "
          + (other.mode == LeaseMode.SHARED ? "read" : "write") + " lock of '" + name
          + "': taking the " + (mode == LeaseMode.SHARED ? "read" : "write")
          + " lock too would wait for itself (no upgrade or downgrade)");
    }
    boolean watchdog = leaseMs < 0;
    long ttlMs = watchdog ? client.config().lockWatchdogTimeout().toMillis() : leaseMs;
    Lease lease;
    try {
      lease = ShardLockClient.await(client.acquireAsync(name, mode, 0,
          TimeUnit.MILLISECONDS.toNanos(ttlMs),
          waitNanos, TimeUnit.NANOSECONDS, watchdog), interruptible);
    } catch (LockBusyException | WaitTimeoutException e) {
      return false;
    }
    Hold hold = new Hold(lease);
    holds.put(me, hold);
    lease.onLost(reason -> {
      for (LostLeaseListener l : listeners) {
        try {
          l.leaseLost(this, me, lease.token(), reason);
        } catch (RuntimeException e) {
          // A listener's bug must not stop the others.
        }
      }
    });
    return true;
  }
}
