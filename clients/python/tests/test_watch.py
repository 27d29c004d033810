"""Watches in the Python client.

The round logic without a server; then, against a real shardlockd (skipped
without $SHARDLOCKD, as test_client.py): values returned by a watch,
watches woken by a release and by an expiry while parked with a long wait,
each change reported once and the newest after a gap, a lock-delay ridden
through, rounds halved under a short --max-wait, bounds refused with their
error, cancel(); and the asyncio forms.
"""

import asyncio
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shardlock  # noqa: E402
from shardlock import protocol as p  # noqa: E402
from shardlock.client import HolderInfo  # noqa: E402
from shardlock import _policy  # noqa: E402
from shardlock.watch import PAUSE, ROUND  # noqa: E402
from test_client import AsyncServerTestCase, Daemon, ServerTestCase, wait_until  # noqa: E402

# A wait no test reaches: a watch that returns before it was woken.
LONG_WAIT = 60.0


def event(token, holders=1, mode="exclusive", values=(b"v",)):
    """A WatchEvent whose newest holder has `token`."""
    listed = [HolderInfo(p.Holder((1, 2), token - i, 1000, 0, value), mode)
              for i, value in enumerate(values)][::-1] if holders else []
    return shardlock.WatchEvent(shardlock.KeyVersion(token if holders else 0, holders),
                                mode if holders else None, 0, 0, holders, listed)


class WatchRounds(unittest.TestCase):
    """WatchRounds, the decisions KeyWatch and AsyncKeyWatch drive."""

    def test_a_repeated_version_re_arms_and_a_new_one_is_reported_once(self):
        rounds = _policy.WatchRounds(30.0, 0.05)
        steps = rounds.steps(None)
        self.assertEqual(next(steps), (ROUND, 30000))
        self.assertEqual(rounds.since, shardlock.NO_VERSION)
        with self.assertRaises(StopIteration) as first:
            steps.send(event(5))
        self.assertEqual(first.exception.value.version, (5, 1))
        steps = rounds.steps(None)
        next(steps)
        self.assertEqual(rounds.since, (5, 1))
        self.assertEqual(steps.send(event(5)), (ROUND, 30000))  # the wait ended: again
        with self.assertRaises(StopIteration) as second:
            steps.send(event(0, holders=0))
        self.assertEqual(second.exception.value.version, (0, 0))

    def test_a_refused_wait_halves_the_round_and_failures_back_off(self):
        rounds = _policy.WatchRounds(30.0, 0.05)
        steps = rounds.steps(None)
        next(steps)
        self.assertEqual(steps.send(shardlock.ServerError(p.ERROR_WAIT_OUT_OF_RANGE, "")),
                         (ROUND, 15000))
        self.assertEqual(rounds.round_wait, 15.0)
        pauses = []
        for _ in range(7):
            action = steps.send(shardlock.UnreachableError("silent"))
            self.assertEqual(action[0], PAUSE)
            pauses.append(action[1])
            self.assertEqual(steps.send(None), (ROUND, 15000))
        self.assertEqual(pauses, [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
        with self.assertRaises(shardlock.ClientClosedError):
            steps.send(shardlock.ClientClosedError("closed"))

    def test_the_deadline_raises_the_last_failure_or_returns_none(self):
        rounds = _policy.WatchRounds(30.0, 0.05)
        steps = rounds.steps(time.monotonic() - 1)  # passed: one round, then the end
        self.assertEqual(next(steps), (ROUND, 0))
        with self.assertRaises(StopIteration) as ended:
            steps.send(event(5))  # reported even at the deadline
        self.assertIsNotNone(ended.exception.value)
        steps = rounds.steps(0.0)
        next(steps)
        with self.assertRaises(StopIteration) as quiet:
            steps.send(event(5))
        self.assertIsNone(quiet.exception.value)
        steps = rounds.steps(0.0)
        next(steps)
        self.assertEqual(steps.send(shardlock.UnreachableError("silent")), (PAUSE, 0.0))
        with self.assertRaises(shardlock.UnreachableError):
            steps.send(None)

    def test_bad_rounds_are_refused(self):
        for round_wait, retry in ((0, 0.05), (30.0, 0), (-1, 0.05)):
            with self.assertRaises(ValueError):
                _policy.WatchRounds(round_wait, retry)


class ServerCase(ServerTestCase):
    """A daemon started with `daemon_options`, clients, and threads joined
    before they close."""

    daemon_options = {}

    def setUp(self):
        self.daemon = Daemon(**self.daemon_options)
        self.clients = []
        self.threads = []

    def tearDown(self):
        for thread in self.threads:
            thread.join(30)
        super().tearDown()

    def later(self, seconds, fn):
        """Runs fn on a thread after `seconds`; joined in tearDown."""
        def run():
            time.sleep(seconds)
            fn()
        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)


class Watches(ServerCase):
    def test_the_state_carries_the_value_and_renewals_keep_the_version(self):
        a, b = self.client(), self.client()
        free = b.watch_once("w/value")
        self.assertEqual((free.version, free.held, free.mode, free.holders), ((0, 0), False,
                                                                                None, []))
        lease = a.acquire("w/value", 5, value="10.0.0.7:8080")
        held = b.watch_once("w/value", since=free.version)
        self.assertEqual(held.version, (lease.token, 1))
        self.assertEqual((held.mode, held.holder_count, held.waiters), ("exclusive", 1, 0))
        holder = held.holders[-1]
        self.assertEqual((holder.owner, holder.token, holder.value),
                         (lease.owner, lease.token, b"10.0.0.7:8080"))
        self.assertTrue(0 < holder.ttl_left_ms <= 5000)
        lease.renew()
        # A renewal is no change: the wait ends with the same version.
        same = b.watch_once("w/value", since=held.version, wait=0.3)
        self.assertEqual(same.version, held.version)
        self.assertEqual(same.holders[-1].value, b"10.0.0.7:8080")
        lease.release()

    def test_a_parked_watch_is_woken_by_a_release(self):
        a, b = self.client(), self.client()
        lease = a.acquire("w/release", 30)
        since = b.watch_once("w/release").version
        self.later(0.3, lease.release)
        start = time.monotonic()
        woken = b.watch_once("w/release", since=since, wait=LONG_WAIT)
        self.assertLess(time.monotonic() - start, LONG_WAIT / 2)
        self.assertEqual((woken.version, woken.held), ((0, 0), False))

    def test_a_parked_watch_is_woken_by_an_expiry(self):
        a, b = self.client(), self.client()
        lease = a.acquire("w/expiry", 0.5, watchdog=False)
        watch = b.watch("w/expiry")
        self.assertEqual(watch.next(5).version, (lease.token, 1))
        start = time.monotonic()
        woken = watch.next(LONG_WAIT)
        self.assertLess(time.monotonic() - start, LONG_WAIT / 2)
        self.assertEqual(woken.version, (0, 0))

    def test_each_version_once_and_the_newest_after_a_gap(self):
        a, b = self.client(), self.client()
        watch = b.watch("w/gap", round=0.2)
        self.assertEqual(watch.next(5).version, (0, 0))
        self.assertIsNone(watch.next(0.7))  # rounds re-armed, nothing reported twice
        tokens = []
        for _ in range(3):
            lease = a.acquire("w/gap", 5)
            tokens.append(lease.token)
            lease.release()
        last = a.acquire("w/gap", 5)
        newest = watch.next(5)
        self.assertEqual(newest.version, (last.token, 1))  # not the three in between
        self.assertGreater(last.token, tokens[-1])
        self.assertIsNone(watch.next(0.3))
        self.assertEqual(watch.version, (last.token, 1))
        last.release()
        self.assertEqual(watch.next(5).version, (0, 0))

    def test_iteration_follows_changes_and_cancel_ends_it(self):
        a, b = self.client(), self.client()
        watch = b.watch("w/iter")
        seen = []

        def follow():
            for e in watch:
                seen.append(e.version)

        follower = threading.Thread(target=follow)
        follower.start()
        self.assertTrue(wait_until(lambda: len(seen) == 1))
        lease = a.acquire("w/iter", 5)
        self.assertTrue(wait_until(lambda: len(seen) == 2))
        lease.release()
        self.assertTrue(wait_until(lambda: len(seen) == 3))
        watch.cancel()  # the follower is parked in a 30 s round
        follower.join(5)
        self.assertFalse(follower.is_alive())
        self.assertEqual(seen, [(0, 0), (lease.token, 1), (0, 0)])
        self.assertIsNone(watch.next(1))

    def test_bad_arguments(self):
        b = self.client()
        with self.assertRaises(ValueError):
            b.watch_once("")
        with self.assertRaises(ValueError):
            b.watch_once("k", wait=-1)
        with self.assertRaises(ValueError):
            b.watch("k", round=0)


class WatchBounds(ServerCase):
    daemon_options = {"extra": ("--max-wait", "1s", "--max-watches-per-key", "1")}

    def test_a_wait_past_max_wait_is_refused_and_a_watch_halves_its_round(self):
        a, b = self.client(), self.client()
        with self.assertRaises(shardlock.ServerError) as refused:
            b.watch_once("w/max", since=shardlock.KeyVersion(0, 0), wait=5)
        self.assertEqual(refused.exception.code, p.ERROR_WAIT_OUT_OF_RANGE)
        watch = b.watch("w/max")
        self.assertEqual(watch.next(5).version, (0, 0))
        lease = a.acquire("w/max", 5)
        self.assertEqual(watch.next(10).version, (lease.token, 1))
        self.assertLessEqual(watch._rounds.round_wait, 1.0)

    def test_a_watch_past_the_servers_bound_is_refused(self):
        a, b = self.client(), self.client()
        parked = threading.Thread(target=a.watch_once, args=("w/bound",),
                                  kwargs={"since": shardlock.KeyVersion(0, 0), "wait": 1})
        parked.start()
        self.threads.append(parked)
        time.sleep(0.2)
        with self.assertRaises(shardlock.ServerError) as refused:
            b.watch_once("w/bound", since=shardlock.KeyVersion(0, 0), wait=1)
        self.assertEqual(refused.exception.code, 10)  # a server limit is reached


class WatchThroughLockDelay(ServerCase):
    daemon_options = {"lock_delay": "1s"}

    def test_a_waiting_watch_rides_through_and_a_try_reports_it(self):
        b = self.client()
        with self.assertRaises(shardlock.RecoveringError):
            b.watch_once("w/delay", wait=0)
        event = b.watch_once("w/delay", wait=10)
        self.assertEqual(event.version, (0, 0))


async def first(n, changes):
    """The first `n` items of the async iterator `changes`."""
    items = []
    async for item in changes:
        items.append(item)
        if len(items) == n:
            return items


class AsyncWatches(AsyncServerTestCase):
    async def test_watch_once_is_woken_by_a_release(self):
        async with shardlock.AsyncClient(self.daemon.address) as a, \
                shardlock.AsyncClient(self.daemon.address) as b:
            lease = await a.acquire("aio/w", 30, value=b"v1")
            held = await b.watch_once("aio/w")
            self.assertEqual((held.version, held.holders[-1].value), ((lease.token, 1), b"v1"))
            asyncio.get_running_loop().call_later(0.3, lambda: asyncio.ensure_future(
                lease.release()))
            start = time.monotonic()
            woken = await b.watch_once("aio/w", since=held.version, wait=LONG_WAIT)
            self.assertLess(time.monotonic() - start, LONG_WAIT / 2)
            self.assertEqual(woken.version, (0, 0))

    async def test_async_for_over_a_watch(self):
        async with shardlock.AsyncClient(self.daemon.address) as a, \
                shardlock.AsyncClient(self.daemon.address) as b:
            task = asyncio.ensure_future(first(3, b.watch("aio/watch")))
            await asyncio.sleep(0.2)
            lease = await a.acquire("aio/watch", 5)
            await asyncio.sleep(0.2)
            await lease.release()
            events = await asyncio.wait_for(task, 10)
            self.assertEqual([e.version for e in events], [(0, 0), (lease.token, 1), (0, 0)])
            watch = b.watch("aio/watch")
            self.assertEqual((await watch.next(5)).version, (0, 0))
            self.assertIsNone(await watch.next(0.3))

if __name__ == "__main__":
    unittest.main()
