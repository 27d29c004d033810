package io.shardlock.bench;

import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.ZooKeeper;

/**
 * LockBenchmark's shape through ZooKeeper's own Java client and the standard lock recipe (the
 * ZooKeeper documentation's "Locks": an ephemeral sequential znode under the lock's node, the
 * lock held when it is the lowest child, else a watch on its predecessor; release deletes it):
 * one ZooKeeper session shared by 1 and by 16 threads, each thread on locks of its own,
 * acquire+release pairs/s and p50/p99 after a warm-up. Built and run by bench-zookeeper.sh
 * against its 3-server ensemble; not part of the client or its tests.
 *
 *   ZkLockBenchmark HOST:PORT,HOST:PORT,... [SECONDS]
 */
public final class ZkLockBenchmark {
  private ZkLockBenchmark() {}

  static final String ROOT = "/bench";
  static final int LOCKS_PER_THREAD = 64;

  public static void main(String[] args) throws Exception {
    if (args.length < 1) {
      System.err.println("usage: ZkLockBenchmark HOSTS [SECONDS]");
      System.exit(2);
    }
    double seconds = args.length > 1 ? Double.parseDouble(args[1]) : 5;
    CountDownLatch connected = new CountDownLatch(1);
    ZooKeeper zk = new ZooKeeper(args[0], 10_000, event -> {
      if (event.getState() == Watcher.Event.KeeperState.SyncConnected) connected.countDown();
    });
    try {
      if (!connected.await(30, TimeUnit.SECONDS)) throw new IllegalStateException("no session");
      for (int t = 0; t < 16; ++t) {
        for (int k = 0; k < LOCKS_PER_THREAD; ++k) ensure(zk, lockPath(t, k));
      }
      LockBenchmark.Pair pair =
          (id, i) -> zk.delete(lock(zk, lockPath(id, (int) (i % LOCKS_PER_THREAD))), -1);
      LockBenchmark.measure(4, Math.min(1.0, seconds), false, pair);  // warm-up
      System.out.printf("%-8s %12s %10s %10s%n", "threads", "pairs/s", "p50 us", "p99 us");
      for (int threads : new int[] {1, 16}) LockBenchmark.measure(threads, seconds, true, pair);
    } finally {
      zk.close();
    }
  }

  static String lockPath(int thread, int k) {
    return ROOT + "/t" + thread + "-k" + k;
  }

  static void ensure(ZooKeeper zk, String path) throws Exception {
    StringBuilder at = new StringBuilder();
    for (String part : path.substring(1).split("/")) {
      at.append('/').append(part);
      try {
        zk.create(at.toString(), new byte[0], ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
      } catch (KeeperException.NodeExistsException e) {
        // made before
      }
    }
  }

  /** The recipe's acquire: returns the znode that holds the lock. */
  static String lock(ZooKeeper zk, String lockPath) throws Exception {
    String mine = zk.create(lockPath + "/lock-", new byte[0], ZooDefs.Ids.OPEN_ACL_UNSAFE,
        CreateMode.EPHEMERAL_SEQUENTIAL);
    String name = mine.substring(lockPath.length() + 1);
    while (true) {
      List<String> children = zk.getChildren(lockPath, false);
      Collections.sort(children);
      int at = children.indexOf(name);
      if (at == 0) return mine;
      CountDownLatch gone = new CountDownLatch(1);
      if (zk.exists(lockPath + "/" + children.get(at - 1), event -> gone.countDown()) != null) {
        gone.await();
      }
    }
  }
}
