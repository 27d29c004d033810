"""Several independent servers without discover (a static node list): each
key goes to its owner under the Router over the addresses as written, as
the C++ client's ClientRouting does. Two real shardlockd (skipped without
$SHARDLOCKD) and xxhash (skipped without it)."""

import asyncio
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shardlock  # noqa: E402
from shardlock import router  # noqa: E402
from test_client import DAEMON, Daemon  # noqa: E402


@unittest.skipUnless(DAEMON, "set SHARDLOCKD to the shardlockd binary")
@unittest.skipIf(router._xxhash is None, "needs xxhash (python3-xxhash)")
class StaticNodes(unittest.TestCase):
    def setUp(self):
        self.daemons = [Daemon(), Daemon()]
        self.addresses = [d.address for d in self.daemons]

    def tearDown(self):
        for d in self.daemons:
            d.stop()

    def owner(self, key):
        r = router.Router([(a.encode(), 1) for a in self.addresses])
        return r.owner(key.encode()).decode()

    def test_each_key_is_taken_at_its_owner(self):
        keys = ["nodes/%d" % i for i in range(24)]
        with shardlock.Client(",".join(self.addresses)) as c, \
                shardlock.Client(list(reversed(self.addresses))) as other_order:
            owners = {c.address_for(k) for k in keys}
            self.assertEqual(owners, set(self.addresses))  # both nodes are used
            for key in keys:
                self.assertEqual(c.address_for(key), self.owner(key))
                self.assertEqual(other_order.address_for(key), c.address_for(key))
            leases = [c.lock(key, ttl=5) for key in keys]
            for key in keys:
                with shardlock.Client(c.address_for(key)) as at_owner:
                    self.assertTrue(at_owner.query(key).held, key)
                with self.assertRaises(shardlock.BusyError):
                    other_order.lock(key, ttl=5, wait=0)
            for lease in leases:
                lease.release()

    def test_the_asyncio_client_routes_alike(self):
        async def run():
            async with shardlock.AsyncClient(self.addresses) as c:
                for i in range(8):
                    key = "nodes/aio/%d" % i
                    self.assertEqual(c.address_for(key), self.owner(key))
                    async with c.lock(key, ttl=5):
                        async with shardlock.AsyncClient(self.owner(key)) as at_owner:
                            self.assertTrue((await at_owner.query(key)).held)
        asyncio.run(run())


if __name__ == "__main__":
    unittest.main()
