"""shardlock: a Python client for the shardlock lease service.

    import shardlock
    client = shardlock.Client("127.0.0.1:7420")
    with client.lock("orders/42", ttl=30) as lease:
        storage.write(data, fence=lease.token)

Standard library only (cluster mode also needs xxhash). It speaks the UDP
wire format itself (protocol.py); see clients/python/README.md.
"""

from .client import Client, Lease, QueryResult
from .errors import (BusyError, ClientClosedError, GrantExpiredError, LeaseExpiredError,
                     LeaseInactiveError, LeaseLostError, NotOwnerError, RecoveringError,
                     RedirectedError, ServerError, ShardlockError, UnreachableError,
                     WaitTimeoutError)

__version__ = "0.1.0"

__all__ = [
    "BusyError", "Client", "ClientClosedError", "GrantExpiredError", "Lease",
    "LeaseExpiredError", "LeaseInactiveError", "LeaseLostError", "NotOwnerError",
    "QueryResult", "RecoveringError", "RedirectedError", "ServerError", "ShardlockError", "UnreachableError",
    "WaitTimeoutError",
]
