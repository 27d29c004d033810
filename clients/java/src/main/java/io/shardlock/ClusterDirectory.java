package io.shardlock;

import io.shardlock.route.Router;
import io.shardlock.wire.MemberEntry;
import io.shardlock.wire.Message;
import io.shardlock.wire.MessageType;
import java.net.Inet6Address;
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

/**
 * Cluster mode's map (the C++ client's ClusterDirectory, the Python client's Routing): MAP read
 * page by page from a source until all {@code member_count} members are in, a {@link Router}
 * over the members as the nodes build theirs (id and weight, the default seed, 2^16 buckets), and
 * one refresh at a time, asking the node that redirected first, then the members, then the
 * seeds, and a node that stopped answering last. The map is swapped whole; epochs only rise.
 * Thread-safe.
 */
final class ClusterDirectory {
  /** A call follows at most this many REDIRECTs (the C++ client's kMaxRedirects). */
  static final int MAX_REDIRECTS = 8;
  /** Unanswered sends of one request to one node that make the client refresh its map. */
  static final int SILENT_SENDS = 3;
  /** A node that redirects under our own map (or is behind it) is asked again after this. */
  static final long REDIRECT_RETRY_NANOS = TimeUnit.MILLISECONDS.toNanos(20);
  /** A map that changes between two pages is read again from the start at most this often. */
  static final int MAX_MAP_RESTARTS = 3;

  /** One cluster map, immutable: members in the Router's order, so owner indices index them. */
  static final class ClusterMap {
    final long epoch;
    final Router router;
    final List<InetSocketAddress> nodes;
    final List<String> texts;

    ClusterMap(long epoch, Router router, List<InetSocketAddress> nodes, List<String> texts) {
      this.epoch = epoch;
      this.router = router;
      this.nodes = nodes;
      this.texts = texts;
    }

    InetSocketAddress ownerOf(byte[] key) {
      return nodes.get(router.ownerIndex(key));
    }

    String textOf(byte[] key) {
      return texts.get(router.ownerIndex(key));
    }
  }

  private final ShardLockClient client;
  private final List<InetSocketAddress> seeds;
  private final boolean ipv6;
  // Each member address resolved once per client; the texts for the client's messages.
  private final ConcurrentHashMap<String, InetSocketAddress> resolved = new ConcurrentHashMap<>();
  private final ConcurrentHashMap<InetSocketAddress, String> texts;
  private volatile ClusterMap map;
  private final Object lock = new Object();
  private CompletableFuture<Void> refreshing;  // under lock; null: none running

  ClusterDirectory(ShardLockClient client, List<InetSocketAddress> seeds,
      ConcurrentHashMap<InetSocketAddress, String> texts) {
    this.client = client;
    this.seeds = List.copyOf(seeds);
    this.ipv6 = seeds.get(0).getAddress() instanceof Inet6Address;
    this.texts = texts;
    for (InetSocketAddress seed : seeds) resolved.putIfAbsent(texts.get(seed), seed);
  }

  /** The current map; null before {@link #discover}. */
  ClusterMap current() {
    return map;
  }

  /**
   * Reads the first map from the seeds in turn; throws {@link UnreachableException} naming each
   * seed's reason when none gives one.
   */
  void discover() {
    StringBuilder failures = new StringBuilder();
    CompletableFuture<Void> done = new CompletableFuture<>();
    new Fetch(new ArrayList<>(seeds), failures, done).page();
    try {
      done.get();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new UnreachableException("interrupted while reading the cluster's map");
    } catch (ExecutionException e) {
      if (e.getCause() instanceof RuntimeException) throw (RuntimeException) e.getCause();
      throw new ShardLockException(e.getCause().toString(), e.getCause());
    }
    if (map == null) {
      throw new UnreachableException("no seed gave the cluster's map: " + failures);
    }
  }

  /**
   * A refresh from {@code first} (a node that redirected: its map is newer), the current map's
   * members, the seeds, then {@code last} (a node that stopped answering), each once; null
   * ones are left out. While one runs, callers share it. Completes (never exceptionally) once
   * it ends, with or without a newer map.
   */
  CompletableFuture<Void> refresh(InetSocketAddress first, InetSocketAddress last) {
    CompletableFuture<Void> done;
    List<InetSocketAddress> sources = new ArrayList<>();
    synchronized (lock) {
      if (refreshing != null) return refreshing;
      done = new CompletableFuture<>();
      refreshing = done;
      ClusterMap current = map;
      List<InetSocketAddress> candidates = new ArrayList<>();
      candidates.add(first);
      if (current != null) candidates.addAll(current.nodes);
      candidates.addAll(seeds);
      for (InetSocketAddress node : candidates) {
        if (node != null && !node.equals(last) && !sources.contains(node)) sources.add(node);
      }
      if (last != null) sources.add(last);
    }
    done.whenComplete((v, e) -> {
      synchronized (lock) {
        refreshing = null;
      }
    });
    new Fetch(sources, new StringBuilder(), done).page();
    return done;
  }

  private void adopt(ClusterMap fetched) {
    synchronized (lock) {
      if (map == null || Long.compareUnsigned(fetched.epoch, map.epoch) > 0) map = fetched;
    }
  }

  /** One map fetch: the sources in turn, each read page by page until one gives a whole map. */
  private final class Fetch {
    final List<InetSocketAddress> sources;
    final StringBuilder failures;
    final CompletableFuture<Void> done;
    int source;
    final List<MemberEntry> members = new ArrayList<>();
    long epoch;
    long count;
    int restarts;

    Fetch(List<InetSocketAddress> sources, StringBuilder failures, CompletableFuture<Void> done) {
      this.sources = sources;
      this.failures = failures;
      this.done = done;
    }

    void page() {
      if (source >= sources.size()) {
        done.complete(null);
        return;
      }
      Message m = new Message(MessageType.MAP, client.transport().newRequestId());
      m.firstMember = members.size();
      Transport.PendingCall call = client.transport().call(sources.get(source), m,
          client.clientLo(), client.clientHi(), client.requestTimeoutNanos());
      call.future.whenComplete((reply, error) -> {
        if (error != null) {
          done.complete(null);  // the client is closing: nobody else will answer either
          return;
        }
        try {
          onPage(reply);
        } catch (RuntimeException e) {
          done.completeExceptionally(e);
        }
      });
    }

    private void onPage(Message reply) {
      String why = take(reply);
      if (why == null) {
        if (members.size() < count) {
          page();
          return;
        }
        why = build();
        if (why == null) {
          done.complete(null);
          return;
        }
      }
      if (failures.length() > 0) failures.append("; ");
      failures.append(texts.getOrDefault(sources.get(source), String.valueOf(sources.get(source))))
          .append(": ").append(why);
      ++source;
      members.clear();
      epoch = 0;
      count = 0;
      restarts = 0;
      page();
    }

    /** Takes one MAP answer; null if it continues the map (maybe from the start), else why not. */
    private String take(Message reply) {
      if (reply == null) return "no answer";
      if (reply.type != MessageType.MAP_REPLY) {
        return "no map (" + (reply.type == MessageType.ERROR
            ? io.shardlock.wire.Protocol.errorText(reply.error) : reply.type.name()) + ")";
      }
      if (reply.epoch == 0) return "not a cluster node (its map has epoch 0)";
      if (epoch != 0 && (reply.epoch != epoch || reply.memberCount != count)) {
        // The map changed between two pages: read it again from the start.
        if (++restarts > MAX_MAP_RESTARTS) return "its map kept changing while it was read";
        members.clear();
        epoch = 0;
        count = 0;
        return null;
      }
      if (reply.memberCount == 0 || reply.memberCount > Router.MAX_MEMBERS) {
        return "a map of " + reply.memberCount + " members";
      }
      List<MemberEntry> page = MemberEntry.parse(reply);
      if (reply.firstMember != members.size() || page.isEmpty()
          || members.size() + page.size() > reply.memberCount) {
        return "a MAP_REPLY page that does not continue the map";
      }
      epoch = reply.epoch;
      count = reply.memberCount;
      members.addAll(page);
      return null;
    }

    /** Builds and adopts the whole map; null, or why it cannot be used. */
    private String build() {
      List<Router.Member> routed = new ArrayList<>();
      for (MemberEntry e : members) {
        if (e.weight > Router.MAX_WEIGHT) return "a member of weight " + e.weight;
        routed.add(new Router.Member(e.id, (int) e.weight));
      }
      Router router;
      try {
        router = new Router(routed);
      } catch (IllegalArgumentException e) {
        return "a map the router refuses (" + e.getMessage() + ")";
      }
      List<MemberEntry> sorted = new ArrayList<>(members);
      sorted.sort(Comparator.comparing(e -> e.id, Arrays::compareUnsigned));
      List<InetSocketAddress> nodes = new ArrayList<>();
      List<String> names = new ArrayList<>();
      int i = 0;
      for (byte[] id : router.ids()) {
        MemberEntry e = sorted.get(i++);
        if (!Arrays.equals(e.id, id)) return "the router reordered the map's members";
        InetSocketAddress node = resolved.get(e.address);
        if (node == null) {
          try {
            node = ShardLockClient.parseServer(e.address);
          } catch (IllegalArgumentException x) {
            return "member address '" + e.address + "' does not resolve";
          }
          if ((node.getAddress() instanceof Inet6Address) != ipv6) {
            return "member address '" + e.address + "' is not of the seeds' address family";
          }
          InetSocketAddress before = resolved.putIfAbsent(e.address, node);
          if (before != null) node = before;
        }
        texts.putIfAbsent(node, e.address);
        nodes.add(node);
        names.add(e.address);
      }
      adopt(new ClusterMap(epoch, router, List.copyOf(nodes), List.copyOf(names)));
      return null;
    }
  }
}
