package io.shardlock.route;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;

/**
 * Which cluster member owns a key: the cluster's Router (src/router.cc, docs/router.md,
 * "Implementation"), configured as the nodes configure theirs (cluster_router_options(): the
 * default seed, 2^16 buckets). A client must agree with the nodes on every key's owner, or each
 * call costs a REDIRECT; RouterTest checks the golden vectors the C++ Router produced (the same
 * file as the Python client's router.py).
 *
 * <ol>
 *   <li>The key's bucket is the top 16 bits of XXH3-64(key, seed).
 *   <li>A member of weight w has w copies. Copy c of member y scores bucket b with a keyed
 *       bijection of [0, 2^16): four rounds of multiply-by-odd, xor-shift and add mod 2^16, the
 *       constants from XXH3 of (c * 16 + round * 2 [+ 1]) as 8 little-endian bytes, seeded with
 *       XXH3(member id, seed).
 *   <li>The owner is the member whose copy scores highest; ties go to the larger tiebreak (XXH3
 *       of c * 16 + 15), then the smaller id (bytewise), then the smaller copy.
 * </ol>
 *
 * As Python's, it ranks the one bucket a lookup needs (O(total weight)) and remembers the
 * answer, rather than building the C++ Router's table of every bucket. Immutable apart from that
 * cache; thread-safe.
 */
public final class Router {
  /** "SHARDLK1": kDefaultRouterSeed. Part of the mapping: changing it moves every key. */
  public static final long SEED = 0x53484152444C4B31L;
  public static final int BUCKET_BITS = 16;
  public static final int MAX_WEIGHT = 1024;
  public static final int MAX_MEMBERS = 65535;
  private static final int ROUNDS = 4;

  private final List<byte[]> ids = new ArrayList<>();
  private final int mask = (1 << BUCKET_BITS) - 1;
  private final int shift = (BUCKET_BITS + 1) / 2;
  // One entry per copy.
  private final int[] copyIndex;
  private final int[] copyNumber;
  private final long[] tiebreak;
  private final int[][] multipliers;
  private final int[][] addends;
  private final Map<Integer, Integer> owners = new java.util.concurrent.ConcurrentHashMap<>();

  /** A member: its id (bytes) and weight. */
  public record Member(byte[] id, int weight) {}

  /**
   * The router over {@code members}. IllegalArgumentException for a membership the C++ Router
   * refuses: none or too many, an empty or repeated id, a weight outside 1..1024.
   */
  public Router(List<Member> members) {
    if (members.isEmpty() || members.size() > MAX_MEMBERS) {
      throw new IllegalArgumentException("a map of " + members.size() + " members");
    }
    List<Member> ordered = new ArrayList<>(members);
    ordered.sort((a, b) -> Arrays.compareUnsigned(a.id(), b.id()));
    int copies = 0;
    for (int i = 0; i < ordered.size(); ++i) {
      Member m = ordered.get(i);
      if (m.id().length == 0) throw new IllegalArgumentException("an empty member id");
      if (i > 0 && Arrays.equals(ordered.get(i - 1).id(), m.id())) {
        throw new IllegalArgumentException("a member id twice");
      }
      if (m.weight() < 1 || m.weight() > MAX_WEIGHT) {
        throw new IllegalArgumentException("a weight of " + m.weight() + " (must be 1..1024)");
      }
      copies += m.weight();
      ids.add(m.id().clone());
    }
    copyIndex = new int[copies];
    copyNumber = new int[copies];
    tiebreak = new long[copies];
    multipliers = new int[copies][ROUNDS];
    addends = new int[copies][ROUNDS];
    int k = 0;
    for (int index = 0; index < ordered.size(); ++index) {
      long nodeHash = Xxh3.hash(ordered.get(index).id(), SEED);
      for (int copy = 0; copy < ordered.get(index).weight(); ++copy, ++k) {
        copyIndex[k] = index;
        copyNumber[k] = copy;
        for (int r = 0; r < ROUNDS; ++r) {
          long round = (long) copy * 16 + r * 2;
          multipliers[k][r] = (int) ((hashU64(round, nodeHash) | 1) & mask);
          addends[k][r] = (int) (hashU64(round + 1, nodeHash) & mask);
        }
        tiebreak[k] = hashU64((long) copy * 16 + 15, nodeHash);
      }
    }
  }

  private static long hashU64(long value, long seed) {
    byte[] b = new byte[8];
    for (int i = 0; i < 8; ++i) b[i] = (byte) (value >>> (8 * i));
    return Xxh3.hash(b, seed);
  }

  /** The member ids, sorted bytewise: owner indices index this list. */
  public List<byte[]> ids() {
    return ids;
  }

  /** The key's bucket: the top 16 bits of its hash. */
  public static int bucket(byte[] key) {
    return (int) (Xxh3.hash(key, SEED) >>> (64 - BUCKET_BITS));
  }

  /** Index into {@link #ids()} of the bucket's owner. */
  public int ownerOfBucket(int bucket) {
    int best = -1;
    long bestScore = -1;
    long bestTie = 0;
    for (int k = 0; k < copyIndex.length; ++k) {
      long x = bucket;
      for (int r = 0; r < ROUNDS; ++r) {
        x = (x * multipliers[k][r]) & mask;
        x = ((x ^ (x >>> shift)) + addends[k][r]) & mask;
      }
      // Higher score, then higher tiebreak (unsigned), then smaller index and copy: copies come
      // in index and copy order, so a strict improvement keeps the earliest on a full tie.
      if (best < 0 || x > bestScore
          || (x == bestScore && Long.compareUnsigned(tiebreak[k], bestTie) > 0)) {
        best = k;
        bestScore = x;
        bestTie = tiebreak[k];
      }
    }
    return copyIndex[best];
  }

  /** Index into {@link #ids()} of the key's owner. */
  public int ownerIndex(byte[] key) {
    int b = bucket(key);
    Integer owner = owners.get(b);
    if (owner == null) {
      owner = ownerOfBucket(b);
      owners.put(b, owner);
    }
    return owner;
  }

  public byte[] owner(byte[] key) {
    return ids.get(ownerIndex(key));
  }
}
