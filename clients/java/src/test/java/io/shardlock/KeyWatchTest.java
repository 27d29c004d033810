package io.shardlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(60)
class KeyWatchTest {
  @Test
  void aWatchIsWokenByARelease() throws Exception {
    try (Daemon daemon = new Daemon("0"); ShardLockClient c = daemon.client()) {
      FencedLock lock = c.getLock("java/watched");
      lock.lock();
      KeyWatch watch = c.watch("java/watched");
      WatchEvent now = watch.next(Duration.ofSeconds(5));
      assertNotNull(now);
      assertTrue(now.held());
      assertEquals(lock.getFence(), now.versionToken());
      assertEquals(LeaseMode.EXCLUSIVE, now.mode());
      assertNull(watch.next(Duration.ofMillis(300)), "no change: nothing to report");
      ExecutorService pool = Executors.newSingleThreadExecutor();
      try {
        Future<WatchEvent> woken = pool.submit(() -> watch.next(Duration.ofSeconds(20)));
        Thread.sleep(300);  // parked at the server
        lock.unlock();
        WatchEvent released = woken.get();
        assertFalse(released.held());
        assertEquals(0, released.versionToken());
      } finally {
        pool.shutdownNow();
      }
    }
  }
}
