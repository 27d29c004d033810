"""Client and Lease: shardlock leases from Python over UDP, no C++ involved.

The same design as the C++ LeaseClient (include/shardlock/lease/client.h):

* One UDP socket and one random 128-bit client id per Client. The owner is
  the handle, not the client: each acquire contends as an owner of its own
  (the client id with the low 32 bits of its lo word replaced by a
  per-client count, as the C++ client's handle_owner()), so two acquires of
  one key through one Client, from one thread or many, exclude each other
  exactly as two processes do. The Lease renews and releases as that owner.
  owner= acts as a known owner instead (a tool that releases for another).
* A wait is asked in rounds (_WaitRounds, as the C++ acquire_in_rounds): a
  round the server answers TIMEOUT is asked again while the wait lasts
  (wait=None: until granted), and one refused as longer than the server's
  --max-wait is halved.
* A receiver thread matches replies to calls by request id (and checks the
  reply type and key, so a stray datagram completes nothing). The calling
  thread sends and retransmits its own request with the SAME request id, after
  20 ms doubling to 400 ms, each interval jittered by +-25%, until the call's
  deadline (the request timeout plus an acquire's wait); the server's dedup
  cache answers a retransmission, so a lost GRANTED never becomes a second
  grant.
* Expiry as the client sees it: the send time of the first transmission of
  the granting (or renewing) request plus the TTL granted, minus a drift
  margin (1% of the TTL + 2 ms), on CLOCK_BOOTTIME. It errs early.
* A watchdog thread (started with the first lease that needs it) renews each
  watched lease at ttl/3 after its last confirmed send, retrying until the
  expiry, and calls on_lost exactly once when a lease is lost. It renews one
  lease at a time. A RENEW answered RECOVERING is asked again after the
  server's retry_after_ms (with jitter), never at once.
* An acquire with a wait rides through the server's lock-delay: answered
  RECOVERING, it asks again (fresh request id, the wait left) after
  retry_after_ms with jitter (a hint past the wait's end cut to one last
  try just before it), and raises RecoveringError only when the wait is
  spent. An acquire without a wait answers at once.
* Cluster mode (discover=True, docs/cluster.md "Clients"): the map comes
  from the seeds (MAP, paged), every request carries its epoch, and each
  ACQUIRE or QUERY goes to the key's owner under the cluster's Router
  (router.py). A REDIRECT from a node with a newer map refreshes the map from
  that node first and goes to the owner; a node that stops answering makes
  the client refresh the map from the others every 3 unanswered sends and
  move to the key's new owner, where a waiting acquire rides through the
  lock-delay as above. All within the call's deadline. Leases renew and
  release at the node that granted them.
* A WATCH (watch_once(), and KeyWatch in watch.py over it) is sent, padded
  to a whole datagram, and ridden through as a waiting acquire is: its wait
  is the time the server may park it.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import socket
import struct
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, \
    Tuple, Union

from . import auth as _auth
from . import protocol as p
from . import router as _router
from .errors import (BusyError, ClientClosedError, GrantExpiredError, LeaseExpiredError,
                     LeaseInactiveError, LeaseLostError, NotOwnerError, RecoveringError,
                     RedirectedError, ServerError, ShardlockError, UnreachableError,
                     WaitTimeoutError)

if TYPE_CHECKING:  # pragma: no cover - imports for annotations only (they import this module)
    from .election import LeaderObserver
    from .watch import KeyWatch

if hasattr(time, "CLOCK_BOOTTIME"):
    def _now() -> float:
        """Seconds on CLOCK_BOOTTIME, which keeps counting through a suspend
        (as the server's lease deadlines do)."""
        return time.clock_gettime(time.CLOCK_BOOTTIME)
else:  # pragma: no cover - not Linux
    _now = time.monotonic

Key = Union[str, bytes]
OnLost = Callable[["Lease", ShardlockError], None]

_HELD, _LOST, _RELEASED = "held", "lost", "released"


def _parse_server(text: str) -> Tuple[str, int]:
    """"HOST:PORT" or "[IPv6]:PORT"."""
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("server address must be HOST:PORT or [IPV6]:PORT, not %r" % text)
    return host, int(port)


def _key_bytes(key: Key) -> bytes:
    data = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if not p.MIN_KEY_LENGTH <= len(data) <= p.MAX_KEY_LENGTH:
        raise ValueError("a key must be 1..256 bytes, not %d" % len(data))
    return data


_MIN_RETRY_AFTER = 0.010
# A waiting acquire whose retry would fall after its wait ends tries once
# more this long before the end instead; with less left it raises.
_LAST_TRY_MARGIN = 0.010


def _retry_delay(retry_after_ms: int) -> float:
    """Seconds to wait before asking a server that answered RECOVERING
    again: what it said (at least 10 ms) plus a random quarter of it (at most
    250 ms), so clients told the same time do not all come back at once. As
    the C++ client's retry_delay()."""
    base = max(retry_after_ms / 1000.0, _MIN_RETRY_AFTER)
    return base + random.uniform(0, min(base / 4, 0.250))


def _to_ms(seconds: float, name: str, allow_zero: bool) -> int:
    ms = int(round(seconds * 1000))
    if ms < (0 if allow_zero else 1) or ms > 0xFFFFFFFF:
        raise ValueError("%s out of range: %r s" % (name, seconds))
    return ms


# ---- owners and waits: what Client and AsyncClient acquires share ----------

# An owner on the wire: the datagram's client_id field as (lo, hi).
OwnerId = Tuple[int, int]
# What owner= takes: 32 hex digits, hi then lo (as Client.client_id,
# Lease.owner and HolderInfo.owner print it), or 16 bytes (as the client_id=
# argument takes them: lo then hi, each little-endian).
Owner = Union[str, bytes, bytearray]

_LOW_32 = 0xFFFFFFFF


def _owner_hex(owner: OwnerId) -> str:
    lo, hi = owner
    return "%016x%016x" % (hi, lo)


def _owner_id(owner: Owner) -> OwnerId:
    """The (lo, hi) of an owner= argument; ValueError if it is neither 32
    hex digits nor 16 bytes."""
    if isinstance(owner, str):
        try:
            if len(owner) != 32:
                raise ValueError
            return int(owner[16:], 16), int(owner[:16], 16)
        except ValueError:
            raise ValueError("an owner is 32 hex digits (hi then lo, as Client.client_id), "
                             "not %r" % owner) from None
    if isinstance(owner, (bytes, bytearray)) and len(owner) == 16:
        return int.from_bytes(owner[:8], "little"), int.from_bytes(owner[8:], "little")
    raise ValueError("an owner is 32 hex digits or 16 bytes, not %r" % (owner,))


def _handle_owner(client: OwnerId, handle: int) -> OwnerId:
    """The owner of a client's `handle`-th handle: the client id with the low
    32 bits of lo replaced by `handle` (C++ handle_owner()), so the server,
    which counts per-client bounds over the upper 96 bits, counts a client's
    handles together."""
    lo, hi = client
    return (lo & ~_LOW_32) | (handle & _LOW_32), hi


class _HandleOwners:
    """The owners a client's acquires contend as: a fresh one per acquire
    (handles 1, 2, ..., wrapping after 2^32, skipping the client id's own low
    32 bits so no handle is the client id), or the one owner= names. Any
    thread: the count moves under a lock."""

    def __init__(self, client: OwnerId) -> None:
        self._client = client
        self._own_low = client[0] & _LOW_32
        self._lock = threading.Lock()
        self._handles = 0  # handles made so far, under _lock

    def resolve(self, owner: Optional[Owner]) -> OwnerId:
        """`owner` as (lo, hi), or a fresh handle's owner for None."""
        if owner is not None:
            return _owner_id(owner)
        with self._lock:
            handle = (self._handles + 1) & _LOW_32
            if handle == self._own_low:
                handle = (handle + 1) & _LOW_32
            self._handles = handle
        return _handle_owner(self._client, handle)


def _wait_seconds(wait: Optional[float], name: str = "wait") -> Optional[float]:
    """A wait argument as seconds, or None for "until granted" (None or
    float('inf')); ValueError for a negative or NaN wait or a non-number."""
    if wait is None:
        return None
    try:
        if isinstance(wait, (str, bytes)):
            raise TypeError
        seconds = float(wait)
    except (TypeError, ValueError):
        raise ValueError("%s must be a number of seconds or None, not %r" % (name, wait)) from None
    if math.isnan(seconds) or seconds < 0:
        raise ValueError("%s must be >= 0 seconds, None or float('inf') (until granted), not %r"
                         % (name, wait))
    return None if math.isinf(seconds) else seconds


# shardlockd's default --max-wait: the first round of a wait without end,
# and the first guess when a longer round is refused; halved from there
# while refused (as the C++ acquire_in_rounds' kUsualMaxWait).
_USUAL_MAX_WAIT_MS = 300_000


class _WaitRounds:
    """An acquire's wait as the rounds the server is asked for, as the C++
    client's acquire_in_rounds(): one round, one queue position, as long as
    the server takes it. A round answered TIMEOUT while the wait lasts is
    asked again (a new request of the same owner, behind later arrivals:
    only a wait longer than the server's --max-wait needs it); one refused
    as longer than the server's --max-wait (ERROR 5) is halved. No I/O:
    the caller sends each round and reports its answer to again()."""

    def __init__(self, wait: Optional[float]) -> None:
        seconds = _wait_seconds(wait)
        self.forever = seconds is None
        self._end = 0.0 if seconds is None else _now() + seconds
        self._waits = seconds is None or seconds > 0
        self._round_ms = _USUAL_MAX_WAIT_MS if seconds is None else \
            min(int(math.ceil(seconds * 1000)), _LOW_32)
        self._asked_ms = 0

    def next_ms(self) -> int:
        """The wait to ask for in the next round (0: a try, BUSY at once)."""
        if not self._waits:
            asked = 0
        elif self.forever:
            asked = self._round_ms
        else:
            # At least 1 ms: a wait of 0 would make it a try.
            left = max(1, int(math.ceil((self._end - _now()) * 1000)))
            asked = min(self._round_ms, left)
        self._asked_ms = asked
        return asked

    def again(self, reply: Optional[p.Message]) -> bool:
        """Whether the round that got `reply` (None: unanswered) is to be
        asked again."""
        if reply is None:
            return False
        if reply.type == p.ERROR and reply.error == p.ERROR_WAIT_OUT_OF_RANGE and \
                self._asked_ms > 1:
            self._round_ms = _USUAL_MAX_WAIT_MS if self._asked_ms > _USUAL_MAX_WAIT_MS \
                else self._asked_ms // 2
            return True
        if reply.type == p.RECOVERING:
            # Still recovering at the round's end (_routed_call rides through
            # it within the round): a finite wait is spent, one without end
            # goes on.
            return self.forever
        return reply.type == p.TIMEOUT and self._waits and (self.forever or _now() < self._end)


class _Call:
    """One request id in flight. `done` and `reply` are written once, by the
    thread that reads the reply off the socket; `event` exists only while
    the caller waits for another thread to read for it."""

    __slots__ = ("type", "key", "done", "reply", "event")

    def __init__(self, message_type: int, key: bytes) -> None:
        self.type = message_type
        self.key = key
        self.done = False
        self.reply: Optional[p.Message] = None
        self.event: Optional[threading.Event] = None


class _Cancel:
    """Ends the calls of one KeyWatch from any thread (KeyWatch.cancel()):
    each call made with it returns None at once once it is cancelled, and
    the pauses between its tries end."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._calls: Set[_Call] = set()  # in flight, under _lock

    @property
    def cancelled(self) -> bool:
        return self.event.is_set()

    def cancel(self) -> None:
        with self._lock:
            self.event.set()
            calls = list(self._calls)
        for call in calls:
            # As a close() does: the waiter sees done without a reply. A
            # reply that races in is dropped; the caller wanted none.
            call.done = True
            event = call.event
            if event is not None:
                event.set()

    def enter(self, call: _Call) -> bool:
        """Registers `call`; False if cancelled already."""
        with self._lock:
            if self.event.is_set():
                return False
            self._calls.add(call)
            return True

    def leave(self, call: _Call) -> None:
        with self._lock:
            self._calls.discard(call)


def _pause(seconds: float, cancel: Optional[_Cancel]) -> None:
    """Sleeps `seconds`, or less if `cancel` is cancelled meanwhile."""
    if cancel is None:
        time.sleep(seconds)
    else:
        cancel.event.wait(seconds)


class QueryResult:
    """A QUERY answer: whether the key is held, how, and by how many."""

    def __init__(self, m: p.Message) -> None:
        self.held = bool(m.held)
        self.token = m.token  # the newest grant's
        self.ttl_left_ms = m.ttl_ms  # the longest any holder has left
        self.waiters = m.waiters
        self.mode = ("exclusive", "shared", "permit")[m.mode]
        self.holders = m.holders
        self.permits = m.permits

    def __repr__(self) -> str:
        return ("QueryResult(held=%r, token=%d, ttl_left_ms=%d, waiters=%d, mode=%r, holders=%d)"
                % (self.held, self.token, self.ttl_left_ms, self.waiters, self.mode, self.holders))


_MODES = ("exclusive", "shared", "permit")


class HolderInfo:
    """One holder of a key (HoldersResult.holder_list)."""

    __slots__ = ("owner", "token", "ttl_left_ms", "mode", "pending", "value")

    def __init__(self, holder: p.Holder, mode: str) -> None:
        # The holder's own owner: 32 hex digits, as Lease.owner prints it.
        self.owner = _owner_hex(holder.owner)
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
        mode = _MODES[reply.mode]
        holders = [HolderInfo(h, mode) for h in reply.holder_list]
        return cls(KeyVersion(holders[-1].token if holders else 0, reply.holders),
                   mode if reply.holders else None, reply.permits, reply.waiters,
                   reply.holders, holders)


def _watch_since(since: Optional[KeyVersion]) -> KeyVersion:
    """The version a WATCH carries: `since`, or NO_VERSION for None."""
    if since is None:
        return NO_VERSION
    token, holders = since
    if not (0 <= token <= 0xFFFFFFFFFFFFFFFF and 0 <= holders <= 0xFFFFFFFF):
        raise ValueError("since must be a KeyVersion (u64 token, u32 holders)")
    return KeyVersion(token, holders)


def _watch_answer(reply: Optional[p.Message], node: "_Node", key: bytes) -> WatchEvent:
    """What a WATCH's last answer means: the state, or the error raised."""
    key_text = key.decode("utf-8", errors="replace")
    if reply is None:
        raise UnreachableError("no answer from %s to WATCH %r" % (node.text, key_text))
    _raise_for_reply(reply, key_text)
    return WatchEvent.from_reply(reply)


class _HolderPages:
    """Gathers the QUERY_HOLDERS pages of one key into a HoldersResult, for
    Client.holders() and AsyncClient.holders()."""

    def __init__(self, key: bytes) -> None:
        self.name = key.decode("utf-8", errors="replace")
        self.result = HoldersResult()
        self.pages = 0

    def first_holder(self) -> int:
        """Where the next page starts."""
        return len(self.result.holder_list)

    def server_predates(self, reply: Optional[p.Message]) -> bool:
        """Whether the first page's answer says the server does not know
        QUERY_HOLDERS: an older codec drops it (no answer), a server that
        decodes it without serving it answers ERROR(not a request)."""
        return self.pages == 0 and (reply is None or (
            reply.type == p.ERROR and reply.error == p.ERROR_NOT_A_REQUEST))

    def take(self, reply: Optional[p.Message], node: "_Node") -> bool:
        """Adds a page; True once every holder the server counts is in (or
        a page came back empty). Raises what a failed answer means."""
        if reply is None:
            raise UnreachableError("no answer from %s to QUERY_HOLDERS" % node.text)
        _raise_for_reply(reply, self.name)
        self.pages += 1
        r = self.result
        mode = _MODES[reply.mode]
        r.holders = reply.holders
        r.held = reply.holders > 0
        r.mode = mode if r.held else None
        r.waiters = reply.waiters
        r.permits = reply.permits
        for h in reply.holder_list:
            r.holder_list.append(HolderInfo(h, mode))
            r.token = max(r.token, h.token)
            r.ttl_left_ms = max(r.ttl_left_ms, h.ttl_left_ms)
        return len(r.holder_list) >= reply.holders or not reply.holder_list or \
            self.pages >= 65536


class _LeaseFacts:
    """What a lease is, for Lease and AsyncLease: set once, read anywhere."""

    _key: bytes
    _token: int
    _mode: int
    _owner: OwnerId

    @property
    def key(self) -> str:
        return self._key.decode("utf-8", errors="replace")

    @property
    def key_bytes(self) -> bytes:
        return self._key

    @property
    def token(self) -> int:
        """The fencing token: pass it to the resource, which rejects older ones."""
        return self._token

    @property
    def mode(self) -> str:
        return ("exclusive", "shared", "permit")[self._mode]

    @property
    def owner(self) -> str:
        """The owner this lease was taken, renews and releases as: 32 hex
        digits, hi then lo (as Client.client_id and HolderInfo.owner). A
        fresh one per acquire unless the acquire named one (owner=)."""
        return _owner_hex(self._owner)


def _refresh_order(current: Optional["_ClusterMap"], seeds: List["_Node"],
                   first: Optional["_Node"] = None,
                   last: Optional["_Node"] = None) -> List["_Node"]:
    """Whom to ask for a newer map, each once: `first` (a node that
    redirected: its map is newer), the current map's members, the seeds,
    then `last` (a node that stopped answering)."""
    sources: List[_Node] = []
    for node in [first] + (current.nodes if current else []) + seeds:
        if node is not None and node != last and node not in sources:
            sources.append(node)
    if last is not None:
        sources.append(last)
    return sources


class Lease(_LeaseFacts):
    """A held lease: key, fencing token and the expiry the client can prove.

    A context manager: leaving the `with` block releases it, and raises
    LeaseLostError if the lease was lost while the block ran (unless another
    exception is already on its way). Its methods may be called from any
    thread. A Lease that is garbage collected while held sends one RELEASE
    (best effort); with the watchdog on, keep a reference to it.

    Each Lease is its own owner (`owner`): its renewals, its watchdog's and
    its release are sent as that owner, so another Lease of the same Client
    can neither renew nor release it.
    """

    def __init__(self, client: "Client", key: bytes, token: int, mode: int, ttl_ms: int,
                 expiry: float, sent: float, watchdog: bool, on_lost: Optional[OnLost],
                 renew_fraction: float, node: "_Node", owner: OwnerId) -> None:
        self._client = client
        self._owner = owner
        # The node that granted it: renewals and releases go there, whatever
        # a newer cluster map says (docs/cluster.md, Clients).
        self._node = node
        self._key = key
        self._token = token
        self._mode = mode
        self._on_lost = on_lost
        self._watchdog = watchdog
        self._renew_fraction = renew_fraction
        self._lock = threading.Lock()
        # Held by the watchdog while it runs on_lost; release() takes it, so
        # no callback outlives a release().
        self._callback_lock = threading.Lock()
        # All below under _lock.
        self._status = _HELD
        self._lost_reason: Optional[ShardlockError] = None
        self._lost_fired = False
        self._ttl_ms = ttl_ms
        self._expiry = expiry
        self._confirmed_sent = sent  # send time of the last confirmed grant or renewal
        self._confirmed_id = 0  # request id of the last applied renewal
        self._pending: Dict[int, Tuple[float, int]] = {}  # renewal id -> (sent, ttl_ms)

    # ---- accessors ------------------------------------------------------

    @property
    def ttl(self) -> float:
        """The TTL (seconds) the last grant or renewal asked for."""
        with self._lock:
            return self._ttl_ms / 1000.0

    @property
    def valid(self) -> bool:
        """True while held, not lost, and the client-side expiry is ahead."""
        with self._lock:
            return self._status == _HELD and _now() < self._expiry

    def remaining(self) -> float:
        """Seconds until the client-side expiry; 0 once passed, released or lost."""
        with self._lock:
            if self._status != _HELD:
                return 0.0
            return max(0.0, self._expiry - _now())

    # ---- calls ------------------------------------------------------------

    def renew(self, ttl: Optional[float] = None) -> None:
        """RENEW for `ttl` seconds (None: the current TTL), at the node that
        granted the lease. Blocks up to the request timeout. NotOwnerError /
        LeaseExpiredError mean the lease is lost (on_lost fires), and so does
        RedirectedError (a cluster node handed the key off);
        LeaseInactiveError that it was already."""
        with self._lock:
            if self._status != _HELD:
                raise LeaseInactiveError("the lease on %r is not held" % self.key)
            ttl_ms = self._ttl_ms if ttl is None else _to_ms(ttl, "ttl", False)
        self._renew_once(ttl_ms, self._client.request_timeout)

    def release(self) -> None:
        """RELEASE, waiting for the answer. The lease is inactive afterwards
        whatever the answer, and on_lost will not fire (if it is running,
        this waits for it, unless called from it). Raises LeaseInactiveError
        if it was released before, NotOwnerError / LeaseExpiredError if the
        server no longer had it, UnreachableError without an answer."""
        if not self._close():
            raise LeaseInactiveError("the lease on %r was released already" % self.key)
        self._client._unwatch(self)
        reply = self._client._call(p.RELEASE, self._key, (self._token,), node=self._node,
                                   owner=self._owner)
        if reply is None:
            raise UnreachableError("no answer to RELEASE of %r" % self.key)
        _raise_for_reply(reply, self.key)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        with self._lock:
            lost = self._lost_reason if self._status == _LOST else None
        try:
            self.release()
        except ShardlockError:
            pass  # it expires on the server at the latest; loss is reported below
        if lost is not None and exc_type is None:
            raise LeaseLostError(self.key, lost)

    def __del__(self) -> None:
        try:
            if self._close():
                self._client._send_once(p.RELEASE, self._key, (self._token,), self._node,
                                        self._owner)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing to do
            pass

    def __repr__(self) -> str:
        return "Lease(key=%r, token=%d, mode=%s, owner=%s, valid=%r)" % (
            self.key, self._token, self.mode, self.owner, self.valid)

    # ---- internals ----------------------------------------------------------

    def _close(self) -> bool:
        """Marks the lease released; True if it was not released before.
        Waits for a running callback unless on the watchdog thread."""
        with self._lock:
            was_open = self._status != _RELEASED
            self._status = _RELEASED
        if not self._client._on_watchdog_thread():
            with self._callback_lock:
                pass
        return was_open

    def _margin(self, ttl_ms: int) -> float:
        return self._client._drift_margin(ttl_ms)

    def _renew_once(self, ttl_ms: int, timeout: float) -> None:
        """One RENEW call and its bookkeeping (see client.h: renewals never
        push the expiry past what the server may hold)."""
        request_id = self._client._new_request_id()
        sent = _now()
        with self._lock:
            self._pending[request_id] = (sent, ttl_ms)
            self._ttl_ms = ttl_ms
            # The server may apply a shorter TTL at any moment: pull in now.
            self._expiry = min(self._expiry, sent + ttl_ms / 1000.0 - self._margin(ttl_ms))
        reply = self._client._call(p.RENEW, self._key, (self._token, ttl_ms), timeout=timeout,
                                   request_id=request_id, sent=sent, node=self._node,
                                   owner=self._owner)
        with self._lock:
            self._pending.pop(request_id, None)
            if reply is not None and reply.type == p.RENEWED:
                if request_id > self._confirmed_id:
                    self._confirmed_id = request_id
                    expiry = sent + reply.ttl_ms / 1000.0 - self._margin(reply.ttl_ms)
                    for newer_id, (newer_sent, newer_ttl) in self._pending.items():
                        if newer_id > request_id:
                            expiry = min(expiry, newer_sent + newer_ttl / 1000.0 -
                                         self._margin(newer_ttl))
                    if self._status == _HELD:
                        self._expiry = expiry
                        self._confirmed_sent = sent
                return
        if reply is None:
            raise UnreachableError("no answer to RENEW of %r" % self.key)
        try:
            _raise_for_reply(reply, self.key)
        except (NotOwnerError, LeaseExpiredError, RedirectedError, ServerError) as error:
            self._mark_lost(error)
            raise

    def _mark_lost(self, reason: ShardlockError) -> None:
        with self._lock:
            if self._status != _HELD:
                return
            self._status = _LOST
            self._lost_reason = reason
        self._client._watchdog_nudge()

    def _fire_lost(self) -> None:
        """On the watchdog thread: on_lost, once, unless released meanwhile."""
        with self._callback_lock:
            with self._lock:
                if self._status != _LOST or self._lost_fired:
                    return
                self._lost_fired = True
                reason = self._lost_reason
            if self._on_lost is not None and reason is not None:
                try:
                    self._on_lost(self, reason)
                except Exception:  # noqa: BLE001 - a callback's bug must not stop the watchdog
                    pass

    def _watch_step(self, now: float) -> Optional[float]:
        """The watchdog's look at this lease: renews it if due, marks it lost
        if its expiry passed, fires on_lost. Returns when to look again, or
        None to stop watching."""
        with self._lock:
            status = self._status
            expiry = self._expiry
            due = self._confirmed_sent + self._ttl_ms / 1000.0 * self._renew_fraction
            ttl_ms = self._ttl_ms
        if status == _RELEASED:
            return None
        if status == _HELD and now >= expiry:
            self._mark_lost(LeaseExpiredError(
                "the lease on %r expired with no confirmed renewal" % self.key))
            status = _LOST
        if status == _LOST:
            self._fire_lost()
            return None
        if self._watchdog and now >= due:
            try:
                # Retried until the expiry (later the lease is lost anyway),
                # one request timeout at a time so other leases get a turn.
                self._renew_once(ttl_ms, max(0.001, min(expiry - now,
                                                        self._client.request_timeout)))
            except RecoveringError as error:
                # The node cannot renew now (failed closed, or restarting):
                # asking again at once would spin. The expiry still ends the
                # lease if it never comes back.
                return min(expiry, _now() + _retry_delay(error.retry_after_ms))
            except ShardlockError:
                pass  # lost (marked) or unanswered (the expiry will tell)
            return _now()
        return min(expiry, due) if self._watchdog else expiry


def _acquire_request(key: Key, ttl: float, shared: bool, permits: int,
                     renew_fraction: float) -> Tuple[bytes, int, int, int]:
    """An acquire's checked arguments: (key bytes, ttl_ms, message type,
    lease mode). ValueError for bad ones. The wait is _WaitRounds'."""
    data = _key_bytes(key)
    ttl_ms = _to_ms(ttl, "ttl", False)
    if not 0 < renew_fraction < 1:
        raise ValueError("renew_fraction must be in (0, 1)")
    if permits:
        if shared:
            raise ValueError("a lease is shared or one of permits, not both")
        if not 1 <= permits <= p.MAX_PERMITS:
            raise ValueError("permits must be 1..65535")
        return data, ttl_ms, p.ACQUIRE_PERMIT, p.MODE_PERMIT
    if shared:
        return data, ttl_ms, p.ACQUIRE_SHARED, p.MODE_SHARED
    return data, ttl_ms, p.ACQUIRE, p.MODE_EXCLUSIVE


def _raw_request(client_id: OwnerId, key: Key, token: int, ttl: Optional[float],
                 owner: Optional[Owner]) -> Tuple[bytes, Tuple[int, ...], OwnerId]:
    """A raw renew() (with `ttl`) or release() (ttl None), checked: (key
    bytes, body values, owner: `owner`, or the client id). ValueError for
    bad arguments. For Client and AsyncClient."""
    data = _key_bytes(key)
    if isinstance(token, bool) or not isinstance(token, int) or \
            not 0 < token <= 0xFFFFFFFFFFFFFFFF:
        raise ValueError("a token is an integer in 1..2^64-1, not %r" % (token,))
    values = (token,) if ttl is None else (token, _to_ms(ttl, "ttl", False))
    return data, values, client_id if owner is None else _owner_id(owner)


def _raw_answer(reply: Optional[p.Message], message_type: int, key: bytes) -> float:
    """What a raw renew() or release() answer means: the TTL answered
    (seconds; 0 for a release), or the error raised."""
    key_text = key.decode("utf-8", errors="replace")
    if reply is None:
        raise UnreachableError("no answer to %s of %r" % (p.type_name(message_type), key_text))
    _raise_for_reply(reply, key_text)
    return reply.ttl_ms / 1000.0 if reply.type == p.RENEWED else 0.0


def _value_bytes(value: Union[bytes, str, None]) -> bytes:
    """An acquire's holder value as bytes (str: UTF-8); ValueError past
    MAX_HOLDER_VALUE_LENGTH bytes."""
    if value is None:
        return b""
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if len(data) > p.MAX_HOLDER_VALUE_LENGTH:
        raise ValueError("a value is at most %d bytes" % p.MAX_HOLDER_VALUE_LENGTH)
    return data


def _request_values(message_type: int, ttl_ms: int, wait_ms: int, permits: int,
                    first_holder: int, since: KeyVersion) -> Tuple[int, ...]:
    """The fixed body fields after the key of a routed request."""
    if message_type == p.QUERY:
        return ()
    if message_type == p.QUERY_HOLDERS:
        return (first_holder,)
    if message_type == p.WATCH:
        return (since.token, since.holders, wait_ms)
    if message_type == p.ACQUIRE_PERMIT:
        return (ttl_ms, wait_ms, permits)
    return (ttl_ms, wait_ms)


def _answers(request_type: int, key: bytes, reply: p.Message) -> bool:
    """Whether `reply` answers a request of `request_type` on `key`: its
    type is one the request gets, and a reply that carries a key carries
    this one (so a stray datagram completes nothing)."""
    return p.reply_answers(request_type, reply.type) and \
        (not p.reply_carries_key(reply.type) or reply.key == key)


def _raise_for_reply(reply: p.Message, key: str) -> None:
    """Raises the error a non-success reply means; returns on success."""
    t = reply.type
    if t in (p.GRANTED, p.RENEWED, p.RELEASED, p.QUERY_REPLY, p.HOLDERS_REPLY):
        return
    if t == p.BUSY:
        raise BusyError(key, reply.ttl_ms)
    if t == p.TIMEOUT:
        raise WaitTimeoutError("the wait for %r ran out" % key)
    if t == p.RECOVERING:
        raise RecoveringError(reply.retry_after_ms)
    if t == p.NOT_OWNER:
        raise NotOwnerError("%r is held by another owner" % key)
    if t == p.EXPIRED:
        raise LeaseExpiredError("the server no longer has the lease on %r" % key)
    if t == p.ERROR:
        raise ServerError(reply.error, p.WIRE_ERRORS.get(reply.error, "unknown error"))
    if t == p.REDIRECT:
        raise RedirectedError(key, reply.epoch)
    raise ShardlockError("unexpected reply %s" % p.type_name(t))


class _Node:
    """A server address: as written ("HOST:PORT") and resolved."""

    __slots__ = ("text", "address")

    def __init__(self, text: str, address: tuple) -> None:
        self.text = text
        self.address = address

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Node) and self.address == other.address

    def __hash__(self) -> int:
        return hash(self.address)

    def __repr__(self) -> str:
        return "_Node(%r)" % self.text


def _resolve(text: str, family: int = 0) -> _Node:
    """ValueError if `text` is malformed or does not resolve (in `family`)."""
    host, port = _parse_server(text)
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_DGRAM)
    except socket.gaierror as error:
        raise ValueError("%s does not resolve: %s" % (text, error)) from None
    return _Node(text, infos[0][4])


def _family(node: _Node) -> int:
    return socket.AF_INET6 if len(node.address) == 4 else socket.AF_INET


def _server_texts(server: Union[str, Sequence[str], None]) -> List[str]:
    """The addresses in `server` (comma-separated text or a list), or
    $SHARDLOCK_SERVER; ValueError if there are none."""
    server = server or os.environ.get("SHARDLOCK_SERVER")
    if not server:
        raise ValueError("no server: pass HOST:PORT or set SHARDLOCK_SERVER")
    texts = [t.strip() for t in (server.split(",") if isinstance(server, str) else server)]
    if not texts or not all(texts):
        raise ValueError("an empty server address in %r" % (server,))
    return texts


def _resolve_nodes(texts: List[str], discover: bool
                   ) -> Tuple[List[_Node], int, Optional["_StaticRoute"]]:
    """The nodes named by `texts`, their address family, and without
    `discover` the static routing over them (None for one node). ValueError
    for a bad or unresolvable address, mixed families, or (without
    discover) one server listed twice, as the C++ client refuses them."""
    nodes = [_resolve(t) for t in texts]
    family = _family(nodes[0])
    if any(_family(node) != family for node in nodes):
        raise ValueError("the servers must all be IPv4 or all IPv6")
    if discover or len(nodes) == 1:
        return nodes, family, None
    for i, node in enumerate(nodes):
        for other in nodes[:i]:
            if other.address == node.address:
                raise ValueError("servers %r and %r are the same address: each server must be "
                                 "listed once" % (other.text, node.text))
    return nodes, family, _StaticRoute(nodes)


class _StaticRoute:
    """Several independent servers, no cluster: the Router over their
    addresses as written, weight 1 each (client_routing.cc)."""

    def __init__(self, nodes: List[_Node]) -> None:
        self.router = _router.Router([(node.text.encode(), 1) for node in nodes])
        by_id = {node.text.encode(): node for node in nodes}
        self.nodes = [by_id[member_id] for member_id in self.router.ids]

    def owner_of(self, key: bytes) -> _Node:
        return self.nodes[self.router.owner_index(key)]


class _ClusterMap:
    """One cluster map, immutable: its epoch, members sorted by id (the
    Router's order, so owner indices are member indices) and their nodes."""

    def __init__(self, epoch: int, members: List[Tuple[bytes, str, int]],
                 nodes: Dict[str, _Node]) -> None:
        self.epoch = epoch
        self.router = _router.Router([(member_id, weight) for member_id, _, weight in members])
        by_id = {member_id: (address, weight) for member_id, address, weight in members}
        self.members = [(member_id, by_id[member_id][0], by_id[member_id][1])
                        for member_id in self.router.ids]
        self.nodes = [nodes[address] for _, address, _ in self.members]

    def owner_of(self, key: bytes) -> _Node:
        return self.nodes[self.router.owner_index(key)]


# The longest a read of the socket blocks: a reader sees close() this soon.
_READ_SLICE = 0.050
_RECV_SIZE = p.MAX_DATAGRAM_SIZE + 64

# A cluster call follows at most this many REDIRECTs (as the C++ client's
# kMaxRedirects), and refreshes its map after this many unanswered sends to
# one node (and again after as many more).
_MAX_REDIRECTS = 8
_SILENT_SENDS = 3
# A node whose map is behind the client's, or that redirects under the same
# map, is asked again after this long (kRedirectRetry).
_REDIRECT_RETRY = 0.020
# A map that changes between two pages is read again from the start at most
# this often per source.
_MAX_MAP_RESTARTS = 3


class _MapPages:
    """One source's map as its MAP_REPLY pages come in (the sync and the
    asyncio client ask for them; this checks and gathers them)."""

    def __init__(self) -> None:
        self.members: List[Tuple[bytes, str, int]] = []
        self.epoch = self.count = self.restarts = 0

    def take(self, reply: Optional[p.Message]) -> bool:
        """Takes the answer to a MAP asking from len(members); True once the
        map is whole. Raises ShardlockError saying why the source gives none."""
        if reply is None:
            raise UnreachableError("no answer")
        if reply.type != p.MAP_REPLY:
            raise ShardlockError("no map (%s)" % p.type_name(reply.type))
        if reply.epoch == 0:
            raise ShardlockError("not a cluster node (its map has epoch 0)")
        if self.epoch and (reply.epoch != self.epoch or reply.member_count != self.count):
            # The map changed between two pages: read it again.
            self.restarts += 1
            if self.restarts > _MAX_MAP_RESTARTS:
                raise ShardlockError("its map kept changing while it was read")
            self.members, self.epoch, self.count = [], 0, 0
            return False
        if not 0 < reply.member_count <= _router.MAX_MEMBERS:
            raise ShardlockError("a map of %d members" % reply.member_count)
        if (reply.first_member != len(self.members) or not reply.members or
                len(self.members) + len(reply.members) > reply.member_count):
            raise ShardlockError("a MAP_REPLY page that does not continue the map")
        self.epoch, self.count = reply.epoch, reply.member_count
        self.members += reply.members
        return len(self.members) == self.count

    def build(self, nodes_by_text: Dict[str, _Node], family: int,
              lock: threading.Lock) -> _ClusterMap:
        """The whole map, each member address resolved once per client
        (`nodes_by_text`, under `lock`)."""
        nodes: Dict[str, _Node] = {}
        for _, address, _ in self.members:
            node = nodes_by_text.get(address)
            if node is None:
                try:
                    node = _resolve(address, family)
                except ValueError as error:
                    raise ShardlockError("member address: %s" % error) from None
                with lock:
                    node = nodes_by_text.setdefault(address, node)
            nodes[address] = node
        try:
            return _ClusterMap(self.epoch, self.members, nodes)
        except ValueError as error:
            raise ShardlockError("a map the router refuses (%s)" % error) from None


class Client:
    """A shardlock lease client for one server, or for a cluster.

        client = Client("127.0.0.1:7420")
        with client.lock("orders/42", ttl=30) as lease:
            storage.write(data, fence=lease.token)

        cluster = Client("10.0.0.1:7420,10.0.0.2:7420", discover=True)

    `server`: "HOST:PORT" or "[IPV6]:PORT" (default: $SHARDLOCK_SERVER).
    With `discover=True` the client is in cluster mode (docs/cluster.md):
    `server` names one or more seeds (a comma-separated string or a list of
    addresses), the constructor reads the cluster's map from the first seed
    that gives one (UnreachableError if none does, ImportError if the
    xxhash package is missing), and each key goes to the member that owns
    it under that map, following redirects and failovers.
    Times are in seconds. Thread-safe: any number of threads may share one
    Client, and each acquire contends as an owner of its own (Lease.owner),
    so threads sharing it exclude each other as separate processes do.
    Close it (or use it as a context manager) to stop its threads; leases
    still alive then become inert and expire on the server after their TTL.
    """

    def __init__(self, server: Union[str, Sequence[str], None] = None, *,
                 discover: bool = False, request_timeout: float = 2.0,
                 initial_retransmit: float = 0.020, max_retransmit: float = 0.400,
                 clock_drift_factor: float = 0.01, clock_drift_allowance: float = 0.002,
                 client_id: Optional[bytes] = None, auth_key: Union[bytes, str, None] = None,
                 auth_key_file: Optional[str] = None) -> None:
        texts = _server_texts(server)
        if not 0 <= clock_drift_factor < 1:
            raise ValueError("clock_drift_factor must be in [0, 1)")
        self._auth_key = _auth.resolve_auth_key(auth_key, auth_key_file)
        if discover or len(texts) > 1:
            _router.require_xxhash()
        seeds, family, static_nodes = _resolve_nodes(texts, discover)
        self.server = ",".join(texts)
        self.request_timeout = request_timeout
        self._seeds = seeds
        self._node = seeds[0]  # the server, without discover
        # Several nodes without discover: each key goes to its owner under
        # the Router over the addresses as written (as the C++ client's
        # ClientRouting), so every client agrees whatever order it lists
        # them in.
        self._static = static_nodes
        self._family = family
        self._initial_retransmit = initial_retransmit
        self._max_retransmit = max_retransmit
        self._drift_factor = clock_drift_factor
        self._drift_allowance = clock_drift_allowance
        raw_id = client_id if client_id is not None else os.urandom(16)
        if len(raw_id) != 16:
            raise ValueError("client_id must be 16 bytes")
        self._client_id = (int.from_bytes(raw_id[:8], "little"),
                           int.from_bytes(raw_id[8:], "little"))
        self._owners = _HandleOwners(self._client_id)
        # Request ids start at the wall-clock millisecond << 20 plus 20
        # random bits, as the C++ client's: a later process acting for the
        # same owner neither collides in the server's dedup cache nor sends
        # ids below ones the server applied (older ids are stale to it).
        # itertools.count's next() is atomic under the GIL: no lock.
        self._ids = itertools.count(((int(time.time() * 1000) << 20) | random.getrandbits(20))
                                    & 0xFFFFFFFFFFFFFFFF)
        self._random = random.Random()
        self._lock = threading.Lock()
        # Request id -> call. Written by the calling threads; read, without
        # the lock (a dict lookup is atomic), by whichever thread reads the
        # socket.
        self._calls: Dict[int, _Call] = {}
        self._closed = False
        # Cluster mode: the current map (swapped whole under _lock; readers
        # keep the one they took), one refresh at a time under
        # _refresh_lock, and every member address resolved once.
        self._discover = discover
        self._map: Optional[_ClusterMap] = None
        self._refresh_lock = threading.Lock()
        self._nodes_by_text: Dict[str, _Node] = {seed.text: seed for seed in seeds}
        # No receiver thread: a calling thread reads the socket itself while
        # it waits for its reply (one at a time, under _rx_lock), and hands
        # other threads' replies to them. Handing every reply from a
        # receiver thread to the caller cost a thread switch per call, the
        # largest part of a call's CPU. The socket stays blocking with a
        # receive timeout (SO_RCVTIMEO), so a read is one recv() system
        # call, not poll() and recv() as Python's own socket timeouts do.
        self._socket = socket.socket(family, socket.SOCK_DGRAM)
        self._rx_lock = threading.Lock()
        self._rx_timeout = 0.0  # SO_RCVTIMEO now; only the reader changes it
        self._set_rx_timeout(_READ_SLICE)
        self._watch_cond = threading.Condition()
        # Leases the watchdog looks after, by id(); a release removes its own.
        self._watched: Dict[int, "weakref.ReferenceType[Lease]"] = {}
        self._watch_changed = False  # under _watch_cond: look again before sleeping
        self._watch_wake = 0.0  # under _watch_cond: when the watchdog looks next
        self._watchdog: Optional[threading.Thread] = None
        if discover:
            failures = self._refresh_map(list(seeds), _now() + len(seeds) * request_timeout)
            if self._map is None:
                self.close()
                raise UnreachableError("no seed gave the cluster's map: " + "; ".join(failures))

    # ---- public -------------------------------------------------------------

    @property
    def client_id(self) -> str:
        """The client's identity: 32 hex digits, hi then lo (as shardlockctl).
        The owner of the raw renew() and release() calls by default; no
        Lease has it as its owner (Lease.owner shares its upper 96 bits)."""
        return _owner_hex(self._client_id)

    def acquire(self, key: Key, ttl: float, wait: Optional[float] = 0, *,
                shared: bool = False, permits: int = 0, watchdog: bool = True,
                on_lost: Optional[OnLost] = None, renew_fraction: float = 1.0 / 3.0,
                value: Union[bytes, str, None] = None, owner: Optional[Owner] = None) -> Lease:
        """Takes `key` for `ttl` seconds, waiting up to `wait` seconds for a
        holder to let go. The default wait=0 is a try: BusyError at once if
        the key is held. wait=None or float('inf'): until granted; a
        negative or NaN wait is a ValueError. Exclusive by default;
        `shared=True` for a shared lease; `permits=N` for one of N permits
        (a counting semaphore). With `watchdog` the lease renews itself at
        renew_fraction x ttl; `on_lost(lease, reason)` runs once, on the
        watchdog thread, if the lease is lost. `value` (bytes, or str as
        UTF-8; at most 256 bytes) stays with the holder for holders() to
        show, through renewals: a leader's address, a host name and pid.

        The lease is its own owner (Lease.owner): a second acquire of the
        key through this client, from this thread or another, is a
        contender like another process's, queued FIFO behind it (or BUSY).
        `owner` (32 hex digits, or 16 bytes as client_id= takes them)
        acquires as that owner instead, for a tool that must act for
        someone else; the server then treats it as that owner's request.

        Blocks at most wait + request_timeout (without end for wait=None).
        A wait is asked in rounds of at most the server's --max-wait (a
        round refused as too long is halved; one answered TIMEOUT is asked
        again while the wait lasts), each riding through a server's
        lock-delay (RECOVERING). In cluster mode the call goes to the key's
        node, follows REDIRECTs (at most 8) and, when the node stops
        answering, refreshes the map and moves to the key's new node, all
        within the round.
        Raises BusyError, WaitTimeoutError, UnreachableError (no answer for
        a whole round: the request timeout, or the round plus it with a
        wait), RecoveringError (only once the wait is spent),
        RedirectedError, ServerError or GrantExpiredError; ValueError for
        bad arguments. The Lease returned is valid."""
        data, ttl_ms, message_type, mode = _acquire_request(key, ttl, shared, permits,
                                                            renew_fraction)
        rounds = _WaitRounds(wait)
        value_bytes = _value_bytes(value)
        lease_owner = self._owners.resolve(owner)
        while True:
            sent, reply, node = self._routed_call(message_type, data, ttl_ms, rounds.next_ms(),
                                                  permits, value=value_bytes, owner=lease_owner)
            if not rounds.again(reply):
                break
        key_text = data.decode("utf-8", errors="replace")
        if reply is None:
            raise UnreachableError("no answer from %s to ACQUIRE %r" % (node.text, key_text))
        _raise_for_reply(reply, key_text)
        expiry = sent + reply.ttl_ms / 1000.0 - self._drift_margin(reply.ttl_ms)
        lease = Lease(self, data, reply.token, mode, reply.ttl_ms, expiry, sent, watchdog,
                      on_lost, renew_fraction, node, lease_owner)
        if _now() >= expiry:
            # The grant may date from any time after the first send, so a wait
            # longer than the TTL ends past this expiry: a RENEW proves the
            # lease still stands and counts the expiry from its own send (as
            # the C++ client does). Refused, the grant is given back.
            try:
                lease._renew_once(reply.ttl_ms, self.request_timeout)
            except ShardlockError:
                pass
            if not lease.valid:
                lease._close()
                self._call(p.RELEASE, data, (reply.token,), node=node, owner=lease_owner)
                raise GrantExpiredError("the grant of %r arrived after its expiry" % key_text)
            with lease._lock:
                expiry, sent = lease._expiry, lease._confirmed_sent
        if watchdog or on_lost is not None:
            self._watch(lease, min(expiry, sent + reply.ttl_ms / 1000.0 * renew_fraction)
                        if watchdog else expiry)
        return lease

    def lock(self, key: Key, ttl: float = 30, wait: Optional[float] = None,
             **options) -> Lease:
        """An exclusive lease, for `with client.lock(key, ttl=30) as lease:`.
        As acquire(), but waits until granted by default (wait=None, as
        redis-py's and kazoo's locks do); wait=0 for a try."""
        return self.acquire(key, ttl, wait, **options)

    def lock_shared(self, key: Key, ttl: float = 30, wait: Optional[float] = None,
                    **options) -> Lease:
        """A shared lease: held alongside other shared leases, never with an
        exclusive one. As lock(): waits until granted by default."""
        return self.acquire(key, ttl, wait, shared=True, **options)

    def renew(self, key: Key, token: int, ttl: float, *, owner: Optional[Owner] = None) -> float:
        """RENEW of the lease (`key`, `token`) as `owner` (default: this
        client's id), for a tool that keeps alive a lease another process
        took (as `shardlockctl renew --owner`): name the lease's own owner
        (Lease.owner, HolderInfo.owner), since every Lease has one of its
        own. Sent to the key's node. Returns the TTL the server answered,
        in seconds: the one asked for, or the time left unchanged when the
        server took the request as stale (it applies an owner's renewals in
        request-id order, and request ids start at the wall-clock
        millisecond: a client started before the lease's own acquire may
        be behind it).
        Raises NotOwnerError, LeaseExpiredError, UnreachableError,
        RedirectedError, ServerError; ValueError for bad arguments. A Lease
        of this client renews itself: use Lease.renew() for it."""
        data, values, as_owner = _raw_request(self._client_id, key, token, ttl, owner)
        reply = self._call(p.RENEW, data, values, node=self._route(data)[0], owner=as_owner)
        return _raw_answer(reply, p.RENEW, data)

    def release(self, key: Key, token: int, *, owner: Optional[Owner] = None) -> None:
        """RELEASE of the lease (`key`, `token`) as `owner` (default: this
        client's id), for a tool that ends a lease another process took (as
        `shardlockctl release --owner`): name the lease's own owner
        (Lease.owner, HolderInfo.owner). Sent to the key's node; waits for
        the answer. A Lease of this client that is released this way learns
        it at its next renewal (on_lost). Raises NotOwnerError,
        LeaseExpiredError, UnreachableError, RedirectedError, ServerError;
        ValueError for bad arguments."""
        data, values, as_owner = _raw_request(self._client_id, key, token, None, owner)
        reply = self._call(p.RELEASE, data, values, node=self._route(data)[0], owner=as_owner)
        _raw_answer(reply, p.RELEASE, data)

    def query(self, key: Key) -> QueryResult:
        """QUERY: who holds `key` and how (no lease taken)."""
        data = _key_bytes(key)
        _, reply, node = self._routed_call(p.QUERY, data)
        if reply is None:
            raise UnreachableError("no answer from %s to QUERY" % node.text)
        _raise_for_reply(reply, data.decode("utf-8", errors="replace"))
        return QueryResult(reply)

    def holders(self, key: Key) -> HoldersResult:
        """QUERY_HOLDERS: each holder of `key` (owner, token, time left),
        oldest grant first, with QUERY's summary, as many pages as it takes.
        A server that predates QUERY_HOLDERS leaves it unanswered (for the
        request timeout) or refuses it; then this asks QUERY and returns its
        summary with listed False."""
        data = _key_bytes(key)
        pages = _HolderPages(data)
        while True:
            _, reply, node = self._routed_call(p.QUERY_HOLDERS, data,
                                               first_holder=pages.first_holder())
            if pages.server_predates(reply):
                return HoldersResult.from_query(self.query(key))
            if pages.take(reply, node):
                return pages.result

    def watch_once(self, key: Key, since: Optional[KeyVersion] = None,
                   wait: float = 30.0) -> WatchEvent:
        """One WATCH of `key` (a blocking query, protocol.h "Watches"): its
        state as soon as its version differs from `since` (at once for
        None), or its state after `wait` seconds with the same version.
        Blocks up to wait + request_timeout; rides through RECOVERING, a
        REDIRECT and a silent node within that, as a waiting acquire does.
        Raises UnreachableError, RecoveringError (only once the wait is
        spent), RedirectedError, ServerError (code 5 for a wait above the
        server's --max-wait; 10 past the server's bounds on parked
        watches), ValueError for bad arguments. watch() loops over it: use
        that to follow a key."""
        data = _key_bytes(key)
        wait_ms = _to_ms(wait, "wait", True)
        return self._watch_once(data, _watch_since(since), wait_ms)

    def watch(self, key: Key, round: float = 30.0, retry: float = 0.05) -> "KeyWatch":
        """A KeyWatch (watch.py) following `key`: `next(timeout)` or
        iteration gives its state now, then each change of version once.
        `round`: the longest one WATCH waits at the server before it
        re-arms; `retry`: the first back-off after a failed round."""
        from .watch import KeyWatch
        return KeyWatch(self, key, round=round, retry=retry)

    def observe(self, name: Key, round: float = 30.0) -> "LeaderObserver":
        """A LeaderObserver (election.py) of the election `name`: its
        leader now, then each change of leader once, in term order."""
        from .election import LeaderObserver
        return LeaderObserver(self, name, round=round)

    @property
    def map_epoch(self) -> int:
        """The epoch of the cluster map in use; 0 without discover."""
        current = self._map
        return current.epoch if current is not None else 0

    @property
    def map_members(self) -> List[Tuple[str, str, int]]:
        """The map's members as (id, "host:port", weight), sorted by id (as
        bytes); empty without discover."""
        current = self._map
        if current is None:
            return []
        return [(member_id.decode("utf-8", errors="replace"), address, weight)
                for member_id, address, weight in current.members]

    def address_for(self, key: Key) -> str:
        """The "host:port" a call on `key` goes to now: its owner under the
        current map, or the server."""
        return self._route(_key_bytes(key))[0].text

    def close(self) -> None:
        """Stops the threads and closes the socket. Calls in flight raise
        ClientClosedError. Must not be called from an on_lost callback."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            calls = list(self._calls.values())
        for call in calls:
            event = call.event
            if event is not None:
                event.set()
        with self._watch_cond:
            self._watch_cond.notify_all()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join()
        # A reader sees _closed within one read slice; the socket is closed
        # once none reads it.
        acquired = self._rx_lock.acquire(timeout=1.0)
        self._socket.close()
        if acquired:
            self._rx_lock.release()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    # ---- calls ------------------------------------------------------------

    def _watch_once(self, key: bytes, since: KeyVersion, wait_ms: int,
                    cancel: Optional[_Cancel] = None) -> WatchEvent:
        _, reply, node = self._routed_call(p.WATCH, key, wait_ms=wait_ms, since=since,
                                           cancel=cancel)
        return _watch_answer(reply, node, key)

    def _route(self, key: bytes) -> Tuple[_Node, Optional[_ClusterMap]]:
        """Where a call on `key` goes, and the map that said so (None: not
        in cluster mode)."""
        current = self._map
        if current is not None:
            return current.owner_of(key), current
        if self._static is not None:
            return self._static.owner_of(key), None
        return self._node, None

    def _routed_call(self, message_type: int, key: bytes, ttl_ms: int = 0, wait_ms: int = 0,
                     permits: int = 0, first_holder: int = 0,
                     value: bytes = b"", since: KeyVersion = NO_VERSION,
                     cancel: Optional[_Cancel] = None, owner: Optional[OwnerId] = None
                     ) -> Tuple[float, Optional[p.Message], _Node]:
        """An ACQUIRE*, QUERY, QUERY_HOLDERS or WATCH call as `owner`
        (default: the client id), within wait + request_timeout; with
        `cancel`, until that is cancelled (None).

        An ACQUIRE* or WATCH with a wait rides through RECOVERING while the
        wait lasts. In cluster mode it also follows REDIRECTs (refreshing the map
        from the redirecting node when its map is newer, at most
        _MAX_REDIRECTS) and, every _SILENT_SENDS unanswered sends, refreshes
        the map from the other members and the seeds (the silent node last)
        and moves to the key's new owner if it changed. Each follow-up is a
        fresh request id asking for the wait left. Returns the first
        transmission's send time of the request id answered last, its reply
        (None: unanswered) and the node that answered (or was asked last)."""
        start = _now()
        wait_end = start + wait_ms / 1000.0
        deadline = wait_end + self.request_timeout
        waits = wait_ms > 0
        sent = start
        redirects = 0
        while True:
            node, routed_by = self._route(key)
            values = _request_values(message_type, ttl_ms, wait_ms, permits, first_holder, since)
            if routed_by is None:
                # One node, or a static list: no map, so nothing to refresh
                # or follow.
                reply = self._call(message_type, key, values, timeout=deadline - sent, sent=sent,
                                   node=node, value=value, cancel=cancel, owner=owner)
                if reply is not None and reply.type == p.RECOVERING and waits:
                    left = wait_end - _now()
                    if left > _LAST_TRY_MARGIN:
                        _pause(min(_retry_delay(reply.retry_after_ms), left - _LAST_TRY_MARGIN),
                               cancel)
                        sent = _now()
                        if sent < deadline:
                            wait_ms = max(1, int((wait_end - sent) * 1000))
                            continue
                return sent, reply, node
            moved = []

            def on_silence(node=node, routed_by=routed_by, moved=moved) -> bool:
                self._refresh_map(self._refresh_sources(last=node), deadline, routed_by)
                if self._route(key)[0] != node:
                    moved.append(True)
                    return True  # abandon this request id: the key moved
                return False

            reply = self._call(message_type, key, values, timeout=deadline - sent, sent=sent,
                               node=node, on_silence=on_silence, value=value, cancel=cancel,
                               owner=owner)
            if reply is None and not moved:
                return sent, None, node
            if reply is not None and reply.type == p.REDIRECT and routed_by is not None:
                behind = reply.epoch < routed_by.epoch and self._map is routed_by
                if not behind:
                    # A hop: the owner moved, or the node is mid-change.
                    redirects += 1
                    if redirects > _MAX_REDIRECTS:
                        return sent, reply, node
                    if reply.epoch > routed_by.epoch:
                        self._refresh_map(self._refresh_sources(first=node), deadline, routed_by)
                if self._map is routed_by:
                    # The node will catch up with our map (not a hop), or no
                    # newer map was found yet: ask again shortly.
                    _pause(max(0.0, min(_REDIRECT_RETRY, deadline - _now())), cancel)
            elif reply is not None and reply.type == p.RECOVERING and waits:
                # A hint past the wait's end is cut to a last try just
                # before it (the node may be ready sooner than it said).
                left = wait_end - _now()
                if left <= _LAST_TRY_MARGIN:
                    return sent, reply, node
                _pause(min(_retry_delay(reply.retry_after_ms), left - _LAST_TRY_MARGIN), cancel)
            elif reply is not None:
                return sent, reply, node
            sent = _now()
            if sent >= deadline:
                return sent, reply, node
            if waits:
                # At least 1 ms: a wait of 0 would make it a try (BUSY at once).
                wait_ms = max(1, int((wait_end - sent) * 1000))

    # ---- the cluster map ------------------------------------------------------

    def _refresh_sources(self, first: Optional[_Node] = None,
                         last: Optional[_Node] = None) -> List[_Node]:
        return _refresh_order(self._map, self._seeds, first, last)

    def _refresh_map(self, sources: List[_Node], deadline: float,
                     routed_by: Optional[_ClusterMap] = None) -> List[str]:
        """Reads the map from the first of `sources` that gives one and
        adopts it if it is newer than the current one. One refresh at a
        time: a caller that waited for another's refresh, which replaced
        the map `routed_by` it routed by, uses that one instead. Returns the
        reason each source failed."""
        failures: List[str] = []
        with self._refresh_lock:
            if routed_by is not None and self._map is not routed_by:
                return failures
            for source in sources:
                timeout = min(self.request_timeout, deadline - _now())
                if timeout <= 0:
                    failures.append("%s: not asked (out of time)" % source.text)
                    continue
                try:
                    fetched = self._fetch_map(source, timeout)
                except ShardlockError as error:
                    failures.append("%s: %s" % (source.text, error))
                    continue
                with self._lock:
                    if self._map is None or fetched.epoch > self._map.epoch:
                        self._map = fetched
                return failures
        return failures

    def _fetch_map(self, source: _Node, timeout: float) -> _ClusterMap:
        """The map of `source`, paged with MAP's first_member (each page
        asked for up to `timeout`). Raises ShardlockError saying why not."""
        pages = _MapPages()
        while True:
            reply = self._call(p.MAP, b"", (len(pages.members),), timeout=timeout, node=source)
            if pages.take(reply):
                return pages.build(self._nodes_by_text, self._family, self._lock)

    def _drift_margin(self, ttl_ms: int) -> float:
        return self._drift_factor * ttl_ms / 1000.0 + self._drift_allowance

    def _new_request_id(self) -> int:
        return next(self._ids) & 0xFFFFFFFFFFFFFFFF

    def _epoch(self) -> Optional[int]:
        """The epoch every request carries in cluster mode; None otherwise."""
        current = self._map
        return current.epoch if current is not None else None

    def _send_once(self, message_type: int, key: bytes, values: Tuple[int, ...],
                   node: _Node, owner: OwnerId) -> None:
        """One datagram as `owner`, no answer awaited (a best-effort RELEASE)."""
        if self._closed:
            return
        try:
            self._socket.sendto(p.pack_request(message_type, self._new_request_id(), owner, key,
                                               values, self._epoch(), self._auth_key),
                                node.address)
        except OSError:
            pass

    def _call(self, message_type: int, key: bytes, values: Tuple[int, ...],
              timeout: Optional[float] = None, request_id: Optional[int] = None,
              sent: Optional[float] = None, node: Optional[_Node] = None,
              on_silence: Optional[Callable[[], bool]] = None,
              value: bytes = b"", cancel: Optional[_Cancel] = None,
              owner: Optional[OwnerId] = None) -> Optional[p.Message]:
        """Sends a request of `message_type` on `key` with the type's fixed
        body `values` (p.pack_request) as `owner` (default: the client id)
        to `node` (default: the server), and
        retransmits it (same request id) until it is answered or `timeout`
        seconds pass; returns the reply, or None. After every _SILENT_SENDS
        unanswered sends it calls `on_silence`, and gives up (None) if that
        returns True; it also returns None once `cancel` is cancelled.
        Raises ClientClosedError if the client is closed."""
        if request_id is None:
            request_id = next(self._ids) & 0xFFFFFFFFFFFFFFFF
        if node is None:
            node = self._node
        data = p.pack_request(message_type, request_id,
                              self._client_id if owner is None else owner, key, values,
                              None if message_type == p.MAP else self._epoch(), self._auth_key,
                              value=value)
        call = _Call(message_type, key)
        if self._closed:
            raise ClientClosedError("the client is closed")
        if cancel is not None and not cancel.enter(call):
            return None
        calls = self._calls
        calls[request_id] = call
        start = _now() if sent is None else sent
        deadline = start + (self.request_timeout if timeout is None else timeout)
        interval = self._initial_retransmit
        sends = 0
        address = node.address
        sendto = self._socket.sendto
        try:
            while True:
                if on_silence is not None and sends and sends % _SILENT_SENDS == 0 \
                        and on_silence():
                    return None
                try:
                    sendto(data, address)
                except OSError:
                    pass  # as a lost datagram: retransmitted
                sends += 1
                now = _now()
                left = deadline - now
                if left <= 0:
                    return None
                jittered = interval * self._random.uniform(0.75, 1.25)
                if self._await_reply(call, now + (jittered if jittered < left else left)):
                    if cancel is not None and cancel.cancelled:
                        return None
                    if call.reply is None:
                        raise ClientClosedError("the client is closed")
                    return call.reply
                interval = min(interval * 2, self._max_retransmit)
        finally:
            calls.pop(request_id, None)
            if cancel is not None:
                cancel.leave(call)

    def _await_reply(self, call: _Call, until: float) -> bool:
        """Waits until `call` is answered (True) or `until` passes (False).
        The first waiter to find the socket free reads it for everyone
        (leader/followers); the others sleep on their call's event, which
        the reader sets when it hands them their reply or stops reading.
        True without a reply: the client was closed."""
        while True:
            if call.done or self._closed:
                return True
            left = until - _now()
            if left <= 0:
                return False
            if self._rx_lock.acquire(False):
                try:
                    self._read_until(call, until)
                finally:
                    self._rx_lock.release()
                    self._hand_off_reading()
                return call.done or self._closed
            if call.event is None:
                # Registered before trying the socket again: a reader that
                # stops after our failed try sees it in _hand_off_reading().
                call.event = threading.Event()
                continue
            call.event.wait(left)
            call.event.clear()

    def _hand_off_reading(self) -> None:
        """After a reader stops: wakes every waiting call, so one of them
        reads next."""
        for call in list(self._calls.values()):
            event = call.event
            if event is not None and not call.done:
                event.set()

    def _set_rx_timeout(self, seconds: float) -> None:
        whole = int(seconds)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                                struct.pack("@ll", whole, max(1, int((seconds - whole) * 1e6))))
        self._rx_timeout = seconds

    def _read_until(self, call: _Call, until: float) -> None:
        """Reads the socket (holding _rx_lock) until `call` is answered,
        `until` passes or the client is closed, handing out every reply it
        reads. Reads block at most _READ_SLICE, so a close is seen soon."""
        recv = self._socket.recv
        while not call.done and not self._closed:
            left = until - _now()
            if left <= 0:
                return
            wanted = left if left < _READ_SLICE else _READ_SLICE
            # Only a shorter wait needs the option changed (a system call);
            # a read that ends early just reads again.
            if wanted < self._rx_timeout - 0.001 or \
                    (wanted == _READ_SLICE and self._rx_timeout != _READ_SLICE):
                self._set_rx_timeout(wanted)
            try:
                data = recv(_RECV_SIZE)
            except OSError:
                # EAGAIN: the timeout; ECONNREFUSED from an ICMP error: a
                # lost datagram, retransmitted.
                continue
            self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        """Hands each reply in `data` to its call; drops what answers none."""
        try:
            datagram = p.decode(data, self._auth_key)
        except p.ProtocolError:
            return  # not a reply this client can read (or not sealed by our key)
        for reply in datagram.messages:
            call = self._calls.get(reply.request_id)
            if call is None or call.done:
                continue
            if not _answers(call.type, call.key, reply):
                continue
            call.reply = reply
            call.done = True
            event = call.event
            if event is not None:
                event.set()

    # ---- the watchdog -------------------------------------------------------

    def _on_watchdog_thread(self) -> bool:
        return self._watchdog is not None and self._watchdog is threading.current_thread()

    def _watch(self, lease: Lease, first_look: float) -> None:
        """Has the watchdog look after `lease` from `first_look` on. Wakes
        the watchdog only when it would look later than that: most leases
        are released before their first renewal, and waking a thread for
        each would cost more than the call."""
        with self._watch_cond:
            self._watched[id(lease)] = weakref.ref(lease)
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watchdog_loop,
                                                  name="shardlock-watchdog", daemon=True)
                self._watch_wake = 0.0
                self._watchdog.start()
            elif first_look < self._watch_wake:
                self._watch_changed = True
                self._watch_cond.notify_all()

    def _unwatch(self, lease: Lease) -> None:
        with self._watch_cond:
            ref = self._watched.get(id(lease))
            if ref is not None and ref() is lease:
                del self._watched[id(lease)]

    def _watchdog_nudge(self) -> None:
        with self._watch_cond:
            self._watch_changed = True
            self._watch_cond.notify_all()

    def _watchdog_loop(self) -> None:
        while not self._closed:
            with self._watch_cond:
                refs = list(self._watched.items())
                self._watch_changed = False
                self._watch_wake = _now() + 1.0
            wake = _now() + 1.0
            finished = []
            for lease_id, ref in refs:
                lease = ref()
                if lease is None:
                    finished.append((lease_id, ref))
                    continue
                try:
                    when = lease._watch_step(_now())
                except ClientClosedError:
                    return
                if when is None:
                    finished.append((lease_id, ref))
                else:
                    wake = min(wake, when)
                del lease
            with self._watch_cond:
                for lease_id, ref in finished:
                    if self._watched.get(lease_id) is ref:
                        del self._watched[lease_id]
                if self._closed:
                    return
                self._watch_wake = wake
                delay = wake - _now()
                # A lease added or lost during the pass was not looked at.
                if delay > 0 and not self._watch_changed:
                    self._watch_cond.wait(delay)
