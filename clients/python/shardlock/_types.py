"""The results the client's calls return (re-exported by client.py,
election.py and the package): no I/O, no state beyond their fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional

from . import protocol as p
from ._common import owner_hex

MODES = ("exclusive", "shared", "permit")


class QueryResult:
    """A QUERY answer: whether the key is held, how, and by how many."""

    def __init__(self, m: p.Message) -> None:
        self.held = bool(m.held)
        self.token = m.token  # the newest grant's
        self.ttl_left_ms = m.ttl_ms  # the longest any holder has left
        self.waiters = m.waiters
        self.mode = MODES[m.mode]
        self.holders = m.holders
        self.permits = m.permits

    def __repr__(self) -> str:
        return ("QueryResult(held=%r, token=%d, ttl_left_ms=%d, waiters=%d, mode=%r, holders=%d)"
                % (self.held, self.token, self.ttl_left_ms, self.waiters, self.mode, self.holders))


class HolderInfo:
    """One holder of a key (HoldersResult.holder_list)."""

    __slots__ = ("owner", "token", "ttl_left_ms", "mode", "pending", "value")

    def __init__(self, holder: p.Holder, mode: str) -> None:
        # The holder's own owner: 32 hex digits, as Lease.owner prints it.
        self.owner = owner_hex(holder.owner)
        self.token = holder.token
        self.ttl_left_ms = holder.ttl_left_ms  # as the server counted it
        self.mode = mode
        # Taken by a multi-key acquire that has not completed: no lease yet.
        self.pending = bool(holder.flags & p.HOLDER_FLAG_PENDING)
        self.value = holder.value  # what its acquire attached; b"" for none

    def __repr__(self) -> str:
        return ("HolderInfo(owner=%r, token=%d, ttl_left_ms=%d, mode=%r, pending=%r, value=%r)"
                % (self.owner, self.token, self.ttl_left_ms, self.mode, self.pending, self.value))


class HoldersResult:
    """Who holds a key (Client.holders()): QUERY's summary and each holder,
    oldest grant first. `listed` is False when the server predates
    QUERY_HOLDERS: then the summary comes from QUERY and holder_list is
    empty. `mode` is None when nobody holds the key."""

    def __init__(self) -> None:
        self.listed = True
        self.held = False
        self.mode: Optional[str] = None
        self.token = 0  # the newest grant's
        self.ttl_left_ms = 0  # the longest any holder has left
        self.waiters = 0
        self.holders = 0  # how many hold it, pending ones included
        self.permits = 0
        self.holder_list: List[HolderInfo] = []

    @classmethod
    def from_query(cls, q: QueryResult) -> "HoldersResult":
        r = cls()
        r.listed = False
        r.held = q.held
        r.mode = q.mode if q.held else None
        r.token = q.token
        r.ttl_left_ms = q.ttl_left_ms
        r.waiters = q.waiters
        r.holders = q.holders
        r.permits = q.permits
        return r

    def __repr__(self) -> str:
        return ("HoldersResult(listed=%r, held=%r, mode=%r, holders=%d, waiters=%d, "
                "holder_list=%r)" % (self.listed, self.held, self.mode, self.holders,
                                     self.waiters, self.holder_list))


class KeyVersion(NamedTuple):
    """A key's version as a watch compares it (protocol.h, "Watches"): the
    newest holder's token and the holder count; (0, 0) while nobody holds
    it. Renewals and waiters do not change it."""

    token: int
    holders: int


# The version of nothing seen yet: a WATCH from it is answered at once.
NO_VERSION = KeyVersion(p.NO_VERSION_TOKEN, 0)


@dataclass
class WatchEvent:
    """A key's state as a watch reports it (Client.watch_once(), KeyWatch).
    `holders` are the newest holders, oldest grant first, ending at the
    newest: every one unless their values take more than a datagram (a
    crowded shared or semaphore key); an exclusive holder is always listed.
    `mode` is None while nobody holds the key."""

    version: KeyVersion
    mode: Optional[str]
    permits: int  # a semaphore key's limit, else 0
    waiters: int
    holder_count: int  # all of them, listed or not
    holders: List[HolderInfo] = field(default_factory=list)

    @property
    def held(self) -> bool:
        return self.holder_count > 0

    @classmethod
    def from_reply(cls, reply: p.Message) -> "WatchEvent":
        """The state a HOLDERS_REPLY answering a WATCH carries. The page is
        a tail (it ends at the newest holder), so the version is read off its
        last entry."""
        mode = MODES[reply.mode]
        holders = [HolderInfo(h, mode) for h in reply.holder_list]
        return cls(KeyVersion(holders[-1].token if holders else 0, reply.holders),
                   mode if reply.holders else None, reply.permits, reply.waiters,
                   reply.holders, holders)


# ---- leaders (election.py) ---------------------------------------------------

@dataclass(frozen=True)
class LeaderInfo:
    """A leader as others see it (Election.leader(), LeaderObserver)."""

    value: bytes  # what its campaign() attached
    owner: str  # its lease's owner, 32 hex digits (Lease.owner; not Client.client_id)
    term: int  # its grant's fencing token
    ttl_left_ms: int  # as the server counted it


@dataclass(frozen=True)
class LeaderChange:
    """One change of leader (LeaderObserver.next()): `leader` is None when
    there is none now."""

    leader: Optional[LeaderInfo]


def leader_of(mode: Optional[str], holders: List[HolderInfo]) -> Optional[LeaderInfo]:
    """The leader a watch event or a holders listing shows: its exclusive
    holder, if any (a pending or shared holder is no leader)."""
    if mode != "exclusive" or len(holders) != 1 or holders[0].pending:
        return None
    h = holders[0]
    return LeaderInfo(h.value, h.owner, h.token, h.ttl_left_ms)
