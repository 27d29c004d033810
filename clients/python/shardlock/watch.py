"""KeyWatch: following a key without polling (the Python side of
include/shardlock/lease/client/watch.h).

    watch = client.watch("jobs/nightly")
    for event in watch:                       # blocks for each change
        if event.held:
            use(event.holders[-1].value)

Design (as the C++ KeyWatch):

* Each round is one WATCH (Client.watch_once()): the server parks it until
  the key's version moves from the one this watch last reported, or the
  round's wait ends (then the same version comes back and the watch re-arms
  silently). The first next() reports the key's state at once.
* Each change is reported once, never the same version twice in a row. A
  watcher that was slow (or a server that was unreachable) sees the key's
  newest state next, not every state in between: the guarantee is the last
  one, as etcd's watch after a compaction or Consul's blocking queries give.
* Rounds ride through a lock-delay, a redirect and a failover as a waiting
  acquire does; a round that fails (unreachable, a server limit) is retried
  after a back-off (doubling up to 1 s), and next() raises the failure only
  when its timeout runs out with no state to report.
* A round waits at most `round` seconds (30 by default, under the server's
  default --max-wait of 300 s); a server with a shorter max-wait makes the
  watch halve it until the server takes it.

The rounds' decisions live in WatchRounds (_policy.py), a generator with no
I/O that KeyWatch drives with blocking calls and AsyncKeyWatch (aio.py) with
awaits. LeaderObserver (election.py's observer) follows a leader through a
KeyWatch and lives here so that client.py can make one without importing
election.py, which builds on the Client.
"""

from __future__ import annotations

from typing import Iterator, Optional, Protocol

from ._blocking import Cancel
from ._common import Key, now
from ._policy import PAUSE, ROUND, LeaderChanges, Outcome, WatchedKey
from ._policy import WatchSteps as Steps
from ._types import NO_VERSION, KeyVersion, LeaderChange, LeaderInfo, WatchEvent
from .errors import ClientClosedError, ServerError, ShardlockError

__all__ = ["ClientClosedError", "KeyWatch", "LeaderObserver", "NO_VERSION", "Outcome", "PAUSE",
           "ROUND", "ServerError", "Steps"]


class WatchingClient(Protocol):
    """What a KeyWatch needs of its Client: one WATCH, ended early by a
    cancel."""

    def _watch_once(self, key: bytes, since: KeyVersion, wait_ms: int,
                    cancel: Optional[Cancel] = None) -> WatchEvent: ...


class KeyWatch(WatchedKey):
    """Follows one key (Client.watch()). One thread calls next() (or
    iterates) at a time; cancel() may be called from any thread. The client
    must stay open while it is used."""

    _client: WatchingClient

    def __init__(self, client: WatchingClient, key: Key, round: float = 30.0,
                 retry: float = 0.05) -> None:
        super().__init__(client, key, round, retry)
        self._cancel = Cancel()

    def next(self, timeout: Optional[float] = None) -> Optional[WatchEvent]:
        """The key's next state: at once on the first call; afterwards the
        first state whose version differs from the one last returned.
        Blocks up to `timeout` seconds (None: until there is one), and up
        to request_timeout more when the server falls silent at the end.
        None when the timeout passed with nothing to report, or once
        cancel() was called. Raises the last round's ShardlockError when no
        state could be read for the whole timeout, ClientClosedError once
        the client is closed."""
        deadline = None if timeout is None else now() + timeout
        cancel = self._cancel
        steps = self._rounds.steps(deadline)
        outcome: Outcome = None
        try:
            while True:
                action, amount = steps.send(outcome)
                if cancel.cancelled:
                    return None
                outcome = None
                if action == PAUSE:
                    cancel.event.wait(amount)
                    continue
                try:
                    outcome = self._client._watch_once(self._key, self._rounds.since,
                                                       int(amount), cancel)
                except ShardlockError as error:
                    outcome = error
                if cancel.cancelled:
                    return None
        except StopIteration as stop:
            event: Optional[WatchEvent] = stop.value
            return event

    def cancel(self) -> None:
        """Ends a next() that is blocked (it returns None soon) and every
        later one, and the iteration."""
        self._cancel.cancel()

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        """next(None): failed rounds are retried until one succeeds; ends
        (StopIteration) after cancel()."""
        event = self.next(None)
        if event is None:
            raise StopIteration
        return event


class LeaderObserver:
    """Follows the leader of one name through a watch (Client.observe()):
    each change once, in term order. One thread calls next() (or iterates)
    at a time; cancel() from any."""

    def __init__(self, client: WatchingClient, name: Key, round: float = 30.0) -> None:
        self._watch = KeyWatch(client, name, round=round)
        self._changes = LeaderChanges()

    def next(self, timeout: Optional[float] = None) -> Optional[LeaderChange]:
        """The leader now on the first call; afterwards the next change of
        leader (another term, or none). Blocks up to `timeout` seconds
        (None: until there is one): None when nothing changed by then, or
        after cancel(). Raises as KeyWatch.next() when the server could not
        be read for the whole timeout."""
        deadline = None if timeout is None else now() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - now())
            event = self._watch.next(left)
            if event is None:
                return None
            change = self._changes.take(event)
            if change is not None:
                return change

    def cancel(self) -> None:
        self._watch.cancel()

    def __iter__(self) -> Iterator[Optional[LeaderInfo]]:
        """Each change's leader (None: no leader now), until cancel()."""
        while True:
            change = self.next(None)
            if change is None:
                return
            yield change.leader
