package io.shardlock;

import io.shardlock.wire.HolderEntry;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

/**
 * Leader election on a lease key, the recipe of Curator's {@code LeaderLatch} and etcd's
 * concurrency.Election (the Java side of include/shardlock/lease/client/election.h and the
 * Python client's election.py): the leader is the key's exclusive holder, its value (an address,
 * a host and pid) the holder value its campaign attached, its term the grant's fencing token,
 * strictly rising over every leader of the name, so a deposed leader's writes can be refused by
 * term. Leadership ends on {@link #resign()}, or when the lease is lost: the listener given to
 * {@link #onLost} runs once, and a leader must stop acting as one then. One campaigner per
 * object; any thread.
 */
public final class Election {
  private final ShardLockClient client;
  private final String name;
  private volatile Lease lease;
  private volatile Consumer<LeaseLostException> onLost = reason -> {};

  /** A leader as others see it. */
  public record Leader(byte[] value, long term, String owner) {
    public String valueText() {
      return new String(value, StandardCharsets.UTF_8);
    }
  }

  Election(ShardLockClient client, String name) {
    this.client = client;
    this.name = name;
    ShardLockClient.keyBytes(name);
  }

  public String name() {
    return name;
  }

  /** Runs {@code listener} once if leadership is lost rather than resigned. */
  public void onLost(Consumer<LeaseLostException> listener) {
    this.onLost = listener;
  }

  /**
   * Waits until elected (FIFO behind the other campaigners), then leads with the watchdog
   * renewing; returns the term. {@code value}: what observers see of this leader, 1..256 bytes.
   * Throws what {@link ShardLockClient#acquire} throws, IllegalStateException if campaigning or
   * leading already.
   */
  public long campaign(byte[] value) throws InterruptedException {
    if (value.length == 0) throw new IllegalArgumentException("a leader's value is 1..256 bytes");
    if (lease != null) throw new IllegalStateException("already leading '" + name + "'");
    long ttl = client.config().lockWatchdogTimeout().toNanos();
    Lease l = ShardLockClient.await(client.acquireAsync(name, LeaseMode.EXCLUSIVE, 0, ttl, -1,
        TimeUnit.NANOSECONDS, true, value), true);
    l.onLost(reason -> onLost.accept(reason));
    lease = l;
    return l.token();
  }

  public long campaign(String value) throws InterruptedException {
    return campaign(value.getBytes(StandardCharsets.UTF_8));
  }

  /** Gives leadership up (RELEASE). IllegalStateException if not leading. */
  public void resign() {
    Lease l = lease;
    if (l == null) throw new IllegalStateException("not leading '" + name + "'");
    lease = null;
    l.release();
  }

  public boolean isLeading() {
    Lease l = lease;
    return l != null && l.isValid();
  }

  /** The term this campaigner leads in; IllegalStateException if not leading. */
  public long term() {
    Lease l = lease;
    if (l == null) throw new IllegalStateException("not leading '" + name + "'");
    return l.token();
  }

  /** The leader now, as the server sees it; empty when there is none. */
  public Optional<Leader> leader() throws InterruptedException {
    WatchEvent now = client.watch(name).next(Duration.ofNanos(client.requestTimeoutNanos()));
    return now == null ? Optional.empty() : leaderOf(now);
  }

  /** An {@link Observer} of this election's leader. */
  public Observer observe() {
    return new Observer(client.watch(name));
  }

  static Optional<Leader> leaderOf(WatchEvent event) {
    if (event.mode() != LeaseMode.EXCLUSIVE || event.holders().size() != 1) {
      return Optional.empty();
    }
    HolderEntry h = event.holders().get(0);
    if (h.pending()) return Optional.empty();
    return Optional.of(new Leader(h.value, h.token,
        String.format("%016x%016x", h.ownerHi, h.ownerLo)));
  }

  /**
   * Follows the leader through a watch: {@link #next} reports the leader now, then each change
   * once, in term order (never a term older than one reported). One thread at a time.
   */
  public static final class Observer {
    private final KeyWatch watch;
    private boolean reported;
    private long term;
    private long highest;

    Observer(KeyWatch watch) {
      this.watch = watch;
    }

    /**
     * The next change of leader (empty inside: no leader now), or null when {@code timeout}
     * passes first.
     */
    public Optional<Leader> next(Duration timeout) throws InterruptedException {
      long end = System.nanoTime() + timeout.toNanos();
      while (true) {
        long left = end - System.nanoTime();
        if (left < 0) return null;
        WatchEvent event = watch.next(Duration.ofNanos(left));
        if (event == null) return null;
        Optional<Leader> leader = leaderOf(event);
        long t = leader.map(Leader::term).orElse(0L);
        if ((reported && t == term) || (leader.isPresent() && Long.compareUnsigned(t, highest) < 0)) {
          continue;
        }
        reported = true;
        term = t;
        if (Long.compareUnsigned(t, highest) > 0) highest = t;
        return leader;
      }
    }
  }
}
