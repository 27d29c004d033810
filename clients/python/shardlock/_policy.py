"""The client's decisions, once for both shells: the routed call, the map
refresh, the renewal, the acquire and the watch rounds, as generators with
no I/O (the sans-I/O shape of h11). Client (client.py, threads) and
AsyncClient (aio.py, asyncio) drive them: each generator yields a step
(action, argument), the driver does it and sends back its outcome:

    SEND, Request    send it, retransmitting (same request id) until it is
                     answered or its timeout passes; send back the reply or
                     None. A request with watch_silence may end early: after
                     every SILENT_SENDS unanswered sends the driver sends
                     back SILENT, keeps the request id alive and goes on as
                     the steps that follow say (REFRESH, then ABANDON).
    ABANDON, bool    after SILENT: True to give the request up (its outcome
                     is then None), False to go on sending it.
    PAUSE, seconds   sleep (a cancelled sync watch wakes early); send back None.
    REFRESH, MapRefresh  refresh the cluster map, one refresh at a time:
                     drive refresh_steps() under the client's refresh lock.
    LOST, error      the lease the steps renew is lost (its state says so
                     already): run the shell's side (on_lost, the watchdog).

A ShardlockError the driver meets doing a step is thrown into the generator
at that step. ClientCore holds what both clients are alike in (settings,
identity, routing) and makes the steps; LeaseState is what a lease is and
what the client can prove of it, for Lease and AsyncLease.
"""

from __future__ import annotations

import itertools
import random
import threading
from typing import (Any, Callable, Dict, Generator, Iterator, List, NamedTuple, Optional, Sequence,
                    Tuple, Union)

from . import auth as _auth
from . import protocol as p
from . import router as _router
from ._common import (LAST_TRY_MARGIN, HandleOwners, Key, Owner, OwnerId, client_identity,
                      first_request_id, key_bytes, key_text, now, owner_hex, retry_delay, to_ms,
                      value_bytes)
from ._requests import (HolderPages, WaitRounds, acquire_request, answer_of, answers,
                        raise_for_reply,
                        request_values)
from ._routing import (MAX_REDIRECTS, REDIRECT_RETRY, ClusterMap, MapPages, Node, Routing,
                       server_texts)
from ._types import (MODES, NO_VERSION, HoldersResult, KeyVersion, LeaderChange, QueryResult,
                     WatchEvent, leader_of)
from .errors import (ClientClosedError, GrantExpiredError, LeaseExpiredError, LeaseInactiveError,
                     NotOwnerError,
                     RecoveringError, RedirectedError, ServerError, ShardlockError,
                     UnreachableError)

SEND, ABANDON, PAUSE, REFRESH, LOST = "send", "abandon", "pause", "refresh", "lost"
# What a driver sends back for a SEND whose request went unanswered for
# SILENT_SENDS sends while it watches for silence.
SILENT = "silent"

Step = Tuple[str, Any]
Steps = Generator[Step, Any, Any]

_U64 = 0xFFFFFFFFFFFFFFFF


class Request(NamedTuple):
    """One request id's datagram, as a SEND asks for it. timeout None: the
    request timeout; sent None: now (the deadline counts from it); node
    None: the server; owner None: the client id; request_id None: a new one."""

    message_type: int
    key: bytes
    values: Tuple[int, ...]
    timeout: Optional[float] = None
    sent: Optional[float] = None
    node: Optional[Node] = None
    value: bytes = b""
    owner: Optional[OwnerId] = None
    request_id: Optional[int] = None
    watch_silence: bool = False


class Routed(NamedTuple):
    """A routed call's end: the first send time of the request id answered
    last, its reply (None: unanswered) and the node that answered (or was
    asked last)."""

    sent: float
    reply: Optional[p.Message]
    node: Node


class MapRefresh(NamedTuple):
    """A REFRESH: read the map from the first of `sources` that gives one,
    by `deadline`, unless the map `routed_by` was replaced meanwhile."""

    sources: List[Node]
    deadline: float
    routed_by: Optional[ClusterMap]


class Run:
    """Steps being driven: `step` is the one to do next (None once they
    ended, with `result` what they returned). A driver loops

        run = Run(steps)
        while run.step is not None:
            run.advance(<do run.step>)   # its outcome, or the ShardlockError met
        return run.result
    """

    def __init__(self, steps: Steps) -> None:
        self._steps = steps
        self.step: Optional[Step] = None
        self.result: Any = None
        self.advance(None)

    def advance(self, outcome: Any) -> None:
        """Sends `outcome` back (a ShardlockError is thrown in instead)."""
        try:
            if isinstance(outcome, ShardlockError):
                self.step = self._steps.throw(outcome)
            else:
                self.step = self._steps.send(outcome)
        except StopIteration as stop:
            self.step = None
            self.result = stop.value

    def abandon_after_silence(self) -> bool:
        """Whether the ABANDON the steps reached after SILENT says to give
        the request up."""
        assert self.step is not None and self.step[0] == ABANDON
        return bool(self.step[1])


HELD, LOST_STATUS, RELEASED = "held", "lost", "released"


class LeaseState:
    """A lease's facts (set once) and its expiry bookkeeping: what Lease and
    AsyncLease share. The fields after _lock are under it (Lease's methods
    run on any thread). Renewals never push the expiry past what the server
    may hold (client.h): a renewal pulls it in when sent, and one answered
    moves it only up to what a newer renewal in flight allows."""

    def __init__(self, client: Any, key: bytes, token: int, mode: int, ttl_ms: int,
                 expiry: float, sent: float, watchdog: bool, on_lost: Any,
                 renew_fraction: float, node: Node, owner: OwnerId) -> None:
        """What Lease(...) and AsyncLease(...) take; then the shell's
        _open()."""
        self._client = client
        self._on_lost = on_lost
        self._key = key
        self._token = token
        self._mode = mode
        # The node that granted it: renewals and releases go there, whatever
        # a newer cluster map says (docs/cluster.md, Clients).
        self._node = node
        self._owner = owner
        self._watchdog = watchdog
        self._renew_fraction = renew_fraction
        self._lock = threading.Lock()
        self._status = HELD
        self._lost_reason: Optional[ShardlockError] = None
        self._ttl_ms = ttl_ms
        self._expiry = expiry
        self._confirmed_sent = sent  # send time of the last confirmed grant or renewal
        self._confirmed_id = 0  # request id of the last applied renewal
        self._pending: Dict[int, Tuple[float, int]] = {}  # renewal id -> (sent, ttl_ms)
        self._open()

    def _open(self) -> None:
        """The shell's own set-up, at the end of the constructor."""

    @property
    def key(self) -> str:
        return key_text(self._key)

    @property
    def key_bytes(self) -> bytes:
        return self._key

    @property
    def token(self) -> int:
        """The fencing token: pass it to the resource, which rejects older ones."""
        return self._token

    @property
    def mode(self) -> str:
        return MODES[self._mode]

    @property
    def owner(self) -> str:
        """The owner this lease was taken, renews and releases as: 32 hex
        digits, hi then lo (as Client.client_id and HolderInfo.owner). A
        fresh one per acquire unless the acquire named one (owner=)."""
        return owner_hex(self._owner)

    @property
    def ttl(self) -> float:
        """The TTL (seconds) the last grant or renewal asked for."""
        with self._lock:
            return self._ttl_ms / 1000.0

    @property
    def valid(self) -> bool:
        """True while held, not lost, and the client-side expiry is ahead."""
        with self._lock:
            return self._status == HELD and now() < self._expiry

    def remaining(self) -> float:
        """Seconds until the client-side expiry; 0 once passed, released or lost."""
        with self._lock:
            if self._status != HELD:
                return 0.0
            return max(0.0, self._expiry - now())

    def _next_ttl_ms(self, ttl: Optional[float]) -> int:
        """A renew()'s TTL in ms (None: the current one); LeaseInactiveError
        unless held."""
        with self._lock:
            if self._status != HELD:
                raise LeaseInactiveError("the lease on %r is not held" % self.key)
            return self._ttl_ms if ttl is None else to_ms(ttl, "ttl", False)

    def _release_request(self) -> Request:
        """The RELEASE of this lease, at the node that granted it."""
        return Request(p.RELEASE, self._key, (self._token,), node=self._node, owner=self._owner)

    def _lose(self, reason: ShardlockError) -> bool:
        """Marks the lease lost for `reason`; True if it was held until now."""
        with self._lock:
            if self._status != HELD:
                return False
            self._status = LOST_STATUS
            self._lost_reason = reason
            return True

    def _lost_while_held(self) -> Optional[ShardlockError]:
        """Why the lease was lost, while it is lost and not released."""
        with self._lock:
            return self._lost_reason if self._status == LOST_STATUS else None

    def _view(self) -> Tuple[str, float, float, int]:
        """What the watchdog looks at: (status, expiry, when the renewal is
        due, ttl_ms)."""
        with self._lock:
            status, expiry, ttl_ms = self._status, self._expiry, self._ttl_ms
            due = self._confirmed_sent + ttl_ms / 1000.0 * self._renew_fraction
        return status, expiry, due, ttl_ms

    def _next_look(self) -> float:
        """When the watchdog looks next: the renewal when due, else the expiry."""
        _, expiry, due, _ = self._view()
        return min(due, expiry) if self._watchdog else expiry

    def _renewal(self, ttl_ms: int, timeout: float, request_id: int,
                 margin: "DriftMargin") -> Steps:
        """One RENEW and its bookkeeping: SEND, then LOST if the answer
        means the lease is gone (NotOwnerError, LeaseExpiredError,
        RedirectedError: a cluster node handed the key off, ServerError),
        which is raised after. UnreachableError without an answer."""
        sent = now()
        with self._lock:
            self._pending[request_id] = (sent, ttl_ms)
            self._ttl_ms = ttl_ms
            # The server may apply a shorter TTL at any moment: pull in now.
            self._expiry = min(self._expiry, sent + ttl_ms / 1000.0 - margin(ttl_ms))
        try:
            reply = yield SEND, Request(p.RENEW, self._key, (self._token, ttl_ms),
                                        timeout=timeout, sent=sent, node=self._node,
                                        owner=self._owner, request_id=request_id)
        except BaseException:
            with self._lock:
                self._pending.pop(request_id, None)
            raise
        with self._lock:
            self._pending.pop(request_id, None)
            if reply is not None and reply.type == p.RENEWED:
                if request_id > self._confirmed_id:
                    self._confirmed_id = request_id
                    expiry = sent + reply.ttl_ms / 1000.0 - margin(reply.ttl_ms)
                    for newer_id, (newer_sent, newer_ttl) in self._pending.items():
                        if newer_id > request_id:
                            expiry = min(expiry, newer_sent + newer_ttl / 1000.0 -
                                         margin(newer_ttl))
                    if self._status == HELD:
                        self._expiry = expiry
                        self._confirmed_sent = sent
                return
        if reply is None:
            raise UnreachableError("no answer to RENEW of %r" % self.key)
        try:
            raise_for_reply(reply, self.key)
        except (NotOwnerError, LeaseExpiredError, RedirectedError, ServerError) as error:
            if self._lose(error):
                yield LOST, error
            raise

    def _watchdog_look(self, request_timeout: float, new_request_id: Callable[[], int],
                       margin: "DriftMargin") -> Generator[Step, Any, Optional[float]]:
        """The watchdog's look at this lease: renews it if due, marks it lost
        (LOST) once its expiry passed. Returns when to look again, or None to
        stop watching (released or lost)."""
        when = now()
        status, expiry, due, ttl_ms = self._view()
        if status == RELEASED:
            return None
        if status == HELD and when >= expiry:
            error = LeaseExpiredError("the lease on %r expired with no confirmed renewal"
                                      % self.key)
            if self._lose(error):
                yield LOST, error
            return None
        if status != HELD:
            return None
        if self._watchdog and when >= due:
            try:
                # Retried until the expiry (later the lease is lost anyway),
                # one request timeout at a time so other leases get a turn.
                yield from self._renewal(ttl_ms, max(0.001, min(expiry - when, request_timeout)),
                                         new_request_id(), margin)
            except RecoveringError as error:
                # The node cannot renew now (failed closed, or restarting):
                # asking again at once would spin. The expiry still ends the
                # lease if it never comes back.
                return min(expiry, now() + retry_delay(error.retry_after_ms))
            except ShardlockError:
                pass  # lost (marked) or unanswered (the expiry will tell)
            return now()
        return min(expiry, due) if self._watchdog else expiry


class DriftMargin:
    """How much earlier than the server the client counts a lease expired:
    a share of the TTL plus a fixed allowance."""

    def __init__(self, factor: float, allowance: float) -> None:
        if not 0 <= factor < 1:
            raise ValueError("clock_drift_factor must be in [0, 1)")
        self.factor = factor
        self.allowance = allowance

    def __call__(self, ttl_ms: int) -> float:
        return self.factor * ttl_ms / 1000.0 + self.allowance


class Grant(NamedTuple):
    """An acquire's end: what the lease is made of."""

    key: bytes
    token: int
    mode: int
    ttl_ms: int
    expiry: float
    sent: float
    node: Node
    owner: OwnerId
    # When the watchdog first looks (renewal due, or the expiry).
    first_look: float


class ClientCore:
    """What Client and AsyncClient are alike in: their settings, identity,
    owners and request ids, where each key goes, and the steps of each
    call. No I/O: the shells send, read and sleep."""

    def __init__(self, server: Union[str, Sequence[str], None] = None, *,
                 discover: bool = False, request_timeout: float = 2.0,
                 initial_retransmit: float = 0.020, max_retransmit: float = 0.400,
                 clock_drift_factor: float = 0.01, clock_drift_allowance: float = 0.002,
                 client_id: Optional[bytes] = None, auth_key: Union[bytes, str, None] = None,
                 auth_key_file: Optional[str] = None, tenant: Optional[int] = None,
                 encrypt: bool = False, cipher: Optional[str] = None) -> None:
        """The arguments Client's docstring describes (AsyncClient takes the
        same); then the shell's _open()."""
        self._texts = server_texts(server)
        self._drift_margin = DriftMargin(clock_drift_factor, clock_drift_allowance)
        self._auth_key = _auth.resolve_envelope(auth_key, auth_key_file, tenant, encrypt, cipher)
        if discover or len(self._texts) > 1:
            _router.require_xxhash()
        self.server = ",".join(self._texts)
        self.request_timeout = request_timeout
        self._discover = discover
        self._initial_retransmit = initial_retransmit
        self._max_retransmit = max_retransmit
        self._client_id = client_identity(
            client_id, None if self._auth_key is None else self._auth_key.key_id)
        self._owners = HandleOwners(self._client_id)  # a fresh owner per acquire
        # itertools.count's next() is atomic under the GIL: no lock.
        self._ids = itertools.count(first_request_id())
        self._random = random.Random()
        # Set once the addresses are resolved (AsyncClient: in start()).
        self._routing: Optional[Routing] = None
        # Request id -> the shell's call in flight (.type, .key, .finished()).
        self._calls: Dict[int, Any] = {}
        self._open()

    def _open(self) -> None:
        """The shell's own set-up, at the end of the constructor."""

    # ---- public ---------------------------------------------------------------

    @property
    def client_id(self) -> str:
        """The client's identity: 32 hex digits, hi then lo (as shardlockctl).
        The owner of the raw renew() and release() calls by default; no
        Lease has it as its owner (Lease.owner shares its upper 96 bits)."""
        return owner_hex(self._client_id)

    @property
    def map_epoch(self) -> int:
        """The epoch of the cluster map in use; 0 without discover."""
        epoch = self._routing.epoch if self._routing is not None else None
        return epoch or 0

    @property
    def map_members(self) -> List[Tuple[str, str, int]]:
        """The map's members as (id, "host:port", weight), sorted by id (as
        bytes); empty without discover."""
        return self._routing.members() if self._routing is not None else []

    def address_for(self, key: Key) -> str:
        """The "host:port" a call on `key` goes to now: its owner under the
        current map, or the server."""
        return self._route(key_bytes(key))[0].text

    # ---- for the shells ---------------------------------------------------------

    def _routes(self) -> Routing:
        if self._routing is None:
            raise ShardlockError("the client is not started: await start() or use async with")
        return self._routing

    def _route(self, key: bytes) -> Tuple[Node, Optional[ClusterMap]]:
        return self._routes().route(key)

    def _new_request_id(self) -> int:
        return next(self._ids) & _U64

    def _datagram(self, request: Request, request_id: int) -> bytes:
        """`request` as the datagram to send, as `request_id`."""
        current = self._routes().map
        epoch = None if current is None or request.message_type == p.MAP else current.epoch
        return p.pack_request(request.message_type, request_id,
                              self._client_id if request.owner is None else request.owner,
                              request.key, request.values, epoch, self._auth_key,
                              value=request.value)

    def _prepare(self, request: Request) -> Tuple[int, bytes, Node, float]:
        """What a shell needs to send `request`: its request id, datagram,
        node and deadline."""
        request_id = self._new_request_id() if request.request_id is None else request.request_id
        node = self._routes().seeds[0] if request.node is None else request.node
        start = now() if request.sent is None else request.sent
        deadline = start + (self.request_timeout if request.timeout is None else request.timeout)
        return request_id, self._datagram(request, request_id), node, deadline

    def _replies(self, data: bytes) -> Iterator[Tuple[p.Message, Any]]:
        """Each reply in the datagram `data` with the call in flight it
        answers (by request id, reply type and key, so a stray datagram
        completes nothing); drops the rest, and datagrams this client cannot
        read (or not sealed by its key)."""
        try:
            datagram = p.decode(data, self._auth_key)
        except p.ProtocolError:
            return
        for reply in datagram.messages:
            call = self._calls.get(reply.request_id)
            if call is not None and not call.finished() and answers(call.type, call.key, reply):
                yield reply, call

    def _raw_call(self, message_type: int, key: bytes, values: Tuple[int, ...],
                  owner: OwnerId) -> Request:
        """A raw renew() or release() at the key's node."""
        return Request(message_type, key, values, node=self._route(key)[0], owner=owner)

    def _routed_steps(self, message_type: int, key: bytes, ttl_ms: int = 0, wait_ms: int = 0,
                      permits: int = 0, first_holder: int = 0, value: bytes = b"",
                      since: KeyVersion = NO_VERSION, owner: Optional[OwnerId] = None
                      ) -> Generator[Step, Any, Routed]:
        """An ACQUIRE*, QUERY, QUERY_HOLDERS or WATCH call as `owner`
        (default: the client id), within wait + request_timeout.

        An ACQUIRE* or WATCH with a wait rides through RECOVERING while the
        wait lasts (a hint past the wait's end cut to a last try just before
        it). In cluster mode it also follows REDIRECTs (refreshing the map
        from the redirecting node when its map is newer, at most
        MAX_REDIRECTS) and, every SILENT_SENDS unanswered sends, refreshes
        the map from the other members and the seeds (the silent node last)
        and moves to the key's new owner if it changed. Each follow-up is a
        fresh request id asking for the wait left."""
        routing = self._routes()
        start = now()
        wait_end = start + wait_ms / 1000.0
        deadline = wait_end + self.request_timeout
        waits = wait_ms > 0
        sent = start
        redirects = 0
        while True:
            node, routed_by = routing.route(key)
            values = request_values(message_type, ttl_ms, wait_ms, permits, first_holder, since)
            moved = False
            # One node, or a static list: no map, so nothing to refresh or
            # follow, and silence is only the deadline.
            outcome = yield SEND, Request(message_type, key, values, timeout=deadline - sent,
                                          sent=sent, node=node, value=value, owner=owner,
                                          watch_silence=routed_by is not None)
            while outcome == SILENT:
                yield REFRESH, MapRefresh(routing.refresh_sources(last=node), deadline,
                                          routed_by)
                # Abandon this request id if the key moved.
                moved = routing.route(key)[0] != node
                outcome = yield ABANDON, moved
            reply: Optional[p.Message] = outcome
            if reply is None and not moved:
                return Routed(sent, None, node)
            if reply is not None and reply.type == p.REDIRECT and routed_by is not None:
                behind = reply.epoch < routed_by.epoch and routing.map is routed_by
                if not behind:
                    # A hop: the owner moved, or the node is mid-change.
                    redirects += 1
                    if redirects > MAX_REDIRECTS:
                        return Routed(sent, reply, node)
                    if reply.epoch > routed_by.epoch:
                        yield REFRESH, MapRefresh(routing.refresh_sources(first=node),
                                                  deadline, routed_by)
                if routing.map is routed_by:
                    # The node will catch up with our map (not a hop), or no
                    # newer map was found yet: ask again shortly.
                    yield PAUSE, max(0.0, min(REDIRECT_RETRY, deadline - now()))
            elif reply is not None and reply.type == p.RECOVERING and waits:
                # A hint past the wait's end is cut to a last try just
                # before it (the node may be ready sooner than it said).
                left = wait_end - now()
                if left <= LAST_TRY_MARGIN:
                    return Routed(sent, reply, node)
                yield PAUSE, min(retry_delay(reply.retry_after_ms), left - LAST_TRY_MARGIN)
            elif reply is not None:
                return Routed(sent, reply, node)
            sent = now()
            if sent >= deadline:
                return Routed(sent, reply, node)
            if waits:
                # At least 1 ms: a wait of 0 would make it a try (BUSY at once).
                wait_ms = max(1, int((wait_end - sent) * 1000))

    def _refresh_steps(self, refresh: MapRefresh) -> Generator[Step, Any, List[str]]:
        """Reads the map from the first of the sources that gives one (MAP,
        paged with first_member, each page asked for up to the request
        timeout) and adopts it if it is newer than the current one. The
        driver runs one at a time: one that waited for another's refresh,
        which replaced the map it routed by, uses that one instead. Returns
        the reason each source failed."""
        routing = self._routes()
        failures: List[str] = []
        if refresh.routed_by is not None and routing.map is not refresh.routed_by:
            return failures
        for source in refresh.sources:
            timeout = min(self.request_timeout, refresh.deadline - now())
            if timeout <= 0:
                failures.append("%s: not asked (out of time)" % source.text)
                continue
            try:
                pages = MapPages()
                while not pages.take((yield SEND, Request(p.MAP, b"", (len(pages.members),),
                                                          timeout=timeout, node=source))):
                    pass
                fetched = routing.build(pages)
            except ShardlockError as error:
                failures.append("%s: %s" % (source.text, error))
                continue
            routing.adopt(fetched)
            return failures
        return failures

    def _first_map_steps(self) -> Generator[Step, Any, None]:
        """Cluster mode's start: the map from the first seed that gives it,
        each seed asked for up to the request timeout; UnreachableError
        naming each seed's reason if none does."""
        seeds = self._routes().seeds
        failures = yield from self._refresh_steps(
            MapRefresh(list(seeds), now() + len(seeds) * self.request_timeout, None))
        if self._routes().map is None:
            raise UnreachableError("no seed gave the cluster's map: " + "; ".join(failures))

    def _acquire_steps(self, key: Key, ttl: float, wait: Optional[float], shared: bool,
                       permits: int, watchdog: bool, watched: bool, renew_fraction: float,
                       value: Union[bytes, str, None], owner: Optional[Owner]
                       ) -> Generator[Step, Any, Grant]:
        """Client.acquire()'s decisions: the checked arguments, the wait in
        rounds (WaitRounds), each a routed call, then the grant. A grant
        past its client-side expiry (a wait longer than the TTL) is proved
        by a RENEW counted from its own send, or given back (RELEASE) and
        GrantExpiredError raised. `watched`: the watchdog looks after it."""
        data, ttl_ms, message_type, mode = acquire_request(key, ttl, shared, permits,
                                                           renew_fraction)
        rounds = WaitRounds(wait)
        held_value = value_bytes(value)
        lease_owner = self._owners.resolve(owner)
        while True:
            sent, reply, node = yield from self._routed_steps(
                message_type, data, ttl_ms, rounds.next_ms(), permits, value=held_value,
                owner=lease_owner)
            if not rounds.again(reply):
                break
        reply = answer_of(reply, "ACQUIRE", node.text, data, name_key=True)
        ttl_ms = reply.ttl_ms
        expiry = sent + ttl_ms / 1000.0 - self._drift_margin(ttl_ms)
        if now() >= expiry:
            # The grant may date from any time after the first send, so a
            # wait longer than the TTL ends past this expiry: a RENEW proves
            # the lease still stands and counts the expiry from its own send
            # (as the C++ client does). Refused, the grant is given back.
            probe = LeaseState(self, data, reply.token, mode, ttl_ms, expiry, sent, watchdog,
                               None, renew_fraction, node, lease_owner)
            try:
                yield from probe._renewal(ttl_ms, self.request_timeout, self._new_request_id(),
                                          self._drift_margin)
            except ShardlockError:
                pass
            if not probe.valid:
                yield SEND, Request(p.RELEASE, data, (reply.token,), node=node,
                                    owner=lease_owner)
                raise GrantExpiredError("the grant of %r arrived after its expiry"
                                        % key_text(data))
            expiry, sent = probe._expiry, probe._confirmed_sent
        due = sent + ttl_ms / 1000.0 * renew_fraction
        first_look = (min(expiry, due) if watchdog else expiry) if watched else 0.0
        return Grant(data, reply.token, mode, ttl_ms, expiry, sent, node, lease_owner, first_look)

    def _holders_steps(self, key: bytes) -> Generator[Step, Any, Any]:
        """Client.holders()'s calls: QUERY_HOLDERS pages, or QUERY's summary
        from a server that predates it."""
        pages = HolderPages(key)
        while True:
            _, reply, node = yield from self._routed_steps(p.QUERY_HOLDERS, key,
                                                           first_holder=pages.first_holder())
            if pages.server_predates(reply):
                return HoldersResult.from_query(QueryResult((yield from self._query_steps(key))))
            if pages.take(reply, node.text):
                return pages.result

    def _query_steps(self, key: bytes) -> Generator[Step, Any, p.Message]:
        _, reply, node = yield from self._routed_steps(p.QUERY, key)
        return answer_of(reply, "QUERY", node.text, key)


# ---- watches ---------------------------------------------------------------------

# A round never waits less than this: a server refusing every wait halves
# the round down to here, then its refusal is a failure like another.
_SHORTEST_ROUND = 0.100
_LONGEST_RETRY = 1.0

# What WatchRounds.steps() asks its driver for, besides PAUSE.
ROUND = "round"  # one WATCH with this many ms of wait; send back its event or error

Outcome = Union[WatchEvent, ShardlockError, None]
WatchSteps = Generator[Tuple[str, float], Outcome, Optional[WatchEvent]]


class WatchRounds:
    """The rounds of one watch: the version last reported, the round's
    length and the back-off. No I/O and no waiting: steps() says what to do
    next, and the driver reports back."""

    def __init__(self, round_wait: float, retry: float) -> None:
        to_ms(round_wait, "round", False)
        to_ms(retry, "retry", False)
        self.version: Optional[KeyVersion] = None  # None: nothing reported yet
        self.round_wait = max(round_wait, _SHORTEST_ROUND)
        self._first_retry = retry

    @property
    def since(self) -> KeyVersion:
        return NO_VERSION if self.version is None else self.version

    def steps(self, deadline: Optional[float]) -> WatchSteps:
        """One next(): yields (ROUND, wait_ms) and (PAUSE, seconds) until it
        returns the next state to report, or None once `deadline` (None:
        never) passed with nothing to report. Raises the last round's
        failure when no round succeeded by then, and ClientClosedError at
        once."""
        retry = self._first_retry
        failure: Optional[ShardlockError] = None
        while True:
            left = None if deadline is None else max(0.0, deadline - now())
            wait = self.round_wait if left is None else min(self.round_wait, left)
            outcome = yield ROUND, int(wait * 1000)
            if isinstance(outcome, WatchEvent):
                failure = None
                if outcome.version != self.version:
                    self.version = outcome.version
                    return outcome
                # The same version: the round's wait ended. Re-armed below.
            elif isinstance(outcome, ServerError) and \
                    outcome.code == p.ERROR_WAIT_OUT_OF_RANGE and \
                    self.round_wait > _SHORTEST_ROUND:
                # The server's max-wait is lower: halve until it is taken.
                self.round_wait = max(self.round_wait / 2, _SHORTEST_ROUND)
            elif isinstance(outcome, ClientClosedError):
                raise outcome
            elif isinstance(outcome, ShardlockError):
                # Unreachable, still recovering at the round's end, a limit:
                # again after a back-off, within the deadline.
                failure = outcome
                pause = retry if deadline is None else min(retry, max(0.0, deadline - now()))
                retry = min(retry * 2, _LONGEST_RETRY)
                yield PAUSE, pause
            if deadline is not None and now() >= deadline:
                if failure is not None:
                    raise failure
                return None


class WatchedKey:
    """What KeyWatch and AsyncKeyWatch share: the key and its rounds."""

    def __init__(self, client: Any, key: Key, round: float = 30.0, retry: float = 0.05) -> None:
        self._client = client
        self._key = key_bytes(key)
        self._rounds = WatchRounds(round, retry)

    @property
    def key(self) -> str:
        return key_text(self._key)

    @property
    def version(self) -> Optional[KeyVersion]:
        """The version of the last state next() returned; None before."""
        return self._rounds.version

    def __repr__(self) -> str:
        return "%s(key=%r, version=%r)" % (type(self).__name__, self.key, self.version)


class LeaderChanges:
    """Turns a watch's events into changes of leader: a change of holders
    that is no change of leader (a pending part, a shared holder, a
    renewal) is skipped; a new term, or none, is reported once, and never
    a term older than one reported (term order). For LeaderObserver and
    AsyncLeaderObserver."""

    def __init__(self) -> None:
        self._reported = False
        self._term = 0  # the last reported leader's; 0: none
        self._highest = 0  # the highest term reported

    def take(self, event: WatchEvent) -> Optional[LeaderChange]:
        leader = leader_of(event.mode, event.holders)
        term = leader.term if leader is not None else 0
        if (self._reported and term == self._term) or (leader is not None and
                                                       term < self._highest):
            return None
        self._reported = True
        self._term = term
        self._highest = max(self._highest, term)
        return LeaderChange(leader)
