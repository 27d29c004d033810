package io.shardlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(60)
class ReadWriteAndSemaphoreTest {
  Daemon daemon;
  ShardLockClient client;
  ExecutorService pool;

  @BeforeEach
  void start() throws Exception {
    daemon = new Daemon("0");
    client = daemon.client();
    pool = Executors.newFixedThreadPool(2);
  }

  @AfterEach
  void stop() throws Exception {
    pool.shutdownNow();
    if (client != null) client.close();
    if (daemon != null) daemon.close();
  }

  @Test
  void readersShareWritersExclude() throws Exception {
    FencedReadWriteLock rw = client.getReadWriteLock("java/rwlock");
    assertTrue(rw == client.getReadWriteLock("java/rwlock"));
    rw.readLock().lock();
    // Another thread reads alongside, but cannot write.
    assertTrue(pool.submit(() -> {
      boolean got = rw.readLock().tryLock();
      rw.readLock().unlock();
      return got;
    }).get());
    assertFalse(pool.submit(() -> rw.writeLock().tryLock()).get());
    // The same thread cannot upgrade: that would wait for itself.
    assertThrows(IllegalMonitorStateException.class, () -> rw.writeLock().tryLock());
    rw.readLock().unlock();
    rw.writeLock().lock();
    assertFalse(pool.submit(() -> rw.readLock().tryLock()).get());
    assertFalse(pool.submit(() -> client.getLock("java/rwlock").tryLock()).get());
    long fence = rw.writeLock().getFence();
    rw.writeLock().unlock();
    rw.readLock().lock();
    assertTrue(Long.compareUnsigned(rw.readLock().getFence(), fence) > 0);
    rw.readLock().unlock();
  }

  @Test
  void semaphoreCountsPermits() throws Exception {
    FencedSemaphore sem = client.getSemaphore("java/semaphore", 2);
    Lease a = sem.tryAcquire();
    Lease b = sem.tryAcquire();
    assertNotNull(a);
    assertNotNull(b);
    assertNotEquals(a.token(), b.token());
    assertNull(sem.tryAcquire());
    assertNull(sem.tryAcquire(100, TimeUnit.MILLISECONDS));
    var waiting = pool.submit(() -> sem.tryAcquire(10, TimeUnit.SECONDS));
    Thread.sleep(200);
    a.release();
    Lease c = waiting.get();
    assertNotNull(c);
    assertEquals(LeaseMode.PERMIT, c.mode());
    b.release();
    c.release();
    assertThrows(IllegalArgumentException.class, () -> client.getSemaphore("java/semaphore", 0));
  }
}
