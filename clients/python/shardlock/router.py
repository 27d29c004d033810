"""Which cluster member owns a key: the cluster's Router, one bucket at a time.

The same mapping as the C++ Router (src/router.cc, docs/router.md,
"Implementation") configured as the nodes configure theirs
(cluster_router_options() in src/cluster/cluster_map.cc): the default seed and 2^16
buckets. A client must agree with the nodes on every key's owner, or each
call costs a REDIRECT; tests/test_router.py checks golden vectors that the
C++ code produced.

1. The key's bucket is the top 16 bits of XXH3-64(key, seed).
2. A member of weight w has w copies. Copy c of member y scores bucket b with
   a keyed bijection of [0, 2^16): four rounds of multiply-by-odd, xor-shift
   and add mod 2^16, the constants from XXH3 of (c * 16 + round * 2 [+ 1]) as
   8 little-endian bytes, seeded with XXH3(member id, seed).
3. The owner is the member whose copy scores highest; ties go to the larger
   tiebreak (XXH3 of c * 16 + 15), then the smaller id (bytewise), then the
   smaller copy.

The C++ Router stores the owner of every bucket in a table; building it costs
about 2^16 (ln copies + 1) permutation steps, far too slow in Python for a
client that asks about a handful of keys. owner_index() ranks the one bucket
it needs instead: O(total weight) per lookup. The per-copy constants (4 XXH3
calls per round) are computed once per map.

XXH3 comes from the `xxhash` package (Debian: python3-xxhash; PyPI: xxhash),
needed only in cluster mode.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

try:
    import xxhash as _xxhash
except ImportError:  # pragma: no cover - depends on the machine
    _xxhash = None  # type: ignore[assignment]  # None: require_xxhash() says how to install it

# "SHARDLK1": kDefaultRouterSeed. Part of the mapping: changing it moves every key.
SEED = 0x53484152444C4B31
BUCKET_BITS = 16  # kClusterBucketBits / ClientRouting::kBucketBits
MAX_WEIGHT = 1024  # kMaxWeight
MAX_MEMBERS = 65535  # RouterSnapshot::kMaxNodes
_ROUNDS = 4
_U64 = 0xFFFFFFFFFFFFFFFF


def require_xxhash() -> None:
    """Raises ImportError naming the package if XXH3 is not available."""
    if _xxhash is None or not hasattr(_xxhash, "xxh3_64_intdigest"):
        raise ImportError("cluster mode needs the xxhash package for XXH3-64 "
                          "(Debian/Ubuntu: apt-get install python3-xxhash; "
                          "pip: pip install 'shardlock[cluster]')")


def _xxh3(data: bytes, seed: int) -> int:
    return _xxhash.xxh3_64_intdigest(data, seed=seed)


def _hash_u64(value: int, seed: int) -> int:
    # Fixed little-endian bytes, as hash_u64() in src/router.cc.
    return _xxh3((value & _U64).to_bytes(8, "little"), seed)


class Router:
    """The owner of a key among `members`, each (id, weight).

    Immutable. Raises ValueError for a membership the C++ Router refuses (an
    empty or repeated id, a weight outside 1..1024, no members or too many),
    and ImportError when xxhash is missing.
    """

    def __init__(self, members: Sequence[Tuple[bytes, int]], seed: int = SEED,
                 bucket_bits: int = BUCKET_BITS) -> None:
        require_xxhash()
        if not members or len(members) > MAX_MEMBERS:
            raise ValueError("a map of %d members" % len(members))
        ordered = sorted(members, key=lambda m: m[0])
        for i, (member_id, weight) in enumerate(ordered):
            if not member_id:
                raise ValueError("an empty member id")
            if i and ordered[i - 1][0] == member_id:
                raise ValueError("member id %r twice" % member_id)
            if not 1 <= weight <= MAX_WEIGHT:
                raise ValueError("member %r has weight %d (must be 1..%d)"
                                 % (member_id, weight, MAX_WEIGHT))
        self.seed = seed
        self.bucket_bits = bucket_bits
        self._mask = (1 << bucket_bits) - 1
        self._shift = (bucket_bits + 1) // 2
        self.ids: List[bytes] = [member_id for member_id, _ in ordered]
        # One entry per copy: (node index, copy, tiebreak, multipliers, addends).
        self._copies: List[Tuple[int, int, int, Tuple[int, ...], Tuple[int, ...]]] = []
        for index, (member_id, weight) in enumerate(ordered):
            node_hash = _xxh3(member_id, seed)
            for copy in range(weight):
                multipliers = []
                addends = []
                for r in range(_ROUNDS):
                    round_value = copy * 16 + r * 2
                    multipliers.append((_hash_u64(round_value, node_hash) | 1) & self._mask)
                    addends.append(_hash_u64(round_value + 1, node_hash) & self._mask)
                tiebreak = _hash_u64(copy * 16 + 15, node_hash)
                self._copies.append((index, copy, tiebreak, tuple(multipliers), tuple(addends)))
        # Bucket -> owner index, filled as lookups come (at most 2^bucket_bits
        # entries): a client asks about the same few keys again and again.
        self._owners: Dict[int, int] = {}

    def bucket(self, key: bytes) -> int:
        """The key's bucket: the top bucket_bits bits of its hash."""
        return _xxh3(key, self.seed) >> (64 - self.bucket_bits)

    def owner_of_bucket(self, bucket: int) -> int:
        """Index into `ids` (sorted bytewise) of the bucket's owner."""
        mask = self._mask
        shift = self._shift
        best = None
        for index, copy, tiebreak, multipliers, addends in self._copies:
            x = bucket
            for m, a in zip(multipliers, addends):
                x = (x * m) & mask
                x = ((x ^ (x >> shift)) + a) & mask
            # Higher level, then higher tiebreak, then smaller index and copy.
            score = (x, tiebreak, -index, -copy)
            if best is None or score > best:
                best = score
        assert best is not None  # a Router has at least one member
        return -best[2]

    def owner_index(self, key: bytes) -> int:
        """Index into `ids` of the key's owner."""
        bucket = self.bucket(key)
        owner = self._owners.get(bucket)
        if owner is None:
            owner = self._owners[bucket] = self.owner_of_bucket(bucket)
        return owner

    def owner(self, key: bytes) -> bytes:
        return self.ids[self.owner_index(key)]
