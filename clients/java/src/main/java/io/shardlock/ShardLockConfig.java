package io.shardlock;

import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

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

  byte[] authKey() {
    return authKey == null ? null : authKey.clone();
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
