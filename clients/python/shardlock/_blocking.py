"""What the blocking shells (client.py, watch.py) share: a call in flight
and the cancel that ends a watch's calls from any thread."""

from __future__ import annotations

import threading
import time
from typing import Optional, Set

from . import protocol as p


class Call:
    """One request id in flight. `done` and `reply` are written once, by the
    thread that reads the reply off the socket; `event` exists only while
    the caller waits for another thread to read for it."""

    __slots__ = ("type", "key", "done", "reply", "event")

    def __init__(self, message_type: int, key: bytes) -> None:
        self.type = message_type
        self.key = key
        self.done = False
        self.reply: Optional[p.Message] = None
        self.event: Optional[threading.Event] = None

    def finished(self) -> bool:
        return self.done


class Cancel:
    """Ends the calls of one KeyWatch from any thread (KeyWatch.cancel()):
    each call made with it returns None at once once it is cancelled, and
    the pauses between its tries end."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._calls: Set[Call] = set()  # in flight, under _lock

    @property
    def cancelled(self) -> bool:
        return self.event.is_set()

    def cancel(self) -> None:
        with self._lock:
            self.event.set()
            calls = list(self._calls)
        for call in calls:
            # As a close() does: the waiter sees done without a reply. A
            # reply that races in is dropped; the caller wanted none.
            call.done = True
            event = call.event
            if event is not None:
                event.set()

    def enter(self, call: Call) -> bool:
        """Registers `call`; False if cancelled already."""
        with self._lock:
            if self.event.is_set():
                return False
            self._calls.add(call)
            return True

    def leave(self, call: Call) -> None:
        with self._lock:
            self._calls.discard(call)


def pause(seconds: float, cancel: Optional[Cancel]) -> None:
    """Sleeps `seconds`, or less if `cancel` is cancelled meanwhile."""
    if cancel is None:
        time.sleep(seconds)
    else:
        cancel.event.wait(seconds)
