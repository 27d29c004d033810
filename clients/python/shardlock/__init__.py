"""shardlock: a Python client for the shardlock lease service.

    import shardlock
    client = shardlock.Client("127.0.0.1:7420")
    with client.lock("orders/42", ttl=30) as lease:  # waits until granted
        storage.write(data, fence=lease.token)       # each lock() its own owner

    locks = shardlock.ReentrantLocks(client)  # reentrant per thread
    with locks.lock("orders/42") as outer, locks.lock("orders/42") as inner:
        assert inner.token == outer.token and inner.hold_count == 2

    for event in client.watch("jobs/nightly"):  # its state now, then each change
        print(event.version, event.holders)

    election = shardlock.Election(client, "scheduler", ttl=10)
    term = election.campaign("10.0.0.7:8080")  # waits until elected; fences writes
    election.resign()

    async with shardlock.AsyncClient("127.0.0.1:7420") as client:
        async with client.lock("orders/42", ttl=30) as lease:
            await storage.write(data, fence=lease.token)

Standard library only (several servers and cluster mode also need xxhash,
a tenant's AES-GCM suite cryptography, portable encryption PyNaCl).
It speaks the UDP wire format itself (protocol.py); see
clients/python/README.md.
"""

from .aio import AsyncClient, AsyncKeyWatch, AsyncLease, AsyncLeaderObserver
from .auth import load_auth_key, parse_auth_key
from .client import (NO_VERSION, Client, HolderInfo, HoldersResult, KeyVersion, Lease,
                     QueryResult, WatchEvent)
from .election import Election, LeaderChange, LeaderInfo, LeaderObserver, leader_of
from .errors import (BusyError, ClientClosedError, GrantExpiredError, LeaseExpiredError,
                     LeaseInactiveError, LeaseLostError, NotOwnerError, PermissionDeniedError,
                     RecoveringError, RedirectedError, ServerError, ShardlockError,
                     UnreachableError, WaitTimeoutError)
from .reentrant import ReentrantLease, ReentrantLocks
from .watch import KeyWatch

# The one place the version is written: pyproject.toml reads it from here.
__version__ = "0.2.0"

__all__ = [
    "AsyncClient", "AsyncKeyWatch", "AsyncLease", "AsyncLeaderObserver", "BusyError", "Client",
    "ClientClosedError", "Election", "GrantExpiredError", "HolderInfo", "HoldersResult",
    "KeyVersion", "KeyWatch", "Lease", "LeaderChange", "LeaderInfo", "LeaderObserver",
    "LeaseExpiredError", "LeaseInactiveError", "LeaseLostError", "NO_VERSION", "NotOwnerError",
    "PermissionDeniedError", "QueryResult", "ReentrantLease", "ReentrantLocks", "RecoveringError", "RedirectedError",
    "ServerError", "ShardlockError", "UnreachableError", "WaitTimeoutError", "WatchEvent",
    "leader_of", "load_auth_key", "parse_auth_key",
]
