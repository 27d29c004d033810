package io.shardlock.bench;

import io.shardlock.ShardLockClient;
import io.shardlock.ShardLockConfig;
import java.util.Arrays;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * Acquire+release pairs per second, and their p50/p99, through the Java client against a running
 * shardlockd: one client shared by 1 and by 16 threads, each thread on keys of its own (so the
 * number is the client's and the server's path, not contention). A plain main, no JMH: a
 * warm-up, then a timed run per thread count.
 *
 *   clients/java/bench.sh HOST:PORT [SECONDS]
 */
public final class LockBenchmark {
  private LockBenchmark() {}

  public static void main(String[] args) throws Exception {
    if (args.length < 1) {
      System.err.println("usage: LockBenchmark HOST:PORT [SECONDS]");
      System.exit(2);
    }
    double seconds = args.length > 1 ? Double.parseDouble(args[1]) : 5;
    try (ShardLockClient client = ShardLockClient.create(
        ShardLockConfig.builder().servers(args[0]).build())) {
      Pair pair = (id, i) -> client.acquire("bench/" + id + "/" + (i % 64), 10, 0,
          TimeUnit.SECONDS, false).release();
      measure(4, Math.min(1.0, seconds), false, pair);  // warm-up: JIT, socket buffers
      System.out.printf("%-8s %12s %10s %10s%n", "threads", "pairs/s", "p50 us", "p99 us");
      for (int threads : new int[] {1, 16}) measure(threads, seconds, true, pair);
    }
  }

  /** One acquire+release by thread {@code id}, its {@code i}-th. */
  @FunctionalInterface
  public interface Pair {
    void run(int id, long i) throws Exception;
  }

  /**
   * Runs {@code pair} back to back on {@code threads} threads for {@code seconds}; prints the
   * pairs/s and the p50/p99 of a pair when {@code print}.
   */
  public static void measure(int threads, double seconds, boolean print, Pair pair)
      throws Exception {
    AtomicBoolean stop = new AtomicBoolean();
    long[][] samples = new long[threads][];
    int[] counts = new int[threads];
    CountDownLatch done = new CountDownLatch(threads);
    Thread[] workers = new Thread[threads];
    for (int t = 0; t < threads; ++t) {
      final int id = t;
      workers[t] = new Thread(() -> {
        long[] mine = new long[1 << 16];
        int n = 0;
        try {
          for (long i = 0; !stop.get(); ++i) {
            long start = System.nanoTime();
            pair.run(id, i);
            long took = System.nanoTime() - start;
            if (n == mine.length) mine = Arrays.copyOf(mine, n * 2);
            mine[n++] = took;
          }
        } catch (Exception e) {
          System.err.println("worker " + id + ": " + e);
        } finally {
          samples[id] = mine;
          counts[id] = n;
          done.countDown();
        }
      });
      workers[t].start();
    }
    long begin = System.nanoTime();
    Thread.sleep((long) (seconds * 1000));
    stop.set(true);
    done.await();
    double elapsed = (System.nanoTime() - begin) / 1e9;
    int total = 0;
    for (int c : counts) total += c;
    long[] all = new long[total];
    int at = 0;
    for (int t = 0; t < threads; ++t) {
      System.arraycopy(samples[t], 0, all, at, counts[t]);
      at += counts[t];
    }
    Arrays.sort(all);
    if (print && total > 0) {
      System.out.printf("%-8d %12.0f %10.1f %10.1f%n", threads, total / elapsed,
          all[total / 2] / 1e3, all[(int) Math.min(total - 1, (long) (total * 0.99))] / 1e3);
    }
  }
}
