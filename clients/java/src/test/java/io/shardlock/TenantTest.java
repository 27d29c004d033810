package io.shardlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.shardlock.ShardLockConfig.CipherSuite;
import io.shardlock.wire.Envelope;
import io.shardlock.wire.Protocol;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The client as a tenant of a real shardlockd started with --tenants (docs/security.md): rights
 * by prefix, both cipher suites, encryption, wrong keys, a tenant's bound, owner ids scoped to
 * the key id, and where the options come from.
 */
@Timeout(60)
class TenantTest {
  // Key id 4275878552 (0xFEDCBA98) is above 2^31 - 1: the top bit of owner.hi and an int below 0.
  static final int ALPHA = 7;
  static final int SECRET = Integer.parseUnsignedInt("4275878552");
  static final int BOUNDED = 9;
  static Path dir;
  static Path alphaKey;
  static Path secretKey;
  static Path boundedKey;
  static Path strangerKey;  // no tenant's
  static Daemon daemon;  // null without $SHARDLOCKD

  @BeforeAll
  static void start() throws Exception {
    dir = Files.createTempDirectory("shardlock-tenants");
    alphaKey = key("alpha.key");
    secretKey = key("secret.key");
    boundedKey = key("bounded.key");
    strangerKey = key("stranger.key");
    Path tenants = dir.resolve("tenants");
    Files.writeString(tenants, String.join("\n",
        "tenant alpha   id=7          key-file=alpha.key",
        "tenant secret  id=4275878552 key-file=secret.key encrypt=yes",
        "tenant bounded id=9          key-file=bounded.key max-leases=1",
        "allow alpha   \"t7/\" acquire,query",
        "allow secret  \"s/\"  acquire,query",
        "allow bounded \"b/\"  acquire,query",
        ""));
    String binary = System.getenv("SHARDLOCKD");
    if (binary != null && !binary.isEmpty()) daemon = new Daemon("0", "--tenants",
        tenants.toString());
  }

  @AfterAll
  static void stop() throws Exception {
    if (daemon != null) daemon.close();
  }

  static Path key(String name) throws Exception {
    byte[] k = new byte[32];
    new SecureRandom().nextBytes(k);
    Path p = dir.resolve(name);
    Files.writeString(p, HexFormat.of().formatHex(k) + "\n");
    return p;
  }

  static ShardLockConfig.Builder tenant(Path key, int keyId) {
    Assumptions.assumeTrue(daemon != null, "set SHARDLOCKD to the shardlockd binary (ctest does)");
    return ShardLockConfig.builder().servers(daemon.address).authKeyFile(key).tenant(keyId);
  }

  static void assumeAes() {
    Assumptions.assumeTrue(Envelope.cpuHasAes(),
        "this CPU has no AES-NI, so shardlockd drops the AES forms");
  }

  static Envelope.Form form(ShardLockClient c) {
    return c.transport().envelope().form();
  }

  /** Acquires and releases inside the prefix; outside it, ERROR permission_denied. */
  static void withinItsPrefixOnly(ShardLockClient c, String prefix) throws Exception {
    Lease lease = c.acquire(prefix + "a", 10, 0, TimeUnit.SECONDS, false);
    assertTrue(lease.token() > 0);
    lease.renew();  // the owner the server scoped is the one this client chose
    lease.release();
    FencedLock lock = c.getLock(prefix + "lock");
    assertTrue(lock.tryLock());
    lock.unlock();
    PermissionDeniedException e = assertThrows(PermissionDeniedException.class,
        () -> c.acquire("elsewhere/a", 10, 0, TimeUnit.SECONDS, false));
    assertEquals(Protocol.ERROR_PERMISSION_DENIED, e.code());
    assertThrows(PermissionDeniedException.class, () -> c.getLock("elsewhere/b").tryLock());
  }

  @Test
  void aTenantUsesItsPrefixInThePortableSuite() throws Exception {
    try (ShardLockClient c = ShardLockClient.create(
        tenant(alphaKey, ALPHA).cipher(CipherSuite.PORTABLE).build())) {
      assertEquals(Envelope.Form.AUTHENTICATED, form(c));
      assertTrue(c.clientId().startsWith("00000007"), c.clientId());
      withinItsPrefixOnly(c, "t7/");
    }
  }

  @Test
  void aTenantUsesItsPrefixOverAes() throws Exception {
    assumeAes();
    try (ShardLockClient c = ShardLockClient.create(
        tenant(alphaKey, ALPHA).cipher(CipherSuite.AES).build())) {
      assertEquals(Envelope.Form.AUTHENTICATED_AES, form(c));
      withinItsPrefixOnly(c, "t7/");
    }
  }

  @Test
  void anEncryptingTenantWorksOverAes() throws Exception {
    assumeAes();
    try (ShardLockClient c = ShardLockClient.create(tenant(secretKey, SECRET).encrypt(true)
        .build())) {
      assertEquals(Envelope.Form.ENCRYPTED_AES, form(c));
      assertTrue(c.clientId().startsWith("fedcba98"), c.clientId());
      withinItsPrefixOnly(c, "s/");
      // Threads seal in streams of their own; the server opens them all.
      java.util.concurrent.ExecutorService pool =
          java.util.concurrent.Executors.newFixedThreadPool(4);
      try {
        java.util.List<java.util.concurrent.Future<Integer>> done = new java.util.ArrayList<>();
        for (int t = 0; t < 4; ++t) {
          String name = "s/thread-" + t;
          done.add(pool.submit(() -> {
            for (int i = 0; i < 20; ++i) c.acquire(name, 10, 0, TimeUnit.SECONDS, false).release();
            return 20;
          }));
        }
        int granted = 0;
        for (java.util.concurrent.Future<Integer> f : done) granted += f.get(30, TimeUnit.SECONDS);
        assertEquals(80, granted);
      } finally {
        pool.shutdownNow();
      }
    }
  }

  @Test
  void anEncryptYesTenantSendingUnencryptedGetsNoAnswer() {
    try (ShardLockClient c = ShardLockClient.create(tenant(secretKey, SECRET)
        .requestTimeout(Duration.ofMillis(300)).build())) {
      UnreachableException e = assertThrows(UnreachableException.class,
          () -> c.acquire("s/a", 10, 0, TimeUnit.SECONDS, false));
      assertFalse(e instanceof AuthenticationFailedException, e.getMessage());
      assertTrue(e.getMessage().contains("encrypt(true)"), e.getMessage());
    }
  }

  @Test
  void aWrongKeyOrKeyIdGetsNoAnswer() {
    for (CipherSuite suite : new CipherSuite[] {CipherSuite.PORTABLE, CipherSuite.AES}) {
      if (suite == CipherSuite.AES && !Envelope.cpuHasAes()) continue;
      for (ShardLockConfig.Builder b : new ShardLockConfig.Builder[] {
          tenant(strangerKey, ALPHA), tenant(alphaKey, BOUNDED), tenant(alphaKey, 12345)}) {
        try (ShardLockClient c = ShardLockClient.create(b.cipher(suite)
            .requestTimeout(Duration.ofMillis(300)).build())) {
          UnreachableException e = assertThrows(UnreachableException.class,
              () -> c.acquire("t7/a", 10, 0, TimeUnit.SECONDS, false));
          assertFalse(e instanceof AuthenticationFailedException, e.getMessage());
        }
      }
    }
  }

  @Test
  void aTenantsMaxLeasesIsALimitWithItsCode() throws Exception {
    try (ShardLockClient c = ShardLockClient.create(tenant(boundedKey, BOUNDED).build())) {
      Lease held = c.acquire("b/1", 10, 0, TimeUnit.SECONDS, false);
      LimitExceededException e = assertThrows(LimitExceededException.class,
          () -> c.acquire("b/2", 10, 0, TimeUnit.SECONDS, false));
      assertEquals(Protocol.ERROR_TENANT_LEASE_LIMIT, e.code());
      held.release();
      c.acquire("b/2", 10, 0, TimeUnit.SECONDS, false).release();
    }
  }

  @Test
  void keyIdZeroIsTheAuthKeyAndMayEncrypt() throws Exception {
    Assumptions.assumeTrue(daemon != null, "set SHARDLOCKD to the shardlockd binary (ctest does)");
    assumeAes();
    try (Daemon single = new Daemon("0", "--auth-key", alphaKey.toString());
        ShardLockClient c = ShardLockClient.create(ShardLockConfig.builder()
            .servers(single.address).authKeyFile(alphaKey).tenant(0).encrypt(true).build())) {
      assertTrue(c.clientId().startsWith("00000000"), c.clientId());
      c.acquire("anything", 10, 0, TimeUnit.SECONDS, false).release();
    }
  }

  // ---- where the options come from (no server) -----------------------------------------------

  static Envelope envelope(ShardLockConfig.Builder b, Map<String, String> environment)
      throws Exception {
    return b.servers("127.0.0.1:1").build().envelope(environment::get);
  }

  @Test
  void optionsFromTheBuilder() throws Exception {
    Map<String, String> none = Map.of();
    assertNull(envelope(ShardLockConfig.builder(), none));
    assertEquals(Envelope.Form.LEGACY,
        envelope(ShardLockConfig.builder().authKeyFile(alphaKey), none).form());
    Envelope e = envelope(ShardLockConfig.builder().authKeyFile(alphaKey).tenant(SECRET)
        .cipher(CipherSuite.PORTABLE), none);
    assertEquals(Envelope.Form.AUTHENTICATED, e.form());
    assertEquals(SECRET, e.keyId());
    assertEquals(Envelope.Form.ENCRYPTED_AES, envelope(ShardLockConfig.builder()
        .authKeyFile(alphaKey).tenant(1).encrypt(true), none).form());
    // AUTO: AES-GCM when encrypting (the only cipher this client encrypts in), else where the CPU
    // has AES-NI.
    assertEquals(Envelope.Form.ENCRYPTED_AES,
        ShardLockConfig.tenantForm(true, CipherSuite.AUTO, false));
    assertEquals(Envelope.Form.AUTHENTICATED,
        ShardLockConfig.tenantForm(false, CipherSuite.AUTO, false));
    assertEquals(Envelope.Form.AUTHENTICATED_AES,
        ShardLockConfig.tenantForm(false, CipherSuite.AUTO, true));
    assertEquals(Envelope.Form.AUTHENTICATED_AES,
        ShardLockConfig.tenantForm(false, CipherSuite.AES, false));
  }

  @Test
  void optionsThatCannotWork() {
    Map<String, String> none = Map.of();
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> ShardLockConfig.builder().servers("127.0.0.1:1").encrypt(true)
            .cipher(CipherSuite.PORTABLE).build());
    assertTrue(e.getMessage().contains("XChaCha20-Poly1305"), e.getMessage());
    assertThrows(IllegalArgumentException.class,
        () -> envelope(ShardLockConfig.builder().tenant(1), none));  // no key
    assertThrows(IllegalArgumentException.class,
        () -> envelope(ShardLockConfig.builder().authKeyFile(alphaKey).encrypt(true), none));
    assertThrows(IllegalArgumentException.class, () -> envelope(ShardLockConfig.builder()
        .authKeyFile(alphaKey).cipher(CipherSuite.AES), none));
    assertThrows(IllegalArgumentException.class, () -> ShardLockClient.create(
        ShardLockConfig.builder().servers("127.0.0.1:1").tenant(1).build()));
  }

  @Test
  void aKeyFromTheEnvironmentBringsItsTenantAlong() throws Exception {
    Map<String, String> env = new HashMap<>();
    env.put("SHARDLOCK_AUTH_KEY_FILE", alphaKey.toString());
    assertEquals(Envelope.Form.LEGACY, envelope(ShardLockConfig.builder(), env).form());
    env.put("SHARDLOCK_TENANT", "4275878552");
    env.put("SHARDLOCK_CIPHER", "portable");
    Envelope e = envelope(ShardLockConfig.builder(), env);
    assertEquals(Envelope.Form.AUTHENTICATED, e.form());
    assertEquals(SECRET, e.keyId());
    env.put("SHARDLOCK_CIPHER", "aes");
    env.put("SHARDLOCK_ENCRYPT", "1");
    assertEquals(Envelope.Form.ENCRYPTED_AES, envelope(ShardLockConfig.builder(), env).form());
    // What the builder gives wins.
    assertEquals(3, envelope(ShardLockConfig.builder().tenant(3), env).keyId());
    // The variables ride along with the environment's key only.
    assertEquals(Envelope.Form.LEGACY,
        envelope(ShardLockConfig.builder().authKeyFile(alphaKey), env).form());
    env.put("SHARDLOCK_TENANT", "4294967296");
    assertThrows(IllegalArgumentException.class, () -> envelope(ShardLockConfig.builder(), env));
    env.put("SHARDLOCK_TENANT", "-1");
    assertThrows(IllegalArgumentException.class, () -> envelope(ShardLockConfig.builder(), env));
    env.put("SHARDLOCK_TENANT", "1");
    env.put("SHARDLOCK_CIPHER", "chacha");
    assertThrows(IllegalArgumentException.class, () -> envelope(ShardLockConfig.builder(), env));
  }
}
