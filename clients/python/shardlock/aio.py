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

Every decision (the routed call, the map refresh, the renewal, the acquire,
the watch rounds) is a generator in _policy.py that Client drives as well;
this module only sends, awaits and sleeps.

Watches and leader observers have their asyncio forms too (AsyncKeyWatch,
AsyncLeaderObserver: `async for`), driving the same round logic as KeyWatch
and LeaderObserver. Campaigning (Election) is in the blocking client only.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Generator, List, Optional, \
    Sequence, Tuple, Union

from . import protocol as p
from ._common import Key, Owner, key_bytes, now, to_ms
from ._policy import (ABANDON, HELD, LOST, PAUSE, REFRESH, RELEASED, SEND, SILENT, ClientCore,
                      LeaderChanges, LeaseState, MapRefresh, Outcome, Request, Run, Steps,
                      WatchedKey)
from ._requests import raw_answer, raw_request, watch_answer, watch_since
from ._routing import SILENT_SENDS, Routing, resolve_nodes
from ._types import (NO_VERSION, HoldersResult, KeyVersion, LeaderChange, LeaderInfo, QueryResult,
                     WatchEvent)
from .errors import (ClientClosedError, GrantExpiredError, LeaseExpiredError, LeaseInactiveError,
                     LeaseLostError, NotOwnerError, RecoveringError, RedirectedError,
                     ServerError, ShardlockError, UnreachableError)

__all__ = ["AsyncClient", "AsyncKeyWatch", "AsyncLease", "AsyncLeaderObserver", "AsyncOnLost",
           "ClientClosedError", "GrantExpiredError", "LeaseExpiredError", "LeaseInactiveError",
           "LeaseLostError", "NO_VERSION", "NotOwnerError", "RecoveringError", "RedirectedError",
           "ServerError", "ShardlockError", "UnreachableError"]

AsyncOnLost = Callable[["AsyncLease", ShardlockError], Optional[Awaitable[None]]]

_SILENCE = object()  # a call's future result: SILENT_SENDS sends went unanswered


class _AsyncCall:
    """One request id in flight: its future, and the timer that retransmits."""

    __slots__ = ("type", "key", "future", "data", "address", "deadline", "interval", "sends",
                 "timer", "client", "watch_silence")

    def __init__(self, client: "AsyncClient", message_type: int, key: bytes, data: bytes,
                 address: Tuple[Any, ...], deadline: float, watch_silence: bool) -> None:
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
        left = self.deadline - now()
        jittered = self.interval * client._random.uniform(0.75, 1.25)
        self.timer = client._loop.call_later(max(0.0, min(jittered, left)), self._tick)

    def _tick(self) -> None:
        if self.future.done():
            return
        if now() >= self.deadline:
            self.future.set_result(None)
            return
        self.interval = min(self.interval * 2, self.client._max_retransmit)
        if self.watch_silence and self.sends % SILENT_SENDS == 0:
            self.future.set_result(_SILENCE)  # the caller decides; resume() goes on
            return
        self.send()

    def resume(self) -> None:
        """After _SILENCE: a new future, and the next send now."""
        self.future = self.client._loop.create_future()
        self.send()

    def finished(self) -> bool:
        return self.future.done()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


class AsyncLease(LeaseState):
    """A held lease, for asyncio: key, fencing token and the expiry the
    client can prove. `async with lease:` releases it on exit and raises
    LeaseLostError if it was lost while the block ran (unless another
    exception is on its way). Use it from the client's event loop only.
    Each AsyncLease is its own owner (`owner`), as a Lease is: tasks sharing
    one AsyncClient exclude each other."""

    _client: "AsyncClient"
    _on_lost: Optional[AsyncOnLost]

    def _open(self) -> None:
        self._timer: Optional[asyncio.TimerHandle] = None
        self._renewal_task: Optional["asyncio.Task[None]"] = None
        if self._watchdog or self._on_lost is not None:
            self._look_at(self._next_look())

    async def renew(self, ttl: Optional[float] = None) -> None:
        """RENEW, as Lease.renew()."""
        await self._renew_once(self._next_ttl_ms(ttl), self._client.request_timeout)

    async def release(self) -> None:
        """RELEASE, waiting for the answer, as Lease.release(). The lease is
        inactive afterwards whatever the answer; on_lost will not run."""
        if self._status == RELEASED:
            raise LeaseInactiveError("the lease on %r was released already" % self.key)
        self._status = RELEASED
        if self._timer is not None:
            self._timer.cancel()
        task = self._renewal_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        raw_answer(await self._client._call(self._release_request()), p.RELEASE, self._key)

    async def __aenter__(self) -> "AsyncLease":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lost = self._lost_while_held()
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

    def _look_at(self, when: float) -> None:
        """The watchdog's next look, at `when`: a timer, then a task."""
        self._timer = self._client._loop.call_later(max(0.0, when - now()), self._look)

    def _look(self) -> None:
        self._timer = None
        if self._status == HELD:
            self._renewal_task = self._client._loop.create_task(self._watchdog_pass())

    async def _watchdog_pass(self) -> None:
        client = self._client
        try:
            when = await client._drive(self._watchdog_look(
                client.request_timeout, client._new_request_id, client._drift_margin), self)
        finally:
            self._renewal_task = None
        if when is not None and self._status == HELD:
            self._look_at(when)

    async def _renew_once(self, ttl_ms: int, timeout: float) -> None:
        client = self._client
        await client._drive(self._renewal(ttl_ms, timeout, client._new_request_id(),
                                          client._drift_margin), self)

    def _after_loss(self) -> None:
        """Lost (marked): no more looks; on_lost runs now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        reason = self._lost_reason
        if self._on_lost is not None and reason is not None:
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

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        assert self._lease is not None
        await self._lease.__aexit__(exc_type, exc, tb)


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, client: "AsyncClient") -> None:
        self.client = client

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.client._dispatch(data)

    def error_received(self, exc: Exception) -> None:
        pass  # ECONNREFUSED from an ICMP error: a lost datagram, retransmitted


class AsyncClient(ClientCore):
    """The asyncio form of Client: the same arguments, the same calls as
    coroutines, leases as AsyncLease.

        async with AsyncClient("127.0.0.1:7420") as client:       # or
        client = await AsyncClient.connect("127.0.0.1:7420")      # ... await client.close()

    start() (or `async with`, or connect()) opens the datagram endpoint on
    the running loop and, with discover=True, reads the cluster's map.
    Server names are resolved there, in the loop's executor.
    """

    def _open(self) -> None:
        self._calls: Dict[int, _AsyncCall] = {}
        self._closed = False
        self._started = False
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
            None, resolve_nodes, self._texts, self._discover)
        self._routing = Routing(seeds, family, static)
        self._refresh_lock = asyncio.Lock()
        self._transport, _ = await self._loop.create_datagram_endpoint(
            lambda: _Protocol(self), family=family)
        self._started = True
        if self._discover:
            try:
                await self._drive(self._first_map_steps())
            except UnreachableError:
                await self.close()
                raise

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

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self.close()

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
        grant = await self._drive(self._acquire_steps(key, ttl, wait, shared, permits, watchdog,
                                                      False, renew_fraction, value, owner))
        return AsyncLease(self, grant.key, grant.token, grant.mode, grant.ttl_ms, grant.expiry,
                          grant.sent, watchdog, on_lost, renew_fraction, grant.node, grant.owner)

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
        data, values, as_owner = raw_request(self._client_id, key, token, ttl, owner)
        reply = await self._call(self._raw_call(p.RENEW, data, values, as_owner))
        return raw_answer(reply, p.RENEW, data)

    async def release(self, key: Key, token: int, *, owner: Optional[Owner] = None) -> None:
        """As Client.release(): RELEASE of (`key`, `token`) as `owner`
        (default: this client's id), waiting for the answer."""
        data, values, as_owner = raw_request(self._client_id, key, token, None, owner)
        reply = await self._call(self._raw_call(p.RELEASE, data, values, as_owner))
        raw_answer(reply, p.RELEASE, data)

    async def query(self, key: Key) -> QueryResult:
        return QueryResult(await self._drive(self._query_steps(key_bytes(key))))

    async def holders(self, key: Key) -> HoldersResult:
        """As Client.holders(): each holder of `key`, oldest grant first."""
        result: HoldersResult = await self._drive(self._holders_steps(key_bytes(key)))
        return result

    async def watch_once(self, key: Key, since: Optional[KeyVersion] = None,
                         wait: float = 30.0) -> WatchEvent:
        """As Client.watch_once(): one WATCH, answered when the key's
        version differs from `since` (at once for None) or after `wait`."""
        data = key_bytes(key)
        wait_ms = to_ms(wait, "wait", True)
        return await self._watch_once(data, watch_since(since), wait_ms)

    def watch(self, key: Key, round: float = 30.0, retry: float = 0.05) -> "AsyncKeyWatch":
        """As Client.watch(): `async for event in client.watch(key)`, or
        `await watch.next(timeout)`."""
        return AsyncKeyWatch(self, key, round=round, retry=retry)

    def observe(self, name: Key, round: float = 30.0) -> "AsyncLeaderObserver":
        """As Client.observe(): `async for leader in client.observe(name)`."""
        return AsyncLeaderObserver(self, name, round=round)

    # ---- driving the steps (_policy.py) ---------------------------------------

    async def _drive(self, steps: Steps, lease: Optional[AsyncLease] = None) -> Any:
        """Runs `steps` to their end on the loop; returns what they return."""
        run = Run(steps)
        while run.step is not None:
            run.advance(await self._do(run, lease))
        return run.result

    async def _do(self, run: Run, lease: Optional[AsyncLease]) -> Any:
        """Does `run`'s step; its outcome, or the ShardlockError it met."""
        assert run.step is not None
        action, argument = run.step
        try:
            if action == SEND:
                silence = (lambda: self._after_silence(run)) if argument.watch_silence else None
                return await self._call(argument, silence)
            if action == PAUSE:
                await asyncio.sleep(argument)
            elif action == REFRESH:
                await self._refresh_map(argument)
            elif action == LOST and lease is not None:
                lease._after_loss()
        except ShardlockError as error:
            return error
        return None

    async def _after_silence(self, run: Run) -> bool:
        """A SEND's on_silence: the steps after SILENT, up to ABANDON."""
        run.advance(SILENT)
        while run.step is not None and run.step[0] != ABANDON:
            run.advance(await self._do(run, None))
        return run.abandon_after_silence()

    async def _refresh_map(self, refresh: MapRefresh) -> List[str]:
        """One refresh at a time."""
        assert self._refresh_lock is not None
        async with self._refresh_lock:
            failures: List[str] = await self._drive(self._refresh_steps(refresh))
            return failures

    # ---- calls ------------------------------------------------------------

    async def _watch_once(self, key: bytes, since: KeyVersion, wait_ms: int) -> WatchEvent:
        _, reply, node = await self._drive(self._routed_steps(p.WATCH, key, wait_ms=wait_ms,
                                                              since=since))
        return watch_answer(reply, node.text, key)

    async def _call(self, request: Request,
                    on_silence: Optional[Callable[[], Awaitable[bool]]] = None
                    ) -> Optional[p.Message]:
        """As Client._call(): the reply, or None once the deadline passes."""
        if self._closed:
            raise ClientClosedError("the client is closed")
        if not self._started:
            raise ShardlockError("the client is not started: await start() or use async with")
        request_id, data, node, deadline = self._prepare(request)
        call = _AsyncCall(self, request.message_type, request.key, data, node.address, deadline,
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
                reply: Optional[p.Message] = result
                return reply
        finally:
            call.cancel()
            self._calls.pop(request_id, None)

    def _dispatch(self, data: bytes) -> None:
        for reply, call in self._replies(data):
            if call.timer is not None:
                call.timer.cancel()
            call.future.set_result(reply)


class AsyncKeyWatch(WatchedKey):
    """KeyWatch (watch.py) for asyncio: the same rounds, awaited. Use it
    from the client's loop, one next() at a time; cancel the awaiting task
    to stop it."""

    _client: AsyncClient

    async def next(self, timeout: Optional[float] = None) -> Optional[WatchEvent]:
        """As KeyWatch.next(): the next state, None when `timeout` passed
        with none; raises the last round's error when none could be read."""
        deadline = None if timeout is None else now() + timeout
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
            event: Optional[WatchEvent] = stop.value
            return event

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
        self._changes = LeaderChanges()

    async def next(self, timeout: Optional[float] = None) -> Optional[LeaderChange]:
        """As LeaderObserver.next()."""
        deadline = None if timeout is None else now() + timeout
        while True:
            event = await self._watch.next(None if deadline is None
                                           else max(0.0, deadline - now()))
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
