"""Reentrant leases keyed to an owner, as Redisson's RLock, Curator's
InterProcessMutex and Hazelcast's FencedLock offer: a second acquire of a
key the owner already holds returns the same grant (same fencing token) and
counts one more hold; only the last release lets the key go.

    locks = shardlock.ReentrantLocks(client)    # one per Client
    with locks.lock("orders/42", ttl=30) as outer:
        with locks.lock("orders/42", ttl=30) as inner:   # no round trip
            assert inner.token == outer.token and inner.hold_count == 2
        # still held here
    # released here

The owner is the Client (its client id), not a thread: every thread that
acquires through one ReentrantLocks shares its holds. Do not use it to
exclude threads of one process from each other (the second thread is let in
at once: use threading.Lock inside the process), nor between holders that
must wait for each other to finish with the resource, nor where a resource
must tell holders apart by token (every hold carries the same one). Two
ReentrantLocks over one Client, or a plain Client.acquire() of a key held
here, take separate grants, the later superseding the earlier: keep one per
Client and take its keys only through it. docs/client.md, "Reentrant
leases", says more.
"""

from __future__ import annotations

import threading
import time
from typing import Dict, Optional

from .client import Client, Key, Lease, _key_bytes
from .errors import (BusyError, LeaseInactiveError, LeaseLostError, ShardlockError,
                     WaitTimeoutError)

_ACQUIRING, _HELD, _FAILED, _RELEASED = range(4)


class _Hold:
    """One grant and the handles that hold it (all under ReentrantLocks._cond)."""

    def __init__(self, key: bytes) -> None:
        self.key = key
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

    def __init__(self, owner: "ReentrantLocks", hold: _Hold, reentered: bool) -> None:
        self._owner = owner
        self._hold: Optional[_Hold] = hold
        assert hold.lease is not None
        self._lease: Lease = hold.lease  # kept after release: key and token stay readable
        self.reentered = reentered  # joined a grant the owner already held

    @property
    def lease(self) -> Lease:
        """The grant (shared by every hold): key, token, ttl, remaining()."""
        return self._lease

    @property
    def key(self) -> str:
        return self._lease.key

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
        with self._owner._cond:
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
        last = self._owner._drop(self)
        if last is None:
            return
        last.release()

    def __enter__(self) -> "ReentrantLease":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
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
            self._owner._drop(self)  # the last Lease's own __del__ then sends RELEASE
        except Exception:  # noqa: BLE001 - released before, or interpreter shutdown
            pass

    def __repr__(self) -> str:
        return "ReentrantLease(key=%r, token=%d, holds=%d, valid=%r)" % (
            self.key, self.token, self.hold_count, self.valid)


class ReentrantLocks:
    """Reentrant exclusive leases of one owner: `client`'s client id.
    Thread-safe."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._cond = threading.Condition()
        self._holds: Dict[bytes, _Hold] = {}  # each key's current grant, under _cond

    def acquire(self, key: Key, ttl: float, wait: float = 0, **options) -> ReentrantLease:
        """An exclusive hold of `key`. If this object holds a valid grant of
        `key`, a handle of that grant (same token, reentered True, one more
        hold) without a round trip; `ttl`, `wait` and `options` are then
        ignored (the grant keeps its TTL, watchdog and on_lost; renew() for
        more time). Otherwise as Client.acquire(key, ttl, wait, **options),
        with its errors; on_lost fires once for all holds of the grant.

        While another thread's acquire of the key is in flight, this one
        waits for it up to `wait` and joins it, or tries itself if it
        failed; a wait that runs out first raises WaitTimeoutError
        (BusyError with no wait)."""
        data = _key_bytes(key)
        deadline = time.monotonic() + wait
        while True:
            with self._cond:
                hold = self._holds.get(data)
                if hold is None or not hold.joinable():
                    hold = self._holds[data] = _Hold(data)
                    first = True
                else:
                    first = False
                    while hold.state == _ACQUIRING:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            if wait > 0:
                                raise WaitTimeoutError(
                                    "an acquire of %r in flight did not finish in time" % data)
                            raise BusyError(data.decode("utf-8", errors="replace"), 0)
                        self._cond.wait(left)
                    if hold.state == _HELD and hold.lease is not None and hold.lease.valid:
                        hold.holds += 1
                        return ReentrantLease(self, hold, reentered=True)
                    continue  # failed, lost or released meanwhile: try again
            if first:
                return self._acquire_first(hold, ttl, max(0.0, deadline - time.monotonic()),
                                           options)

    def lock(self, key: Key, ttl: float = 30, wait: float = 0, **options) -> ReentrantLease:
        """For `with locks.lock(key, ttl=30) as lease:`. As acquire()."""
        return self.acquire(key, ttl, wait, **options)

    def hold_count(self, key: Key) -> int:
        """How many handles hold this object's current grant of `key` (0:
        none, or an acquire of it is in flight)."""
        with self._cond:
            hold = self._holds.get(_key_bytes(key))
            return hold.holds if hold is not None and hold.state == _HELD else 0

    # ---- internals ------------------------------------------------------------

    def _acquire_first(self, hold: _Hold, ttl: float, wait: float, options) -> ReentrantLease:
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
        """Under _cond: drops the key's entry if it is still `hold`."""
        if self._holds.get(hold.key) is hold:
            del self._holds[hold.key]

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
