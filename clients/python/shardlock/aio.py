"""AsyncClient and AsyncLease: shardlock leases from asyncio.

    async with shardlock.AsyncClient("127.0.0.1:7420") as client:
        async with client.lock("orders/42", ttl=30) as lease:
            await storage.write(data, fence=lease.token)

The same protocol, retransmission, expiry and routing as Client (client.py),
on asyncio's datagram endpoint: no threads. A call is one future and one
timer handle; the timer retransmits (same request id) without waking the
awaiting task, and datagram_received() completes the future. The watchdog
is a timer per lease that starts a renewal task when it is due; a release
cancels it. Everything runs on the loop the client was started on.

Watches and leader observers have their asyncio forms too (AsyncKeyWatch,
AsyncLeaderObserver: `async for`), driving the same round logic as KeyWatch
and LeaderObserver. Campaigning (Election) is in the blocking client only.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Generator, List, Optional, \
    Sequence, Tuple, Union

from . import auth as _auth
from . import protocol as p
from . import router as _router
from .client import (_LAST_TRY_MARGIN, _MAX_REDIRECTS, _REDIRECT_RETRY, _SILENT_SENDS,
                     NO_VERSION, HoldersResult, KeyVersion, Owner, OwnerId, QueryResult,
                     WatchEvent, _acquire_request, _ClusterMap, _HandleOwners, _HolderPages,
                     _LeaseFacts, _MapPages, _Node, _WaitRounds, _answers, _key_bytes, _now,
                     _owner_hex, _raw_answer, _raw_request, _request_values, _raise_for_reply,
                     _refresh_order, _resolve_nodes, _retry_delay, _server_texts, _to_ms,
                     _value_bytes, _watch_answer, _watch_since, Key)
from .election import LeaderChange, LeaderInfo, _LeaderChanges
from .watch import PAUSE, Outcome, _WatchedKey
from .errors import (ClientClosedError, GrantExpiredError, LeaseExpiredError,
                     LeaseInactiveError, LeaseLostError, NotOwnerError, RecoveringError,
                     RedirectedError, ServerError, ShardlockError, UnreachableError)

AsyncOnLost = Callable[["AsyncLease", ShardlockError], Optional[Awaitable[None]]]

_HELD, _LOST, _RELEASED = "held", "lost", "released"
_SILENCE = object()  # a call's future result: _SILENT_SENDS sends went unanswered


class _AsyncCall:
    """One request id in flight: its future, and the timer that retransmits."""

    __slots__ = ("type", "key", "future", "data", "address", "deadline", "interval", "sends",
                 "timer", "client", "watch_silence")

    def __init__(self, client: "AsyncClient", message_type: int, key: bytes, data: bytes,
                 address: tuple, deadline: float, watch_silence: bool) -> None:
        self.client = client
        self.type = message_type
        self.key = key
        self.data = data
        self.address = address
        self.deadline = deadline
        self.interval = client._initial_retransmit
        self.sends = 0
        self.watch_silence = watch_silence
        self.future: "asyncio.Future[Any]" = client._loop.create_future()
        self.timer: Optional[asyncio.TimerHandle] = None

    def send(self) -> None:
        """Sends (again) and sets the timer for the next look."""
        client = self.client
        transport = client._transport
        if transport is not None:
            try:
                transport.sendto(self.data, self.address)
            except OSError:
                pass  # as a lost datagram: retransmitted
        self.sends += 1
        left = self.deadline - _now()
        jittered = self.interval * client._random.uniform(0.75, 1.25)
        self.timer = client._loop.call_later(max(0.0, min(jittered, left)), self._tick)

    def _tick(self) -> None:
        if self.future.done():
            return
        if _now() >= self.deadline:
            self.future.set_result(None)
            return
        self.interval = min(self.interval * 2, self.client._max_retransmit)
        if self.watch_silence and self.sends % _SILENT_SENDS == 0:
            self.future.set_result(_SILENCE)  # the caller decides; resume() goes on
            return
        self.send()

    def resume(self) -> None:
        """After _SILENCE: a new future, and the next send now."""
        self.future = self.client._loop.create_future()
        self.send()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


class AsyncLease(_LeaseFacts):
    """A held lease, for asyncio: key, fencing token and the expiry the
    client can prove. `async with lease:` releases it on exit and raises
    LeaseLostError if it was lost while the block ran (unless another
    exception is on its way). Use it from the client's event loop only.
    Each AsyncLease is its own owner (`owner`), as a Lease is: tasks sharing
    one AsyncClient exclude each other."""

    def __init__(self, client: "AsyncClient", key: bytes, token: int, mode: int, ttl_ms: int,
                 expiry: float, sent: float, watchdog: bool, on_lost: Optional[AsyncOnLost],
                 renew_fraction: float, node: _Node, owner: OwnerId) -> None:
        self._client = client
        self._owner = owner
        self._node = node  # renewals and releases go where it was granted
        self._key = key
        self._token = token
        self._mode = mode
        self._on_lost = on_lost
        self._watchdog = watchdog
        self._renew_fraction = renew_fraction
        self._status = _HELD
        self._lost_reason: Optional[ShardlockError] = None
        self._ttl_ms = ttl_ms
        self._expiry = expiry
        self._confirmed_sent = sent
        self._confirmed_id = 0
        self._pending: Dict[int, Tuple[float, int]] = {}
        self._timer: Optional[asyncio.TimerHandle] = None
        self._renewal: Optional["asyncio.Task[None]"] = None
        if watchdog or on_lost is not None:
            self._schedule()

    @property
    def ttl(self) -> float:
        return self._ttl_ms / 1000.0

    @property
    def valid(self) -> bool:
        """True while held, not lost, and the client-side expiry is ahead."""
        return self._status == _HELD and _now() < self._expiry

    def remaining(self) -> float:
        """Seconds until the client-side expiry; 0 once passed, released or lost."""
        return max(0.0, self._expiry - _now()) if self._status == _HELD else 0.0

    async def renew(self, ttl: Optional[float] = None) -> None:
        """RENEW, as Lease.renew()."""
        if self._status != _HELD:
            raise LeaseInactiveError("the lease on %r is not held" % self.key)
        ttl_ms = self._ttl_ms if ttl is None else _to_ms(ttl, "ttl", False)
        await self._renew_once(ttl_ms, self._client.request_timeout)

    async def release(self) -> None:
        """RELEASE, waiting for the answer, as Lease.release(). The lease is
        inactive afterwards whatever the answer; on_lost will not run."""
        if self._status == _RELEASED:
            raise LeaseInactiveError("the lease on %r was released already" % self.key)
        self._status = _RELEASED
        if self._timer is not None:
            self._timer.cancel()
        if self._renewal is not None and self._renewal is not asyncio.current_task():
            self._renewal.cancel()
        reply = await self._client._call(p.RELEASE, self._key, (self._token,), node=self._node,
                                         owner=self._owner)
        if reply is None:
            raise UnreachableError("no answer to RELEASE of %r" % self.key)
        _raise_for_reply(reply, self.key)

    async def __aenter__(self) -> "AsyncLease":
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        lost = self._lost_reason if self._status == _LOST else None
        try:
            await self.release()
        except ShardlockError:
            pass  # it expires on the server at the latest; loss is reported below
        if lost is not None and exc_type is None:
            raise LeaseLostError(self.key, lost)

    def __repr__(self) -> str:
        return "AsyncLease(key=%r, token=%d, mode=%s, owner=%s, valid=%r)" % (
            self.key, self._token, self.mode, self.owner, self.valid)

    # ---- internals ----------------------------------------------------------

    def _schedule(self) -> None:
        """The watchdog's next look: the renewal when due, else the expiry."""
        due = self._confirmed_sent + self._ttl_ms / 1000.0 * self._renew_fraction
        when = min(due, self._expiry) if self._watchdog else self._expiry
        self._timer = self._client._loop.call_later(max(0.0, when - _now()), self._look)

    def _look(self) -> None:
        self._timer = None
        if self._status != _HELD:
            return
        if _now() >= self._expiry:
            self._mark_lost(LeaseExpiredError(
                "the lease on %r expired with no confirmed renewal" % self.key))
            return
        self._renewal = self._client._loop.create_task(self._watchdog_renew())

    async def _watchdog_renew(self) -> None:
        delay = 0.0
        try:
            left = self._expiry - _now()
            await self._renew_once(self._ttl_ms,
                                   max(0.001, min(left, self._client.request_timeout)))
        except RecoveringError as error:
            delay = _retry_delay(error.retry_after_ms)
        except ShardlockError:
            pass  # lost (marked) or unanswered (the expiry will tell)
        finally:
            self._renewal = None
        if self._status == _HELD:
            if delay:
                self._timer = self._client._loop.call_later(
                    min(delay, max(0.0, self._expiry - _now())), self._look)
            else:
                self._schedule()

    async def _renew_once(self, ttl_ms: int, timeout: float) -> None:
        client = self._client
        request_id = client._new_request_id()
        sent = _now()
        margin = client._drift_margin
        self._pending[request_id] = (sent, ttl_ms)
        self._ttl_ms = ttl_ms
        self._expiry = min(self._expiry, sent + ttl_ms / 1000.0 - margin(ttl_ms))
        try:
            reply = await client._call(p.RENEW, self._key, (self._token, ttl_ms), timeout=timeout,
                                       request_id=request_id, sent=sent, node=self._node,
                                       owner=self._owner)
        finally:
            self._pending.pop(request_id, None)
        if reply is not None and reply.type == p.RENEWED:
            if request_id > self._confirmed_id:
                self._confirmed_id = request_id
                expiry = sent + reply.ttl_ms / 1000.0 - margin(reply.ttl_ms)
                for newer_id, (newer_sent, newer_ttl) in self._pending.items():
                    if newer_id > request_id:
                        expiry = min(expiry, newer_sent + newer_ttl / 1000.0 - margin(newer_ttl))
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
        if self._status != _HELD:
            return
        self._status = _LOST
        self._lost_reason = reason
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._on_lost is not None:
            try:
                result = self._on_lost(self, reason)
                if inspect.isawaitable(result):
                    self._client._loop.create_task(result)  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - a callback's bug must not stop the loop's work
                pass


class _LockContext:
    """What AsyncClient.lock() returns: `async with` it for a lease held
    through the block, or `await` it for the AsyncLease."""

    __slots__ = ("_acquire", "_lease")

    def __init__(self, acquire: Awaitable[AsyncLease]) -> None:
        self._acquire = acquire
        self._lease: Optional[AsyncLease] = None

    def __await__(self) -> Generator[Any, None, AsyncLease]:
        return self._acquire.__await__()

    async def __aenter__(self) -> AsyncLease:
        self._lease = await self._acquire
        return self._lease

    async def __aexit__(self, exc_type, exc, tb) -> None:
        assert self._lease is not None
        await self._lease.__aexit__(exc_type, exc, tb)


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, client: "AsyncClient") -> None:
        self.client = client

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.client._dispatch(data)

    def error_received(self, exc: Exception) -> None:
        pass  # ECONNREFUSED from an ICMP error: a lost datagram, retransmitted


class AsyncClient:
    """The asyncio form of Client: the same arguments, the same calls as
    coroutines, leases as AsyncLease.

        async with AsyncClient("127.0.0.1:7420") as client:       # or
        client = await AsyncClient.connect("127.0.0.1:7420")      # ... await client.close()

    start() (or `async with`, or connect()) opens the datagram endpoint on
    the running loop and, with discover=True, reads the cluster's map.
    Server names are resolved there, in the loop's executor.
    """

    def __init__(self, server: Union[str, Sequence[str], None] = None, *,
                 discover: bool = False, request_timeout: float = 2.0,
                 initial_retransmit: float = 0.020, max_retransmit: float = 0.400,
                 clock_drift_factor: float = 0.01, clock_drift_allowance: float = 0.002,
                 client_id: Optional[bytes] = None, auth_key: Union[bytes, str, None] = None,
                 auth_key_file: Optional[str] = None) -> None:
        self._texts = _server_texts(server)
        if not 0 <= clock_drift_factor < 1:
            raise ValueError("clock_drift_factor must be in [0, 1)")
        self._auth_key = _auth.resolve_auth_key(auth_key, auth_key_file)
        if discover or len(self._texts) > 1:
            _router.require_xxhash()
        self.server = ",".join(self._texts)
        self.request_timeout = request_timeout
        self._discover = discover
        self._initial_retransmit = initial_retransmit
        self._max_retransmit = max_retransmit
        self._drift_factor = clock_drift_factor
        self._drift_allowance = clock_drift_allowance
        raw_id = client_id if client_id is not None else os.urandom(16)
        if len(raw_id) != 16:
            raise ValueError("client_id must be 16 bytes")
        self._client_id = (int.from_bytes(raw_id[:8], "little"),
                           int.from_bytes(raw_id[8:], "little"))
        self._owners = _HandleOwners(self._client_id)  # a fresh owner per acquire
        self._next_id = ((int(__import__("time").time() * 1000) << 20) |
                         random.getrandbits(20)) & 0xFFFFFFFFFFFFFFFF
        self._random = random.Random()
        self._calls: Dict[int, _AsyncCall] = {}
        self._closed = False
        self._started = False
        self._map: Optional[_ClusterMap] = None
        self._seeds: List[_Node] = []
        self._node: Optional[_Node] = None
        self._static = None
        self._family = 0
        self._nodes_by_text: Dict[str, _Node] = {}
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._transport: Optional[asyncio.DatagramTransport] = None
        self._refresh_lock: Optional[asyncio.Lock] = None

    @classmethod
    async def connect(cls, server: Union[str, Sequence[str], None] = None,
                      **options: Any) -> "AsyncClient":
        """AsyncClient(server, **options), started."""
        client = cls(server, **options)
        await client.start()
        return client

    async def start(self) -> None:
        """Opens the endpoint; in cluster mode reads the map from the seeds
        (UnreachableError naming each seed's reason if none gives it)."""
        if self._started:
            return
        self._loop = asyncio.get_running_loop()
        seeds, family, static = await self._loop.run_in_executor(
            None, _resolve_nodes, self._texts, self._discover)
        self._seeds, self._family, self._static = seeds, family, static
        self._node = seeds[0]
        self._nodes_by_text = {seed.text: seed for seed in seeds}
        self._refresh_lock = asyncio.Lock()
        self._transport, _ = await self._loop.create_datagram_endpoint(
            lambda: _Protocol(self), family=family)
        self._started = True
        if self._discover:
            failures = await self._refresh_map(list(seeds),
                                               _now() + len(seeds) * self.request_timeout)
            if self._map is None:
                await self.close()
                raise UnreachableError("no seed gave the cluster's map: " + "; ".join(failures))

    async def close(self) -> None:
        """Closes the endpoint. Calls in flight raise ClientClosedError;
        leases still alive stay held on the server until their TTL runs out."""
        if self._closed:
            return
        self._closed = True
        for call in list(self._calls.values()):
            call.cancel()
            if not call.future.done():
                call.future.set_result(None)
        if self._transport is not None:
            self._transport.close()

    async def __aenter__(self) -> "AsyncClient":
        await self.start()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self.close()

    @property
    def client_id(self) -> str:
        """As Client.client_id: the raw calls' default owner, no lease's."""
        return _owner_hex(self._client_id)

    @property
    def map_epoch(self) -> int:
        return self._map.epoch if self._map is not None else 0

    @property
    def map_members(self) -> List[Tuple[str, str, int]]:
        current = self._map
        if current is None:
            return []
        return [(member_id.decode("utf-8", errors="replace"), address, weight)
                for member_id, address, weight in current.members]

    def address_for(self, key: Key) -> str:
        return self._route(_key_bytes(key))[0].text

    async def acquire(self, key: Key, ttl: float, wait: Optional[float] = 0, *,
                      shared: bool = False, permits: int = 0, watchdog: bool = True,
                      on_lost: Optional[AsyncOnLost] = None,
                      renew_fraction: float = 1.0 / 3.0,
                      value: Union[bytes, str, None] = None,
                      owner: Optional[Owner] = None) -> AsyncLease:
        """As Client.acquire(): a try by default (wait=0), wait=None or
        float('inf') until granted; each acquire its own owner unless
        `owner` names one. `on_lost(lease, reason)` runs on the loop; if it
        returns an awaitable, that runs as a task."""
        data, ttl_ms, message_type, mode = _acquire_request(key, ttl, shared, permits,
                                                            renew_fraction)
        rounds = _WaitRounds(wait)
        value_bytes = _value_bytes(value)
        lease_owner = self._owners.resolve(owner)
        while True:
            sent, reply, node = await self._routed_call(message_type, data, ttl_ms,
                                                        rounds.next_ms(), permits,
                                                        value=value_bytes, owner=lease_owner)
            if not rounds.again(reply):
                break
        key_text = data.decode("utf-8", errors="replace")
        if reply is None:
            raise UnreachableError("no answer from %s to ACQUIRE %r" % (node.text, key_text))
        _raise_for_reply(reply, key_text)
        expiry = sent + reply.ttl_ms / 1000.0 - self._drift_margin(reply.ttl_ms)
        if _now() >= expiry:
            # Past its expiry (a wait longer than the TTL): a RENEW proves it
            # still stands, counted from its own send, as Client.acquire().
            probe = AsyncLease(self, data, reply.token, mode, reply.ttl_ms, expiry, sent, False,
                               None, renew_fraction, node, lease_owner)
            try:
                await probe._renew_once(reply.ttl_ms, self.request_timeout)
            except ShardlockError:
                pass
            if not probe.valid:
                await self._call(p.RELEASE, data, (reply.token,), node=node, owner=lease_owner)
                raise GrantExpiredError("the grant of %r arrived after its expiry" % key_text)
            expiry, sent = probe._expiry, probe._confirmed_sent
        return AsyncLease(self, data, reply.token, mode, reply.ttl_ms, expiry, sent, watchdog,
                          on_lost, renew_fraction, node, lease_owner)

    def lock(self, key: Key, ttl: float = 30, wait: Optional[float] = None,
             **options: Any) -> _LockContext:
        """An exclusive lease: `async with client.lock(key, ttl=30) as lease:`
        (released on exit), or `lease = await client.lock(...)`. Waits until
        granted by default (wait=None), as Client.lock(); wait=0 for a try."""
        return _LockContext(self.acquire(key, ttl, wait, **options))

    def lock_shared(self, key: Key, ttl: float = 30, wait: Optional[float] = None,
                    **options: Any) -> _LockContext:
        """A shared lease, as lock()."""
        return _LockContext(self.acquire(key, ttl, wait, shared=True, **options))

    async def renew(self, key: Key, token: int, ttl: float, *,
                    owner: Optional[Owner] = None) -> float:
        """As Client.renew(): RENEW of (`key`, `token`) as `owner` (default:
        this client's id); the TTL granted, in seconds."""
        data, values, as_owner = _raw_request(self._client_id, key, token, ttl, owner)
        reply = await self._call(p.RENEW, data, values, node=self._route(data)[0],
                                 owner=as_owner)
        return _raw_answer(reply, p.RENEW, data)

    async def release(self, key: Key, token: int, *, owner: Optional[Owner] = None) -> None:
        """As Client.release(): RELEASE of (`key`, `token`) as `owner`
        (default: this client's id), waiting for the answer."""
        data, values, as_owner = _raw_request(self._client_id, key, token, None, owner)
        reply = await self._call(p.RELEASE, data, values, node=self._route(data)[0],
                                 owner=as_owner)
        _raw_answer(reply, p.RELEASE, data)

    async def query(self, key: Key) -> QueryResult:
        data = _key_bytes(key)
        _, reply, node = await self._routed_call(p.QUERY, data)
        if reply is None:
            raise UnreachableError("no answer from %s to QUERY" % node.text)
        _raise_for_reply(reply, data.decode("utf-8", errors="replace"))
        return QueryResult(reply)

    async def holders(self, key: Key) -> HoldersResult:
        """As Client.holders(): each holder of `key`, oldest grant first."""
        data = _key_bytes(key)
        pages = _HolderPages(data)
        while True:
            _, reply, node = await self._routed_call(p.QUERY_HOLDERS, data,
                                                     first_holder=pages.first_holder())
            if pages.server_predates(reply):
                return HoldersResult.from_query(await self.query(key))
            if pages.take(reply, node):
                return pages.result

    async def watch_once(self, key: Key, since: Optional[KeyVersion] = None,
                         wait: float = 30.0) -> WatchEvent:
        """As Client.watch_once(): one WATCH, answered when the key's
        version differs from `since` (at once for None) or after `wait`."""
        data = _key_bytes(key)
        wait_ms = _to_ms(wait, "wait", True)
        return await self._watch_once(data, _watch_since(since), wait_ms)

    def watch(self, key: Key, round: float = 30.0, retry: float = 0.05) -> "AsyncKeyWatch":
        """As Client.watch(): `async for event in client.watch(key)`, or
        `await watch.next(timeout)`."""
        return AsyncKeyWatch(self, key, round=round, retry=retry)

    def observe(self, name: Key, round: float = 30.0) -> "AsyncLeaderObserver":
        """As Client.observe(): `async for leader in client.observe(name)`."""
        return AsyncLeaderObserver(self, name, round=round)

    # ---- internals ----------------------------------------------------------

    def _drift_margin(self, ttl_ms: int) -> float:
        return self._drift_factor * ttl_ms / 1000.0 + self._drift_allowance

    async def _watch_once(self, key: bytes, since: KeyVersion, wait_ms: int) -> WatchEvent:
        _, reply, node = await self._routed_call(p.WATCH, key, wait_ms=wait_ms, since=since)
        return _watch_answer(reply, node, key)

    def _new_request_id(self) -> int:
        request_id = self._next_id
        self._next_id = (request_id + 1) & 0xFFFFFFFFFFFFFFFF
        return request_id

    def _route(self, key: bytes) -> Tuple[_Node, Optional[_ClusterMap]]:
        current = self._map
        if current is not None:
            return current.owner_of(key), current
        if self._static is not None:
            return self._static.owner_of(key), None
        if self._node is None:
            raise ShardlockError("the client is not started: await start() or use async with")
        return self._node, None

    async def _call(self, message_type: int, key: bytes, values: Tuple[int, ...],
                    timeout: Optional[float] = None, request_id: Optional[int] = None,
                    sent: Optional[float] = None, node: Optional[_Node] = None,
                    on_silence: Optional[Callable[[], Awaitable[bool]]] = None,
                    value: bytes = b"", owner: Optional[OwnerId] = None) -> Optional[p.Message]:
        """As Client._call(): the reply, or None once `timeout` passes."""
        if self._closed:
            raise ClientClosedError("the client is closed")
        if not self._started:
            raise ShardlockError("the client is not started: await start() or use async with")
        if request_id is None:
            request_id = self._new_request_id()
        target = node if node is not None else self._node
        assert target is not None
        epoch = None if message_type == p.MAP or self._map is None else self._map.epoch
        data = p.pack_request(message_type, request_id,
                              self._client_id if owner is None else owner, key, values, epoch,
                              self._auth_key, value=value)
        start = _now() if sent is None else sent
        deadline = start + (self.request_timeout if timeout is None else timeout)
        call = _AsyncCall(self, message_type, key, data, target.address, deadline,
                          on_silence is not None)
        self._calls[request_id] = call
        try:
            call.send()
            while True:
                result = await call.future
                if result is _SILENCE:
                    assert on_silence is not None
                    if await on_silence():
                        return None
                    call.resume()
                    continue
                if result is None and self._closed:
                    raise ClientClosedError("the client is closed")
                return result
        finally:
            call.cancel()
            self._calls.pop(request_id, None)

    def _dispatch(self, data: bytes) -> None:
        try:
            datagram = p.decode(data, self._auth_key)
        except p.ProtocolError:
            return
        for reply in datagram.messages:
            call = self._calls.get(reply.request_id)
            if call is None or call.future.done() or not _answers(call.type, call.key, reply):
                continue
            call.timer.cancel() if call.timer is not None else None
            call.future.set_result(reply)

    async def _routed_call(self, message_type: int, key: bytes, ttl_ms: int = 0,
                           wait_ms: int = 0, permits: int = 0, first_holder: int = 0,
                           value: bytes = b"", since: KeyVersion = NO_VERSION,
                           owner: Optional[OwnerId] = None
                           ) -> Tuple[float, Optional[p.Message], _Node]:
        """As Client._routed_call(): RECOVERING ridden through while the wait
        lasts; in cluster mode REDIRECTs followed and silent owners left."""
        start = _now()
        wait_end = start + wait_ms / 1000.0
        deadline = wait_end + self.request_timeout
        waits = wait_ms > 0
        sent = start
        redirects = 0
        while True:
            node, routed_by = self._route(key)
            values = _request_values(message_type, ttl_ms, wait_ms, permits, first_holder, since)
            moved = []
            on_silence = None
            if routed_by is not None:
                async def on_silence(node: _Node = node, routed_by: _ClusterMap = routed_by
                                     ) -> bool:
                    await self._refresh_map(self._refresh_sources(last=node), deadline,
                                            routed_by)
                    if self._route(key)[0] != node:
                        moved.append(True)
                        return True
                    return False
            reply = await self._call(message_type, key, values, timeout=deadline - sent,
                                     sent=sent, node=node, on_silence=on_silence, value=value,
                                     owner=owner)
            if reply is None and not moved:
                return sent, None, node
            if reply is not None and reply.type == p.REDIRECT and routed_by is not None:
                behind = reply.epoch < routed_by.epoch and self._map is routed_by
                if not behind:
                    redirects += 1
                    if redirects > _MAX_REDIRECTS:
                        return sent, reply, node
                    if reply.epoch > routed_by.epoch:
                        await self._refresh_map(self._refresh_sources(first=node), deadline,
                                                routed_by)
                if self._map is routed_by:
                    await asyncio.sleep(max(0.0, min(_REDIRECT_RETRY, deadline - _now())))
            elif reply is not None and reply.type == p.RECOVERING and waits:
                left = wait_end - _now()
                if left <= _LAST_TRY_MARGIN:
                    return sent, reply, node
                await asyncio.sleep(min(_retry_delay(reply.retry_after_ms),
                                        left - _LAST_TRY_MARGIN))
            elif reply is not None:
                return sent, reply, node
            sent = _now()
            if sent >= deadline:
                return sent, reply, node
            if waits:
                wait_ms = max(1, int((wait_end - sent) * 1000))

    def _refresh_sources(self, first: Optional[_Node] = None,
                         last: Optional[_Node] = None) -> List[_Node]:
        return _refresh_order(self._map, self._seeds, first, last)

    async def _refresh_map(self, sources: List[_Node], deadline: float,
                           routed_by: Optional[_ClusterMap] = None) -> List[str]:
        """As Client._refresh_map(): one refresh at a time."""
        failures: List[str] = []
        assert self._refresh_lock is not None
        async with self._refresh_lock:
            if routed_by is not None and self._map is not routed_by:
                return failures
            for source in sources:
                timeout = min(self.request_timeout, deadline - _now())
                if timeout <= 0:
                    failures.append("%s: not asked (out of time)" % source.text)
                    continue
                try:
                    pages = _MapPages()
                    while not pages.take(await self._call(p.MAP, b"", (len(pages.members),),
                                                          timeout=timeout, node=source)):
                        pass
                    fetched = pages.build(self._nodes_by_text, self._family, _NO_LOCK)
                except ShardlockError as error:
                    failures.append("%s: %s" % (source.text, error))
                    continue
                if self._map is None or fetched.epoch > self._map.epoch:
                    self._map = fetched
                return failures
        return failures


class AsyncKeyWatch(_WatchedKey):
    """KeyWatch (watch.py) for asyncio: the same rounds, awaited. Use it
    from the client's loop, one next() at a time; cancel the awaiting task
    to stop it."""

    _client: AsyncClient

    async def next(self, timeout: Optional[float] = None) -> Optional[WatchEvent]:
        """As KeyWatch.next(): the next state, None when `timeout` passed
        with none; raises the last round's error when none could be read."""
        deadline = None if timeout is None else _now() + timeout
        steps = self._rounds.steps(deadline)
        outcome: Outcome = None
        try:
            while True:
                action, amount = steps.send(outcome)
                outcome = None
                if action == PAUSE:
                    await asyncio.sleep(amount)
                    continue
                try:
                    outcome = await self._client._watch_once(self._key, self._rounds.since,
                                                             int(amount))
                except ShardlockError as error:
                    outcome = error
        except StopIteration as stop:
            return stop.value

    def __aiter__(self) -> "AsyncKeyWatch":
        return self

    async def __anext__(self) -> WatchEvent:
        event = await self.next(None)
        assert event is not None  # without a timeout, only a state ends next()
        return event


class AsyncLeaderObserver:
    """LeaderObserver (election.py) for asyncio: `async for leader in
    client.observe(name)` yields each change's leader (LeaderInfo, or None
    for none), in term order."""

    def __init__(self, client: AsyncClient, name: Key, round: float = 30.0) -> None:
        self._watch = AsyncKeyWatch(client, name, round=round)
        self._changes = _LeaderChanges()

    async def next(self, timeout: Optional[float] = None) -> Optional[LeaderChange]:
        """As LeaderObserver.next()."""
        deadline = None if timeout is None else _now() + timeout
        while True:
            event = await self._watch.next(None if deadline is None
                                           else max(0.0, deadline - _now()))
            if event is None:
                return None
            change = self._changes.take(event)
            if change is not None:
                return change

    async def __aiter__(self) -> AsyncIterator[Optional[LeaderInfo]]:
        while True:
            change = await self.next(None)
            assert change is not None
            yield change.leader


class _NoLock:
    """A lock for code that runs on one loop only."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_NO_LOCK: Any = _NoLock()
