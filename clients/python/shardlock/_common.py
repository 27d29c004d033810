"""What every part of the client uses and none owns: the clock, argument
checks, and the owners acquires contend as. A leaf: imports only the
codec."""

from __future__ import annotations

import math
import os
import random
import threading
import time
from typing import Optional, Tuple, Union

from . import protocol as p

if hasattr(time, "CLOCK_BOOTTIME"):
    def now() -> float:
        """Seconds on CLOCK_BOOTTIME, which keeps counting through a suspend
        (as the server's lease deadlines do)."""
        return time.clock_gettime(time.CLOCK_BOOTTIME)
else:  # pragma: no cover - not Linux
    now = time.monotonic

Key = Union[str, bytes]

# An owner on the wire: the datagram's client_id field as (lo, hi).
OwnerId = Tuple[int, int]
# What owner= takes: 32 hex digits, hi then lo (as Client.client_id,
# Lease.owner and HolderInfo.owner print it), or 16 bytes (as the client_id=
# argument takes them: lo then hi, each little-endian).
Owner = Union[str, bytes, bytearray]

LOW_32 = 0xFFFFFFFF


def parse_server(text: str) -> Tuple[str, int]:
    """"HOST:PORT" or "[IPv6]:PORT"."""
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("server address must be HOST:PORT or [IPV6]:PORT, not %r" % text)
    return host, int(port)


def key_bytes(key: Key) -> bytes:
    data = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if not p.MIN_KEY_LENGTH <= len(data) <= p.MAX_KEY_LENGTH:
        raise ValueError("a key must be 1..256 bytes, not %d" % len(data))
    return data


def key_text(key: bytes) -> str:
    """A key as errors and reprs print it."""
    return key.decode("utf-8", errors="replace")


_MIN_RETRY_AFTER = 0.010
# A waiting call whose retry would fall after its wait ends tries once more
# this long before the end instead; with less left it ends.
LAST_TRY_MARGIN = 0.010


def retry_delay(retry_after_ms: int) -> float:
    """Seconds to wait before asking a server that answered RECOVERING
    again: what it said (at least 10 ms) plus a random quarter of it (at most
    250 ms), so clients told the same time do not all come back at once. As
    the C++ client's retry_delay()."""
    base = max(retry_after_ms / 1000.0, _MIN_RETRY_AFTER)
    return base + random.uniform(0, min(base / 4, 0.250))


def to_ms(seconds: float, name: str, allow_zero: bool) -> int:
    ms = int(round(seconds * 1000))
    if ms < (0 if allow_zero else 1) or ms > 0xFFFFFFFF:
        raise ValueError("%s out of range: %r s" % (name, seconds))
    return ms


def wait_seconds(wait: Optional[float], name: str = "wait") -> Optional[float]:
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


def value_bytes(value: Union[bytes, str, None]) -> bytes:
    """An acquire's holder value as bytes (str: UTF-8); ValueError past
    MAX_HOLDER_VALUE_LENGTH bytes."""
    if value is None:
        return b""
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if len(data) > p.MAX_HOLDER_VALUE_LENGTH:
        raise ValueError("a value is at most %d bytes" % p.MAX_HOLDER_VALUE_LENGTH)
    return data


# ---- owners ----------------------------------------------------------------

def owner_hex(owner: OwnerId) -> str:
    lo, hi = owner
    return "%016x%016x" % (hi, lo)


def owner_id(owner: Owner) -> OwnerId:
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


def handle_owner(client: OwnerId, handle: int) -> OwnerId:
    """The owner of a client's `handle`-th handle: the client id with the low
    32 bits of lo replaced by `handle` (C++ handle_owner()), so the server,
    which counts per-client bounds over the upper 96 bits, counts a client's
    handles together."""
    lo, hi = client
    return (lo & ~LOW_32) | (handle & LOW_32), hi


class HandleOwners:
    """The owners a client's acquires contend as: a fresh one per acquire
    (handles 1, 2, ..., wrapping after 2^32, skipping the client id's own low
    32 bits so no handle is the client id), or the one owner= names. Any
    thread: the count moves under a lock."""

    def __init__(self, client: OwnerId) -> None:
        self._client = client
        self._own_low = client[0] & LOW_32
        self._lock = threading.Lock()
        self._handles = 0  # handles made so far, under _lock

    def resolve(self, owner: Optional[Owner]) -> OwnerId:
        """`owner` as (lo, hi), or a fresh handle's owner for None."""
        if owner is not None:
            return owner_id(owner)
        with self._lock:
            handle = (self._handles + 1) & LOW_32
            if handle == self._own_low:
                handle = (handle + 1) & LOW_32
            self._handles = handle
        return handle_owner(self._client, handle)


def client_identity(client_id: Optional[bytes], tenant: Optional[int] = None) -> OwnerId:
    """The client id as (lo, hi): `client_id` (16 bytes), or a random one;
    with a `tenant`, its key id in the top 32 bits of hi. A server with
    tenants forces every owner a tenant names so (docs/security.md), so
    that no tenant can name another's lease; choosing the id so keeps the
    owners this client sends, and sees in holders(), the server's (as the
    C++ client does)."""
    raw = client_id if client_id is not None else os.urandom(16)
    if len(raw) != 16:
        raise ValueError("client_id must be 16 bytes")
    lo, hi = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")
    if tenant is not None:
        hi = (hi & LOW_32) | (tenant << 32)
    return lo, hi


def first_request_id() -> int:
    """Where a client's request ids start: the wall-clock millisecond << 20
    plus 20 random bits, as the C++ client's, so a later process acting for
    the same owner neither collides in the server's dedup cache nor sends
    ids below ones the server applied (older ids are stale to it)."""
    return ((int(time.time() * 1000) << 20) | random.getrandbits(20)) & 0xFFFFFFFFFFFFFFFF

