"""ReentrantLocks against a real shardlockd (see test_client.py): holds of
one thread share a grant and its token, only the last release frees the
key, a lost grant invalidates every hold; another thread waits at the
server (scope "thread", the default), or shares the holds (scope "client")."""

import os
import sys
import threading
import time
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
        # The next acquire takes a new grant, not the lost one: a contender
        # like another (the client's expiry errs early, so the server may
        # hold the lost grant a few ms more).
        fresh = self.locks.acquire("py/short", 10, wait=5)
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

    def test_another_thread_waits_until_the_last_hold_is_released(self):
        outer = self.locks.acquire("py/per-thread", 10)
        inner = self.locks.acquire("py/per-thread", 10)
        self.assertEqual((inner.reentered, inner.token, inner.hold_count),
                         (True, outer.token, 2))
        self.assertEqual(inner.owner, outer.owner)
        got = {}
        entered = threading.Event()

        def other_thread():
            self.assertEqual(self.locks.hold_count("py/per-thread"), 0)  # not its holds
            with self.locks.lock("py/per-thread", ttl=10, wait=10) as hold:
                got["hold"] = (hold.reentered, hold.token, hold.hold_count, hold.owner)
                entered.set()

        thread = threading.Thread(target=other_thread)
        thread.start()
        self.assertTrue(wait_until(lambda: self.other.query("py/per-thread").waiters == 1))
        inner.release()
        time.sleep(0.2)  # one hold left: the other thread still waits
        self.assertFalse(entered.is_set())
        self.assertEqual(self.other.query("py/per-thread").waiters, 1)
        outer.release()
        self.assertTrue(entered.wait(5))
        thread.join(5)
        reentered, token, holds, owner = got["hold"]
        self.assertEqual((reentered, holds), (False, 1))
        self.assertGreater(token, outer.token)
        self.assertNotEqual(owner, outer.owner)

    def test_a_plain_acquire_of_the_client_is_another_contender(self):
        with self.locks.lock("py/plain", ttl=10):
            with self.assertRaises(shardlock.BusyError):
                self.owner.acquire("py/plain", 5)

    def test_an_unknown_scope_is_refused(self):
        with self.assertRaises(ValueError):
            shardlock.ReentrantLocks(self.owner, scope="process")
        self.assertEqual(self.locks.scope, "thread")

    def test_scope_client_lets_threads_share_holds(self):
        self.locks = shardlock.ReentrantLocks(self.owner, scope="client")
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

    def test_scope_client_a_try_does_not_wait_for_an_acquire_in_flight(self):
        self.locks = shardlock.ReentrantLocks(self.owner, scope="client")
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
