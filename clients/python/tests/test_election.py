"""Leader election in the Python client.

The leader filter without a server; then, against a real shardlockd
(skipped without $SHARDLOCKD, as test_client.py): two campaigners and an
observer seeing one leader at a time in term order, resign handing over, a
campaign waiting longer than its TTL, on_lost after a release by another
client with the same owner id; and the asyncio observer.
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
from test_client import AsyncServerTestCase, wait_until  # noqa: E402
from test_watch import ServerCase, event, first  # noqa: E402


class LeaderChanges(unittest.TestCase):
    def test_each_term_once_none_once_and_never_an_older_term(self):
        changes = _policy.LeaderChanges()
        self.assertIsNone(changes.take(event(0, holders=0)).leader)
        self.assertIsNone(changes.take(event(0, holders=0)))
        first = changes.take(event(7, values=(b"a",))).leader
        self.assertEqual((first.term, first.value, first.ttl_left_ms), (7, b"a", 1000))
        self.assertIsNone(changes.take(event(7, values=(b"a",))))  # a renewal
        # Shared holders are no leader: a change to none, once.
        self.assertIsNone(changes.take(event(9, holders=2, mode="shared",
                                             values=(b"", b""))).leader)
        self.assertIsNone(changes.take(event(10, holders=1, mode="shared")))
        self.assertIsNone(changes.take(event(6)))  # older than one reported
        self.assertEqual(changes.take(event(8)).leader.term, 8)
        self.assertIsNone(changes.take(event(0, holders=0)).leader)

    def test_a_pending_or_shared_holder_is_no_leader(self):
        pending = HolderInfo(p.Holder((1, 2), 3, 0, p.HOLDER_FLAG_PENDING, b""), "exclusive")
        self.assertIsNone(shardlock.leader_of("exclusive", [pending]))
        self.assertIsNone(shardlock.leader_of("shared", event(3).holders))
        self.assertIsNone(shardlock.leader_of(None, []))
        self.assertEqual(shardlock.leader_of("exclusive", event(3).holders).term, 3)


class Elections(ServerCase):
    def test_two_campaigners_and_an_observer_see_one_leader_at_a_time_in_term_order(self):
        ca, cb, co = self.client(), self.client(), self.client()
        observer = co.observe("sched")
        # Changes are gathered in order by one thread; this one checks them.
        seen_live = []

        def follow():
            for leader in observer:
                seen_live.append(leader)

        follower = threading.Thread(target=follow)
        follower.start()
        self.assertTrue(wait_until(lambda: len(seen_live) == 1))
        self.assertIsNone(seen_live[0])
        a = shardlock.Election(ca, "sched")
        b = shardlock.Election(cb, "sched")
        a_term = a.campaign("host-a:1")
        self.assertTrue(a.leading)
        self.assertEqual(a.term, a_term)
        self.assertTrue(wait_until(lambda: len(seen_live) == 2))
        self.assertEqual((seen_live[1].value, seen_live[1].owner, seen_live[1].term),
                         (b"host-a:1", a.owner, a_term))

        elected = threading.Event()

        def campaign_b():
            b.campaign("host-b:2")
            elected.set()

        campaigner = threading.Thread(target=campaign_b)
        campaigner.start()
        self.threads.append(campaigner)
        self.assertTrue(wait_until(lambda: ca.query("sched").waiters == 1))
        self.assertFalse(elected.is_set())
        self.assertFalse(b.leading)
        a.resign()  # hands over at once
        self.assertTrue(elected.wait(5))
        self.assertTrue(b.leading)
        self.assertFalse(a.leading)
        self.assertEqual(a.term, 0)
        b_term = b.term
        self.assertGreater(b_term, a_term)
        self.assertTrue(wait_until(lambda: seen_live and seen_live[-1] is not None and
                                   seen_live[-1].term == b_term))
        leader = a.leader()
        self.assertEqual((leader.value, leader.owner, leader.term),
                         (b"host-b:2", b.owner, b_term))
        b.resign()
        self.assertTrue(wait_until(lambda: seen_live[-1] is None))
        self.assertIsNone(a.leader())
        observer.cancel()
        follower.join(5)
        self.assertFalse(follower.is_alive())
        # One leader at a time, each change once, terms rising: the hand-off
        # may show "none" between the two, never a leader twice in a row.
        leaders = [x for x in seen_live if x is not None]
        self.assertEqual([x.term for x in leaders], [a_term, b_term])
        for before, after in zip(seen_live, seen_live[1:]):
            self.assertNotEqual(before, after)

    def test_campaign_wait_busy_resign_and_bad_values(self):
        ca, cb = self.client(), self.client()
        a = shardlock.Election(ca, "job")
        b = shardlock.Election(cb, "job")
        a.campaign("a")
        with self.assertRaises(RuntimeError):
            a.campaign("a")
        with self.assertRaises(shardlock.WaitTimeoutError):
            b.campaign("b", wait=0.2)
        with self.assertRaises(shardlock.BusyError):
            b.campaign("b", wait=0)
        self.assertFalse(b.leading)
        self.assertEqual(b.term, 0)
        with self.assertRaises(shardlock.LeaseInactiveError):
            b.resign()
        with self.assertRaises(ValueError):
            b.campaign("x" * (p.MAX_HOLDER_VALUE_LENGTH + 1), wait=0)
        with a:
            pass  # leaving the block resigns
        self.assertFalse(a.leading)
        self.assertIsNone(a.leader())

    def test_a_campaign_waits_longer_than_the_ttl(self):
        # The grant arrives past its client-side expiry (counted from the
        # request's first send); the client renews it before returning it.
        ca, cb = self.client(), self.client()
        a = shardlock.Election(ca, "long", ttl=1.0)
        b = shardlock.Election(cb, "long", ttl=1.0)
        a_term = a.campaign("a")
        self.later(2.5, a.resign)
        self.assertGreater(b.campaign("b", wait=10), a_term)
        self.assertTrue(b.leading)
        b.resign()

    def test_on_lost_fires_once_when_another_client_releases_as_its_owner(self):
        ca, cb = self.client(), self.client()
        lost = []
        a = shardlock.Election(ca, "svc", ttl=0.6,
                               on_lost=lambda election, reason: lost.append((election, reason)))
        term = a.campaign("a")
        owner = a.owner
        self.assertEqual(a.leader().owner, owner)
        self.assertNotEqual(owner, ca.client_id)  # each campaign is its own owner
        # Ends the lease at the server as its owner (as `shardlockctl
        # release --owner`): A's next renewal is refused.
        cb.release("svc", term, owner=owner)
        self.assertTrue(wait_until(lambda: len(lost) == 1))
        self.assertIs(lost[0][0], a)
        self.assertIsInstance(lost[0][1], (shardlock.NotOwnerError, shardlock.LeaseExpiredError))
        self.assertFalse(a.leading)
        b = shardlock.Election(cb, "svc", ttl=0.6)
        self.assertGreater(b.campaign("b", wait=5), term)
        time.sleep(0.3)
        self.assertEqual(len(lost), 1)
        b.resign()
        # A lost leadership may campaign again.
        self.assertGreater(a.campaign("a", wait=5), term)
        a.resign()


class AsyncObserver(AsyncServerTestCase):
    async def test_async_for_over_an_observer(self):
        async with shardlock.AsyncClient(self.daemon.address) as a, \
                shardlock.AsyncClient(self.daemon.address) as b:
            task = asyncio.ensure_future(first(3, b.observe("aio/elect")))
            await asyncio.sleep(0.2)
            lease = await a.acquire("aio/elect", 5, value="me")
            await asyncio.sleep(0.2)
            await lease.release()
            leaders = await asyncio.wait_for(task, 10)
            self.assertEqual([x.term if x else None for x in leaders], [None, lease.token, None])
            self.assertEqual((leaders[1].value, leaders[1].owner), (b"me", lease.owner))
            observer = b.observe("aio/elect")
            self.assertIsNone((await observer.next(5)).leader)
            self.assertIsNone(await observer.next(0.3))


if __name__ == "__main__":
    unittest.main()
