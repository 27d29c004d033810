"""Cluster mode against fake nodes: small UDP servers on loopback that answer
as a test scripts them, so REDIRECT, RECOVERING and a node that stops
answering can be staged exactly. The end-to-end run against real shardlockd
nodes and etcd is test_cluster_failover.py."""

import os
import socket
import struct
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shardlock  # noqa: E402
from shardlock import protocol as p  # noqa: E402
from shardlock import router  # noqa: E402

try:
    router.require_xxhash()
    NO_XXHASH = None
except ImportError as missing:
    NO_XXHASH = str(missing)


def encode_reply(message_type, request_id, **fields):
    """A single-message reply datagram (the codec itself only encodes
    requests)."""
    out = bytearray(struct.pack("<IBBBBQQQ", p.MAGIC, p.VERSION, 0, message_type, 1, request_id,
                                0, 0))
    for attribute, fmt in p._BODIES[message_type]:
        if fmt == "key":
            key = fields.get("key", b"")
            out += struct.pack("<H", len(key)) + key
        elif fmt == "members":
            members = fields["members"]
            out += struct.pack("<B", len(members))
            for member_id, address, weight in members:
                out += struct.pack("<H", len(member_id)) + member_id
                out += struct.pack("<H", len(address)) + address.encode()
                out += struct.pack("<I", weight)
        elif fmt == "holder_list":
            out += b"\x00"  # no holders listed: the fakes answer for free keys
        else:
            out += struct.pack("<" + fmt, fields.get(attribute, 0))
    return bytes(out)


class FakeNode:
    """A UDP server on 127.0.0.1:0. `handler(node, datagram, message)`
    returns the reply bytes, or None to stay silent. Every request is kept in
    `requests` as (datagram, message)."""

    def __init__(self, handler=None):
        self.handler = handler
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.settimeout(0.05)
        self.address = "127.0.0.1:%d" % self.socket.getsockname()[1]
        self.requests = []
        self.lock = threading.Lock()
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stopped:
            try:
                data, peer = self.socket.recvfrom(2048)
            except socket.timeout:
                continue
            except OSError:
                return
            datagram = p.decode(data)
            message = datagram.messages[0]
            with self.lock:
                self.requests.append((datagram, message))
                handler = self.handler
            reply = handler(self, datagram, message) if handler else None
            if reply is not None:
                self.socket.sendto(reply, peer)

    def of_type(self, message_type):
        with self.lock:
            return [(d, m) for d, m in self.requests if m.type == message_type]

    def calls(self, message_type):
        """How many distinct requests (request ids) of `message_type` came:
        a retransmission under load is the same call."""
        return len({m.request_id for _, m in self.of_type(message_type)})

    def close(self):
        self.stopped = True
        self.thread.join()
        self.socket.close()


class Cluster:
    """Fake nodes that all serve one map (`epoch`, `members`), one member
    per MAP_REPLY page so that paging is exercised; each node grants keys
    with its own token base unless `override` (node id -> handler) says
    otherwise."""

    def __init__(self, ids):
        self.epoch = 1
        self.nodes = {member_id: FakeNode(self._handle) for member_id in ids}
        self.members = [(member_id.encode(), node.address, 1)
                        for member_id, node in self.nodes.items()]
        self.override = {}
        self.tokens = {member_id: 1000 * (i + 1) for i, member_id in enumerate(ids)}

    def id_of(self, node):
        return next(i for i, n in self.nodes.items() if n is node)

    def _handle(self, node, datagram, m):
        node_id = self.id_of(node)
        if node_id in self.override:
            return self.override[node_id](node, datagram, m)
        return self.answer(node, datagram, m)

    def answer(self, node, datagram, m):
        """What a healthy node of this map answers."""
        if m.type == p.MAP:
            page = self.members[m.first_member:m.first_member + 1]
            return encode_reply(p.MAP_REPLY, m.request_id, epoch=self.epoch,
                                member_count=len(self.members), first_member=m.first_member,
                                members=page)
        if m.type in (p.ACQUIRE, p.ACQUIRE_SHARED, p.ACQUIRE_PERMIT):
            return encode_reply(p.GRANTED, m.request_id, key=m.key,
                                token=self.tokens[self.id_of(node)], ttl_ms=m.ttl_ms)
        if m.type == p.RENEW:
            return encode_reply(p.RENEWED, m.request_id, key=m.key, ttl_ms=m.ttl_ms)
        if m.type == p.RELEASE:
            return encode_reply(p.RELEASED, m.request_id)
        if m.type == p.QUERY:
            return encode_reply(p.QUERY_REPLY, m.request_id, key=m.key)
        if m.type == p.WATCH:
            return encode_reply(p.HOLDERS_REPLY, m.request_id, key=m.key)
        return None

    def router(self):
        return router.Router([(member_id, weight) for member_id, _, weight in self.members])

    def key_owned_by(self, member_id, prefix="key-"):
        r = self.router()
        for i in range(10000):
            key = ("%s%d" % (prefix, i)).encode()
            if r.owner(key) == member_id.encode():
                return key
        raise AssertionError("no key for %s" % member_id)

    def close(self):
        for node in self.nodes.values():
            node.close()


@unittest.skipIf(NO_XXHASH, NO_XXHASH)
class ClusterModeTestCase(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(["a", "b", "c"])
        self.clients = []

    def tearDown(self):
        for client in self.clients:
            client.close()
        self.cluster.close()

    def client(self, seeds=None, **options):
        options.setdefault("request_timeout", 1.0)
        seeds = seeds or [self.cluster.nodes["a"].address]
        c = shardlock.Client(seeds, discover=True, **options)
        self.clients.append(c)
        return c

    def move_b_away(self, key):
        """The cluster moves b's buckets: epoch 2 has a and c only. b, still
        up, redirects (its map is newer than the client's). Returns the
        new owner of `key`."""
        self.cluster.epoch = 2
        self.cluster.members = [m for m in self.cluster.members if m[0] != b"b"]
        self.cluster.override["b"] = lambda node, d, m: (
            self.cluster.answer(node, d, m) if m.type == p.MAP
            else encode_reply(p.REDIRECT, m.request_id, epoch=2))
        return self.cluster.router().owner(key).decode()


class Discovery(ClusterModeTestCase):
    def test_the_map_is_read_page_by_page_and_keys_go_to_their_owner(self):
        c = self.client(",".join([self.cluster.nodes["c"].address]))
        self.assertEqual(c.map_epoch, 1)
        self.assertEqual([m[0] for m in c.map_members], ["a", "b", "c"])
        self.assertEqual(self.cluster.nodes["c"].calls(p.MAP), 3)  # one page each
        for owner in ("a", "b", "c"):
            key = self.cluster.key_owned_by(owner)
            self.assertEqual(c.address_for(key), self.cluster.nodes[owner].address)
            with c.lock(key, ttl=5, watchdog=False) as lease:
                self.assertEqual(lease.token, self.cluster.tokens[owner])
            acquires = self.cluster.nodes[owner].of_type(p.ACQUIRE)
            self.assertEqual(acquires[-1][1].key, key)
            # Every request carries the map's epoch.
            self.assertEqual(acquires[-1][0].epoch, 1)
            self.assertEqual(self.cluster.nodes[owner].of_type(p.RELEASE)[-1][0].epoch, 1)

    def test_no_seed_with_a_map_is_unreachable_naming_each_seed(self):
        single = FakeNode(lambda node, d, m: encode_reply(
            p.MAP_REPLY, m.request_id, epoch=0, member_count=0, first_member=0, members=[]))
        silent = FakeNode()
        try:
            with self.assertRaises(shardlock.UnreachableError) as caught:
                shardlock.Client([single.address, silent.address], discover=True,
                                 request_timeout=0.3)
            self.assertIn("not a cluster node", str(caught.exception))
            self.assertIn(silent.address, str(caught.exception))
        finally:
            single.close()
            silent.close()

    def test_one_server_listed_twice_is_refused(self):
        # Several servers without discover are a static node list
        # (test_nodes.py); the same address twice is a mistake, as the C++
        # client says.
        with self.assertRaises(ValueError) as caught:
            shardlock.Client("127.0.0.1:1,127.0.0.1:1")
        self.assertIn("same address", str(caught.exception))


class Redirects(ClusterModeTestCase):
    def test_a_redirect_refreshes_the_map_from_that_node_and_goes_to_the_owner(self):
        c = self.client()
        key = self.cluster.key_owned_by("b")
        new_owner = self.move_b_away(key)
        lease = c.acquire(key, ttl=5, watchdog=False)
        self.assertEqual(lease.token, self.cluster.tokens[new_owner])
        self.assertEqual(c.map_epoch, 2)
        # Asked b first for the newer map.
        self.assertTrue(self.cluster.nodes["b"].of_type(p.MAP))
        self.assertEqual(self.cluster.nodes[new_owner].of_type(p.ACQUIRE)[-1][0].epoch, 2)
        lease.release()

    def test_redirects_are_bounded(self):
        c = self.client()
        key = self.cluster.key_owned_by("b")
        # b redirects under the client's own epoch, forever.
        self.cluster.override["b"] = lambda node, d, m: (
            self.cluster.answer(node, d, m) if m.type == p.MAP
            else encode_reply(p.REDIRECT, m.request_id, epoch=1))
        with self.assertRaises(shardlock.RedirectedError):
            c.acquire(key, ttl=5, wait=10, watchdog=False)
        self.assertEqual(self.cluster.nodes["b"].calls(p.ACQUIRE), 9)  # 1 + 8 hops

    def test_a_renew_answered_redirect_loses_the_lease_at_its_granting_node(self):
        c = self.client()
        key = self.cluster.key_owned_by("b")
        lost = threading.Event()
        reasons = []
        lease = c.acquire(key, ttl=5, watchdog=False,
                          on_lost=lambda lease, reason: (reasons.append(reason), lost.set()))
        self.cluster.override["b"] = lambda node, d, m: (
            self.cluster.answer(node, d, m) if m.type == p.MAP
            else encode_reply(p.REDIRECT, m.request_id, epoch=2))
        with self.assertRaises(shardlock.RedirectedError):
            lease.renew()
        self.assertTrue(lost.wait(5))
        self.assertIsInstance(reasons[0], shardlock.RedirectedError)
        self.assertFalse(lease.valid)
        self.assertEqual(self.cluster.nodes["b"].calls(p.RENEW), 1)


class Recovering(ClusterModeTestCase):
    def owner_recovers_after(self, owner, answers):
        """`owner` answers RECOVERING (retry in 30 ms) `answers` times."""
        count = [0]

        def handler(node, d, m):
            if m.type == p.ACQUIRE and count[0] < answers:
                count[0] += 1
                return encode_reply(p.RECOVERING, m.request_id, retry_after_ms=30)
            return self.cluster.answer(node, d, m)
        self.cluster.override[owner] = handler

    def test_a_waiting_acquire_rides_through_recovering(self):
        c = self.client()
        key = self.cluster.key_owned_by("c")
        self.owner_recovers_after("c", 3)
        lease = c.acquire(key, ttl=5, wait=10, watchdog=False)
        self.assertEqual(lease.token, self.cluster.tokens["c"])
        # Each retry a fresh request id asking for the wait left.
        self.assertEqual(self.cluster.nodes["c"].calls(p.ACQUIRE), 4)
        acquires = self.cluster.nodes["c"].of_type(p.ACQUIRE)
        self.assertTrue(all(0 < m.wait_ms <= 10000 for _, m in acquires))

    def test_a_hint_past_the_wait_still_waits_it_out(self):
        c = self.client()
        key = self.cluster.key_owned_by("c")
        count = [0]

        def handler(node, d, m):
            if m.type == p.ACQUIRE:
                count[0] += 1
                return encode_reply(p.RECOVERING, m.request_id, retry_after_ms=60000)
            return self.cluster.answer(node, d, m)
        self.cluster.override["c"] = handler
        started = time.monotonic()
        with self.assertRaises(shardlock.RecoveringError):
            c.acquire(key, ttl=5, wait=0.3, watchdog=False)
        # A last try just before the wait ends, and no report before it.
        self.assertGreaterEqual(time.monotonic() - started, 0.28)
        self.assertEqual(self.cluster.nodes["c"].calls(p.ACQUIRE), 2)

    def test_a_try_reports_recovering_at_once(self):
        c = self.client()
        key = self.cluster.key_owned_by("c")
        self.owner_recovers_after("c", 100)
        with self.assertRaises(shardlock.RecoveringError):
            c.acquire(key, ttl=5, watchdog=False)
        self.assertEqual(self.cluster.nodes["c"].calls(p.ACQUIRE), 1)


class Watches(ClusterModeTestCase):
    """A WATCH is routed and ridden through as a waiting acquire."""

    def test_a_redirected_watch_goes_to_the_owner_of_the_newer_map(self):
        c = self.client()
        key = self.cluster.key_owned_by("b")
        new_owner = self.move_b_away(key)
        event = c.watch_once(key, since=shardlock.KeyVersion(7, 1), wait=10)
        self.assertEqual(event.version, (0, 0))
        watch = self.cluster.nodes[new_owner].of_type(p.WATCH)[-1]
        self.assertEqual((watch[0].epoch, watch[1].token, watch[1].holders), (2, 7, 1))
        self.assertLessEqual(watch[1].wait_ms, 10000)

    def test_a_waiting_watch_rides_through_recovering_with_the_same_version(self):
        c = self.client()
        key = self.cluster.key_owned_by("c")
        count = [0]

        def handler(node, d, m):
            if m.type == p.WATCH and count[0] < 3:
                count[0] += 1
                return encode_reply(p.RECOVERING, m.request_id, retry_after_ms=30)
            return self.cluster.answer(node, d, m)
        self.cluster.override["c"] = handler
        self.assertEqual(c.watch_once(key, since=shardlock.KeyVersion(9, 2), wait=10).version,
                         (0, 0))
        watches = self.cluster.nodes["c"].of_type(p.WATCH)
        self.assertEqual(self.cluster.nodes["c"].calls(p.WATCH), 4)  # fresh ids, same version
        self.assertTrue(all((m.token, m.holders) == (9, 2) and 0 < m.wait_ms <= 10000
                            for _, m in watches))
        count[0] = 0
        with self.assertRaises(shardlock.RecoveringError):
            c.watch_once(key, wait=0)  # a try reports it


class Silence(ClusterModeTestCase):
    def test_a_silent_owner_makes_the_client_move_to_the_new_owner(self):
        c = self.client()
        key = self.cluster.key_owned_by("b")
        # b dies; the others publish epoch 2 without it a little later.
        self.cluster.override["b"] = lambda node, d, m: None
        new_members = [m for m in self.cluster.members if m[0] != b"b"]

        def publish():
            time.sleep(0.5)
            self.cluster.members = new_members
            self.cluster.epoch = 2
        threading.Thread(target=publish, daemon=True).start()
        new_owner = router.Router([(i, w) for i, _, w in new_members]).owner(key).decode()
        lease = c.acquire(key, ttl=5, wait=10, watchdog=False)
        self.assertEqual(lease.token, self.cluster.tokens[new_owner])
        self.assertEqual(c.map_epoch, 2)
        granted = self.cluster.nodes[new_owner].of_type(p.ACQUIRE)[-1]
        self.assertEqual(granted[0].epoch, 2)
        self.assertLess(granted[1].wait_ms, 10000)  # the wait left, not the whole
        # Renewal and release go to the new owner, which granted it.
        lease.renew()
        lease.release()
        self.assertTrue(self.cluster.nodes[new_owner].of_type(p.RELEASE))

    def test_silence_through_the_whole_wait_is_unreachable_only_then(self):
        c = self.client(request_timeout=0.3)
        key = self.cluster.key_owned_by("b")
        self.cluster.override["b"] = lambda node, d, m: None
        maps_read = self.cluster.nodes["a"].calls(p.MAP) + self.cluster.nodes["c"].calls(p.MAP)
        start = time.monotonic()
        with self.assertRaises(shardlock.UnreachableError):
            c.acquire(key, ttl=5, wait=1.0, watchdog=False)
        self.assertGreaterEqual(time.monotonic() - start, 1.0)
        # It asked the others for a newer map meanwhile (3 pages a time).
        self.assertGreaterEqual(self.cluster.nodes["a"].calls(p.MAP) +
                                self.cluster.nodes["c"].calls(p.MAP), maps_read + 3)


if __name__ == "__main__":
    unittest.main()
