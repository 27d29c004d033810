"""Leader election on a lease key (the Python side of
include/shardlock/lease/client/election.h): the recipe etcd's
concurrency.Election, Curator's LeaderLatch / LeaderSelector and
`consul lock` give.

    election = shardlock.Election(client, "scheduler/nightly",
                                  on_lost=lambda e, reason: stop_leading())
    term = election.campaign("10.0.0.7:8080 pid 4242")   # waits until elected
    run_as_leader(fence=term)                             # the term fences writes
    election.resign()

    for leader in client.observe("scheduler/nightly"):    # each change, in term order
        route_to(leader.value if leader else None)

Design (as the C++ Election):

* An election is a key; its leader is the key's exclusive holder, and the
  leader's value (an address, a host and pid) is the holder value its
  acquire attached. campaign() is an exclusive acquire that waits (FIFO at
  the key's node) and then holds with the watchdog.
* The term is the grant's fencing token: strictly rising over every leader
  of a name, so a deposed leader's writes can be refused by term.
* Leadership ends on resign(), or when the lease is lost (a renewal refused
  or not confirmed before the client-side expiry): on_lost says so, once,
  on the client's watchdog thread. A leader must stop acting as one then.
* A campaign is one waiting acquire (FIFO), in rounds only as long as the
  server's max-wait forces (Client.acquire() with wait=None asks them). A
  wait longer than the TTL ends in a grant past its client-side expiry,
  which the client renews before returning it, so it leads at once.
* Each campaign contends as an owner of its own (Lease.owner), as every
  acquire does: two Elections of one name over one Client compete as two
  processes would. LeaderInfo.owner is the leader's lease's owner.
* Observers follow the key with a watch (watch.py): each change of leader
  is reported once, in term order; one that was away sees the newest
  leader, not each one between.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Union

from ._common import Key, key_bytes, to_ms, value_bytes, wait_seconds
from ._types import HolderInfo, LeaderChange, LeaderInfo, WatchEvent, leader_of
from .client import Client, Lease
from .errors import LeaseInactiveError, ShardlockError
from .watch import KeyWatch, LeaderObserver

__all__ = ["Election", "HolderInfo", "KeyWatch", "LeaderChange", "LeaderInfo", "LeaderObserver",
           "OnLeadershipLost", "WatchEvent", "leader_of"]

OnLeadershipLost = Callable[["Election", ShardlockError], None]


class Election:
    """One campaigner for one name (an exclusive lease key). Its methods may
    be called from any thread. The client must stay open while it leads.
    `ttl`: the leadership lease's TTL in seconds, how long a leader that
    dies silently keeps the others waiting; renewed at ttl / 3 by the
    watchdog. `on_lost(election, reason)`: called once if leadership is
    lost rather than resigned, on the client's watchdog thread (it may also
    be set as the attribute, before campaign())."""

    def __init__(self, client: Client, name: Key, ttl: float = 10.0,
                 on_lost: Optional[OnLeadershipLost] = None) -> None:
        self._client = client
        self._name = key_bytes(name)
        to_ms(ttl, "ttl", False)
        self.ttl = ttl
        self.on_lost = on_lost
        self._lock = threading.Lock()
        self._campaigning = False  # under _lock
        self._lease: Optional[Lease] = None  # under _lock: the leadership, once won

    @property
    def name(self) -> str:
        return self._name.decode("utf-8", errors="replace")

    def campaign(self, value: Union[bytes, str], wait: Optional[float] = None) -> int:
        """Waits up to `wait` seconds (None or float('inf'): for ever), FIFO
        behind earlier campaigners, to become leader with `value` (bytes, or
        str as UTF-8; at most 256 bytes), then holds the leadership with the
        watchdog. Returns the term. Raises WaitTimeoutError when the wait
        ran out (BusyError for wait=0 while someone leads), RuntimeError
        while this Election campaigns or leads already, ValueError for a bad
        value or a negative or NaN wait, and what acquire() raises
        otherwise. Blocks."""
        data = value_bytes(value)
        wait_seconds(wait)
        with self._lock:
            if self._campaigning or (self._lease is not None and self._lease.valid):
                raise RuntimeError("this Election campaigns or leads already")
            self._campaigning = True
            self._lease = None
        try:
            lease = self._client.acquire(self._name, self.ttl, wait, value=data,
                                         on_lost=self._lost)
        finally:
            with self._lock:
                self._campaigning = False
        with self._lock:
            self._lease = lease
        return lease.token

    def _lost(self, lease: Lease, reason: ShardlockError) -> None:
        callback = self.on_lost
        if callback is not None:
            callback(self, reason)

    def resign(self) -> None:
        """Gives leadership up (RELEASE): the next campaigner is elected at
        once. Raises LeaseInactiveError when not leading, and what
        Lease.release() raises (NotOwnerError, LeaseExpiredError: the
        leadership was lost already). Blocks up to request_timeout."""
        with self._lock:
            lease, self._lease = self._lease, None
        if lease is None:
            raise LeaseInactiveError("%r: not leading" % self.name)
        lease.release()

    @property
    def leading(self) -> bool:
        """Whether this campaigner leads now, as the client can prove."""
        with self._lock:
            return self._lease is not None and self._lease.valid

    @property
    def owner(self) -> Optional[str]:
        """The owner of this campaigner's leadership lease while leading
        (Lease.owner: what leader() reports as LeaderInfo.owner), else None.
        An operator releases the leadership with client.release(name, term,
        owner=...)."""
        with self._lock:
            lease = self._lease
        return lease.owner if lease is not None and lease.valid else None

    @property
    def term(self) -> int:
        """This campaigner's term while leading, else 0."""
        with self._lock:
            lease = self._lease
        return lease.token if lease is not None and lease.valid else 0

    def leader(self) -> Optional[LeaderInfo]:
        """The current leader of the name (anyone's), or None when there is
        none. Raises what Client.holders() raises. Blocks."""
        r = self._client.holders(self._name)
        return leader_of(r.mode, r.holder_list)

    def observe(self, round: float = 30.0) -> LeaderObserver:
        """A LeaderObserver of this election's name."""
        return LeaderObserver(self._client, self._name, round=round)

    def __enter__(self) -> "Election":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Resigns if leading (a failure to is left to the lease's TTL)."""
        try:
            self.resign()
        except ShardlockError:
            pass

    def __repr__(self) -> str:
        return "Election(name=%r, leading=%r, term=%d)" % (self.name, self.leading, self.term)
