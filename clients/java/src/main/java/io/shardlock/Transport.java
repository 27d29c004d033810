package io.shardlock;

import io.shardlock.wire.Codec;
import io.shardlock.wire.Datagram;
import io.shardlock.wire.DecodeResult;
import io.shardlock.wire.Envelope;
import io.shardlock.wire.Message;
import io.shardlock.wire.MessageType;
import io.shardlock.wire.Protocol;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.StandardProtocolFamily;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.DatagramChannel;
import java.security.SecureRandom;
import java.util.Arrays;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The client's I/O: one UDP socket, a receiver thread that matches replies to calls by request id
 * (and by type and key, so a stray or forged datagram completes nothing), and retransmission of
 * each call with the SAME request id on the timer, after 20 ms doubling to 400 ms, each interval
 * jittered by +-25%, until the call's deadline. The server's dedup cache answers a
 * retransmission, so a lost GRANTED never becomes a second grant. Thread-safe.
 */
final class Transport implements AutoCloseable {
  private final DatagramChannel channel;
  private final Envelope envelope;  // null: datagrams are not sealed
  private final ScheduledExecutorService timer;
  private final long initialRetransmitNanos;
  private final long maxRetransmitNanos;
  private final ConcurrentHashMap<Long, PendingCall> calls = new ConcurrentHashMap<>();
  // Request ids start at the wall-clock millisecond << 20 plus 20 random bits, as the C++ and
  // Python clients' do: a later process acting for the same owner neither collides in the
  // server's dedup cache nor sends ids below ones the server applied.
  private final AtomicLong ids;
  private final AtomicLong authMismatches = new AtomicLong();
  private final AtomicLong malformed = new AtomicLong();
  private final Thread receiver;
  private volatile boolean closed;

  /** One request id in flight. */
  static final class PendingCall {
    final MessageType type;
    final byte[] key;
    final byte[] datagram;
    final InetSocketAddress node;
    final long ownerLo;
    final long ownerHi;
    final long deadline;  // System.nanoTime()
    /** Completed with the reply, or null when the deadline passed unanswered. */
    final CompletableFuture<Message> future = new CompletableFuture<>();
    long interval;  // the timer thread's alone
    int sends;  // the timer thread's alone
    // Cluster mode: run on the timer thread after every SILENT_SENDS unanswered sends, so the
    // caller can refresh its map and move the call to the key's new owner.
    Runnable onSilent;
    // The next retransmission, cancelled when the call is answered so answered calls do not
    // fill the timer's queue (and wake its thread) until their next interval.
    volatile java.util.concurrent.ScheduledFuture<?> retransmission;
    byte[] keyList = new byte[0];  // ACQUIRE_MANY: its keys, to release a late grant
    int keyCount;
    volatile boolean abandoned;

    PendingCall(MessageType type, byte[] key, byte[] datagram, InetSocketAddress node,
        long ownerLo, long ownerHi, long deadline) {
      this.type = type;
      this.key = key;
      this.datagram = datagram;
      this.node = node;
      this.ownerLo = ownerLo;
      this.ownerHi = ownerHi;
      this.deadline = deadline;
    }
  }

  Transport(boolean ipv6, Envelope envelope, ScheduledExecutorService timer,
      long initialRetransmitNanos, long maxRetransmitNanos) throws IOException {
    this.channel = DatagramChannel.open(ipv6 ? StandardProtocolFamily.INET6
        : StandardProtocolFamily.INET);
    this.channel.bind(null);
    this.envelope = envelope;
    this.timer = timer;
    this.initialRetransmitNanos = initialRetransmitNanos;
    this.maxRetransmitNanos = maxRetransmitNanos;
    long start = (System.currentTimeMillis() << 20) | new SecureRandom().nextInt(1 << 20);
    this.ids = new AtomicLong(start);
    this.receiver = new Thread(this::receive, "shardlock-receiver");
    this.receiver.setDaemon(true);
    this.receiver.start();
  }

  long newRequestId() {
    return ids.getAndIncrement();
  }

  /** How datagrams are sealed; null: they are not. */
  Envelope envelope() {
    return envelope;
  }

  /** Replies dropped because their tag did not verify under our key (or they had none). */
  long authMismatches() {
    return authMismatches.get();
  }

  /**
   * The request datagram for {@code m} as owner {@code (lo, hi)}: padded to max_reply_size(),
   * or to a whole datagram for MAP, QUERY_HOLDERS and WATCH, whose reply page fills what it may
   * (and a WATCH's answer may come later, within the bytes its datagram left) less the seal;
   * sealed when the client has a key, in its envelope's form.
   */
  byte[] encode(Message m, long ownerLo, long ownerHi, Long epoch) {
    Datagram d = Datagram.of(m, ownerLo, ownerHi);
    if (epoch != null) {
      d.hasEpoch = true;
      d.epoch = epoch;
    }
    boolean paged = m.type == MessageType.MAP || m.type == MessageType.QUERY_HOLDERS
        || m.type == MessageType.WATCH;
    byte[] bytes = paged
        ? Codec.encode(d, Protocol.MAX_DATAGRAM_SIZE - (envelope != null ? envelope.overhead() : 0))
        : Codec.encodeRequest(d);
    if (envelope != null) {
      if (bytes.length + envelope.overhead() > Protocol.MAX_DATAGRAM_SIZE) {
        throw new IllegalArgumentException("request too large to seal");
      }
      bytes = envelope.seal(bytes);
    }
    return bytes;
  }

  /**
   * Sends {@code m} (its request id set by the caller) to {@code node} as owner (lo, hi) and
   * retransmits it until answered or {@code timeoutNanos} pass. The future completes with the
   * reply, or null without one; never exceptionally but for a closed client.
   */
  PendingCall call(InetSocketAddress node, Message m, long ownerLo, long ownerHi,
      long timeoutNanos) {
    return call(node, m, ownerLo, ownerHi, timeoutNanos, null, null);
  }

  /**
   * As {@link #call(InetSocketAddress, Message, long, long, long)}, the datagram carrying {@code
   * epoch} (the cluster map's that routed it; null: none), and {@code onSilent} (null: none)
   * run after every {@link ClusterDirectory#SILENT_SENDS} sends still unanswered.
   */
  PendingCall call(InetSocketAddress node, Message m, long ownerLo, long ownerHi,
      long timeoutNanos, Long epoch, Runnable onSilent) {
    byte[] bytes = encode(m, ownerLo, ownerHi, epoch);
    PendingCall call = new PendingCall(m.type, m.key, bytes, node, ownerLo, ownerHi,
        System.nanoTime() + timeoutNanos);
    if (closed) {
      call.future.completeExceptionally(new ClientClosedException());
      return call;
    }
    call.keyList = m.keyList;
    call.keyCount = m.keyCount;
    call.onSilent = onSilent;
    calls.put(m.requestId, call);
    call.interval = initialRetransmitNanos;
    transmit(m.requestId, call);
    return call;
  }

  /** One datagram, no answer awaited (a best-effort RELEASE). */
  void sendOnce(InetSocketAddress node, Message m, long ownerLo, long ownerHi) {
    sendOnce(node, m, ownerLo, ownerHi, null);
  }

  void sendOnce(InetSocketAddress node, Message m, long ownerLo, long ownerHi, Long epoch) {
    if (closed) return;
    send(encode(m, ownerLo, ownerHi, epoch), node);
  }

  /**
   * Gives up on {@code call}: its future is cancelled, and a GRANTED that still arrives for it
   * (a queued acquire answered later) is released at once, so no lease outlives its caller's
   * interest by more than a datagram.
   */
  void abandon(long requestId, PendingCall call) {
    call.abandoned = true;
    call.future.cancel(false);
    if (!call.type.queuesWhenWaiting()) calls.remove(requestId, call);
  }

  private void transmit(long requestId, PendingCall call) {
    if (call.future.isDone() && !call.abandoned) return;
    long now = System.nanoTime();
    long left = call.deadline - now;
    if (left <= 0 || closed) {
      calls.remove(requestId, call);
      call.future.complete(null);
      return;
    }
    if (!call.abandoned) {
      send(call.datagram, call.node);
      if (call.onSilent != null && ++call.sends % ClusterDirectory.SILENT_SENDS == 0) {
        call.onSilent.run();
      }
    }
    double jitter = ThreadLocalRandom.current().nextDouble(0.75, 1.25);
    long wait = Math.min((long) (call.interval * jitter), left);
    call.interval = Math.min(call.interval * 2, maxRetransmitNanos);
    try {
      call.retransmission =
          timer.schedule(() -> transmit(requestId, call), wait, TimeUnit.NANOSECONDS);
    } catch (java.util.concurrent.RejectedExecutionException e) {
      calls.remove(requestId, call);
      call.future.completeExceptionally(new ClientClosedException());
    }
  }

  private void send(byte[] bytes, InetSocketAddress node) {
    try {
      channel.send(ByteBuffer.wrap(bytes), node);
    } catch (IOException e) {
      // As a lost datagram: retransmitted.
    }
  }

  private void receive() {
    ByteBuffer buffer = ByteBuffer.allocate(Protocol.MAX_DATAGRAM_SIZE + 64);
    while (!closed) {
      buffer.clear();
      try {
        channel.receive(buffer);
      } catch (ClosedChannelException e) {
        return;
      } catch (IOException e) {
        continue;  // an ICMP error surfaced: as a lost datagram
      }
      buffer.flip();
      dispatch(buffer.array(), buffer.limit());
    }
  }

  private void dispatch(byte[] data, int length) {
    if (envelope != null) {
      byte[] plain = envelope.open(data, length);
      if (plain == null) {
        if (looksLikeShardlock(data, length)) authMismatches.incrementAndGet();
        return;
      }
      data = plain;
      length = plain.length;
    } else if (length > Protocol.HEADER_FLAGS_OFFSET
        && (data[Protocol.HEADER_FLAGS_OFFSET] & Protocol.FLAG_AUTHENTICATED) != 0) {
      if (looksLikeShardlock(data, length)) authMismatches.incrementAndGet();
      return;
    }
    DecodeResult r = Codec.decode(data, 0, length);
    if (!r.ok()) {
      malformed.incrementAndGet();
      return;
    }
    for (Message reply : r.datagram.messages) {
      PendingCall call = calls.get(reply.requestId);
      if (call == null) continue;
      if (!call.type.answeredBy(reply.type)) continue;
      if (reply.type.replyCarriesKey() && !Arrays.equals(reply.key, call.key)) continue;
      if (!calls.remove(reply.requestId, call)) continue;
      java.util.concurrent.ScheduledFuture<?> next = call.retransmission;
      if (next != null) next.cancel(false);
      if (call.abandoned) {
        if (reply.type == MessageType.GRANTED) {
          Message release = new Message(MessageType.RELEASE, newRequestId());
          release.key = call.key;
          release.token = reply.token;
          sendOnce(call.node, release, call.ownerLo, call.ownerHi);
        } else if (reply.type == MessageType.GRANTED_MANY) {
          int at = 0;
          for (int i = 0; i < call.keyCount && i < reply.listedTokenCount(); ++i) {
            int n = (call.keyList[at] & 0xFF) | (call.keyList[at + 1] & 0xFF) << 8;
            Message release = new Message(MessageType.RELEASE, newRequestId());
            release.key = Arrays.copyOfRange(call.keyList, at + 2, at + 2 + n);
            release.token = reply.listedToken(i);
            sendOnce(call.node, release, call.ownerLo, call.ownerHi);
            at += 2 + n;
          }
        }
        continue;
      }
      call.future.complete(reply);
    }
  }

  private static boolean looksLikeShardlock(byte[] data, int length) {
    return length >= 4 && (data[0] & 0xFF) == 0x53 && (data[1] & 0xFF) == 0x48
        && (data[2] & 0xFF) == 0x4C && (data[3] & 0xFF) == 0x4B;
  }

  @Override
  public void close() {
    if (closed) return;
    closed = true;
    try {
      channel.close();
    } catch (IOException e) {
      // Nothing left to do with it.
    }
    for (PendingCall call : calls.values()) {
      call.future.completeExceptionally(new ClientClosedException());
    }
    calls.clear();
    try {
      receiver.join(1000);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  boolean closed() {
    return closed;
  }

  static boolean cancelled(Throwable t) {
    return t instanceof CancellationException;
  }
}
