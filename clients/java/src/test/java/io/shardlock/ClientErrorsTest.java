package io.shardlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.shardlock.wire.Protocol;
import java.net.DatagramSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** The causes the error hierarchy names, each provoked for real. */
@Timeout(60)
class ClientErrorsTest {
  @Test
  void recoveringWithTimeLeftThenRiddenThrough() throws Exception {
    try (Daemon daemon = new Daemon("1500ms");
        ShardLockClient c = daemon.client()) {
      FencedLock lock = c.getLock("java/recovering");
      RecoveringException e = assertThrows(RecoveringException.class, lock::tryLock);
      assertTrue(e.retryAfterMillis() > 0 && e.retryAfterMillis() <= 1500, e.getMessage());
      lock.lock();  // waits through the lock-delay
      assertTrue(lock.isHeldByCurrentThread());
      lock.unlock();
    }
  }

  @Test
  void unreachableSaysWhere() throws Exception {
    int port;
    try (DatagramSocket s = new DatagramSocket(0)) {
      port = s.getLocalPort();  // nothing answers there once closed
    }
    try (ShardLockClient c = ShardLockClient.create(ShardLockConfig.builder()
        .servers("127.0.0.1:" + port).requestTimeout(Duration.ofMillis(300)).build())) {
      UnreachableException e = assertThrows(UnreachableException.class,
          () -> c.getLock("java/nobody").tryLock());
      assertTrue(e.getMessage().contains("127.0.0.1:" + port), e.getMessage());
      assertFalse(e instanceof AuthenticationFailedException);
    }
  }

  @Test
  void sealedDatagramsWithTheServersKey() throws Exception {
    Path key = Files.createTempFile("shardlock", ".key");
    Files.writeString(key, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n");
    try (Daemon daemon = new Daemon("0", "--auth-key", key.toString());
        ShardLockClient sealed = daemon.client(ShardLockConfig.builder().servers(daemon.address)
            .authKeyFile(key));
        ShardLockClient plain = daemon.client(ShardLockConfig.builder().servers(daemon.address)
            .requestTimeout(Duration.ofMillis(300)))) {
      FencedLock lock = sealed.getLock("java/sealed");
      assertTrue(lock.tryLock());
      assertTrue(lock.getFence() > 0);
      lock.unlock();
      // The server drops unsealed requests without an answer.
      assertThrows(UnreachableException.class, () -> plain.getLock("java/sealed").tryLock());
    }
  }

  @Test
  void limitExceededIsNamed() throws Exception {
    try (Daemon daemon = new Daemon("0", "--max-waiters-per-key", "1");
        ShardLockClient c = daemon.client()) {
      Lease held = c.acquire("java/limit", 10, 0, TimeUnit.SECONDS, false);
      var first = c.acquireAsync("java/limit", LeaseMode.EXCLUSIVE, 0, 10, 10, TimeUnit.SECONDS,
          false);
      Thread.sleep(300);
      LimitExceededException e = assertThrows(LimitExceededException.class,
          () -> c.acquire("java/limit", 10, 10, TimeUnit.SECONDS, false));
      assertEquals(io.shardlock.wire.Protocol.ERROR_LIMIT_EXCEEDED, e.code());
      first.cancel(false);
      held.release();
    }
  }

  @Test
  void errorCodesWithAClassOfTheirOwn() {
    assertTrue(ServerErrorException.of(Protocol.ERROR_PERMISSION_DENIED)
        instanceof PermissionDeniedException);
    for (int code : new int[] {Protocol.ERROR_LIMIT_EXCEEDED, Protocol.ERROR_TENANT_LEASE_LIMIT,
        Protocol.ERROR_TENANT_WAITER_LIMIT, Protocol.ERROR_TENANT_WATCH_LIMIT}) {
      ServerErrorException e = ServerErrorException.of(code);
      assertTrue(e instanceof LimitExceededException, e.getMessage());
      assertEquals(code, e.code());
    }
    assertEquals(ServerErrorException.class,
        ServerErrorException.of(Protocol.ERROR_BAD_MODE).getClass());
  }

  @Test
  void configRefusesNonsense() {
    assertThrows(IllegalArgumentException.class, () -> ShardLockConfig.builder().servers("a:1,"));
    assertThrows(IllegalArgumentException.class,
        () -> ShardLockConfig.builder().requestTimeout(Duration.ZERO));
    assertThrows(IllegalArgumentException.class,
        () -> ShardLockClient.create(ShardLockConfig.builder().servers("no-port").build()));
  }

  @Test
  void discoverWithoutAClusterSaysWhy() throws Exception {
    int port;
    try (DatagramSocket s = new DatagramSocket(0)) {
      port = s.getLocalPort();
    }
    String silent = "127.0.0.1:" + port;
    try (Daemon daemon = new Daemon("0ms")) {
      // One seed that is not a cluster node (its map has epoch 0), one that does not answer.
      UnreachableException e = assertThrows(UnreachableException.class, () -> ShardLockClient
          .create(ShardLockConfig.builder().servers(daemon.address + "," + silent)
              .discover(true).requestTimeout(Duration.ofMillis(300)).build()));
      assertTrue(e.getMessage().contains(daemon.address + ": not a cluster node"),
          e.getMessage());
      assertTrue(e.getMessage().contains(silent + ": no answer"), e.getMessage());
    }
  }
}
