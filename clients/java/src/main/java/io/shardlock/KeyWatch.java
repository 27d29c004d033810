package io.shardlock;

import io.shardlock.wire.HolderEntry;
import io.shardlock.wire.Message;
import io.shardlock.wire.MessageType;
import io.shardlock.wire.Protocol;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * Follows one key without polling (protocol.h, "Watches"): {@link #next} gives the key's state
 * now, then each change of its version once. Each WATCH waits at the server (parked until a
 * grant, release or expiry changes the version, or its round ends) and rides through the
 * server's lock-delay. One thread at a time; made by {@link ShardLockClient#watch}.
 */
public final class KeyWatch {
  private static final long ROUND_MS = 30_000;

  private final ShardLockClient client;
  private final String name;
  private final byte[] key;
  private long sinceToken = Protocol.NO_VERSION_TOKEN;
  private long sinceHolders;

  KeyWatch(ShardLockClient client, String name) {
    this.client = client;
    this.name = name;
    this.key = ShardLockClient.keyBytes(name);
  }

  public String key() {
    return name;
  }

  /**
   * The key's state once its version differs from the last one returned (at once the first
   * time), or null when {@code timeout} passes first. Throws {@link UnreachableException},
   * {@link ServerErrorException} (10: the server's bound on parked watches),
   * InterruptedException.
   */
  public WatchEvent next(Duration timeout) throws InterruptedException {
    long end = System.nanoTime() + timeout.toNanos();
    while (true) {
      if (Thread.interrupted()) throw new InterruptedException();
      long leftMs = TimeUnit.NANOSECONDS.toMillis(end - System.nanoTime());
      if (leftMs < 0) return null;
      WatchEvent event = once(Math.min(ROUND_MS, leftMs));
      if (event == null) continue;  // RECOVERING: asked again after its hint
      if (event.versionToken() != sinceToken || event.holderCount() != sinceHolders) {
        sinceToken = event.versionToken();
        sinceHolders = event.holderCount();
        return event;
      }
    }
  }

  private WatchEvent once(long waitMs) throws InterruptedException {
    long timeout = TimeUnit.MILLISECONDS.toNanos(waitMs) + client.requestTimeoutNanos();
    long mismatches = client.transport().authMismatches();
    long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(waitMs);
    CompletableFuture<ShardLockClient.Routed> call = client.routed(key, () -> {
      Message m = new Message(MessageType.WATCH, client.transport().newRequestId());
      m.key = key;
      m.token = sinceToken;
      m.holders = sinceHolders;
      // A follow-up at another node asks for the wait left (at least 1 ms).
      m.waitMs = waitMs == 0 ? 0 : Math.max(1, Math.min(waitMs, (end - System.nanoTime()) / 1_000_000));
      return m;
    }, client.clientLo(), client.clientHi(), System.nanoTime() + timeout);
    ShardLockClient.Routed routed = ShardLockClient.await(call, true);
    Message reply = routed.reply;
    InetSocketAddress node = routed.node;
    if (reply == null) throw client.unreachable(node, "WATCH", name, timeout, mismatches);
    switch (reply.type) {
      case HOLDERS_REPLY: {
        List<HolderEntry> holders = HolderEntry.parse(reply);
        long token = holders.isEmpty() ? 0 : holders.get(holders.size() - 1).token;
        LeaseMode mode = reply.holders == 0 ? null : LeaseMode.values()[reply.mode];
        return new WatchEvent(token, reply.holders, mode, reply.waiters, reply.permits, holders);
      }
      case RECOVERING:
        Thread.sleep(TimeUnit.NANOSECONDS.toMillis(
            ShardLockClient.retryDelayNanos(reply.retryAfterMs)));
        return null;
      case ERROR:
        throw ServerErrorException.of(reply.error);
      case REDIRECT:
        throw new RedirectedException(name, reply.epoch);
      default:
        throw new ShardLockException("unexpected reply " + reply.type);
    }
  }
}
