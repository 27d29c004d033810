"""Why a shardlock call did not succeed.

Every error a server or the network causes is a ShardlockError; arguments
refused before anything is sent (an empty key, a TTL of 0) are ValueError.
"""

from __future__ import annotations


class ShardlockError(Exception):
    """Base class of every shardlock failure."""


class BusyError(ShardlockError):
    """The key is held by another owner (an acquire with wait=0)."""

    def __init__(self, key: str, holder_ttl_left_ms: int) -> None:
        super().__init__("%r is busy: the holder has %d ms left" % (key, holder_ttl_left_ms))
        self.key = key
        self.holder_ttl_left_ms = holder_ttl_left_ms


class WaitTimeoutError(ShardlockError):
    """The wait ran out before the holder let go (the server's TIMEOUT)."""


class UnreachableError(ShardlockError):
    """No answer before the call's deadline: the request timeout, plus the
    wait of an acquire that waits. An acquire that ends this way may still
    have been granted; the server then holds it until its TTL runs out."""


class RecoveringError(ShardlockError):
    """The server is in its lock-delay after a start; retry after
    retry_after_ms."""

    def __init__(self, retry_after_ms: int) -> None:
        super().__init__("the server is recovering: retry after %d ms" % retry_after_ms)
        self.retry_after_ms = retry_after_ms


class RedirectedError(ShardlockError):
    """A cluster node answered REDIRECT: the key belongs to another node in
    the node's map of `epoch`. A Client without discover=True gets it for
    every key the node does not own; one in cluster mode only after 8 hops,
    or when its deadline passes with a REDIRECT as the last answer. A
    renewal answered so means the lease is lost (the node handed the key
    off)."""

    def __init__(self, key: str, epoch: int) -> None:
        super().__init__("%r belongs to another cluster node (map epoch %d)" % (key, epoch))
        self.epoch = epoch


class ServerError(ShardlockError):
    """The server answered ERROR; `code` is its WireError number."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__("server error %d: %s" % (code, text))
        self.code = code


class PermissionDeniedError(ServerError):
    """The server answered ERROR permission_denied (`code` 16): the
    client's tenant (shardlockd --tenants, docs/security.md) has no right
    to `key`, or to this kind of request, under its key prefixes. Asking
    again gets the same answer until the tenant file grants the right."""

    def __init__(self, key: str) -> None:
        ShardlockError.__init__(self, "permission denied on %r: the tenant has no right to "
                                      "this key or request" % key)
        self.code = 16  # protocol.ERROR_PERMISSION_DENIED
        self.key = key


class NotOwnerError(ShardlockError):
    """RENEW or RELEASE refused: another owner holds the lease."""


class LeaseExpiredError(ShardlockError):
    """The lease is gone: the server no longer has it (RENEW or RELEASE was
    answered EXPIRED), or its client-side expiry passed unrenewed."""


class GrantExpiredError(ShardlockError):
    """The grant arrived after its own client-side expiry (a wait of at
    least the TTL, or a reply recovered late); it was released."""


class LeaseInactiveError(ShardlockError):
    """The lease was released or lost before this call."""


class LeaseLostError(ShardlockError):
    """Raised by a `with` block whose lease was lost while it ran: the code
    inside may have run without mutual exclusion. `reason` is why."""

    def __init__(self, key: str, reason: ShardlockError) -> None:
        super().__init__("the lease on %r was lost: %s" % (key, reason))
        self.key = key
        self.reason = reason


class ClientClosedError(ShardlockError):
    """The client was closed."""
