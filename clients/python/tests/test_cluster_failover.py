"""Riding through a failover, end to end for the Python client: a real
etcd, three real shardlockd cluster nodes, and the node owning a key's
bucket killed with -9.
A waiting acquire issued right after the kill is granted by the key's new
owner within its wait, never raising RecoveringError or UnreachableError
first (as tests/cluster/etcd/client_failover_test.cc checks for C++ and C).

Needs $SHARDLOCKD (ctest sets it), etcd at $SHARDLOCK_ETCD (default
/usr/bin/etcd) and the xxhash package; skipped without any of them. The only
timing check is a lower bound: no grant before the cluster's lock-delay
after the kill, which a slow machine cannot break.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import shardlock  # noqa: E402
from shardlock import router  # noqa: E402
from test_client import Daemon  # noqa: E402

ETCD = os.environ.get("SHARDLOCK_ETCD", "/usr/bin/etcd")
# --max-ttl 2s + --etcd-lease-ttl 2s + the 500 ms drift margin: the new
# owner refuses a dead node's buckets this long after it saw the node's
# member key vanish, which is after the kill.
CLUSTER_LOCK_DELAY = 4.5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """A single-member etcd on loopback, as tests/torture/etcd_server.cc."""

    def __init__(self, directory):
        client_port, peer_port = free_port(), free_port()
        self.endpoint = "127.0.0.1:%d" % client_port
        client_url = "http://" + self.endpoint
        peer_url = "http://127.0.0.1:%d" % peer_port
        self.log = open(os.path.join(directory, "etcd.log"), "wb")
        self.process = subprocess.Popen(
            [ETCD, "--name=default", "--data-dir=" + os.path.join(directory, "etcd"),
             "--listen-client-urls=" + client_url, "--advertise-client-urls=" + client_url,
             "--listen-peer-urls=" + peer_url, "--initial-advertise-peer-urls=" + peer_url,
             "--initial-cluster=default=" + peer_url, "--logger=zap", "--log-outputs=stderr",
             "--log-level=warn"], stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(client_url + "/health", timeout=1) as answer:
                    if b'"health":"true"' in answer.read():
                        return
            except OSError:
                pass
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise AssertionError("etcd did not become healthy")

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.log.close()


@unittest.skipUnless(os.access(ETCD, os.X_OK), "no etcd at %s (set SHARDLOCK_ETCD)" % ETCD)
class ClusterFailover(unittest.TestCase):
    def setUp(self):
        try:
            router.require_xxhash()
        except ImportError as missing:
            self.skipTest(str(missing))
        self.root = tempfile.mkdtemp(prefix="shardlock-py-failover-")
        self.nodes = {}
        self.clients = []
        self.etcd = Etcd(self.root)

    def tearDown(self):
        for client in self.clients:
            client.close()
        for node in self.nodes.values():
            node.stop()
        self.etcd.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def start_node(self, node_id):
        self.nodes[node_id] = Daemon(lock_delay="2s", extra=[
            "--io", "socket", "--data-dir", os.path.join(self.root, node_id),
            "--cluster", "etcd://" + self.etcd.endpoint, "--cluster-name", "py-failover",
            "--node-id", node_id, "--max-ttl", "2s", "--etcd-lease-ttl", "2s"])

    def client(self, seeds, **options):
        c = shardlock.Client(seeds, discover=True, **options)
        self.clients.append(c)
        return c

    def client_with_members(self, ids):
        """A cluster client whose map has exactly `ids`, waiting up to 30 s
        for the cluster to publish it."""
        deadline = time.monotonic() + 30
        seeds = [node.address for node in self.nodes.values()]
        while True:
            try:
                c = self.client(seeds)
                seen = {member_id for member_id, _, _ in c.map_members}
            except shardlock.UnreachableError:
                seen = set()
            if seen == ids or time.monotonic() > deadline:
                self.assertEqual(seen, ids)
                return c
            time.sleep(0.1)

    def keys_of(self, c, node_id, count):
        address = self.nodes[node_id].address
        keys = [k for k in ("key-%d" % i for i in range(10000)) if c.address_for(k) == address]
        self.assertGreaterEqual(len(keys), count)
        return keys[:count]

    def test_a_waiting_acquire_is_granted_by_the_new_owner_after_a_kill(self):
        for node_id in ("n1", "n2", "n3"):
            self.start_node(node_id)
        before = self.client_with_members({"n1", "n2", "n3"})
        keys = self.keys_of(before, "n2", 2)
        # n2 grants (the wait rides through its start's lock-delay), and the
        # lease is still held when n2 dies.
        held = before.acquire(keys[0], ttl=2, wait=30, watchdog=False)
        self.assertTrue(held.valid)

        killed_at = time.monotonic()
        self.nodes["n2"].process.send_signal(signal.SIGKILL)

        # A client whose map still names n2 (it routes keys[1] there first)...
        results = {}

        def stale_map_acquire():
            try:
                lease = before.acquire(keys[1], ttl=2, wait=40, watchdog=False)
                results["stale"] = (lease, time.monotonic())
            except shardlock.ShardlockError as error:
                results["stale"] = (error, time.monotonic())
        stale = threading.Thread(target=stale_map_acquire)
        stale.start()
        # ...and one created after the kill, with the dead node last among
        # its seeds, as a user's list would still name it.
        after = self.client([self.nodes[i].address for i in ("n1", "n3", "n2")])
        lease = after.acquire(keys[0], ttl=2, wait=40, watchdog=False)
        granted_at = time.monotonic()
        self.assertTrue(lease.valid)
        self.assertNotEqual(after.address_for(keys[0]), self.nodes["n2"].address)
        self.assertGreaterEqual(granted_at - killed_at, CLUSTER_LOCK_DELAY)

        stale.join(60)
        outcome, at = results["stale"]
        self.assertIsInstance(outcome, shardlock.Lease, repr(outcome))
        self.assertGreater(outcome.token, 0)
        self.assertGreaterEqual(at - killed_at, CLUSTER_LOCK_DELAY)
        del held  # its RELEASE goes to the dead node: nothing to wait for


if __name__ == "__main__":
    unittest.main()
