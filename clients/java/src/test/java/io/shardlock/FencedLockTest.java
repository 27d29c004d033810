package io.shardlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** FencedLock against a real shardlockd, one daemon per test. */
@Timeout(60)
class FencedLockTest {
  Daemon daemon;
  final List<ShardLockClient> clients = new ArrayList<>();

  @BeforeEach
  void start() throws Exception {
    daemon = new Daemon("0");
  }

  @AfterEach
  void stop() throws Exception {
    for (ShardLockClient c : clients) c.close();
    if (daemon != null) daemon.close();
  }

  ShardLockClient client() {
    return client(ShardLockConfig.builder());
  }

  ShardLockClient client(ShardLockConfig.Builder b) {
    ShardLockClient c = daemon.client(b.servers(daemon.address));
    clients.add(c);
    return c;
  }

  @Test
  void lockAndUnlock() {
    ShardLockClient c = client();
    FencedLock lock = c.getLock("java/a");
    assertFalse(lock.isHeldByCurrentThread());
    lock.lock();
    assertTrue(lock.isHeldByCurrentThread());
    assertTrue(lock.getFence() > 0);
    assertTrue(lock.getLease().remainingMillis() > 25_000);
    lock.unlock();
    assertFalse(lock.isHeldByCurrentThread());
    assertThrows(IllegalMonitorStateException.class, lock::getFence);
    // Released at the server: another client takes it at once.
    FencedLock other = client().getLock("java/a");
    assertTrue(other.tryLock());
    other.unlock();
  }

  @Test
  void reentrantPerThread() throws Exception {
    ShardLockClient c = client();
    FencedLock lock = c.getLock("java/reentrant");
    assertTrue(lock == c.getLock("java/reentrant"), "one object per name");
    lock.lock();
    long fence = lock.getFence();
    assertTrue(lock.tryLock());
    lock.lock();
    assertEquals(3, lock.getHoldCount());
    assertEquals(fence, lock.getFence(), "a reentry is the same grant");
    // Another thread of the same client is a contender, not a reentry.
    ExecutorService pool = Executors.newSingleThreadExecutor();
    try {
      assertFalse(pool.submit(() -> lock.tryLock()).get());
      lock.unlock();
      lock.unlock();
      assertTrue(lock.isHeldByCurrentThread());
      assertFalse(pool.submit(() -> lock.tryLock()).get());
      lock.unlock();
      assertFalse(lock.isHeldByCurrentThread());
      assertTrue(pool.submit(() -> {
        boolean got = lock.tryLock();
        lock.unlock();
        return got;
      }).get());
    } finally {
      pool.shutdownNow();
    }
  }

  @Test
  void sixteenThreadsOfOneClientNeverOverlap() throws Exception {
    ShardLockClient c = client();
    FencedLock lock = c.getLock("java/counter");
    int threads = 16;
    int rounds = 8;
    AtomicInteger inside = new AtomicInteger();
    AtomicInteger overlaps = new AtomicInteger();
    int[] counter = {0};
    List<Long> fences = Collections.synchronizedList(new ArrayList<>());
    ExecutorService pool = Executors.newFixedThreadPool(threads);
    List<Future<?>> done = new ArrayList<>();
    for (int t = 0; t < threads; ++t) {
      done.add(pool.submit(() -> {
        for (int i = 0; i < rounds; ++i) {
          lock.lock();
          try {
            if (inside.incrementAndGet() != 1) overlaps.incrementAndGet();
            fences.add(lock.getFence());
            int seen = counter[0];
            Thread.sleep(2);
            counter[0] = seen + 1;
            inside.decrementAndGet();
          } catch (InterruptedException e) {
            throw new RuntimeException(e);
          } finally {
            lock.unlock();
          }
        }
      }));
    }
    for (Future<?> f : done) f.get();
    pool.shutdown();
    assertEquals(0, overlaps.get());
    assertEquals(threads * rounds, counter[0]);
    // Fencing tokens strictly increase, grant after grant.
    for (int i = 1; i < fences.size(); ++i) {
      assertTrue(Long.compareUnsigned(fences.get(i), fences.get(i - 1)) > 0,
          "fence " + fences.get(i) + " after " + fences.get(i - 1));
    }
  }

  @Test
  void tryLockTimesOutThenWaitersAreGrantedInFifoOrder() throws Exception {
    FencedLock holder = client().getLock("java/fifo");
    holder.lock();
    FencedLock lock = client().getLock("java/fifo");
    ExecutorService pool = Executors.newFixedThreadPool(2);
    try {
      assertFalse(pool.submit(() -> lock.tryLock(200, TimeUnit.MILLISECONDS)).get());
      List<String> order = Collections.synchronizedList(new ArrayList<>());
      CountDownLatch firstSent = new CountDownLatch(1);
      Future<?> a = pool.submit(() -> {
        firstSent.countDown();
        if (lock.tryLock(20, TimeUnit.SECONDS)) {
          order.add("a");
          lock.unlock();
        }
        return null;
      });
      firstSent.await();
      Thread.sleep(300);  // a is queued at the server before b asks
      Future<?> b = pool.submit(() -> {
        if (lock.tryLock(20, TimeUnit.SECONDS)) {
          order.add("b");
          lock.unlock();
        }
        return null;
      });
      Thread.sleep(300);
      holder.unlock();
      a.get();
      b.get();
      assertEquals(List.of("a", "b"), order);
    } finally {
      pool.shutdownNow();
    }
  }

  @Test
  void misuseIsRefusedAsReentrantLockRefusesIt() {
    FencedLock lock = client().getLock("java/misuse");
    assertThrows(IllegalMonitorStateException.class, lock::unlock);
    UnsupportedOperationException e =
        assertThrows(UnsupportedOperationException.class, lock::newCondition);
    assertTrue(e.getMessage().contains("no conditions"));
    assertThrows(IllegalArgumentException.class, () -> client().getLock(""));
  }

  @Test
  void busyWithTimeLeft() throws Exception {
    ShardLockClient a = client();
    Lease lease = a.acquire("java/busy", 10, 0, TimeUnit.SECONDS, false);
    LockBusyException e = assertThrows(LockBusyException.class,
        () -> client().acquire("java/busy", 10, 0, TimeUnit.SECONDS, false));
    assertTrue(e.holderTtlLeftMillis() > 5_000 && e.holderTtlLeftMillis() <= 10_000);
    lease.release();
  }

  @Test
  void watchdogKeepsTheLockPastItsTtl() throws Exception {
    FencedLock lock = client(ShardLockConfig.builder()
        .lockWatchdogTimeout(Duration.ofMillis(600))).getLock("java/watchdog");
    lock.lock();
    Thread.sleep(2_000);
    assertTrue(lock.isHeldByCurrentThread());
    assertFalse(client().getLock("java/watchdog").tryLock());
    lock.unlock();
  }

  @Test
  void leaseTimeEndsTheLockAndSaysSo() throws Exception {
    FencedLock lock = client().getLock("java/lease-time");
    AtomicReference<LeaseLostException> lost = new AtomicReference<>();
    AtomicInteger fired = new AtomicInteger();
    lock.addLostListener((l, holder, fence, reason) -> {
      fired.incrementAndGet();
      lost.set(reason);
    });
    assertTrue(lock.tryLock(0, 300, TimeUnit.MILLISECONDS));
    Thread.sleep(900);
    assertFalse(lock.isHeldByCurrentThread());
    assertEquals(1, fired.get());
    assertEquals(LeaseLostException.Reason.LEASE_TIME_ELAPSED, lost.get().reason());
    assertTrue(client().getLock("java/lease-time").tryLock());
    assertThrows(LeaseLostException.class, lock::unlock);
    assertEquals(0, lock.getHoldCount());
  }

  @Test
  void aLostLeaseFiresTheListenerOnce() throws Exception {
    FencedLock lock = client(ShardLockConfig.builder()
        .lockWatchdogTimeout(Duration.ofMillis(800))
        .requestTimeout(Duration.ofMillis(300))).getLock("java/lost");
    AtomicInteger fired = new AtomicInteger();
    AtomicReference<LeaseLostException> reason = new AtomicReference<>();
    CountDownLatch once = new CountDownLatch(1);
    lock.addLostListener((l, holder, fence, why) -> {
      fired.incrementAndGet();
      reason.set(why);
      once.countDown();
    });
    lock.lock();
    daemon.signal("STOP");
    try {
      assertTrue(once.await(10, TimeUnit.SECONDS), "the listener ran");
      assertFalse(lock.isHeldByCurrentThread());
      Thread.sleep(1_000);
    } finally {
      daemon.signal("CONT");
    }
    assertEquals(1, fired.get());
    assertEquals(LeaseLostException.Reason.EXPIRED, reason.get().reason());
    LeaseLostException e = assertThrows(LeaseLostException.class, lock::unlock);
    assertNotNull(e.reason());
  }

  @Test
  void interruptedWaitGivesUpAndALaterGrantIsReleased() throws Exception {
    FencedLock holder = client().getLock("java/interrupt");
    holder.lock();
    FencedLock lock = client().getLock("java/interrupt");
    AtomicReference<Throwable> thrown = new AtomicReference<>();
    Thread waiter = new Thread(() -> {
      try {
        lock.lockInterruptibly();
      } catch (Throwable t) {
        thrown.set(t);
      }
    });
    waiter.start();
    Thread.sleep(300);
    waiter.interrupt();
    waiter.join(5_000);
    assertTrue(thrown.get() instanceof InterruptedException, String.valueOf(thrown.get()));
    // The abandoned wait is granted when the holder lets go, and given back at once.
    holder.unlock();
    FencedLock third = client().getLock("java/interrupt");
    assertTrue(third.tryLock(5, TimeUnit.SECONDS));
    third.unlock();
  }

  @Test
  void asyncAcquire() throws Exception {
    ShardLockClient c = client();
    Lease lease = c.acquireAsync("java/async", LeaseMode.EXCLUSIVE, 0, 5, 0, TimeUnit.SECONDS,
        true).get(5, TimeUnit.SECONDS);
    assertTrue(lease.isValid());
    Throwable busy = assertThrows(java.util.concurrent.ExecutionException.class,
        () -> c.acquireAsync("java/async", LeaseMode.EXCLUSIVE, 0, 5, 0, TimeUnit.SECONDS,
            true).get(5, TimeUnit.SECONDS)).getCause();
    assertTrue(busy instanceof LockBusyException);
    lease.release();
  }

  @Test
  void sharedAndPermitLeases() throws Exception {
    ShardLockClient c = client();
    Lease r1 = c.acquireAsync("java/rw", LeaseMode.SHARED, 0, 5, 0, TimeUnit.SECONDS, false).get();
    Lease r2 = c.acquireAsync("java/rw", LeaseMode.SHARED, 0, 5, 0, TimeUnit.SECONDS, false).get();
    assertThrows(LockBusyException.class, () -> c.acquire("java/rw", 5, 0, TimeUnit.SECONDS, false));
    r1.release();
    r2.release();
    Lease p1 = c.acquireAsync("java/sem", LeaseMode.PERMIT, 2, 5, 0, TimeUnit.SECONDS, false).get();
    Lease p2 = c.acquireAsync("java/sem", LeaseMode.PERMIT, 2, 5, 0, TimeUnit.SECONDS, false).get();
    Throwable third = assertThrows(java.util.concurrent.ExecutionException.class,
        () -> c.acquireAsync("java/sem", LeaseMode.PERMIT, 2, 5, 0, TimeUnit.SECONDS, false)
            .get()).getCause();
    assertTrue(third instanceof LockBusyException);
    p1.release();
    p2.release();
  }
}
