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

The rounds' decisions live in _WatchRounds, a generator with no I/O that
KeyWatch drives with blocking calls and AsyncKeyWatch (aio.py) with awaits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generator, Iterator, Optional, Tuple, Union

from . import protocol as p
from .client import NO_VERSION, KeyVersion, Key, WatchEvent, _Cancel, _key_bytes, _now, _to_ms
from .errors import ClientClosedError, ServerError, ShardlockError

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

# A round never waits less than this: a server refusing every wait halves
# the round down to here, then its refusal is a failure like another.
_SHORTEST_ROUND = 0.100
_LONGEST_RETRY = 1.0

# What _WatchRounds.steps() asks its driver for.
ROUND = "round"  # one WATCH with this many ms of wait; send back its event or error
PAUSE = "pause"  # sleep this many seconds; send back None

Outcome = Union[WatchEvent, ShardlockError, None]
Steps = Generator[Tuple[str, float], Outcome, Optional[WatchEvent]]


class _WatchRounds:
    """The rounds of one watch: the version last reported, the round's
    length and the back-off. No I/O and no waiting: steps() says what to do
    next, and the driver reports back."""

    def __init__(self, round_wait: float, retry: float) -> None:
        _to_ms(round_wait, "round", False)
        _to_ms(retry, "retry", False)
        self.version: Optional[KeyVersion] = None  # None: nothing reported yet
        self.round_wait = max(round_wait, _SHORTEST_ROUND)
        self._first_retry = retry

    @property
    def since(self) -> KeyVersion:
        return NO_VERSION if self.version is None else self.version

    def steps(self, deadline: Optional[float]) -> Steps:
        """One next(): yields (ROUND, wait_ms) and (PAUSE, seconds) until it
        returns the next state to report, or None once `deadline` (None:
        never) passed with nothing to report. Raises the last round's
        failure when no round succeeded by then, and ClientClosedError at
        once."""
        retry = self._first_retry
        failure: Optional[ShardlockError] = None
        while True:
            left = None if deadline is None else max(0.0, deadline - _now())
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
                pause = retry if deadline is None else min(retry, max(0.0, deadline - _now()))
                retry = min(retry * 2, _LONGEST_RETRY)
                yield PAUSE, pause
            if deadline is not None and _now() >= deadline:
                if failure is not None:
                    raise failure
                return None


class _WatchedKey:
    """What KeyWatch and AsyncKeyWatch share: the key and its rounds."""

    def __init__(self, client: Any, key: Key, round: float = 30.0, retry: float = 0.05) -> None:
        self._client = client
        self._key = _key_bytes(key)
        self._rounds = _WatchRounds(round, retry)

    @property
    def key(self) -> str:
        return self._key.decode("utf-8", errors="replace")

    @property
    def version(self) -> Optional[KeyVersion]:
        """The version of the last state next() returned; None before."""
        return self._rounds.version

    def __repr__(self) -> str:
        return "%s(key=%r, version=%r)" % (type(self).__name__, self.key, self.version)


class KeyWatch(_WatchedKey):
    """Follows one key (Client.watch()). One thread calls next() (or
    iterates) at a time; cancel() may be called from any thread. The client
    must stay open while it is used."""

    _client: "Client"

    def __init__(self, client: "Client", key: Key, round: float = 30.0,
                 retry: float = 0.05) -> None:
        super().__init__(client, key, round, retry)
        self._cancel = _Cancel()

    def next(self, timeout: Optional[float] = None) -> Optional[WatchEvent]:
        """The key's next state: at once on the first call; afterwards the
        first state whose version differs from the one last returned.
        Blocks up to `timeout` seconds (None: until there is one), and up
        to request_timeout more when the server falls silent at the end.
        None when the timeout passed with nothing to report, or once
        cancel() was called. Raises the last round's ShardlockError when no
        state could be read for the whole timeout, ClientClosedError once
        the client is closed."""
        deadline = None if timeout is None else _now() + timeout
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
            return stop.value

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
