package io.shardlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.net.HttpURLConnection;
import java.net.ServerSocket;
import java.net.URL;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Cluster mode end to end (as tests/cluster/etcd/client_failover_test.cc's
 * WithReplicasAKilledNodesHoldersKeepTheirLeases): a real etcd on loopback and three shardlockd
 * nodes with --replicas 2. A FencedLock held with the watchdog on a key of n2 survives kill -9
 * of n2: its renewals move to the backup that took n2's buckets over, the lock stays held and no
 * listener fires; a lock() another client was waiting in (at n2, then at the new owner) is
 * granted there once the holder unlocks. Needs $SHARDLOCKD and etcd ($SHARDLOCK_ETCD, default
 * /usr/bin/etcd); skipped without either. Every wait is bounded; nothing checks how fast.
 */
@Timeout(150)
class ClusterFailoverTest {
  // 8 s leases and a 2 s replica timeout, as the C++ test: a loaded machine (sanitizer builds on
  // two shared cores) can stall a node that long without it being dead, and the failover must
  // fit in what is left of a lease after its last renewal.
  static final Duration TTL = Duration.ofSeconds(8);

  Path root;
  Process etcd;
  String etcdEndpoint;
  final Map<String, Daemon> nodes = new LinkedHashMap<>();
  final List<ShardLockClient> clients = new ArrayList<>();

  static int freePort() throws IOException {
    try (ServerSocket s = new ServerSocket(0)) {
      return s.getLocalPort();
    }
  }

  @BeforeEach
  void startEtcd() throws Exception {
    String binary = System.getenv("SHARDLOCKD");
    Assumptions.assumeTrue(binary != null && !binary.isEmpty(),
        "set SHARDLOCKD to the shardlockd binary (ctest does)");
    String etcdBinary = System.getenv().getOrDefault("SHARDLOCK_ETCD", "/usr/bin/etcd");
    Assumptions.assumeTrue(Files.isExecutable(Path.of(etcdBinary)),
        "no etcd at " + etcdBinary + ": the cluster test is skipped (apt-get install "
            + "etcd-server, or set SHARDLOCK_ETCD)");
    root = Files.createTempDirectory("shardlock-java-cluster-");
    etcdEndpoint = "127.0.0.1:" + freePort();
    String clientUrl = "http://" + etcdEndpoint;
    String peerUrl = "http://127.0.0.1:" + freePort();
    etcd = new ProcessBuilder(etcdBinary, "--name=default",
        "--data-dir=" + root.resolve("etcd"), "--listen-client-urls=" + clientUrl,
        "--advertise-client-urls=" + clientUrl, "--listen-peer-urls=" + peerUrl,
        "--initial-advertise-peer-urls=" + peerUrl, "--initial-cluster=default=" + peerUrl,
        "--logger=zap", "--log-outputs=stderr", "--log-level=warn")
        .redirectOutput(ProcessBuilder.Redirect.DISCARD)
        .redirectError(root.resolve("etcd.log").toFile()).start();
    assertTrue(pollUntil(() -> healthy(clientUrl), Duration.ofSeconds(30)),
        "etcd did not become healthy");
  }

  static boolean healthy(String clientUrl) {
    try {
      HttpURLConnection c = (HttpURLConnection) new URL(clientUrl + "/health").openConnection();
      c.setConnectTimeout(1000);
      c.setReadTimeout(1000);
      try (InputStream in = c.getInputStream()) {
        return new String(in.readAllBytes(), StandardCharsets.UTF_8).contains("\"health\":\"true\"");
      }
    } catch (IOException e) {
      return false;
    }
  }

  @AfterEach
  void stopAll() throws Exception {
    for (ShardLockClient c : clients) c.close();
    for (Daemon d : nodes.values()) d.close();
    if (etcd != null) {
      etcd.destroyForcibly();
      etcd.waitFor(10, TimeUnit.SECONDS);
    }
  }

  void startNode(String id) throws IOException {
    nodes.put(id, new Daemon("10s", "--io", "socket", "--data-dir", root.resolve(id).toString(),
        "--cluster", "etcd://" + etcdEndpoint, "--cluster-name", "java-failover",
        "--node-id", id, "--max-ttl", "10s", "--etcd-lease-ttl", "2s", "--replicas", "2",
        "--replica-timeout", "2s"));
  }

  ShardLockClient client(List<String> seeds) {
    ShardLockClient c = ShardLockClient.create(ShardLockConfig.builder()
        .servers(String.join(",", seeds)).discover(true).lockWatchdogTimeout(TTL).build());
    clients.add(c);
    return c;
  }

  /** A cluster client whose map has every node, waiting up to 30 s for the cluster to say so. */
  ShardLockClient clientWithAllMembers() throws InterruptedException {
    List<String> seeds = new ArrayList<>();
    for (Daemon d : nodes.values()) seeds.add(d.address);
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (true) {
      Set<String> seen = Set.of();
      try {
        ShardLockClient c = client(seeds);
        seen = Set.copyOf(c.mapMembers());
        if (seen.equals(Set.copyOf(seeds))) return c;
      } catch (UnreachableException e) {
        // no map yet
      }
      if (System.nanoTime() - deadline > 0) {
        assertEquals(Set.copyOf(seeds), seen, "the cluster's map");
      }
      Thread.sleep(100);
    }
  }

  static boolean pollUntil(BooleanSupplier done, Duration within) throws InterruptedException {
    long deadline = System.nanoTime() + within.toNanos();
    while (!done.getAsBoolean()) {
      if (System.nanoTime() - deadline > 0) return false;
      Thread.sleep(50);
    }
    return true;
  }

  @Test
  void aHolderKeepsItsLockThroughAKillOfItsPrimaryAndAWaiterIsGrantedByTheNewOwner()
      throws Exception {
    for (String id : List.of("n1", "n2", "n3")) startNode(id);
    ShardLockClient holder = clientWithAllMembers();
    String n2 = nodes.get("n2").address;
    String key = null;
    for (int i = 0; i < 10_000 && key == null; ++i) {
      if (holder.addressFor("java-key-" + i).equals(n2)) key = "java-key-" + i;
    }
    assertTrue(key != null, "no key of n2");
    long epochBefore = holder.mapEpoch();

    FencedLock lock = holder.getLock(key);
    AtomicInteger lost = new AtomicInteger();
    lock.addLostListener((l, thread, fence, reason) -> lost.incrementAndGet());
    // Waits through the nodes' start-up lock-delay (--lock-delay: cluster mode wants it at
    // least --max-ttl).
    assertTrue(lock.tryLock(60, TimeUnit.SECONDS), "n2 did not grant " + key);
    long fence = lock.getFence();
    Lease lease = lock.getLease();

    // A second client, seeded by the nodes that stay, waits for the key (queued at n2).
    ShardLockClient rival = client(List.of(nodes.get("n1").address, nodes.get("n3").address));
    FencedLock rivalLock = rival.getLock(key);
    CompletableFuture<Long> waiter = CompletableFuture.supplyAsync(() -> {
      try {
        if (!rivalLock.tryLock(90, TimeUnit.SECONDS)) return -1L;
        long f = rivalLock.getFence();
        rivalLock.unlock();
        return f;
      } catch (InterruptedException e) {
        return -2L;
      }
    });
    Thread.sleep(300);
    assertFalse(waiter.isDone(), "the rival was granted a held lock");

    nodes.get("n2").process.destroyForcibly();  // SIGKILL
    assertTrue(nodes.get("n2").process.waitFor(10, TimeUnit.SECONDS));
    long killed = System.nanoTime();

    // The lease renews after the kill, at the backup that took n2's bucket over: its
    // client-side expiry moves past what any renewal before the kill gave.
    String key0 = key;
    assertTrue(pollUntil(() -> System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(
        lease.remainingMillis()) - (killed + TTL.toNanos()) > 0, Duration.ofSeconds(40)),
        "no renewal confirmed after the kill (" + lease + ")");
    assertTrue(lock.isHeldByCurrentThread());
    assertEquals(0, lost.get(), "a lost-lease listener ran");
    assertEquals(fence, lock.getFence());
    assertNotEquals(n2, holder.addressFor(key0), "the key still routes to the dead node");
    assertTrue(Long.compareUnsigned(holder.mapEpoch(), epochBefore) > 0);
    assertFalse(waiter.isDone(), "the rival was granted a held lock");

    lock.unlock();  // at the new owner
    long granted = waiter.get(60, TimeUnit.SECONDS);
    assertTrue(granted > 0, "the waiting lock() was not granted: " + granted);
    assertTrue(Long.compareUnsigned(granted, fence) > 0, "fences " + fence + ", " + granted);
    assertNotEquals(n2, rival.addressFor(key0));
    assertEquals(0, lost.get());
  }
}
