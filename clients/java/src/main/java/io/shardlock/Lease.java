package io.shardlock;

import io.shardlock.wire.Message;
import io.shardlock.wire.MessageType;
import java.net.InetSocketAddress;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

/**
 * A held lease: its key, its fencing token, and the expiry the client can prove. Each lease is an
 * owner of its own on the wire (the client id with a per-lease handle in its low 32 bits), so no
 * other lease of the same client can renew or release it. Thread-safe.
 *
 * <p>The client's expiry is the send time of the first transmission of the granting (or last
 * confirmed renewing) request plus the TTL, minus a drift margin: it errs early. With the
 * watchdog the lease renews itself at a third of its TTL after its last confirmed send and
 * retries until the expiry; a lease that cannot prove it is still held by then is lost. The
 * listeners given to {@link #onLost} run once, on the client's event thread, with the reason.
 */
public final class Lease implements AutoCloseable {
  private enum State { HELD, LOST, RELEASED }

  private final ShardLockClient client;
  private final String name;
  private final byte[] key;
  private final long token;
  private final LeaseMode mode;
  final long ownerLo;
  final long ownerHi;
  // The node that last answered (or was asked) for this lease, for the client's messages: the
  // granting one at first. Renewals and releases go to the key's owner now, which in cluster
  // mode may be another node (a backup that took the key over holds the lease).
  private volatile InetSocketAddress node;
  private final long ttlMs;
  private final boolean watchdog;
  private final List<Consumer<LeaseLostException>> listeners = new CopyOnWriteArrayList<>();

  private final Object lock = new Object();
  private State state = State.HELD;  // under lock
  private long expiry;  // System.nanoTime(), under lock
  private long confirmedSent;  // under lock
  private LeaseLostException lostReason;  // under lock
  private boolean fired;  // under lock
  private boolean renewing;  // the watchdog's renewal in flight; under lock
  private ScheduledFuture<?> look;  // under lock

  Lease(ShardLockClient client, String name, byte[] key, long token, LeaseMode mode,
      long ownerLo, long ownerHi, InetSocketAddress node, long ttlMs, long sent, long expiry,
      boolean watchdog) {
    this.client = client;
    this.name = name;
    this.key = key;
    this.token = token;
    this.mode = mode;
    this.ownerLo = ownerLo;
    this.ownerHi = ownerHi;
    this.node = node;
    this.ttlMs = ttlMs;
    this.confirmedSent = sent;
    this.expiry = expiry;
    this.watchdog = watchdog;
  }

  /** The key as given to the acquire. */
  public String name() {
    return name;
  }

  /** The fencing token: pass it to the resource, which rejects any lower one it has seen. */
  public long token() {
    return token;
  }

  public LeaseMode mode() {
    return mode;
  }

  /** The TTL the lease was granted (and is renewed) for. */
  public long ttlMillis() {
    return ttlMs;
  }

  /** Whether the lease renews itself. */
  public boolean watchdog() {
    return watchdog;
  }

  /** The owner it was taken as: 32 hex digits, hi then lo (as shardlockctl prints owners). */
  public String owner() {
    return String.format("%016x%016x", ownerHi, ownerLo);
  }

  /** True while held, not lost, and the client-side expiry is ahead. */
  public boolean isValid() {
    synchronized (lock) {
      return state == State.HELD && System.nanoTime() - expiry < 0;
    }
  }

  /** Milliseconds until the client-side expiry; 0 once passed, released or lost. */
  public long remainingMillis() {
    synchronized (lock) {
      if (state != State.HELD) return 0;
      return Math.max(0, TimeUnit.NANOSECONDS.toMillis(expiry - System.nanoTime()));
    }
  }

  /** Why the lease was lost, or null while it is not. */
  public LeaseLostException lostReason() {
    synchronized (lock) {
      return lostReason;
    }
  }

  /**
   * Runs {@code listener} once, on the client's event thread, when the lease is lost (at once if
   * it was already); never after a release.
   */
  public void onLost(Consumer<LeaseLostException> listener) {
    // Once per listener even when it is added while the lease is being lost.
    java.util.concurrent.atomic.AtomicBoolean ran = new java.util.concurrent.atomic.AtomicBoolean();
    Consumer<LeaseLostException> once = reason -> {
      if (ran.compareAndSet(false, true)) listener.accept(reason);
    };
    listeners.add(once);
    synchronized (lock) {
      if (state != State.LOST || !fired) return;
    }
    LeaseLostException reason = lostReason();
    client.events().execute(() -> once.accept(reason));
  }

  /**
   * RENEW at the key's owner, for its TTL; blocks up to the request timeout. That is the node
   * that granted the lease, or in cluster mode the key's owner under the client's current map
   * (with --replicas the backup that took a dead primary's keys over holds its leases), found
   * as an acquire finds it (REDIRECTs followed, the map refreshed when the node falls silent).
   * A NOT_OWNER, EXPIRED or REDIRECT answer means the lease is lost: the listeners run and this
   * throws {@link LeaseLostException}.
   */
  public void renew() {
    Message reply = await(renewAsync(client.requestTimeoutNanos()));
    if (reply == null) {
      throw client.unreachable(node, "RENEW", name, client.requestTimeoutNanos(), -1);
    }
    if (reply.type == MessageType.RECOVERING) throw new RecoveringException(reply.retryAfterMs);
    LeaseLostException lost = lostReason();
    if (lost != null) throw lost;
  }

  /**
   * RELEASE, waiting for the answer. The lease is inactive afterwards whatever the answer, and
   * the lost listeners no longer run. Throws {@link LeaseLostException} if the lease had been
   * lost (the server answered NOT_OWNER or EXPIRED, or the client could not prove it held),
   * {@link UnreachableException} without an answer (the server then holds the lease until its
   * TTL runs out); IllegalStateException if released before.
   */
  public void release() {
    LeaseLostException lost;
    synchronized (lock) {
      if (state == State.RELEASED) {
        throw new IllegalStateException("the lease on '" + name + "' was released already");
      }
      lost = state == State.LOST ? lostReason : null;
      state = State.RELEASED;
      if (look != null) look.cancel(false);
    }
    Message reply = await(client.routed(key, () -> request(MessageType.RELEASE), ownerLo, ownerHi,
        System.nanoTime() + client.requestTimeoutNanos()).thenApply(this::answeredBy));
    if (lost != null) throw lost;
    if (reply == null) {
      throw client.unreachable(node, "RELEASE", name, client.requestTimeoutNanos(), -1);
    }
    switch (reply.type) {
      case RELEASED:
        return;
      case NOT_OWNER:
        throw new LeaseLostException(name, LeaseLostException.Reason.NOT_OWNER,
            "another owner holds it now");
      case EXPIRED:
        throw new LeaseLostException(name, LeaseLostException.Reason.SERVER_EXPIRED,
            "the server no longer had it");
      case RECOVERING:
        throw new RecoveringException(reply.retryAfterMs);
      case ERROR:
        throw ServerErrorException.of(reply.error);
      default:
        throw new ShardLockException("unexpected reply " + reply.type);
    }
  }

  /** {@link #release()}, for try-with-resources. */
  @Override
  public void close() {
    release();
  }

  /** A release whose outcome nobody waits for (a grant that came too late, a closing client). */
  void releaseQuietly() {
    synchronized (lock) {
      if (state == State.RELEASED) return;
      state = State.RELEASED;
      if (look != null) look.cancel(false);
    }
    client.transport().sendOnce(client.nodeFor(key), request(MessageType.RELEASE), ownerLo,
        ownerHi, client.mapEpoch() == 0 ? null : client.mapEpoch());
  }

  @Override
  public String toString() {
    return "Lease(" + name + ", token=" + Long.toUnsignedString(token) + ", " + mode + ", owner="
        + owner() + ", valid=" + isValid() + ")";
  }

  /** A RELEASE or RENEW of this lease, a fresh request id. */
  private Message request(MessageType type) {
    Message m = new Message(type, client.transport().newRequestId());
    m.key = key;
    m.token = token;
    if (type == MessageType.RENEW) m.ttlMs = ttlMs;
    return m;
  }

  private Message answeredBy(ShardLockClient.Routed routed) {
    node = routed.node;
    return routed.reply;
  }

  private static Message await(CompletableFuture<Message> future) {
    boolean interrupted = false;
    try {
      while (true) {
        try {
          return future.get();
        } catch (InterruptedException e) {
          interrupted = true;  // a renew or release is short: finish it, keep the interrupt
        } catch (ExecutionException e) {
          Throwable cause = e.getCause();
          if (cause instanceof RuntimeException) throw (RuntimeException) cause;
          throw new ShardLockException(cause.toString(), cause);
        }
      }
    } finally {
      if (interrupted) Thread.currentThread().interrupt();
    }
  }

  // ---- the watchdog --------------------------------------------------------------------------

  private long margin() {
    return client.driftMarginNanos(ttlMs);
  }

  /** One RENEW and its bookkeeping; the future gets the reply (null: unanswered). */
  private CompletableFuture<Message> renewAsync(long timeoutNanos) {
    long sent = System.nanoTime();
    return client.routed(key, () -> request(MessageType.RENEW), ownerLo, ownerHi,
        sent + timeoutNanos).thenApply(this::answeredBy)
        .thenApply(reply -> {
          if (reply != null) onRenewReply(reply, sent);
          return reply;
        });
  }

  private void onRenewReply(Message reply, long sent) {
    switch (reply.type) {
      case RENEWED:
        synchronized (lock) {
          // Renewals never push the expiry past what the server may hold: counted from this
          // request's first send, and only forward.
          if (state == State.HELD && sent - confirmedSent > 0) {
            confirmedSent = sent;
            expiry = sent + TimeUnit.MILLISECONDS.toNanos(reply.ttlMs) - margin();
          }
        }
        return;
      case NOT_OWNER:
        markLost(LeaseLostException.Reason.NOT_OWNER, "the renewal was answered NOT_OWNER: "
            + "another owner holds it now");
        return;
      case EXPIRED:
        markLost(LeaseLostException.Reason.SERVER_EXPIRED,
            "the renewal was answered EXPIRED: the server no longer had it");
        return;
      case REDIRECT:
        markLost(LeaseLostException.Reason.REDIRECTED,
            "the node handed the key to another node (map epoch " + reply.epoch + ")");
        return;
      case ERROR:
        markLost(LeaseLostException.Reason.SERVER_ERROR, "the server refused the renewal: "
            + io.shardlock.wire.Protocol.errorText(reply.error));
        return;
      default:
        return;  // RECOVERING: the expiry still ends the lease if it never comes back
    }
  }

  void markLost(LeaseLostException.Reason reason, String why) {
    synchronized (lock) {
      if (state != State.HELD) return;
      state = State.LOST;
      lostReason = new LeaseLostException(name, reason, why);
      fired = true;
      if (look != null) look.cancel(false);
    }
    LeaseLostException r = lostReason();
    for (Consumer<LeaseLostException> listener : listeners) {
      client.events().execute(() -> {
        synchronized (lock) {
          if (state == State.RELEASED) return;  // released meanwhile: nobody is listening
        }
        listener.accept(r);
      });
    }
  }

  /** Starts the watchdog's looks at this lease (the renewals, or only the expiry). */
  void startWatching() {
    scheduleLook(System.nanoTime(), nextLook());
  }

  private long nextLook() {
    synchronized (lock) {
      if (!watchdog) return expiry;
      long due = confirmedSent + TimeUnit.MILLISECONDS.toNanos(ttlMs) / 3;
      return expiry - due < 0 ? expiry : due;
    }
  }

  private void scheduleLook(long now, long at) {
    synchronized (lock) {
      if (state != State.HELD) return;
      try {
        look = client.timer().schedule(this::look, Math.max(0, at - now), TimeUnit.NANOSECONDS);
      } catch (java.util.concurrent.RejectedExecutionException e) {
        // The client is closing: the lease becomes inert and expires on the server.
      }
    }
  }

  private void look() {
    long now = System.nanoTime();
    long until;
    synchronized (lock) {
      if (state != State.HELD || renewing) return;
      until = expiry;
    }
    if (now - until >= 0) {
      if (watchdog) {
        markLost(LeaseLostException.Reason.EXPIRED,
            "no renewal was confirmed before its expiry (the server did not answer in time)");
      } else {
        markLost(LeaseLostException.Reason.LEASE_TIME_ELAPSED,
            "its lease time (" + ttlMs + " ms) ran out before it was released");
      }
      return;
    }
    if (!watchdog || now - nextLook() < 0) {
      scheduleLook(now, nextLook());
      return;
    }
    synchronized (lock) {
      renewing = true;
    }
    // Retried until the expiry, one request timeout at a time.
    long timeout = Math.max(1_000_000L, Math.min(until - now, client.requestTimeoutNanos()));
    renewAsync(timeout).whenComplete((reply, error) -> {
      synchronized (lock) {
        renewing = false;
      }
      long after = System.nanoTime();
      if (reply != null && reply.type == MessageType.RECOVERING) {
        // The node cannot renew now: asking again at once would spin.
        long delay = ShardLockClient.retryDelayNanos(reply.retryAfterMs);
        long at;
        synchronized (lock) {
          at = Math.min(expiry, after + delay);
        }
        scheduleLook(after, at);
      } else if (error == null) {
        scheduleLook(after, reply == null ? after : nextLook());
      }
    });
  }
}
