package io.shardlock;

import io.shardlock.wire.Envelope;
import io.shardlock.wire.Message;
import io.shardlock.wire.MessageType;
import io.shardlock.wire.Protocol;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.Inet6Address;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A shardlock client: leases and locks from Java over UDP, no JNI. Thread-safe; any number of
 * threads may share one client, and each acquire contends as an owner of its own, so threads of
 * one client exclude each other exactly as separate processes do.
 *
 * <pre>{@code
 * try (ShardLockClient client = ShardLockClient.create(
 *         ShardLockConfig.builder().servers("127.0.0.1:7420").build())) {
 *   FencedLock lock = client.getLock("orders/42");
 *   lock.lock();
 *   try {
 *     storage.write(data, lock.getFence());
 *   } finally {
 *     lock.unlock();
 *   }
 * }
 * }</pre>
 *
 * <p>Threads: one receiver (reads the socket, completes calls), one timer (retransmissions and
 * the watchdog) and one event thread (lost-lease listeners), all daemons, all stopped by {@link
 * #close()}. Leases still held then become inert and expire on the server after their TTL.
 */
public final class ShardLockClient implements AutoCloseable {
  private final ShardLockConfig config;
  // The servers in the router's order (its ids are the addresses as written, weight 1 each, as
  // the C++ client's ClientRouting), and the router over them; null for one server.
  private final java.util.List<InetSocketAddress> nodes = new java.util.ArrayList<>();
  private final ConcurrentHashMap<InetSocketAddress, String> nodeTexts =
      new ConcurrentHashMap<>();
  private final io.shardlock.route.Router router;
  // Cluster mode (discover(true)): the cluster's map, which routes every key; null otherwise.
  private final ClusterDirectory directory;
  private final Transport transport;
  private final ScheduledThreadPoolExecutor timer;
  private final ExecutorService events;
  private final long clientLo;
  private final long clientHi;
  private final AtomicInteger handles = new AtomicInteger();
  private final ConcurrentHashMap<String, FencedLock> locks = new ConcurrentHashMap<>();
  private final ConcurrentHashMap<String, FencedReadWriteLock> readWriteLocks =
      new ConcurrentHashMap<>();
  private final long requestTimeoutNanos;

  // shardlockd's default --max-wait: the first round of a wait without end, and the first guess
  // when a longer round is refused; halved from there while refused.
  static final long USUAL_MAX_WAIT_MS = 300_000;
  private static final long LAST_TRY_MARGIN_NANOS = TimeUnit.MILLISECONDS.toNanos(10);

  private ShardLockClient(ShardLockConfig config) throws IOException {
    this.config = config;
    java.util.List<io.shardlock.route.Router.Member> members = new java.util.ArrayList<>();
    java.util.Map<String, InetSocketAddress> byText = new java.util.HashMap<>();
    java.util.List<InetSocketAddress> seeds = new java.util.ArrayList<>();
    for (String text : config.servers()) {
      InetSocketAddress address = parseServer(text);
      if (!config.discover() && nodeTexts.containsKey(address)) {
        throw new IllegalArgumentException("servers '" + nodeTexts.get(address) + "' and '" + text
            + "' are the same address: each server must be listed once");
      }
      if (!nodeTexts.isEmpty() && (address.getAddress() instanceof Inet6Address)
          != (nodeTexts.keySet().iterator().next().getAddress() instanceof Inet6Address)) {
        throw new IllegalArgumentException("the servers must all be IPv4 or all IPv6");
      }
      nodeTexts.putIfAbsent(address, text);
      byText.put(text, address);
      if (!seeds.contains(address)) seeds.add(address);
      members.add(new io.shardlock.route.Router.Member(text.getBytes(StandardCharsets.UTF_8), 1));
    }
    if (config.discover() || members.size() == 1) {
      this.router = null;
      nodes.addAll(seeds);
    } else {
      this.router = new io.shardlock.route.Router(members);
      for (byte[] id : router.ids()) nodes.add(byText.get(new String(id, StandardCharsets.UTF_8)));
    }
    InetSocketAddress server = nodes.get(0);
    Envelope envelope = config.envelope(System::getenv);
    this.requestTimeoutNanos = config.requestTimeout().toNanos();
    this.timer = new ScheduledThreadPoolExecutor(1, daemon("shardlock-timer"));
    this.timer.setRemoveOnCancelPolicy(true);
    this.events = Executors.newSingleThreadExecutor(daemon("shardlock-events"));
    SecureRandom random = new SecureRandom();
    this.clientLo = random.nextLong();
    long hi = random.nextLong();
    if (envelope != null && envelope.form() != Envelope.Form.LEGACY) {
      // The server forces the tenant's key id into the top 32 bits of every owner id (docs/
      // security.md); choosing them so keeps the ids this client sees its own, as the C++
      // client's choose_identity() does.
      hi = (hi & 0xFFFFFFFFL) | (long) envelope.keyId() << 32;
    }
    this.clientHi = hi;
    this.transport = new Transport(server.getAddress() instanceof Inet6Address, envelope, timer,
        config.initialRetransmit().toNanos(), config.maxRetransmit().toNanos());
    this.directory = config.discover() ? new ClusterDirectory(this, seeds, nodeTexts) : null;
    if (directory != null) {
      try {
        directory.discover();
      } catch (RuntimeException e) {
        close();
        throw e;
      }
    }
  }

  /**
   * A client for {@code config}'s server. Throws IllegalArgumentException for an address that
   * does not parse or resolve, UncheckedIOException when the socket or key file cannot be
   * opened. With {@code discover(true)} it reads the cluster's map from the seeds first, and
   * throws {@link UnreachableException} (naming each seed's reason) when none gives one.
   */
  public static ShardLockClient create(ShardLockConfig config) {
    try {
      return new ShardLockClient(config);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static java.util.concurrent.ThreadFactory daemon(String name) {
    return r -> {
      Thread t = new Thread(r, name);
      t.setDaemon(true);
      return t;
    };
  }

  static InetSocketAddress parseServer(String text) {
    String host;
    String port;
    if (text.startsWith("[")) {
      int end = text.indexOf("]:");
      if (end < 0) throw badAddress(text);
      host = text.substring(1, end);
      port = text.substring(end + 2);
    } else {
      int colon = text.lastIndexOf(':');
      if (colon <= 0) throw badAddress(text);
      host = text.substring(0, colon);
      port = text.substring(colon + 1);
    }
    int p;
    try {
      p = Integer.parseInt(port);
    } catch (NumberFormatException e) {
      throw badAddress(text);
    }
    if (p <= 0 || p > 65535) throw badAddress(text);
    InetSocketAddress address = new InetSocketAddress(host, p);
    if (address.isUnresolved()) throw new IllegalArgumentException(text + " does not resolve");
    return address;
  }

  private static IllegalArgumentException badAddress(String text) {
    return new IllegalArgumentException("a server address is HOST:PORT or [IPV6]:PORT, not '"
        + text + "'");
  }

  // ---- public API --------------------------------------------------------------------------

  /** The client's identity: 32 hex digits, hi then lo. No lease has it as its owner. */
  public String clientId() {
    return String.format("%016x%016x", clientHi, clientLo);
  }

  public ShardLockConfig config() {
    return config;
  }

  /**
   * The lock named {@code name} (a key of 1..256 UTF-8 bytes): the same object for the same
   * name, so its reentrancy is per thread across every caller of this client.
   */
  public FencedLock getLock(String name) {
    keyBytes(name);
    return locks.computeIfAbsent(name, n -> new FencedLock(this, n));
  }

  /**
   * The read-write lock named {@code name} (shared leases for readers, an exclusive one for the
   * writer, on one key): the same object for the same name. It takes the key {@code name}, as
   * {@link #getLock} does, so its write lock and getLock(name) exclude each other.
   */
  public FencedReadWriteLock getReadWriteLock(String name) {
    keyBytes(name);
    return readWriteLocks.computeIfAbsent(name, n -> new FencedReadWriteLock(this, n));
  }

  /**
   * A lock over all of {@code names} at once (2..16 keys of one server), all or nothing and
   * deadlock-free: see {@link FencedMultiLock}.
   */
  public FencedMultiLock getMultiLock(String... names) {
    if (names.length < 1 || names.length > Protocol.MAX_KEYS_PER_REQUEST) {
      throw new IllegalArgumentException("a multi-lock takes 1..16 keys, not " + names.length);
    }
    java.util.Set<String> seen = new java.util.HashSet<>();
    for (String n : names) {
      keyBytes(n);
      if (!seen.add(n)) throw new IllegalArgumentException("a key twice: " + n);
    }
    return new FencedMultiLock(this, java.util.List.of(names));
  }

  /** The election named {@code name} (a lease key), for one campaigner: see {@link Election}. */
  public Election getElection(String name) {
    return new Election(this, name);
  }

  /** A {@link KeyWatch} following {@code key}: its state now, then each change once. */
  public KeyWatch watch(String key) {
    return new KeyWatch(this, key);
  }

  /**
   * A counting semaphore of {@code permits} on the key {@code name}: at most that many holders
   * at once, each with a lease (and fencing token) of its own. The first user's limit holds
   * until the key is idle; another limit meanwhile is refused (ServerErrorException 12).
   */
  public FencedSemaphore getSemaphore(String name, int permits) {
    keyBytes(name);
    if (permits < 1 || permits > Protocol.MAX_PERMITS) {
      throw new IllegalArgumentException("permits must be 1..65535, not " + permits);
    }
    return new FencedSemaphore(this, name, permits);
  }

  /**
   * Takes {@code key} exclusively for {@code ttl}, waiting up to {@code wait} for a holder to
   * let go ({@code wait} 0: a try; negative: until granted). The lease renews itself when {@code
   * watchdog} is set. Blocks at most wait + the request timeout. Throws {@link
   * LockBusyException} (a try, the key held), {@link WaitTimeoutException}, {@link
   * RecoveringException} (only once the wait is spent), {@link UnreachableException}, {@link
   * ServerErrorException}; InterruptedException, after giving up the request (a grant that
   * arrives later is released at once).
   */
  public Lease acquire(String key, long ttl, long wait, TimeUnit unit, boolean watchdog)
      throws InterruptedException {
    return await(acquireAsync(key, LeaseMode.EXCLUSIVE, 0, ttl, wait, unit, watchdog), true);
  }

  /**
   * The asynchronous acquire: as {@link #acquire}, for {@code mode} (PERMIT: one of {@code
   * permits}). The future completes with the lease or exceptionally with the
   * ShardLockException; cancelling it gives up the request, and a grant that arrives afterwards
   * is released.
   */
  public CompletableFuture<Lease> acquireAsync(String key, LeaseMode mode, int permits, long ttl,
      long wait, TimeUnit unit, boolean watchdog) {
    return acquireAsync(key, mode, permits, ttl, wait, unit, watchdog, new byte[0]);
  }

  /**
   * As {@link #acquireAsync(String, LeaseMode, int, long, long, TimeUnit, boolean)}, attaching
   * {@code value} (0..256 bytes; empty: none) to the holder it makes: a leader's address, a host
   * name and pid, which watches and holder listings show, kept through renewals.
   */
  public CompletableFuture<Lease> acquireAsync(String key, LeaseMode mode, int permits, long ttl,
      long wait, TimeUnit unit, boolean watchdog, byte[] value) {
    if (value.length > Protocol.MAX_HOLDER_VALUE_LENGTH) {
      throw new IllegalArgumentException("a holder value is at most 256 bytes");
    }
    byte[] data = keyBytes(key);
    long ttlMs = unit.toMillis(ttl);
    if (ttlMs < 1 || ttlMs > 0xFFFFFFFFL) {
      throw new IllegalArgumentException("ttl out of range: " + ttl + " " + unit);
    }
    if (mode == LeaseMode.PERMIT && (permits < 1 || permits > Protocol.MAX_PERMITS)) {
      throw new IllegalArgumentException("permits must be 1..65535, not " + permits);
    }
    if (transport.closed()) throw new ClientClosedException();
    long waitNanos = wait < 0 ? -1 : unit.toNanos(wait);
    AcquireOperation op = new AcquireOperation(key, data, mode, permits, ttlMs, waitNanos,
        watchdog, newOwnerLo());
    op.value = value.clone();
    op.start();
    return op.result;
  }

  /**
   * Takes every key of {@code keys} (2..16 distinct keys of one server) all or nothing, in one
   * ACQUIRE_MANY: either a lease per key, in the given order, or none held. With a wait the
   * server takes the keys in its global key order, so two multi-key acquires never wait for each
   * other in a cycle. {@code mode}: EXCLUSIVE or SHARED. Fails as {@link #acquireAsync} does; a
   * busy key is named in the {@link LockBusyException}.
   */
  public CompletableFuture<java.util.List<Lease>> acquireManyAsync(java.util.List<String> keys,
      LeaseMode mode, long ttl, long wait, TimeUnit unit, boolean watchdog) {
    if (keys.isEmpty() || keys.size() > Protocol.MAX_KEYS_PER_REQUEST) {
      throw new IllegalArgumentException("a multi-key acquire takes 1..16 keys, not "
          + keys.size());
    }
    if (mode == LeaseMode.PERMIT) throw new IllegalArgumentException("no multi-key permits");
    if (new java.util.HashSet<>(keys).size() != keys.size()) {
      throw new IllegalArgumentException("a key twice in " + keys);
    }
    java.io.ByteArrayOutputStream list = new java.io.ByteArrayOutputStream();
    for (String k : keys) {
      byte[] b = keyBytes(k);
      list.write(b.length & 0xFF);
      list.write(b.length >>> 8);
      list.writeBytes(b);
    }
    long ttlMs = unit.toMillis(ttl);
    if (ttlMs < 1 || ttlMs > 0xFFFFFFFFL) {
      throw new IllegalArgumentException("ttl out of range: " + ttl + " " + unit);
    }
    if (transport.closed()) throw new ClientClosedException();
    long waitNanos = wait < 0 ? -1 : unit.toNanos(wait);
    AcquireOperation op = new AcquireOperation(String.join(",", keys), new byte[0], mode, 0,
        ttlMs, waitNanos, watchdog, newOwnerLo());
    op.many = java.util.List.copyOf(keys);
    op.routeKey = keyBytes(keys.get(0));
    op.server = nodeFor(op.routeKey);
    for (String k : keys) {
      if (!nodeFor(keyBytes(k)).equals(op.server)) {
        throw new IllegalArgumentException("the keys are owned by different servers ('"
            + keys.get(0) + "' by " + addressFor(keys.get(0)) + ", '" + k + "' by "
            + addressFor(k) + "); one multi-key acquire takes keys of one server");
      }
    }
    op.keyList = list.toByteArray();
    op.start();
    return op.manyResult;
  }

  /** Stops the client's threads and closes its socket; calls in flight fail. Idempotent. */
  @Override
  public void close() {
    transport.close();
    timer.shutdownNow();
    events.shutdown();
  }

  // ---- what the lock types and leases share ------------------------------------------------

  Transport transport() {
    return transport;
  }

  ScheduledExecutorService timer() {
    return timer;
  }

  ExecutorService events() {
    return events;
  }

  long clientLo() {
    return clientLo;
  }

  long clientHi() {
    return clientHi;
  }

  long requestTimeoutNanos() {
    return requestTimeoutNanos;
  }

  long driftMarginNanos(long ttlMs) {
    return (long) (config.clockDriftFactor() * TimeUnit.MILLISECONDS.toNanos(ttlMs))
        + config.clockDriftAllowance().toNanos();
  }

  /** The owner of a fresh handle: the client id with a per-client count in the low 32 bits. */
  private long newOwnerLo() {
    int own = (int) clientLo;
    int handle = handles.incrementAndGet();
    if (handle == own) handle = handles.incrementAndGet();
    return (clientLo & ~0xFFFFFFFFL) | (handle & 0xFFFFFFFFL);
  }

  static byte[] keyBytes(String key) {
    byte[] data = key.getBytes(StandardCharsets.UTF_8);
    if (data.length < Protocol.MIN_KEY_LENGTH || data.length > Protocol.MAX_KEY_LENGTH) {
      throw new IllegalArgumentException("a key must be 1..256 bytes, not " + data.length);
    }
    return data;
  }

  /**
   * The server that owns {@code key}: its owner under the cluster's current map (cluster mode),
   * the only one, or its owner under the Router over the servers as written (weight 1 each), so
   * every client agrees whatever order it lists them in.
   */
  InetSocketAddress nodeFor(byte[] key) {
    if (directory != null) return directory.current().ownerOf(key);
    return router == null ? nodes.get(0) : nodes.get(router.ownerIndex(key));
  }

  /** The "host:port" a call on {@code key} goes to (now: a cluster's map may change). */
  public String addressFor(String key) {
    byte[] k = keyBytes(key);
    if (directory != null) return directory.current().textOf(k);
    return nodeTexts.get(nodeFor(k));
  }

  /** Cluster mode: the epoch of the map the client routes by; 0 otherwise. */
  public long mapEpoch() {
    return directory == null ? 0 : directory.current().epoch;
  }

  /** Cluster mode: the map's members as "host:port", in the Router's order; empty otherwise. */
  public java.util.List<String> mapMembers() {
    return directory == null ? java.util.List.of() : directory.current().texts;
  }

  /** Where a routed call ended: its last reply (null: none by the deadline), from which node. */
  static final class Routed {
    final Message reply;
    final InetSocketAddress node;
    final long sent;  // the first send of the request id that was answered

    Routed(Message reply, InetSocketAddress node, long sent) {
      this.reply = reply;
      this.node = node;
      this.sent = sent;
    }
  }

  /**
   * One call on {@code key} to its owner until {@code deadline} (System.nanoTime()), each attempt
   * a fresh request id from {@code make}. In cluster mode (the C++ CallEngine, the Python
   * client's _routed_steps) every datagram carries the routing map's epoch; a REDIRECT from a
   * node with a newer map refreshes ours from that node first and goes to the owner under it
   * (at most {@link ClusterDirectory#MAX_REDIRECTS} hops), one from a node behind ours is asked
   * again there after 20 ms; every {@link ClusterDirectory#SILENT_SENDS} unanswered sends
   * refresh the map from the members and seeds (the silent node last), and a call whose key
   * moved goes to its new owner. Without a map a REDIRECT is the answer. The future completes
   * with the final answer (RECOVERING is the caller's); cancelling it gives up the attempt in
   * flight (a late grant is released).
   */
  CompletableFuture<Routed> routed(byte[] key, java.util.function.Supplier<Message> make,
      long ownerLo, long ownerHi, long deadline) {
    RoutedCall call = new RoutedCall(key, make, ownerLo, ownerHi, deadline);
    call.attempt();
    return call.result;
  }

  private final class RoutedCall {
    final byte[] key;
    final java.util.function.Supplier<Message> make;
    final long ownerLo;
    final long ownerHi;
    final long deadline;
    final CompletableFuture<Routed> result = new CompletableFuture<>();
    int redirects;
    Message lastReply;
    InetSocketAddress lastNode;
    long lastSent;
    volatile Attempt inFlight;

    /** One request id at one node. */
    final class Attempt {
      final InetSocketAddress node;
      final ClusterDirectory.ClusterMap routedBy;
      final long requestId;
      final long sent = System.nanoTime();
      final java.util.concurrent.atomic.AtomicBoolean settled =
          new java.util.concurrent.atomic.AtomicBoolean();
      Transport.PendingCall call;

      Attempt(InetSocketAddress node, ClusterDirectory.ClusterMap routedBy, long requestId) {
        this.node = node;
        this.routedBy = routedBy;
        this.requestId = requestId;
      }

      /** Gives this attempt up unless it was answered; true if it was given up. */
      boolean giveUp() {
        if (!settled.compareAndSet(false, true)) return false;
        transport.abandon(requestId, call);
        return true;
      }
    }

    RoutedCall(byte[] key, java.util.function.Supplier<Message> make, long ownerLo,
        long ownerHi, long deadline) {
      this.key = key;
      this.make = make;
      this.ownerLo = ownerLo;
      this.ownerHi = ownerHi;
      this.deadline = deadline;
      result.whenComplete((r, error) -> {
        if (error instanceof CancellationException) {
          Attempt a = inFlight;
          if (a != null) a.giveUp();
        }
      });
    }

    void attempt() {
      if (result.isDone()) return;
      long now = System.nanoTime();
      if (lastNode != null && now - deadline >= 0) {
        result.complete(new Routed(lastReply, lastNode, lastSent));
        return;
      }
      ClusterDirectory.ClusterMap map = directory == null ? null : directory.current();
      InetSocketAddress node = map != null ? map.ownerOf(key) : nodeFor(key);
      Message m = make.get();
      Attempt a = new Attempt(node, map, m.requestId);
      Runnable onSilent = map == null ? null : () -> onSilent(a);
      a.call = transport.call(node, m, ownerLo, ownerHi, Math.max(1, deadline - now),
          map == null ? null : map.epoch, onSilent);
      inFlight = a;
      if (result.isCancelled()) {
        a.giveUp();
        return;
      }
      a.call.future.whenComplete((reply, error) -> {
        if (!a.settled.compareAndSet(false, true)) return;  // moved on, or cancelled
        if (error != null) {
          if (!(error instanceof CancellationException)) result.completeExceptionally(error);
          return;
        }
        try {
          answered(a, reply);
        } catch (RuntimeException e) {
          result.completeExceptionally(e);
        }
      });
    }

    /** Cluster mode, SILENT_SENDS more sends unanswered: refresh, and move if the key moved. */
    private void onSilent(Attempt a) {
      directory.refresh(null, a.node).whenComplete((v, e) -> {
        ClusterDirectory.ClusterMap now = directory.current();
        if (now == a.routedBy || now.ownerOf(key).equals(a.node)) return;
        if (a.giveUp()) attempt();
      });
    }

    private void answered(Attempt a, Message reply) {
      lastReply = reply;
      lastNode = a.node;
      lastSent = a.sent;
      if (reply == null || reply.type != MessageType.REDIRECT || a.routedBy == null) {
        result.complete(new Routed(reply, a.node, a.sent));
        return;
      }
      boolean behind = Long.compareUnsigned(reply.epoch, a.routedBy.epoch) < 0
          && directory.current() == a.routedBy;
      if (behind) {
        later(a);  // the node will catch up with our map: not a hop
        return;
      }
      if (++redirects > ClusterDirectory.MAX_REDIRECTS) {
        result.complete(new Routed(reply, a.node, a.sent));
        return;
      }
      if (Long.compareUnsigned(reply.epoch, a.routedBy.epoch) > 0) {
        directory.refresh(a.node, null).whenComplete((v, e) -> later(a));
      } else {
        later(a);
      }
    }

    /** Asks again: at once if the map changed since {@code a} was routed, else after 20 ms. */
    private void later(Attempt a) {
      if (directory.current() != a.routedBy) {
        attempt();
        return;
      }
      long delay = Math.max(0, Math.min(ClusterDirectory.REDIRECT_RETRY_NANOS,
          deadline - System.nanoTime()));
      try {
        timer.schedule(this::attempt, delay, TimeUnit.NANOSECONDS);
      } catch (java.util.concurrent.RejectedExecutionException e) {
        result.completeExceptionally(new ClientClosedException());
      }
    }
  }

  /** What a silent call means: no answer at all, or answers that failed authentication. */
  UnreachableException unreachable(InetSocketAddress node, String what, String key,
      long waitedNanos, long mismatchesBefore) {
    long seen = transport.authMismatches() - Math.max(0, mismatchesBefore);
    String serverText = nodeTexts.getOrDefault(node, String.valueOf(node));
    String base = "no answer from " + serverText + " to " + what + " '" + key + "' within "
        + TimeUnit.NANOSECONDS.toMillis(waitedNanos) + " ms";
    Envelope envelope = transport.envelope();
    if (mismatchesBefore >= 0 && seen > 0) {
      return new AuthenticationFailedException(seen + " repl" + (seen == 1 ? "y" : "ies") + " from "
          + serverText + " failed authentication: " + (envelope != null
              ? "the server sends them unsealed, in another form or under another key (its "
                  + "--auth-key or --tenants key is not ours)"
              : "the server seals them (it has an --auth-key or --tenants; give this client "
                  + "the key with authKeyFile)"));
    }
    String hint;
    if (envelope == null) {
      hint = ", and does it want datagrams sealed (--auth-key, --tenants)?";
    } else if (envelope.form() == Envelope.Form.LEGACY) {
      hint = " with this --auth-key?";
    } else {
      // The server drops what does not open under a tenant's key, answering nothing.
      hint = ", with key id " + Integer.toUnsignedString(envelope.keyId()) + " a tenant of its "
          + "--tenants under this key" + (envelope.form().encrypts() ? "" : " (encrypt=yes "
          + "there wants encrypt(true) here)") + (envelope.form().aes() ? ", on a CPU with "
          + "AES-NI (else cipher(PORTABLE))" : "") + "?";
    }
    return new UnreachableException(base + ": is shardlockd running there" + hint);
  }

  /**
   * Seconds to wait before asking a server that answered RECOVERING again: what it said (at
   * least 10 ms) plus a random quarter of it (at most 250 ms), so clients told the same time do
   * not all come back at once.
   */
  static long retryDelayNanos(long retryAfterMs) {
    long base = TimeUnit.MILLISECONDS.toNanos(Math.max(retryAfterMs, 10));
    long spread = Math.min(base / 4, TimeUnit.MILLISECONDS.toNanos(250));
    return base + (spread > 0 ? ThreadLocalRandom.current().nextLong(spread) : 0);
  }

  /** Waits for {@code future}; interrupts cancel it (interruptible) or are kept for later. */
  static <T> T await(CompletableFuture<T> future, boolean interruptible)
      throws InterruptedException {
    boolean interrupted = false;
    try {
      while (true) {
        try {
          return future.get();
        } catch (InterruptedException e) {
          if (interruptible) {
            future.cancel(false);
            throw e;
          }
          interrupted = true;
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

  /**
   * One acquire as the rounds the server is asked for (the C++ acquire_in_rounds()): a round
   * answered TIMEOUT while the wait lasts is asked again, one refused as longer than the
   * server's --max-wait is halved, and a RECOVERING answer is asked again after the server's
   * retry_after (jittered) while the wait lasts. Each round is a fresh request id; each runs on
   * whichever thread completed the previous one.
   */
  private final class AcquireOperation {
    final String name;
    final byte[] key;
    final LeaseMode mode;
    final int permits;
    final long ttlMs;
    final boolean forever;
    final boolean waits;
    final long waitEnd;
    final boolean watchdog;
    final long ownerLo;
    long roundMs;
    long askedMs;
    long roundEnd;  // System.nanoTime() when the round's wait ends
    InetSocketAddress server;  // the key's node (a multi-key acquire's: every key's)
    byte[] value = new byte[0];  // the holder value
    final long mismatchesAtStart = transport.authMismatches();
    final CompletableFuture<Lease> result = new CompletableFuture<>();
    // A multi-key acquire: its keys, their wire list, and the future its caller holds.
    java.util.List<String> many;
    byte[] keyList;
    final CompletableFuture<java.util.List<Lease>> manyResult = new CompletableFuture<>();
    // The round in flight, for cancel().
    volatile CompletableFuture<Routed> inFlight;
    // The key that routes the rounds (a multi-key acquire's first).
    byte[] routeKey;

    AcquireOperation(String name, byte[] key, LeaseMode mode, int permits, long ttlMs,
        long waitNanos, boolean watchdog, long ownerLo) {
      this.name = name;
      this.key = key;
      this.mode = mode;
      this.permits = permits;
      this.ttlMs = ttlMs;
      this.forever = waitNanos < 0;
      this.waits = forever || waitNanos > 0;
      this.waitEnd = System.nanoTime() + Math.max(0, waitNanos);
      this.watchdog = watchdog;
      this.ownerLo = ownerLo;
      this.routeKey = key;
      this.roundMs = forever ? USUAL_MAX_WAIT_MS
          : Math.min(0xFFFFFFFFL, (waitNanos + 999_999) / 1_000_000);
      result.whenComplete((lease, error) -> {
        if (error instanceof CancellationException) {
          CompletableFuture<Routed> c = inFlight;
          if (c != null) c.cancel(false);
        } else if (error != null) {
          manyResult.completeExceptionally(error);
        }
      });
      manyResult.whenComplete((leases, error) -> {
        if (error instanceof CancellationException) result.cancel(false);
      });
    }

    void start() {
      round();
    }

    private long nextWaitMs() {
      if (!waits) return 0;
      if (forever) return roundMs;
      long left = Math.max(1, (waitEnd - System.nanoTime() + 999_999) / 1_000_000);
      return Math.min(roundMs, left);
    }

    private void round() {
      if (result.isDone()) return;
      askedMs = nextWaitMs();
      roundEnd = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(askedMs);
      long timeout = TimeUnit.MILLISECONDS.toNanos(askedMs) + requestTimeoutNanos;
      CompletableFuture<Routed> c = routed(routeKey, this::request, ownerLo, clientHi,
          System.nanoTime() + timeout);
      inFlight = c;
      if (result.isCancelled()) {
        c.cancel(false);
        return;
      }
      c.whenComplete((routed, error) -> {
        if (error != null) {
          if (!(error instanceof CancellationException)) result.completeExceptionally(error);
          return;
        }
        try {
          server = routed.node;
          answer(routed.reply, routed.sent, timeout);
        } catch (RuntimeException e) {
          result.completeExceptionally(e);
        }
      });
    }

    /** The round's request, a fresh request id each time (a REDIRECT or a move asks again). */
    private Message request() {
      Message m = new Message(acquireType(), transport.newRequestId());
      m.key = key;
      m.ttlMs = ttlMs;
      // A follow-up within the round asks for the round's wait left (at least 1 ms: 0 would
      // make it a try).
      long left = (roundEnd - System.nanoTime() + 999_999) / 1_000_000;
      m.waitMs = askedMs == 0 ? 0 : Math.max(1, Math.min(askedMs, left));
      m.permits = permits;
      m.value = value;
      if (many != null) {
        m.mode = mode == LeaseMode.SHARED ? Protocol.MODE_SHARED : Protocol.MODE_EXCLUSIVE;
        m.keyCount = many.size();
        m.keyList = keyList;
      }
      return m;
    }

    private MessageType acquireType() {
      if (many != null) return MessageType.ACQUIRE_MANY;
      switch (mode) {
        case SHARED: return MessageType.ACQUIRE_SHARED;
        case PERMIT: return MessageType.ACQUIRE_PERMIT;
        default: return MessageType.ACQUIRE;
      }
    }

    private void answer(Message reply, long sent, long waited) {
      if (reply == null) {
        result.completeExceptionally(unreachable(server, acquireType().name(), name, waited,
            mismatchesAtStart));
        return;
      }
      long now = System.nanoTime();
      switch (reply.type) {
        case GRANTED:
          granted(reply, sent);
          return;
        case GRANTED_MANY:
          grantedMany(reply, sent);
          return;
        case BUSY_MANY:
          result.completeExceptionally(new LockBusyException(
              reply.index < many.size() ? many.get(reply.index) : name, reply.ttlMs));
          return;
        case BUSY:
          result.completeExceptionally(new LockBusyException(name, reply.ttlMs));
          return;
        case TIMEOUT:
          if (waits && (forever || now - waitEnd < 0)) {
            round();
          } else {
            result.completeExceptionally(new WaitTimeoutException(name));
          }
          return;
        case RECOVERING: {
          long left = waitEnd - now;
          if (!waits || (!forever && left <= LAST_TRY_MARGIN_NANOS)) {
            result.completeExceptionally(new RecoveringException(reply.retryAfterMs));
            return;
          }
          long delay = retryDelayNanos(reply.retryAfterMs);
          if (!forever) delay = Math.min(delay, left - LAST_TRY_MARGIN_NANOS);
          try {
            timer.schedule(this::round, delay, TimeUnit.NANOSECONDS);
          } catch (java.util.concurrent.RejectedExecutionException e) {
            result.completeExceptionally(new ClientClosedException());
          }
          return;
        }
        case ERROR:
          if (reply.error == Protocol.ERROR_WAIT_OUT_OF_RANGE && askedMs > 1) {
            roundMs = askedMs > USUAL_MAX_WAIT_MS ? USUAL_MAX_WAIT_MS : askedMs / 2;
            round();
            return;
          }
          result.completeExceptionally(ServerErrorException.of(reply.error));
          return;
        case REDIRECT:
          result.completeExceptionally(new RedirectedException(name, reply.epoch));
          return;
        default:
          result.completeExceptionally(new ShardLockException("unexpected reply " + reply.type));
      }
    }

    private void grantedMany(Message reply, long sent) {
      if (reply.listedTokenCount() != many.size()) {
        result.completeExceptionally(new ShardLockException("GRANTED_MANY with "
            + reply.listedTokenCount() + " tokens for " + many.size() + " keys"));
        return;
      }
      long expiry = sent + TimeUnit.MILLISECONDS.toNanos(reply.ttlMs)
          - driftMarginNanos(reply.ttlMs);
      java.util.List<Lease> leases = new java.util.ArrayList<>(many.size());
      for (int i = 0; i < many.size(); ++i) {
        leases.add(new Lease(ShardLockClient.this, many.get(i), keyBytes(many.get(i)),
            reply.listedToken(i), mode, ownerLo, clientHi, server, reply.ttlMs, sent, expiry,
            watchdog));
      }
      if (System.nanoTime() - expiry >= 0) {
        for (Lease l : leases) l.releaseQuietly();
        result.completeExceptionally(new GrantExpiredException(name));
        return;
      }
      for (Lease l : leases) l.startWatching();
      if (!manyResult.complete(leases)) {
        for (Lease l : leases) l.releaseQuietly();  // cancelled meanwhile
      }
    }

    private void granted(Message reply, long sent) {
      long expiry = sent + TimeUnit.MILLISECONDS.toNanos(reply.ttlMs)
          - driftMarginNanos(reply.ttlMs);
      Lease lease = new Lease(ShardLockClient.this, name, key, reply.token, mode, ownerLo,
          clientHi, server, reply.ttlMs, sent, expiry, watchdog);
      if (System.nanoTime() - expiry >= 0) {
        // The grant may date from any time after the first send: a wait longer than the TTL
        // can end past this expiry. Give it back rather than hand out a lease nobody can prove.
        lease.releaseQuietly();
        result.completeExceptionally(new GrantExpiredException(name));
        return;
      }
      lease.startWatching();
      if (!result.complete(lease)) lease.releaseQuietly();  // cancelled meanwhile
    }
  }
}
