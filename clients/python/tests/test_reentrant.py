"""ReentrantLocks against a real shardlockd (see test_client.py): holds of
one owner share a grant and its token, only the last release frees the key,
a lost grant invalidates every hold, and threads of one owner share holds."""

import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shardlock  # noqa: E402
from test_client import ServerTestCase, wait_until  # noqa: E402


class Reentrant(ServerTestCase):
    def setUp(self):
        super().setUp()
        self.owner = self.client()
        self.other = self.client()
        self.locks = shardlock.ReentrantLocks(self.owner)

    def free_for_other(self, key):
        try:
            self.other.acquire(key, 5).release()
            return True
        except shardlock.BusyError:
            return False

    def test_a_second_acquire_shares_the_token_and_counts_a_hold(self):
        with self.locks.lock("py/r", ttl=10) as outer:
            self.assertFalse(outer.reentered)
            with self.locks.lock("py/r", ttl=10) as inner:
                self.assertTrue(inner.reentered)
                self.assertEqual(inner.token, outer.token)
                self.assertEqual(inner.key, "py/r")
                self.assertEqual(outer.hold_count, 2)
                self.assertEqual(self.locks.hold_count("py/r"), 2)
                inner.renew(20)
                self.assertEqual(outer.lease.ttl, 20)
            self.assertEqual(outer.hold_count, 1)
            self.assertTrue(outer.valid)
            self.assertFalse(self.free_for_other("py/r"))
        self.assertEqual(self.locks.hold_count("py/r"), 0)
        self.assertTrue(self.free_for_other("py/r"))

    def test_only_the_last_release_frees_the_key(self):
        first = self.locks.acquire("py/last", 10)
        second = self.locks.acquire("py/last", 10)
        first.release()  # either one may go first: holds are not a stack
        self.assertFalse(first.valid)
        self.assertEqual(first.hold_count, 0)
        with self.assertRaises(shardlock.LeaseInactiveError):
            first.release()
        self.assertTrue(second.valid)
        self.assertFalse(self.free_for_other("py/last"))
        second.release()
        self.assertTrue(self.free_for_other("py/last"))

        # Dropping the last handle sends its RELEASE best effort.
        third = self.locks.acquire("py/dropped", 10)
        fourth = self.locks.acquire("py/dropped", 10)
        del fourth
        self.assertFalse(self.free_for_other("py/dropped"))
        del third
        self.assertTrue(wait_until(lambda: self.free_for_other("py/dropped")))

    def test_a_lost_grant_invalidates_every_hold_and_fires_once(self):
        lost = []
        a = self.locks.acquire("py/short", 0.3, watchdog=False,
                               on_lost=lambda lease, reason: lost.append(reason))
        b = self.locks.acquire("py/short", 0.3)
        self.assertTrue(b.reentered)
        self.assertTrue(wait_until(lambda: lost))
        self.assertFalse(a.valid)
        self.assertFalse(b.valid)
        # The next acquire takes a new grant, not the lost one.
        fresh = self.locks.acquire("py/short", 10)
        self.assertFalse(fresh.reentered)
        self.assertGreater(fresh.token, a.token)
        a.release()
        with self.assertRaises(shardlock.ShardlockError):
            b.release()  # the last hold of the lost grant: the server refuses it
        self.assertTrue(fresh.valid)
        self.assertFalse(self.free_for_other("py/short"))
        self.assertEqual(len(lost), 1)
        with self.assertRaises(shardlock.LeaseLostError):
            with self.locks.lock("py/lost-in-block", ttl=0.3, watchdog=False):
                wait_until(lambda: False, timeout=0.5)

    def test_threads_of_one_owner_share_holds(self):
        pin = self.locks.acquire("py/threads", 10)
        failures = []

        def work():
            for _ in range(30):
                try:
                    with self.locks.lock("py/threads", ttl=10, wait=5) as hold:
                        if hold.token != pin.token or not hold.valid:
                            failures.append(hold.token)
                except shardlock.ShardlockError as error:
                    failures.append(error)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertEqual(failures, [])
        self.assertEqual(pin.hold_count, 1)
        pin.release()
        self.assertTrue(self.free_for_other("py/threads"))

    def test_a_try_does_not_wait_for_an_acquire_in_flight(self):
        blocker = self.other.acquire("py/queue", 10)
        got = {}
        first = threading.Thread(
            target=lambda: got.setdefault("first", self.locks.acquire("py/queue", 10, wait=10)))
        first.start()
        self.assertTrue(wait_until(lambda: self.other.query("py/queue").waiters == 1))
        with self.assertRaises(shardlock.BusyError):
            self.locks.acquire("py/queue", 10)
        second = threading.Thread(
            target=lambda: got.setdefault("second", self.locks.acquire("py/queue", 10, wait=10)))
        second.start()
        blocker.release()
        first.join()
        second.join()
        self.assertEqual(got["first"].token, got["second"].token)
        self.assertTrue(got["second"].reentered)
        self.assertEqual(self.locks.hold_count("py/queue"), 2)


if __name__ == "__main__":
    unittest.main()
