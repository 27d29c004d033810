package io.shardlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(60)
class MultiLockTest {
  @Test
  void allOrNothing() throws Exception {
    try (Daemon daemon = new Daemon("0"); ShardLockClient c = daemon.client()) {
      FencedLock single = c.getLock("java/m/b");
      single.lock();
      FencedMultiLock multi = c.getMultiLock("java/m/a", "java/m/b", "java/m/c");
      ExecutorService pool = Executors.newSingleThreadExecutor();
      try {
        // b is held: none of a, b, c is taken.
        assertFalse(pool.submit(() -> multi.tryLock()).get());
        assertTrue(c.getLock("java/m/a").tryLock());
        c.getLock("java/m/a").unlock();
        single.unlock();
        assertTrue(multi.tryLock());
        assertTrue(multi.isHeldByCurrentThread());
        assertEquals(3, multi.getFences().size());
        assertTrue(multi.tryLock());  // reentrant
        multi.unlock();
        assertFalse(pool.submit(() -> c.getLock("java/m/c").tryLock()).get());
        multi.unlock();
        assertFalse(multi.isHeldByCurrentThread());
        assertThrows(IllegalMonitorStateException.class, multi::unlock);
        assertTrue(pool.submit(() -> {
          boolean got = c.getLock("java/m/c").tryLock();
          c.getLock("java/m/c").unlock();
          return got;
        }).get());
      } finally {
        pool.shutdownNow();
      }
    }
  }

  @Test
  void overlappingMultiLocksInOppositeOrdersNeverDeadlock() throws Exception {
    try (Daemon daemon = new Daemon("0"); ShardLockClient c = daemon.client()) {
      FencedMultiLock ab = c.getMultiLock("java/d/a", "java/d/b");
      FencedMultiLock ba = c.getMultiLock("java/d/b", "java/d/a");
      AtomicInteger inside = new AtomicInteger();
      AtomicInteger overlaps = new AtomicInteger();
      ExecutorService pool = Executors.newFixedThreadPool(4);
      List<Future<?>> done = new ArrayList<>();
      for (int t = 0; t < 4; ++t) {
        FencedMultiLock lock = t % 2 == 0 ? ab : ba;
        done.add(pool.submit(() -> {
          for (int i = 0; i < 10; ++i) {
            lock.lock();
            try {
              if (inside.incrementAndGet() != 1) overlaps.incrementAndGet();
              inside.decrementAndGet();
            } finally {
              lock.unlock();
            }
          }
          return null;
        }));
      }
      for (Future<?> f : done) f.get();
      pool.shutdown();
      assertEquals(0, overlaps.get());
    }
  }
}
