"""AsyncClient against a real shardlockd (skipped without $SHARDLOCKD): the
asyncio API (`async with client.lock(...)`) on the datagram endpoint."""

import asyncio
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shardlock  # noqa: E402
from test_client import AsyncServerTestCase  # noqa: E402


class AsyncLocks(AsyncServerTestCase):
    async def test_lock_busy_and_release(self):
        async with shardlock.AsyncClient(self.daemon.address) as a, \
                shardlock.AsyncClient(self.daemon.address) as b:
            async with a.lock("aio/a", ttl=5) as lease:
                self.assertIsInstance(lease, shardlock.AsyncLease)
                self.assertTrue(lease.valid)
                self.assertGreater(lease.token, 0)
                self.assertTrue(4 < lease.remaining() <= 5)
                self.assertTrue((await a.query("aio/a")).held)
                with self.assertRaises(shardlock.BusyError):
                    await b.lock("aio/a", ttl=5, wait=0)
                with self.assertRaises(shardlock.WaitTimeoutError):
                    await b.acquire("aio/a", 5, wait=0.2)
            self.assertFalse(lease.valid)
            self.assertFalse((await a.query("aio/a")).held)
            with self.assertRaises(shardlock.LeaseInactiveError):
                await lease.release()
            second = await b.lock("aio/a", ttl=5)
            self.assertGreater(second.token, lease.token)
            await second.release()

    async def test_holders_lists_each_holder(self):
        async with shardlock.AsyncClient(self.daemon.address) as a, \
                shardlock.AsyncClient(self.daemon.address) as b:
            ra = await a.acquire("aio/who", 5, shared=True)
            rb = await b.acquire("aio/who", 5, shared=True)
            r = await a.holders("aio/who")
            self.assertTrue(r.listed)
            self.assertEqual((r.held, r.mode, r.holders), (True, "shared", 2))
            self.assertEqual([h.owner for h in r.holder_list], [ra.owner, rb.owner])
            self.assertEqual([h.token for h in r.holder_list], [ra.token, rb.token])
            await ra.release()
            await rb.release()
            free = await a.holders("aio/who")
            self.assertEqual((free.held, free.mode, free.holder_list), (False, None, []))

    async def test_a_waiting_acquire_is_handed_the_lease(self):
        async with shardlock.AsyncClient(self.daemon.address) as a, \
                shardlock.AsyncClient(self.daemon.address) as b:
            held = await a.lock("aio/handoff", ttl=5)
            waiter = asyncio.ensure_future(b.acquire("aio/handoff", 5, wait=5))
            await asyncio.sleep(0.1)
            self.assertFalse(waiter.done())
            await held.release()
            lease = await asyncio.wait_for(waiter, 5)
            self.assertGreater(lease.token, held.token)
            await lease.release()

    async def test_many_calls_at_once_on_one_client(self):
        async with shardlock.AsyncClient(self.daemon.address) as a:
            leases = await asyncio.gather(*(a.acquire("aio/many/%d" % i, 5) for i in range(50)))
            self.assertTrue(all(lease.valid for lease in leases))
            self.assertEqual([lease.key for lease in leases], ["aio/many/%d" % i for i in range(50)])
            self.assertTrue(all(q.held for q in await asyncio.gather(
                *(a.query("aio/many/%d" % i) for i in range(50)))))
            await asyncio.gather(*(lease.release() for lease in leases))

    async def test_shared_leases_and_permits(self):
        async with shardlock.AsyncClient(self.daemon.address) as a, \
                shardlock.AsyncClient(self.daemon.address) as b:
            async with a.lock_shared("aio/s", ttl=5), b.lock_shared("aio/s", ttl=5) as r:
                self.assertEqual(r.mode, "shared")
                self.assertEqual((await a.query("aio/s")).holders, 2)
            p1 = await a.acquire("aio/p", 5, permits=2)
            p2 = await b.acquire("aio/p", 5, permits=2)
            async with await shardlock.AsyncClient.connect(self.daemon.address) as c:
                with self.assertRaises(shardlock.BusyError):
                    await c.acquire("aio/p", 5, permits=2)
            await p1.release()
            await p2.release()

    async def test_the_watchdog_keeps_a_short_lease(self):
        async with shardlock.AsyncClient(self.daemon.address) as a, \
                shardlock.AsyncClient(self.daemon.address) as b:
            async with a.lock("aio/watch", ttl=1) as lease:
                await asyncio.sleep(2.5)
                self.assertTrue(lease.valid)
                with self.assertRaises(shardlock.BusyError):
                    await b.lock("aio/watch", ttl=1, wait=0)

    async def test_on_lost_runs_once_when_the_server_dies(self):
        async with shardlock.AsyncClient(self.daemon.address, request_timeout=0.3) as a:
            lost = []
            with self.assertRaises(shardlock.LeaseLostError):
                async with a.lock("aio/lost", ttl=1,
                                  on_lost=lambda lease, reason: lost.append(reason)):
                    self.daemon.kill()
                    for _ in range(40):
                        if lost:
                            break
                        await asyncio.sleep(0.1)
            self.assertEqual(len(lost), 1)
            self.assertIsInstance(lost[0], shardlock.LeaseExpiredError)

    async def test_closed_and_unstarted_clients(self):
        client = shardlock.AsyncClient(self.daemon.address)
        with self.assertRaises(shardlock.ShardlockError):
            await client.acquire("aio/x", 5)
        await client.start()
        await client.close()
        with self.assertRaises(shardlock.ClientClosedError):
            await client.acquire("aio/x", 5)


if __name__ == "__main__":
    unittest.main()
