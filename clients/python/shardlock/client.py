"""Client and Lease: shardlock leases from Python over UDP, no C++ involved.

The same design as the C++ LeaseClient (include/shardlock/lease/client.h):

* One UDP socket and one random 128-bit client id per Client. The owner is
  the handle, not the client: each acquire contends as an owner of its own
  (the client id with the low 32 bits of its lo word replaced by a
  per-client count, as the C++ client's handle_owner()), so two acquires of
  one key through one Client, from one thread or many, exclude each other
  exactly as two processes do. The Lease renews and releases as that owner.
  owner= acts as a known owner instead (a tool that releases for another).
* A wait is asked in rounds (WaitRounds, as the C++ acquire_in_rounds): a
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

The decisions above (routing, riding through, the rounds, the renewal
bookkeeping) are generators without I/O in _policy.py, which AsyncClient
(aio.py) drives as well; this module sends, reads the socket and runs the
watchdog thread.
"""

from __future__ import annotations

import socket
import struct
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Union

from . import protocol as p
from ._blocking import Call, Cancel, pause
from ._common import Key, Owner, OwnerId, key_bytes, now, to_ms
from ._policy import (ABANDON, LOST, LOST_STATUS, PAUSE, REFRESH, RELEASED, SEND, SILENT,
                      ClientCore, LeaseState, MapRefresh, Request, Run, Steps)
from ._requests import raw_answer, raw_request, watch_answer, watch_since
from ._routing import SILENT_SENDS, Routing, resolve_nodes
from ._types import (NO_VERSION, HolderInfo, HoldersResult, KeyVersion, QueryResult,
                     WatchEvent)
from .errors import (BusyError, ClientClosedError, GrantExpiredError, LeaseExpiredError,
                     LeaseInactiveError, LeaseLostError, NotOwnerError, RecoveringError,
                     RedirectedError, ServerError, ShardlockError, UnreachableError,
                     WaitTimeoutError)
from .watch import KeyWatch, LeaderObserver

# What this module defined or imported before the split stays importable
# from it: the result types and the errors.
__all__ = ["BusyError", "Client", "ClientClosedError", "GrantExpiredError", "HolderInfo",
           "HoldersResult", "Key", "KeyVersion", "Lease", "LeaseExpiredError",
           "LeaseInactiveError", "LeaseLostError", "NO_VERSION", "NotOwnerError", "OnLost",
           "Owner", "OwnerId", "QueryResult", "RecoveringError", "RedirectedError", "ServerError",
           "ShardlockError", "UnreachableError", "WaitTimeoutError", "WatchEvent"]

OnLost = Callable[["Lease", ShardlockError], None]


class Lease(LeaseState):
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

    _client: "Client"
    _on_lost: Optional[OnLost]

    def _open(self) -> None:
        # Held by the watchdog while it runs on_lost; release() takes it, so
        # no callback outlives a release().
        self._callback_lock = threading.Lock()
        self._lost_fired = False  # under _lock

    def renew(self, ttl: Optional[float] = None) -> None:
        """RENEW for `ttl` seconds (None: the current TTL), at the node that
        granted the lease. Blocks up to the request timeout. NotOwnerError /
        LeaseExpiredError mean the lease is lost (on_lost fires), and so does
        RedirectedError (a cluster node handed the key off);
        LeaseInactiveError that it was already."""
        self._renew_once(self._next_ttl_ms(ttl), self._client.request_timeout)

    def release(self) -> None:
        """RELEASE, waiting for the answer. The lease is inactive afterwards
        whatever the answer, and on_lost will not fire (if it is running,
        this waits for it, unless called from it). Raises LeaseInactiveError
        if it was released before, NotOwnerError / LeaseExpiredError if the
        server no longer had it, UnreachableError without an answer."""
        if not self._close():
            raise LeaseInactiveError("the lease on %r was released already" % self.key)
        self._client._unwatch(self)
        raw_answer(self._client._call(self._release_request()), p.RELEASE, self._key)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lost = self._lost_while_held()
        try:
            self.release()
        except ShardlockError:
            pass  # it expires on the server at the latest; loss is reported below
        if lost is not None and exc_type is None:
            raise LeaseLostError(self.key, lost)

    def __del__(self) -> None:
        try:
            if self._close():
                self._client._send_once(self._release_request())
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
            was_open = self._status != RELEASED
            self._status = RELEASED
        if not self._client._on_watchdog_thread():
            with self._callback_lock:
                pass
        return was_open

    def _renew_once(self, ttl_ms: int, timeout: float) -> None:
        client = self._client
        client._drive(self._renewal(ttl_ms, timeout, client._new_request_id(),
                                    client._drift_margin), lease=self)

    def _after_loss(self) -> None:
        """Lost (marked): the watchdog runs on_lost."""
        self._client._watchdog_nudge()

    def _fire_lost(self) -> None:
        """On the watchdog thread: on_lost, once, unless released meanwhile."""
        with self._callback_lock:
            with self._lock:
                if self._status != LOST_STATUS or self._lost_fired:
                    return
                self._lost_fired = True
                reason = self._lost_reason
            if self._on_lost is not None and reason is not None:
                try:
                    self._on_lost(self, reason)
                except Exception:  # noqa: BLE001 - a callback's bug must not stop the watchdog
                    pass

    def _watch_step(self) -> Optional[float]:
        """The watchdog's look at this lease (renews it if due, marks it
        lost if its expiry passed, fires on_lost). Returns when to look
        again, or None to stop watching."""
        client = self._client
        when = client._drive(self._watchdog_look(client.request_timeout, client._new_request_id,
                                                 client._drift_margin), lease=self)
        if when is None:
            self._fire_lost()
        return when  # type: ignore[no-any-return]


# The longest a read of the socket blocks: a reader sees close() this soon.
_READ_SLICE = 0.050
_RECV_SIZE = p.MAX_DATAGRAM_SIZE + 64


class Client(ClientCore):
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
    `auth_key` (32 bytes or 64 hex digits) or `auth_key_file` (default
    $SHARDLOCK_AUTH_KEY_FILE) seals every datagram, as shardlockd
    --auth-key wants; with `tenant` (a key id) the key is that tenant's
    (shardlockd --tenants) and `encrypt=True` encrypts (the tenant's
    encrypt=yes). `cipher` picks a tenant's suite: "auto" (the default, or
    $SHARDLOCK_CIPHER with a key from the environment) seals with AES-256-GCM
    where this CPU has AES-NI and the cryptography package is installed,
    else with BLAKE2b and XChaCha20-Poly1305 (encryption then needs PyNaCl);
    "portable" always does the latter, as a server without AES-NI needs;
    "aes" always AES-GCM. The client's owner ids then carry the
    tenant's key id in their top 32 bits, as the server scopes them.
    Times are in seconds. Thread-safe: any number of threads may share one
    Client, and each acquire contends as an owner of its own (Lease.owner),
    so threads sharing it exclude each other as separate processes do.
    Close it (or use it as a context manager) to stop its threads; leases
    still alive then become inert and expire on the server after their TTL.
    """

    def _open(self) -> None:
        discover = self._discover
        seeds, family, static_nodes = resolve_nodes(self._texts, discover)
        # Several nodes without discover: each key goes to its owner under
        # the Router over the addresses as written (as the C++ client's
        # ClientRouting), so every client agrees whatever order it lists
        # them in.
        self._routing = Routing(seeds, family, static_nodes)
        self._lock = threading.Lock()
        # Request id -> call. Written by the calling threads; read, without
        # the lock (a dict lookup is atomic), by whichever thread reads the
        # socket.
        self._calls: Dict[int, Call] = {}
        self._closed = False
        # Cluster mode: one map refresh at a time.
        self._refresh_lock = threading.Lock()
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
            try:
                self._drive(self._first_map_steps())
            except UnreachableError:
                self.close()
                raise

    # ---- public -------------------------------------------------------------

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
        watched = watchdog or on_lost is not None
        grant = self._drive(self._acquire_steps(key, ttl, wait, shared, permits, watchdog,
                                                watched, renew_fraction, value, owner))
        lease = Lease(self, grant.key, grant.token, grant.mode, grant.ttl_ms, grant.expiry,
                      grant.sent, watchdog, on_lost, renew_fraction, grant.node, grant.owner)
        if watched:
            self._watch(lease, grant.first_look)
        return lease

    def lock(self, key: Key, ttl: float = 30, wait: Optional[float] = None,
             **options: Any) -> Lease:
        """An exclusive lease, for `with client.lock(key, ttl=30) as lease:`.
        As acquire(), but waits until granted by default (wait=None, as
        redis-py's and kazoo's locks do); wait=0 for a try."""
        return self.acquire(key, ttl, wait, **options)

    def lock_shared(self, key: Key, ttl: float = 30, wait: Optional[float] = None,
                    **options: Any) -> Lease:
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
        data, values, as_owner = raw_request(self._client_id, key, token, ttl, owner)
        return raw_answer(self._call(self._raw_call(p.RENEW, data, values, as_owner)),
                          p.RENEW, data)

    def release(self, key: Key, token: int, *, owner: Optional[Owner] = None) -> None:
        """RELEASE of the lease (`key`, `token`) as `owner` (default: this
        client's id), for a tool that ends a lease another process took (as
        `shardlockctl release --owner`): name the lease's own owner
        (Lease.owner, HolderInfo.owner). Sent to the key's node; waits for
        the answer. A Lease of this client that is released this way learns
        it at its next renewal (on_lost). Raises NotOwnerError,
        LeaseExpiredError, UnreachableError, RedirectedError, ServerError;
        ValueError for bad arguments."""
        data, values, as_owner = raw_request(self._client_id, key, token, None, owner)
        raw_answer(self._call(self._raw_call(p.RELEASE, data, values, as_owner)),
                   p.RELEASE, data)

    def query(self, key: Key) -> QueryResult:
        """QUERY: who holds `key` and how (no lease taken)."""
        return QueryResult(self._drive(self._query_steps(key_bytes(key))))

    def holders(self, key: Key) -> HoldersResult:
        """QUERY_HOLDERS: each holder of `key` (owner, token, time left),
        oldest grant first, with QUERY's summary, as many pages as it takes.
        A server that predates QUERY_HOLDERS leaves it unanswered (for the
        request timeout) or refuses it; then this asks QUERY and returns its
        summary with listed False."""
        return self._drive(self._holders_steps(key_bytes(key)))  # type: ignore[no-any-return]

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
        data = key_bytes(key)
        wait_ms = to_ms(wait, "wait", True)
        return self._watch_once(data, watch_since(since), wait_ms)

    def watch(self, key: Key, round: float = 30.0, retry: float = 0.05) -> KeyWatch:
        """A KeyWatch (watch.py) following `key`: `next(timeout)` or
        iteration gives its state now, then each change of version once.
        `round`: the longest one WATCH waits at the server before it
        re-arms; `retry`: the first back-off after a failed round."""
        return KeyWatch(self, key, round=round, retry=retry)

    def observe(self, name: Key, round: float = 30.0) -> LeaderObserver:
        """A LeaderObserver (election.py) of the election `name`: its
        leader now, then each change of leader once, in term order."""
        return LeaderObserver(self, name, round=round)

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

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close()

    # ---- driving the steps (_policy.py) ---------------------------------------

    def _drive(self, steps: Steps, cancel: Optional[Cancel] = None,
               lease: Optional[Lease] = None) -> Any:
        """Runs `steps` to their end with blocking calls; returns what they
        return."""
        run = Run(steps)
        while run.step is not None:
            run.advance(self._do(run, cancel, lease))
        return run.result

    def _do(self, run: Run, cancel: Optional[Cancel], lease: Optional[Lease]) -> Any:
        """Does `run`'s step; its outcome, or the ShardlockError it met."""
        assert run.step is not None
        action, argument = run.step
        try:
            if action == SEND:
                on_silence = None
                if argument.watch_silence:
                    def on_silence() -> bool:
                        # The steps after SILENT, up to ABANDON.
                        run.advance(SILENT)
                        while run.step is not None and run.step[0] != ABANDON:
                            run.advance(self._do(run, cancel, None))
                        return run.abandon_after_silence()
                return self._call(argument, on_silence, cancel)
            if action == PAUSE:
                pause(argument, cancel)
            elif action == REFRESH:
                self._refresh_map(argument)
            elif action == LOST and lease is not None:
                lease._after_loss()
        except ShardlockError as error:
            return error
        return None

    def _refresh_map(self, refresh: MapRefresh) -> List[str]:
        with self._refresh_lock:
            return self._drive(self._refresh_steps(refresh))  # type: ignore[no-any-return]

    # ---- calls ------------------------------------------------------------

    def _watch_once(self, key: bytes, since: KeyVersion, wait_ms: int,
                    cancel: Optional[Cancel] = None) -> WatchEvent:
        _, reply, node = self._drive(self._routed_steps(p.WATCH, key, wait_ms=wait_ms,
                                                        since=since), cancel)
        return watch_answer(reply, node.text, key)

    def _send_once(self, request: Request) -> None:
        """One datagram, no answer awaited (a best-effort RELEASE)."""
        if self._closed:
            return
        _, data, node, _ = self._prepare(request)
        try:
            self._socket.sendto(data, node.address)
        except OSError:
            pass

    def _call(self, request: Request, on_silence: Optional[Callable[[], bool]] = None,
              cancel: Optional[Cancel] = None) -> Optional[p.Message]:
        """Sends `request` and retransmits it (same request id) until it is
        answered or its deadline passes; returns the reply, or None. After
        every SILENT_SENDS unanswered sends it calls `on_silence`, and gives
        up (None) if that returns True; it also returns None once `cancel`
        is cancelled. Raises ClientClosedError if the client is closed."""
        request_id, data, node, deadline = self._prepare(request)
        call = Call(request.message_type, request.key)
        if self._closed:
            raise ClientClosedError("the client is closed")
        if cancel is not None and not cancel.enter(call):
            return None
        calls = self._calls
        calls[request_id] = call
        interval = self._initial_retransmit
        sends = 0
        address = node.address
        sendto = self._socket.sendto
        try:
            while True:
                if on_silence is not None and sends and sends % SILENT_SENDS == 0 \
                        and on_silence():
                    return None
                try:
                    sendto(data, address)
                except OSError:
                    pass  # as a lost datagram: retransmitted
                sends += 1
                current = now()
                left = deadline - current
                if left <= 0:
                    return None
                jittered = interval * self._random.uniform(0.75, 1.25)
                if self._await_reply(call, current + (jittered if jittered < left else left)):
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

    def _await_reply(self, call: Call, until: float) -> bool:
        """Waits until `call` is answered (True) or `until` passes (False).
        The first waiter to find the socket free reads it for everyone
        (leader/followers); the others sleep on their call's event, which
        the reader sets when it hands them their reply or stops reading.
        True without a reply: the client was closed."""
        while True:
            if call.done or self._closed:
                return True
            left = until - now()
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

    def _read_until(self, call: Call, until: float) -> None:
        """Reads the socket (holding _rx_lock) until `call` is answered,
        `until` passes or the client is closed, handing out every reply it
        reads. Reads block at most _READ_SLICE, so a close is seen soon."""
        recv = self._socket.recv
        while not call.done and not self._closed:
            left = until - now()
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
            for reply, waiting in self._replies(data):
                waiting.reply = reply
                waiting.done = True
                event = waiting.event
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
                self._watch_wake = now() + 1.0
            wake = now() + 1.0
            finished = []
            for lease_id, ref in refs:
                lease = ref()
                if lease is None:
                    finished.append((lease_id, ref))
                    continue
                try:
                    when = lease._watch_step()
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
                delay = wake - now()
                # A lease added or lost during the pass was not looked at.
                if delay > 0 and not self._watch_changed:
                    self._watch_cond.wait(delay)
