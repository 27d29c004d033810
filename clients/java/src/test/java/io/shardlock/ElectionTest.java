package io.shardlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(60)
class ElectionTest {
  @Test
  void twoCampaignersAndAnObserver() throws Exception {
    try (Daemon daemon = new Daemon("0"); ShardLockClient c = daemon.client()) {
      Election first = c.getElection("java/election");
      Election second = c.getElection("java/election");
      Election.Observer observer = first.observe();
      Optional<Election.Leader> none = observer.next(Duration.ofSeconds(5));
      assertNotNull(none);
      assertFalse(none.isPresent());

      long term1 = first.campaign("node-1:8080");
      assertTrue(first.isLeading());
      Optional<Election.Leader> seen = observer.next(Duration.ofSeconds(5));
      assertEquals("node-1:8080", seen.orElseThrow().valueText());
      assertEquals(term1, seen.get().term());
      assertEquals("node-1:8080", second.leader().orElseThrow().valueText());

      ExecutorService pool = Executors.newSingleThreadExecutor();
      try {
        Future<Long> term2 = pool.submit(() -> second.campaign("node-2:8080"));  // waits, FIFO
        Thread.sleep(300);
        assertFalse(term2.isDone(), "one leader at a time");
        first.resign();
        long t2 = term2.get();
        assertTrue(Long.compareUnsigned(t2, term1) > 0, "terms rise");
        // The observer sees the new leader (perhaps after "none" in between), in term order.
        Optional<Election.Leader> next = observer.next(Duration.ofSeconds(5));
        if (next.isEmpty()) next = observer.next(Duration.ofSeconds(5));
        assertEquals("node-2:8080", next.orElseThrow().valueText());
        assertEquals(t2, next.get().term());
        second.resign();
      } finally {
        pool.shutdownNow();
      }
    }
  }
}
