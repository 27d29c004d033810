"""Reentrant leases, as Redisson's RLock, Curator's InterProcessMutex and
Hazelcast's FencedLock offer: a second acquire of a key the same holder
already holds returns the same grant (same fencing token) and counts one
more hold; only the last release lets the key go.

    locks = shardlock.ReentrantLocks(client)    # reentrant per thread
    with locks.lock("orders/42", ttl=30) as outer:
        with locks.lock("orders/42", ttl=30) as inner:   # no round trip
            assert inner.token == outer.token and inner.hold_count == 2
        # still held here
    # released here

Who the holder is (`scope`):

* "thread" (the default, Redisson's rule): the thread. The same thread
  re-enters; another thread of the same process, through this object or
  not, is a contender like any other: its acquire waits at the server (FIFO)
  or is refused, since each grant is its own owner (Lease.owner).
* "client": this object, whatever the thread (what ReentrantLocks was in
  earlier versions): every thread that acquires through it shares its
  holds, so it does not exclude the threads of one process from each
  other. Keep it for code that hands a hold between threads and knows it.

Either way every hold of a grant carries the same token: do not use it
between holders that must wait for each other to finish with the resource,
nor where the resource must tell them apart. A plain Client.acquire() of a
key held here, or another ReentrantLocks, is a contender like another
process's. docs/client.md, "Reentrant leases", says more.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Dict, Optional, Tuple

from ._common import Key, key_bytes, wait_seconds
from .client import Client, Lease
from .errors import (BusyError, LeaseInactiveError, LeaseLostError, ShardlockError,
                     WaitTimeoutError)

_ACQUIRING, _HELD, _FAILED, _RELEASED = range(4)
_SCOPES = ("thread", "client")

# A hold's holder and key: (a thread's number, or 0 for scope "client"; key).
_HoldKey = Tuple[int, bytes]


class _Hold:
    """One grant and the handles that hold it (all under ReentrantLocks._cond)."""

    def __init__(self, slot: _HoldKey) -> None:
        self.slot = slot
        self.key = slot[1]
        self.state = _ACQUIRING
        self.lease: Optional[Lease] = None
        self.holds = 0

    def joinable(self) -> bool:
        return self.state == _ACQUIRING or (
            self.state == _HELD and self.lease is not None and self.lease.valid)


class ReentrantLease:
    """One hold of a reentrant grant. A context manager, as Lease: leaving
    the block drops this hold (and releases the key if it was the last), and
    raises LeaseLostError if the grant was lost meanwhile. Dropping the last
    reference to a held handle drops its hold; the last one's RELEASE is then
    sent best effort, as a Lease's."""

    def __init__(self, locks: "ReentrantLocks", hold: _Hold, reentered: bool) -> None:
        self._locks = locks
        self._hold: Optional[_Hold] = hold
        assert hold.lease is not None
        self._lease: Lease = hold.lease  # kept after release: key and token stay readable
        self.reentered = reentered  # joined a grant its holder already held

    @property
    def lease(self) -> Lease:
        """The grant (shared by every hold): key, token, ttl, remaining()."""
        return self._lease

    @property
    def key(self) -> str:
        return self._lease.key

    @property
    def owner(self) -> str:
        """The grant's owner (Lease.owner), the same for every hold."""
        return self._lease.owner

    @property
    def token(self) -> int:
        """The fencing token: the same for every hold of one grant."""
        return self._lease.token

    @property
    def valid(self) -> bool:
        """True while this hold is not released and the grant is held; once
        the grant is lost, False for every hold."""
        return self._hold is not None and self._lease.valid

    @property
    def hold_count(self) -> int:
        """How many handles hold the grant now (this one included); 0 once
        this hold was released."""
        with self._locks._cond:
            return self._hold.holds if self._hold is not None else 0

    def remaining(self) -> float:
        return self._lease.remaining() if self._hold is not None else 0.0

    def renew(self, ttl: Optional[float] = None) -> None:
        """Renews the grant for every hold (Lease.renew())."""
        if self._hold is None:
            raise LeaseInactiveError("the hold on %r was released" % self.key)
        self._lease.renew(ttl)

    def release(self) -> None:
        """Drops this hold. The last one releases the grant, waiting for the
        answer and raising as Lease.release() does; any other returns at once
        and the key stays held. LeaseInactiveError if released before."""
        last = self._locks._drop(self)
        if last is None:
            return
        last.release()

    def __enter__(self) -> "ReentrantLease":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lost = self._hold is not None and not self._lease.valid
        try:
            self.release()
        except ShardlockError:
            pass  # it expires on the server at the latest; loss is reported below
        if lost and exc_type is None:
            # The Lease's own reason when it was marked lost; an expiry it
            # has not noticed yet (no watchdog, no on_lost) has none.
            reason = getattr(self._lease, "_lost_reason", None) or LeaseInactiveError(
                "the grant of %r expired while the block ran" % self.key)
            raise LeaseLostError(self.key, reason)

    def __del__(self) -> None:
        try:
            self._locks._drop(self)  # the last Lease's own __del__ then sends RELEASE
        except Exception:  # noqa: BLE001 - released before, or interpreter shutdown
            pass

    def __repr__(self) -> str:
        return "ReentrantLease(key=%r, token=%d, holds=%d, valid=%r)" % (
            self.key, self.token, self.hold_count, self.valid)


class ReentrantLocks:
    """Reentrant exclusive leases over `client`, reentrant per thread
    (scope="thread", the default) or for every thread of this object
    (scope="client", the per-client behaviour of earlier versions); see
    the module's docstring. Thread-safe."""

    def __init__(self, client: Client, scope: str = "thread") -> None:
        if scope not in _SCOPES:
            raise ValueError("scope must be 'thread' or 'client', not %r" % (scope,))
        self._client = client
        self.scope = scope
        self._cond = threading.Condition()
        # Each holder's current grant of each key, under _cond.
        self._holds: Dict[_HoldKey, _Hold] = {}
        # Scope "thread": each thread's number, never reused (a thread id
        # is, once its thread ended, and a hold may outlive its thread).
        self._thread = threading.local()
        self._thread_numbers = itertools.count(1)

    def acquire(self, key: Key, ttl: float, wait: Optional[float] = 0,
                **options: Any) -> ReentrantLease:
        """An exclusive hold of `key`. If the calling thread (scope
        "client": this object) holds a valid grant of `key` here, a handle
        of that grant (same token, reentered True, one more hold) without a
        round trip; `ttl`, `wait` and `options` are then ignored (the grant
        keeps its TTL, watchdog and on_lost; renew() for more time).
        Otherwise as Client.acquire(key, ttl, wait, **options), with its
        errors and its waits (wait=0 a try, None until granted): a new grant
        of its own owner, for which another thread's hold is a holder like
        any other. on_lost fires once for all holds of the grant.

        Scope "client" only: while another thread's acquire of the key is
        in flight, this one waits for it up to `wait` and joins it, or
        tries itself if it failed; a wait that runs out first raises
        WaitTimeoutError (BusyError with no wait)."""
        data = key_bytes(key)
        seconds = wait_seconds(wait)
        deadline = None if seconds is None else time.monotonic() + seconds
        slot = (self._holder(), data)
        while True:
            with self._cond:
                hold = self._holds.get(slot)
                if hold is None or not hold.joinable():
                    hold = self._holds[slot] = _Hold(slot)
                    first = True
                else:
                    first = False
                    while hold.state == _ACQUIRING:
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            if seconds:
                                raise WaitTimeoutError(
                                    "an acquire of %r in flight did not finish in time" % data)
                            raise BusyError(data.decode("utf-8", errors="replace"), 0)
                        self._cond.wait(left)
                    if hold.state == _HELD and hold.lease is not None and hold.lease.valid:
                        hold.holds += 1
                        return ReentrantLease(self, hold, reentered=True)
                    continue  # failed, lost or released meanwhile: try again
            if first:
                return self._acquire_first(
                    hold, ttl, None if deadline is None else max(0.0, deadline - time.monotonic()),
                    options)

    def lock(self, key: Key, ttl: float = 30, wait: Optional[float] = None,
             **options: Any) -> ReentrantLease:
        """For `with locks.lock(key, ttl=30) as lease:`. As acquire(), but
        waits until granted by default (wait=None), as Client.lock()."""
        return self.acquire(key, ttl, wait, **options)

    def hold_count(self, key: Key) -> int:
        """How many handles hold the calling thread's (scope "client": this
        object's) current grant of `key` (0: none, or an acquire of it is in
        flight)."""
        with self._cond:
            hold = self._holds.get((self._holder(), key_bytes(key)))
            return hold.holds if hold is not None and hold.state == _HELD else 0

    # ---- internals ------------------------------------------------------------

    def _holder(self) -> int:
        """Who holds: the calling thread's number, or 0 for scope "client"."""
        if self.scope == "client":
            return 0
        number = getattr(self._thread, "number", None)
        if number is None:
            with self._cond:  # an RLock: hold_count() calls this under it
                number = self._thread.number = next(self._thread_numbers)
        return number

    def _acquire_first(self, hold: _Hold, ttl: float, wait: Optional[float],
                       options: Dict[str, Any]) -> ReentrantLease:
        lease: Optional[Lease] = None
        try:
            lease = self._client.acquire(hold.key, ttl, wait, **options)
        finally:
            with self._cond:
                if lease is not None:
                    hold.lease, hold.holds, hold.state = lease, 1, _HELD
                else:
                    hold.state = _FAILED
                    self._forget(hold)
                self._cond.notify_all()
        return ReentrantLease(self, hold, reentered=False)

    def _forget(self, hold: _Hold) -> None:
        """Under _cond: drops the holder's entry of the key if it is still
        `hold`."""
        if self._holds.get(hold.slot) is hold:
            del self._holds[hold.slot]

    def _drop(self, handle: ReentrantLease) -> Optional[Lease]:
        """Drops `handle`'s hold; returns the grant's Lease if it was the
        last, for the caller to release."""
        with self._cond:
            hold = handle._hold
            if hold is None:
                raise LeaseInactiveError("the hold on %r was released already" % handle.key)
            handle._hold = None
            hold.holds -= 1
            if hold.holds > 0:
                return None
            hold.state = _RELEASED
            self._forget(hold)
            last, hold.lease = hold.lease, None
            return last
