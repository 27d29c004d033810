package io.shardlock;

import io.shardlock.wire.Auth;
import io.shardlock.wire.Envelope;
import java.io.IOException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.OptionalInt;
import java.util.function.Function;

/**
 * How a {@link ShardLockClient} reaches its servers and how long it waits. Immutable; made by
 * {@link #builder()}:
 *
 * <pre>{@code
 * ShardLockConfig config = ShardLockConfig.builder()
 *     .servers("10.0.0.1:7420")
 *     .authKeyFile(Path.of("/etc/shardlock/auth.key"))
 *     .requestTimeout(Duration.ofSeconds(2))
 *     .build();
 * }</pre>
 *
 * <p>A tenant of a server started with {@code --tenants} (docs/security.md) gives its key as the
 * auth key and its key id as {@link Builder#tenant}, and with {@link Builder#encrypt} encrypts:
 *
 * <pre>{@code
 * ShardLockConfig.builder().servers("10.0.0.1:7420")
 *     .authKeyFile("/etc/shardlock/billing.key").tenant(1).encrypt(true)
 *     .build();
 * }</pre>
 */
public final class ShardLockConfig {
  private final List<String> servers;
  private final boolean discover;
  private final Path authKeyFile;
  private final byte[] authKey;
  private final Duration requestTimeout;
  private final Duration initialRetransmit;
  private final Duration maxRetransmit;
  private final Duration lockWatchdogTimeout;
  private final double clockDriftFactor;
  private final Duration clockDriftAllowance;
  private final Integer tenant;  // null: none given
  private final boolean encrypt;
  private final CipherSuite cipher;  // null: none given (the environment's, else AUTO)

  /**
   * Which cipher suite a tenant's datagrams are sealed in (envelope.h's EnvelopeCipher). Java
   * seals the portable suite's authenticated form (keyed BLAKE2b, flags 0x05) and both AES-256-GCM
   * forms (0x15, 0x1D), but not the portable encrypted form (XChaCha20-Poly1305, in neither JDK
   * 17 nor Bouncy Castle 1.72): this client encrypts with AES-GCM only.
   */
  public enum CipherSuite {
    /** AES-GCM when encrypting, or where this CPU has AES-NI (as the C++ client); else portable. */
    AUTO,
    /** Keyed BLAKE2b (0x05): any server, including one without AES-NI. Cannot encrypt here. */
    PORTABLE,
    /** AES-256-GCM (0x15, or 0x1D encrypted): the server needs AES-NI to read it. */
    AES,
  }

  // The variables shardlockctl reads; the tenant ones ride along with a key from the environment.
  static final String KEY_FILE_ENVIRONMENT = "SHARDLOCK_AUTH_KEY_FILE";
  static final String TENANT_ENVIRONMENT = "SHARDLOCK_TENANT";
  static final String ENCRYPT_ENVIRONMENT = "SHARDLOCK_ENCRYPT";
  static final String CIPHER_ENVIRONMENT = "SHARDLOCK_CIPHER";

  private ShardLockConfig(Builder b) {
    this.servers = List.copyOf(b.servers);
    this.discover = b.discover;
    this.authKeyFile = b.authKeyFile;
    this.authKey = b.authKey == null ? null : b.authKey.clone();
    this.requestTimeout = b.requestTimeout;
    this.initialRetransmit = b.initialRetransmit;
    this.maxRetransmit = b.maxRetransmit;
    this.lockWatchdogTimeout = b.lockWatchdogTimeout;
    this.clockDriftFactor = b.clockDriftFactor;
    this.clockDriftAllowance = b.clockDriftAllowance;
    this.tenant = b.tenant;
    this.encrypt = b.encrypt;
    this.cipher = b.cipher;
  }

  public static Builder builder() {
    return new Builder();
  }

  /** The servers as written, "HOST:PORT" or "[IPV6]:PORT". */
  public List<String> servers() {
    return servers;
  }

  public boolean discover() {
    return discover;
  }

  public Path authKeyFile() {
    return authKeyFile;
  }

  public Duration requestTimeout() {
    return requestTimeout;
  }

  public Duration initialRetransmit() {
    return initialRetransmit;
  }

  public Duration maxRetransmit() {
    return maxRetransmit;
  }

  /** The TTL of a lock taken without a lease time; the watchdog renews it at a third. */
  public Duration lockWatchdogTimeout() {
    return lockWatchdogTimeout;
  }

  public double clockDriftFactor() {
    return clockDriftFactor;
  }

  public Duration clockDriftAllowance() {
    return clockDriftAllowance;
  }

  /** The tenant's key id as given (unsigned), or empty (none, or $SHARDLOCK_TENANT's). */
  public OptionalInt tenant() {
    return tenant == null ? OptionalInt.empty() : OptionalInt.of(tenant);
  }

  public boolean encrypt() {
    return encrypt;
  }

  /** The cipher suite as given; AUTO when none was. */
  public CipherSuite cipher() {
    return cipher == null ? CipherSuite.AUTO : cipher;
  }

  /**
   * How the client seals: the key from authKey, authKeyFile or the file in
   * $SHARDLOCK_AUTH_KEY_FILE, in the legacy form without a tenant, else as the tenant's key id in
   * the form encrypt and cipher pick; null without a key. A key from the environment brings
   * $SHARDLOCK_TENANT, $SHARDLOCK_ENCRYPT=1 and $SHARDLOCK_CIPHER along where tenant, encrypt
   * and cipher were not given, as shardlockctl reads them. IllegalArgumentException for a tenant
   * or encryption without a key, encryption or AES without a tenant, encryption in the portable
   * suite, a bad variable; IOException for a key file that cannot be read.
   */
  Envelope envelope(Function<String, String> environment) throws IOException {
    byte[] key = authKey == null ? null : authKey.clone();
    if (key == null && authKeyFile != null) key = Auth.loadKey(authKeyFile);
    Integer keyId = tenant;
    boolean encrypting = encrypt;
    CipherSuite suite = cipher;
    String file = environment.apply(KEY_FILE_ENVIRONMENT);
    if (key == null && file != null && !file.isEmpty()) {
      key = Auth.loadKey(Path.of(file));
      if (keyId == null) keyId = tenantOf(environment.apply(TENANT_ENVIRONMENT));
      encrypting = encrypting || "1".equals(environment.apply(ENCRYPT_ENVIRONMENT));
      if (suite == null) suite = cipherOf(environment.apply(CIPHER_ENVIRONMENT));
    }
    if (suite == null) suite = CipherSuite.AUTO;
    if (key == null && (keyId != null || encrypting)) {
      throw new IllegalArgumentException("a tenant (and encryption) needs the tenant's key: "
          + "authKeyFile or authKey");
    }
    if (keyId == null && encrypting) {
      throw new IllegalArgumentException("encryption needs a tenant key id (tenant)");
    }
    if (keyId == null && suite == CipherSuite.AES) {
      throw new IllegalArgumentException("the AES-GCM cipher seals a tenant's datagrams: it needs "
          + "a tenant key id (tenant)");
    }
    if (key == null) return null;
    if (keyId == null) return new Envelope(key, 0, Envelope.Form.LEGACY);
    return new Envelope(key, keyId, tenantForm(encrypting, suite, Envelope.cpuHasAes()));
  }

  /** The key-id form a tenant seals in: encrypted or not, in the suite `suite` picks. */
  static Envelope.Form tenantForm(boolean encrypt, CipherSuite suite, boolean cpuHasAes) {
    if (encrypt) {
      if (suite == CipherSuite.PORTABLE) throw portableEncryption();
      return Envelope.Form.ENCRYPTED_AES;
    }
    boolean aes = suite == CipherSuite.AES || (suite == CipherSuite.AUTO && cpuHasAes);
    return aes ? Envelope.Form.AUTHENTICATED_AES : Envelope.Form.AUTHENTICATED;
  }

  private static IllegalArgumentException portableEncryption() {
    return new IllegalArgumentException("the portable cipher encrypts with XChaCha20-Poly1305, "
        + "which this client does not have (JDK 17, Bouncy Castle 1.72): encrypt with "
        + "cipher(AES) or AUTO (the server then needs AES-NI)");
  }

  private static Integer tenantOf(String text) {
    if (text == null || text.isEmpty()) return null;
    try {
      if (text.chars().allMatch(c -> c >= '0' && c <= '9')) return Integer.parseUnsignedInt(text);
    } catch (NumberFormatException e) {
      // out of range: as below
    }
    throw new IllegalArgumentException("$" + TENANT_ENVIRONMENT + " wants a key id (0 to "
        + "4294967295), not '" + text + "'");
  }

  private static CipherSuite cipherOf(String text) {
    if (text == null || text.isEmpty()) return null;
    for (CipherSuite c : CipherSuite.values()) {
      if (c.name().toLowerCase(Locale.ROOT).equals(text)) return c;
    }
    throw new IllegalArgumentException("$" + CIPHER_ENVIRONMENT + " is auto, portable or aes, "
        + "not '" + text + "'");
  }

  /** Builds a {@link ShardLockConfig}; every setter checks its argument at once. */
  public static final class Builder {
    private final List<String> servers = new ArrayList<>();
    private boolean discover;
    private Path authKeyFile;
    private byte[] authKey;
    private Duration requestTimeout = Duration.ofSeconds(2);
    private Duration initialRetransmit = Duration.ofMillis(20);
    private Duration maxRetransmit = Duration.ofMillis(400);
    private Duration lockWatchdogTimeout = Duration.ofSeconds(30);
    private double clockDriftFactor = 0.01;
    private Duration clockDriftAllowance = Duration.ofMillis(2);
    private Integer tenant;
    private boolean encrypt;
    private CipherSuite cipher;

    private Builder() {}

    /** The servers, comma-separated ("host:port,host:port"); replaces any given before. */
    public Builder servers(String commaSeparated) {
      servers.clear();
      for (String s : commaSeparated.split(",", -1)) {
        String t = s.strip();
        if (t.isEmpty()) {
          throw new IllegalArgumentException("an empty server address in '" + commaSeparated
              + "'");
        }
        servers.add(t);
      }
      return this;
    }

    /** Cluster mode: the servers are seeds that give the cluster's map (docs/cluster.md). */
    public Builder discover(boolean discover) {
      this.discover = discover;
      return this;
    }

    /** A key file (64 hex digits, `shardlockctl keygen`): every datagram is sealed with it. */
    public Builder authKeyFile(Path path) {
      this.authKeyFile = path;
      return this;
    }

    public Builder authKeyFile(String path) {
      return authKeyFile(Path.of(path));
    }

    /** The 32-byte datagram key itself, instead of a file. */
    public Builder authKey(byte[] key) {
      if (key.length != 32) throw new IllegalArgumentException("an auth key is 32 bytes");
      this.authKey = key.clone();
      return this;
    }

    /**
     * Seal as the tenant whose key id this is (shardlockd --tenants; the key is the auth key):
     * every datagram names it, replies are taken only under it, and the client's owner ids carry
     * it in the top 32 bits of their hi word, as the server scopes them. Unsigned: ids above 2^31
     * - 1 are given as {@code Integer.parseUnsignedInt("4275878552")}. Default: none (the legacy
     * seal of {@code --auth-key}, or $SHARDLOCK_TENANT with a key from the environment).
     */
    public Builder tenant(int keyId) {
      this.tenant = keyId;
      return this;
    }

    /**
     * Encrypt every datagram (a tenant with encrypt=yes needs it; any tenant may): bytes 6 on,
     * keys, values and owners included, with AES-256-GCM. Needs a tenant. Default off.
     */
    public Builder encrypt(boolean encrypt) {
      this.encrypt = encrypt;
      return this;
    }

    /** The tenant's cipher suite (default AUTO); see {@link CipherSuite}. */
    public Builder cipher(CipherSuite suite) {
      if (suite == null) throw new IllegalArgumentException("cipher: AUTO, PORTABLE or AES");
      this.cipher = suite;
      return this;
    }

    /** How long one request retransmits before the call is unreachable. Default 2 s. */
    public Builder requestTimeout(Duration timeout) {
      this.requestTimeout = positive(timeout, "requestTimeout");
      return this;
    }

    /** The first retransmission interval (default 20 ms); it doubles up to maxRetransmit. */
    public Builder initialRetransmit(Duration interval) {
      this.initialRetransmit = positive(interval, "initialRetransmit");
      return this;
    }

    public Builder maxRetransmit(Duration interval) {
      this.maxRetransmit = positive(interval, "maxRetransmit");
      return this;
    }

    /** The TTL of locks taken without a lease time (default 30 s, as Redisson's). */
    public Builder lockWatchdogTimeout(Duration ttl) {
      this.lockWatchdogTimeout = positive(ttl, "lockWatchdogTimeout");
      return this;
    }

    /**
     * The client's expiry errs early by {@code factor x ttl + allowance} (default 1% + 2 ms), for
     * clocks that drift apart.
     */
    public Builder clockDrift(double factor, Duration allowance) {
      if (!(factor >= 0 && factor < 1)) {
        throw new IllegalArgumentException("clock drift factor must be in [0, 1)");
      }
      if (allowance.isNegative()) throw new IllegalArgumentException("negative drift allowance");
      this.clockDriftFactor = factor;
      this.clockDriftAllowance = allowance;
      return this;
    }

    public ShardLockConfig build() {
      if (servers.isEmpty()) {
        String env = System.getenv("SHARDLOCK_SERVER");
        if (env == null || env.isEmpty()) {
          throw new IllegalArgumentException("no server: call servers(\"HOST:PORT\") or set "
              + "SHARDLOCK_SERVER");
        }
        servers(env);
      }
      if (authKey != null && authKeyFile != null) {
        throw new IllegalArgumentException("give authKey or authKeyFile, not both");
      }
      if (encrypt && cipher == CipherSuite.PORTABLE) throw portableEncryption();
      if (maxRetransmit.compareTo(initialRetransmit) < 0) {
        throw new IllegalArgumentException("maxRetransmit is below initialRetransmit");
      }
      return new ShardLockConfig(this);
    }

    private static Duration positive(Duration d, String name) {
      if (d.isNegative() || d.isZero()) {
        throw new IllegalArgumentException(name + " must be positive, not " + d);
      }
      return d;
    }
  }
}
