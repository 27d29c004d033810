"""Building requests and reading replies: checked arguments in, wire
values out; a reply in, a result or the error it means out. No I/O."""

from __future__ import annotations

import math
from typing import Optional, Tuple

from . import protocol as p
from ._common import (LOW_32, Key, Owner, OwnerId, key_bytes, key_text, now, owner_id, to_ms,
                      wait_seconds)
from ._types import MODES, NO_VERSION, HolderInfo, HoldersResult, KeyVersion, WatchEvent
from .errors import (BusyError, LeaseExpiredError, NotOwnerError, PermissionDeniedError,
                     RecoveringError, RedirectedError, ServerError, ShardlockError,
                     UnreachableError, WaitTimeoutError)


def acquire_request(key: Key, ttl: float, shared: bool, permits: int,
                    renew_fraction: float) -> Tuple[bytes, int, int, int]:
    """An acquire's checked arguments: (key bytes, ttl_ms, message type,
    lease mode). ValueError for bad ones. The wait is WaitRounds'."""
    data = key_bytes(key)
    ttl_ms = to_ms(ttl, "ttl", False)
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


def raw_request(client_id: OwnerId, key: Key, token: int, ttl: Optional[float],
                owner: Optional[Owner]) -> Tuple[bytes, Tuple[int, ...], OwnerId]:
    """A raw renew() (with `ttl`) or release() (ttl None), checked: (key
    bytes, body values, owner: `owner`, or the client id). ValueError for
    bad arguments. For Client and AsyncClient."""
    data = key_bytes(key)
    if isinstance(token, bool) or not isinstance(token, int) or \
            not 0 < token <= 0xFFFFFFFFFFFFFFFF:
        raise ValueError("a token is an integer in 1..2^64-1, not %r" % (token,))
    values = (token,) if ttl is None else (token, to_ms(ttl, "ttl", False))
    return data, values, client_id if owner is None else owner_id(owner)


def raw_answer(reply: Optional[p.Message], message_type: int, key: bytes) -> float:
    """What a raw renew() or release() answer means: the TTL answered
    (seconds; 0 for a release), or the error raised."""
    if reply is None:
        raise UnreachableError("no answer to %s of %r" % (p.type_name(message_type),
                                                          key_text(key)))
    if reply.type not in _SUCCESS:
        raise_for_reply(reply, key_text(key))
    return reply.ttl_ms / 1000.0 if reply.type == p.RENEWED else 0.0


def request_values(message_type: int, ttl_ms: int, wait_ms: int, permits: int,
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


def answers(request_type: int, key: bytes, reply: p.Message) -> bool:
    """Whether `reply` answers a request of `request_type` on `key`: its
    type is one the request gets, and a reply that carries a key carries
    this one (so a stray datagram completes nothing)."""
    return p.reply_answers(request_type, reply.type) and \
        (not p.reply_carries_key(reply.type) or reply.key == key)


def raise_for_reply(reply: p.Message, key: str) -> None:
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
        if reply.error == p.ERROR_PERMISSION_DENIED:
            raise PermissionDeniedError(key)
        raise ServerError(reply.error, p.WIRE_ERRORS.get(reply.error, "unknown error"))
    if t == p.REDIRECT:
        raise RedirectedError(key, reply.epoch)
    raise ShardlockError("unexpected reply %s" % p.type_name(t))


_SUCCESS = frozenset((p.GRANTED, p.RENEWED, p.RELEASED, p.QUERY_REPLY, p.HOLDERS_REPLY))


def answer_of(reply: Optional[p.Message], request: str, where: str, key: bytes,
              name_key: bool = False) -> p.Message:
    """`reply` if it is a success; else raises what it means (None: no
    answer from `where` to the `request`, followed by the key if
    `name_key`)."""
    if reply is None:
        if name_key:
            request = "%s %r" % (request, key_text(key))
        raise UnreachableError("no answer from %s to %s" % (where, request))
    if reply.type not in _SUCCESS:
        raise_for_reply(reply, key_text(key))
    return reply


def watch_since(since: Optional[KeyVersion]) -> KeyVersion:
    """The version a WATCH carries: `since`, or NO_VERSION for None."""
    if since is None:
        return NO_VERSION
    token, holders = since
    if not (0 <= token <= 0xFFFFFFFFFFFFFFFF and 0 <= holders <= 0xFFFFFFFF):
        raise ValueError("since must be a KeyVersion (u64 token, u32 holders)")
    return KeyVersion(token, holders)


def watch_answer(reply: Optional[p.Message], where: str, key: bytes) -> WatchEvent:
    """What a WATCH's last answer (from `where`) means: the state, or the
    error raised."""
    return WatchEvent.from_reply(answer_of(reply, "WATCH", where, key, name_key=True))


# shardlockd's default --max-wait: the first round of a wait without end,
# and the first guess when a longer round is refused; halved from there
# while refused (as the C++ acquire_in_rounds' kUsualMaxWait).
USUAL_MAX_WAIT_MS = 300_000


class WaitRounds:
    """An acquire's wait as the rounds the server is asked for, as the C++
    client's acquire_in_rounds(): one round, one queue position, as long as
    the server takes it. A round answered TIMEOUT while the wait lasts is
    asked again (a new request of the same owner, behind later arrivals:
    only a wait longer than the server's --max-wait needs it); one refused
    as longer than the server's --max-wait (ERROR 5) is halved. No I/O:
    the caller sends each round and reports its answer to again()."""

    def __init__(self, wait: Optional[float]) -> None:
        seconds = wait_seconds(wait)
        self.forever = seconds is None
        self._end = 0.0 if seconds is None else now() + seconds
        self._waits = seconds is None or seconds > 0
        self._round_ms = USUAL_MAX_WAIT_MS if seconds is None else \
            min(int(math.ceil(seconds * 1000)), LOW_32)
        self._asked_ms = 0

    def next_ms(self) -> int:
        """The wait to ask for in the next round (0: a try, BUSY at once)."""
        if not self._waits:
            asked = 0
        elif self.forever:
            asked = self._round_ms
        else:
            # At least 1 ms: a wait of 0 would make it a try.
            left = max(1, int(math.ceil((self._end - now()) * 1000)))
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
            self._round_ms = USUAL_MAX_WAIT_MS if self._asked_ms > USUAL_MAX_WAIT_MS \
                else self._asked_ms // 2
            return True
        if reply.type == p.RECOVERING:
            # Still recovering at the round's end (the routed call rides
            # through it within the round): a finite wait is spent, one
            # without end goes on.
            return self.forever
        return reply.type == p.TIMEOUT and self._waits and (self.forever or now() < self._end)


class HolderPages:
    """Gathers the QUERY_HOLDERS pages of one key into a HoldersResult, for
    Client.holders() and AsyncClient.holders()."""

    def __init__(self, key: bytes) -> None:
        self.key = key
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

    def take(self, reply: Optional[p.Message], where: str) -> bool:
        """Adds a page (from `where`); True once every holder the server
        counts is in (or a page came back empty). Raises what a failed
        answer means."""
        reply = answer_of(reply, "QUERY_HOLDERS", where, self.key)
        self.pages += 1
        r = self.result
        mode = MODES[reply.mode]
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
