"""The owner is the handle, not the client (real shardlockd, see
test_client.py). Threads and asyncio tasks sharing one client exclude each
other; two handles of one client queue FIFO; reentrancy is per thread; an
explicit owner acts for someone else; wait=None waits until granted."""

import asyncio
import math
import os
import random
import sys
import threading
import time
import types
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shardlock  # noqa: E402
from shardlock import _common, _requests  # noqa: E402
from shardlock import protocol as p  # noqa: E402
from test_client import AsyncServerTestCase, Daemon, ServerTestCase, wait_until  # noqa: E402

OWNER = "0123456789abcdef" "fedcba9876543210"  # hi, lo


def same_client(owner, client_id):
    """Whether `owner` (hex) is a handle of `client_id` (hex): the upper 96
    bits agree, as the server groups per-client bounds."""
    return owner[:24] == client_id[:24]

WORKERS = 8
ROUNDS = 12  # per worker: 96 critical sections of ~10 ms each


class _Section:
    """A critical section that counts who is inside it: read the counter,
    sleep, write it back. Any overlap loses an increment."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.inside = 0
        self.overlaps = 0
        self.counter = 0

    def enter(self) -> None:
        with self.guard:
            self.inside += 1
            if self.inside > 1:
                self.overlaps += 1

    def leave(self) -> None:
        with self.guard:
            self.inside -= 1


class ThreadsOfOneClient(ServerTestCase):
    def test_threads_sharing_one_client_exclude_each_other(self):
        c = self.client()
        section = _Section()
        errors = []

        def work():
            try:
                for _ in range(ROUNDS):
                    with c.lock("py/threads", ttl=5):
                        section.enter()
                        value = section.counter
                        time.sleep(random.uniform(0.005, 0.015))
                        section.counter = value + 1
                        section.leave()
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append(error)

        threads = [threading.Thread(target=work) for _ in range(WORKERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        self.assertEqual((section.overlaps, section.counter, errors), (0, WORKERS * ROUNDS, []))


class TasksOfOneClient(AsyncServerTestCase):
    async def test_tasks_sharing_one_client_exclude_each_other(self):
        async with shardlock.AsyncClient(self.daemon.address) as c:
            section = _Section()

            async def work():
                for _ in range(ROUNDS):
                    async with c.lock("aio/tasks", ttl=5):
                        section.enter()
                        value = section.counter
                        await asyncio.sleep(random.uniform(0.005, 0.015))
                        section.counter = value + 1
                        section.leave()

            await asyncio.wait_for(asyncio.gather(*(work() for _ in range(WORKERS))), 30)
            self.assertEqual((section.overlaps, section.counter), (0, WORKERS * ROUNDS))



class OwnerDerivation(unittest.TestCase):
    """No server: the owners a client's handles contend as."""

    def test_handles_count_from_one_skipping_the_client_ids_own_low_bits(self):
        client = (0xAAAA_BBBB_0000_0002, 0x1111_2222_3333_4444)
        owners = _common.HandleOwners(client)
        made = [owners.resolve(None) for _ in range(3)]
        self.assertEqual(made, [(0xAAAA_BBBB_0000_0001, client[1]),
                                (0xAAAA_BBBB_0000_0003, client[1]),
                                (0xAAAA_BBBB_0000_0004, client[1])])
        self.assertNotIn(client, made)
        # An explicit owner, as hex (hi then lo) or as client_id= bytes.
        self.assertEqual(owners.resolve(OWNER), (0xfedcba9876543210, 0x0123456789abcdef))
        raw = bytes.fromhex(OWNER)[::-1]
        self.assertEqual(owners.resolve(raw), owners.resolve(OWNER))
        for bad in ("abc", "g" * 32, b"short", 42):
            with self.subTest(bad=bad):
                with self.assertRaises(ValueError):
                    owners.resolve(bad)

    def test_the_count_wraps_after_2_to_the_32(self):
        owners = _common.HandleOwners((0x5_0000_0000, 7))
        owners._handles = 0xFFFF_FFFE
        self.assertEqual([owners.resolve(None)[0] for _ in range(3)],
                         [0x5_FFFF_FFFF, 0x5_0000_0001, 0x5_0000_0002])  # 0 is the client's

    def test_threads_get_distinct_owners(self):
        owners = _common.HandleOwners((0, 0))
        made = []

        def take():
            for _ in range(1000):
                made.append(owners.resolve(None))

        threads = [threading.Thread(target=take) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertEqual(len(set(made)), 8000)


class WaitArguments(unittest.TestCase):
    """No server: what a wait means, and the rounds it is asked in."""

    def test_none_and_infinity_wait_until_granted_and_bad_waits_are_refused(self):
        self.assertIsNone(_common.wait_seconds(None))
        self.assertIsNone(_common.wait_seconds(math.inf))
        self.assertEqual(_common.wait_seconds(0), 0.0)
        self.assertEqual(_common.wait_seconds(2.5), 2.5)
        for bad in (-1, -math.inf, math.nan, "5", [1]):
            with self.subTest(bad=bad):
                with self.assertRaises(ValueError):
                    _common.wait_seconds(bad)

    def test_rounds_halve_when_refused_and_go_on_after_a_timeout(self):
        refused = types.SimpleNamespace(type=p.ERROR, error=p.ERROR_WAIT_OUT_OF_RANGE)
        timeout = types.SimpleNamespace(type=p.TIMEOUT, error=0)
        busy = types.SimpleNamespace(type=p.BUSY, error=0)
        forever = _requests.WaitRounds(None)
        self.assertEqual(forever.next_ms(), 300_000)
        self.assertTrue(forever.again(refused))
        self.assertEqual(forever.next_ms(), 150_000)
        self.assertTrue(forever.again(timeout))
        self.assertEqual(forever.next_ms(), 150_000)
        self.assertFalse(forever.again(None))  # unanswered: UnreachableError
        self.assertTrue(forever.again(types.SimpleNamespace(type=p.RECOVERING, error=0)))
        long = _requests.WaitRounds(3600)
        self.assertEqual(long.next_ms(), 3_600_000)
        self.assertTrue(long.again(refused))
        self.assertEqual(long.next_ms(), 300_000)  # the usual --max-wait first
        try_once = _requests.WaitRounds(0)
        self.assertEqual(try_once.next_ms(), 0)
        self.assertFalse(try_once.again(busy))
        self.assertFalse(try_once.again(timeout))
        self.assertFalse(try_once.again(types.SimpleNamespace(type=p.RECOVERING, error=0)))
        short = _requests.WaitRounds(0.001)
        self.assertEqual(short.next_ms(), 1)
        self.assertFalse(short.again(refused))  # 1 ms refused: the server's error
        time.sleep(0.01)
        self.assertFalse(short.again(timeout))  # the wait is spent


class TwoHandlesOfOneClient(ServerTestCase):
    def test_a_second_acquire_is_refused_and_the_first_handle_stays_valid(self):
        c = self.client()
        first = c.acquire("py/second", 10, watchdog=False)
        with self.assertRaises(shardlock.BusyError):
            c.acquire("py/second", 10)
        with self.assertRaises(shardlock.WaitTimeoutError):
            c.lock("py/second", ttl=10, wait=0.2)
        self.assertTrue(first.valid)
        first.renew()
        self.assertNotEqual(first.owner, c.client_id)
        self.assertTrue(same_client(first.owner, c.client_id))
        first.release()  # its own grant: no LeaseExpiredError
        self.assertFalse(c.query("py/second").held)

    def test_waiting_handles_are_granted_in_fifo_order_on_each_release(self):
        c = self.client()
        first = c.acquire("py/fifo", 10, watchdog=False)
        order = []
        leases = {}
        releases = {i: threading.Event() for i in range(3)}

        def waiter(i):
            lease = c.acquire("py/fifo", 10, wait=15)
            order.append(i)
            leases[i] = lease
            releases[i].wait(10)
            lease.release()

        threads = []
        for i in range(3):
            threads.append(threading.Thread(target=waiter, args=(i,)))
            threads[-1].start()
            # One at a time into the queue, so the order is known.
            self.assertTrue(wait_until(lambda: c.query("py/fifo").waiters == i + 1))
        first.renew()  # still its holder, with three waiting behind it
        self.assertTrue(first.valid)
        self.assertEqual(order, [])
        first.release()
        for i in range(3):
            self.assertTrue(wait_until(lambda: len(order) == i + 1))
            self.assertEqual(order, list(range(i + 1)))
            releases[i].set()
        for thread in threads:
            thread.join(10)
        tokens = [first.token] + [leases[i].token for i in range(3)]
        self.assertEqual(tokens, sorted(set(tokens)))
        owners = {first.owner} | {leases[i].owner for i in range(3)}
        self.assertEqual(len(owners), 4)
        self.assertTrue(all(same_client(owner, c.client_id) for owner in owners))

    def test_two_elections_over_one_client_compete(self):
        c = self.client()
        a = shardlock.Election(c, "py/elect", ttl=5)
        b = shardlock.Election(c, "py/elect", ttl=5)
        a_term = a.campaign("a")
        with self.assertRaises(shardlock.BusyError):
            b.campaign("b", wait=0)
        threading.Timer(0.3, a.resign).start()
        self.assertGreater(b.campaign("b", wait=10), a_term)
        self.assertFalse(a.leading)
        self.assertEqual(b.leader().owner, b.owner)
        b.resign()


class ExplicitOwner(ServerTestCase):
    def test_another_client_renews_and_releases_as_the_owner(self):
        a = self.client()
        lease = a.acquire("py/owned", 10, owner=OWNER, watchdog=False, value="tool")
        # Started later, as a tool is: its request ids are above the lease's
        # (the server applies an owner's renewals in request-id order).
        time.sleep(0.01)
        b = self.client()
        self.assertEqual(lease.owner, OWNER)
        self.assertEqual([h.owner for h in b.holders("py/owned").holder_list], [OWNER])
        with self.assertRaises(shardlock.NotOwnerError):
            b.release("py/owned", lease.token)  # as b's own id: not the owner
        self.assertEqual(b.renew("py/owned", lease.token, 20, owner=OWNER), 20)
        b.release("py/owned", lease.token, owner=bytes.fromhex(OWNER)[::-1])
        self.assertFalse(b.query("py/owned").held)
        with self.assertRaises(shardlock.ShardlockError):
            lease.release()  # ended by b
        with self.assertRaises(ValueError):
            a.acquire("py/owned", 10, owner="not hex")
        with self.assertRaises(ValueError):
            b.release("py/owned", 0, owner=OWNER)

    def test_the_raw_calls_default_to_the_client_id(self):
        a = self.client()
        b = self.client(client_id=bytes.fromhex(a.client_id)[::-1])
        lease = a.acquire("py/raw", 10, owner=a.client_id, watchdog=False)
        self.assertEqual(lease.owner, a.client_id)
        b.release("py/raw", lease.token)
        self.assertFalse(a.query("py/raw").held)


class Waits(ServerTestCase):
    def test_none_and_infinity_wait_until_granted(self):
        holder, c = self.client(), self.client()
        for wait in (None, math.inf):
            with self.subTest(wait=wait):
                held = holder.acquire("py/forever", 10)
                threading.Timer(0.3, held.release).start()
                lease = c.acquire("py/forever", 5, wait=wait)
                self.assertGreater(lease.token, held.token)
                lease.release()

    def test_with_lock_waits_by_default(self):
        holder, c = self.client(), self.client()
        held = holder.acquire("py/default", 10)
        threading.Timer(0.3, held.release).start()
        with c.lock("py/default", ttl=5) as lease:
            self.assertGreater(lease.token, held.token)
        with holder.lock_shared("py/default", ttl=5):
            with self.assertRaises(shardlock.BusyError):
                c.lock("py/default", ttl=5, wait=0)

    def test_bad_waits_are_value_errors(self):
        c = self.client()
        for wait in (-1, math.nan, -math.inf):
            with self.subTest(wait=wait):
                with self.assertRaises(ValueError):
                    c.acquire("py/bad", 5, wait=wait)
                with self.assertRaises(ValueError):
                    c.lock("py/bad", wait=wait)
                with self.assertRaises(ValueError):
                    shardlock.Election(c, "py/bad").campaign("v", wait=wait)
        self.assertFalse(c.query("py/bad").held)


class WaitsPastMaxWait(unittest.TestCase):
    """A server whose --max-wait is shorter than the wait: rounds."""

    def setUp(self):
        self.daemon = Daemon(extra=("--max-wait", "1s"))
        self.holder = shardlock.Client(self.daemon.address)
        self.c = shardlock.Client(self.daemon.address)

    def tearDown(self):
        self.holder.close()
        self.c.close()
        self.daemon.stop()

    def test_a_wait_without_end_rides_through_rounds_until_granted(self):
        held = self.holder.acquire("py/rounds", 10)
        threading.Timer(2.5, held.release).start()
        lease = self.c.acquire("py/rounds", 5, wait=None)
        self.assertGreater(lease.token, held.token)
        lease.release()

    def test_a_finite_wait_past_max_wait_ends_in_wait_timeout(self):
        held = self.holder.acquire("py/rounds-end", 10)
        with self.assertRaises(shardlock.WaitTimeoutError):
            self.c.acquire("py/rounds-end", 5, wait=2.2)
        held.release()


class AsyncOwners(AsyncServerTestCase):
    async def test_two_handles_queue_fifo_and_an_explicit_owner_is_released_by_another(self):
        async with shardlock.AsyncClient(self.daemon.address) as c, \
                shardlock.AsyncClient(self.daemon.address) as other:
            first = await c.acquire("aio/fifo", 10, watchdog=False)
            with self.assertRaises(shardlock.BusyError):
                await c.acquire("aio/fifo", 10)
            order = []

            async def waiter(i):
                lease = await c.acquire("aio/fifo", 10, wait=None)
                order.append(i)
                await lease.release()

            tasks = []
            for i in range(3):
                tasks.append(asyncio.ensure_future(waiter(i)))
                for _ in range(500):
                    if (await c.query("aio/fifo")).waiters == i + 1:
                        break
                    await asyncio.sleep(0.01)
            await first.renew()
            self.assertTrue(first.valid)
            self.assertNotEqual(first.owner, c.client_id)
            await first.release()
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
            self.assertEqual(order, [0, 1, 2])

            lease = await c.acquire("aio/owned", 10, owner=OWNER, watchdog=False)
            self.assertEqual(lease.owner, OWNER)
            self.assertEqual(await other.renew("aio/owned", lease.token, 20, owner=OWNER), 20)
            await other.release("aio/owned", lease.token, owner=OWNER)
            self.assertFalse((await other.query("aio/owned")).held)
            with self.assertRaises(ValueError):
                await c.acquire("aio/bad", 5, wait=-1)
            with self.assertRaises(ValueError):
                await c.lock("aio/bad", wait=math.nan)


if __name__ == "__main__":
    unittest.main()
