"""The Python client against a real shardlockd, with no C++ on the client
side: the package's own codec and socket.

The daemon's path comes from $SHARDLOCKD (ctest sets it); without it these
tests are skipped. Each test class starts its own daemon on 127.0.0.1:0 with
--lock-delay 0 and reads the port from its JSON ready line.
"""

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shardlock  # noqa: E402
from shardlock import protocol as p  # noqa: E402

DAEMON = os.environ.get("SHARDLOCKD")


class Daemon:
    """shardlockd as a child process."""

    def __init__(self, lock_delay="0", extra=()):
        if not DAEMON:
            raise unittest.SkipTest("set SHARDLOCKD to the shardlockd binary")
        if not os.access(DAEMON, os.X_OK):
            raise AssertionError("SHARDLOCKD=%s is not an executable" % DAEMON)
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [DAEMON, "--listen", "127.0.0.1:0", "--lock-delay", lock_delay, "--shards", "4",
             *extra],
            stdout=subprocess.PIPE, stderr=self.stderr)
        ready, _, _ = select.select([self.process.stdout], [], [], 30)
        line = self.process.stdout.readline() if ready else b""
        if not line:
            self.kill()
            self.stderr.seek(0)
            raise AssertionError("shardlockd did not start: %s" % self.stderr.read().decode())
        event = json.loads(line)
        assert event["event"] == "ready", line
        self.port = event["port"]
        self.address = "127.0.0.1:%d" % self.port

    def kill(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.process.stdout.close()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        self.kill()
        self.stderr.close()


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class ServerTestCase(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon()
        self.clients = []

    def tearDown(self):
        for client in self.clients:
            client.close()
        self.daemon.stop()

    def client(self, **options):
        c = shardlock.Client(self.daemon.address, **options)
        self.clients.append(c)
        return c


class AsyncServerTestCase(unittest.IsolatedAsyncioTestCase):
    """A daemon per test, for the asyncio client's tests."""

    def setUp(self):
        self.daemon = Daemon()

    def tearDown(self):
        self.daemon.stop()


class Locks(ServerTestCase):
    def test_lock_and_unlock(self):
        a = self.client()
        with a.lock("py/a", ttl=5) as lease:
            self.assertTrue(lease.valid)
            self.assertGreater(lease.token, 0)
            self.assertEqual(lease.key, "py/a")
            self.assertEqual(lease.mode, "exclusive")
            self.assertTrue(4 < lease.remaining() <= 5)
            q = a.query("py/a")
            self.assertTrue(q.held)
            self.assertEqual(q.token, lease.token)
        self.assertFalse(lease.valid)
        self.assertEqual(lease.remaining(), 0)
        self.assertFalse(a.query("py/a").held)
        with self.assertRaises(shardlock.LeaseInactiveError):
            lease.release()

    def test_busy_from_a_second_client(self):
        a, b = self.client(), self.client()
        self.assertNotEqual(a.client_id, b.client_id)
        with a.lock("py/busy", ttl=5):
            with self.assertRaises(shardlock.BusyError) as busy:
                b.lock("py/busy", ttl=5, wait=0)
            self.assertGreater(busy.exception.holder_ttl_left_ms, 0)
            with self.assertRaises(shardlock.WaitTimeoutError):
                b.lock("py/busy", ttl=5, wait=0.2)
        with b.lock("py/busy", ttl=5) as lease:
            self.assertTrue(lease.valid)

    def test_a_waiting_acquire_is_handed_the_lease(self):
        a, b = self.client(), self.client()
        held = a.lock("py/handoff", ttl=5)
        got = {}

        def waiter():
            got["lease"] = b.lock("py/handoff", ttl=5, wait=5)

        thread = threading.Thread(target=waiter)
        thread.start()
        self.assertTrue(wait_until(lambda: a.query("py/handoff").waiters == 1))
        held.release()
        thread.join(10)
        self.assertGreater(got["lease"].token, held.token)
        got["lease"].release()

    def test_shared_leases_coexist(self):
        a, b, c = self.client(), self.client(), self.client()
        with a.lock_shared("py/shared", ttl=5) as ra, b.lock_shared("py/shared", ttl=5) as rb:
            self.assertEqual(ra.mode, "shared")
            self.assertNotEqual(ra.token, rb.token)
            q = c.query("py/shared")
            self.assertEqual((q.held, q.mode, q.holders), (True, "shared", 2))
            with self.assertRaises(shardlock.BusyError):
                c.lock("py/shared", ttl=5, wait=0)
        with c.lock("py/shared", ttl=5):
            with self.assertRaises(shardlock.BusyError):
                a.lock_shared("py/shared", ttl=5, wait=0)

    def test_permits(self):
        a, b, c = self.client(), self.client(), self.client()
        with a.lock("py/permits", ttl=5, permits=2), b.lock("py/permits", ttl=5, permits=2):
            with self.assertRaises(shardlock.BusyError):
                c.lock("py/permits", ttl=5, permits=2, wait=0)
            with self.assertRaises(shardlock.ServerError) as error:
                c.lock("py/permits", ttl=5, permits=3)
            self.assertEqual(error.exception.code, 12)  # kLeaseKindMismatch

    def test_tokens_rise(self):
        clients = [self.client(), self.client()]
        tokens = []
        for i in range(6):
            with clients[i % 2].lock("py/tokens", ttl=5) as lease:
                tokens.append(lease.token)
        self.assertEqual(tokens, sorted(set(tokens)))

    def test_renew_and_explicit_ttl(self):
        a = self.client()
        lease = a.acquire("py/renew", ttl=5, watchdog=False)
        lease.renew(2)
        self.assertLessEqual(lease.remaining(), 2)
        self.assertEqual(lease.ttl, 2)
        lease.renew()
        lease.release()
        with self.assertRaises(shardlock.LeaseInactiveError):
            lease.renew()

    def test_bad_arguments_raise_value_error(self):
        a = self.client()
        for kwargs in (dict(key="", ttl=1), dict(key="k" * 257, ttl=1), dict(key="k", ttl=0),
                       dict(key="k", ttl=1, wait=-1), dict(key="k", ttl=1, permits=70000),
                       dict(key="k", ttl=1, permits=2, shared=True)):
            with self.subTest(**{k: str(v)[:10] for k, v in kwargs.items()}):
                with self.assertRaises(ValueError):
                    a.acquire(**kwargs)
        with self.assertRaises(ValueError):
            shardlock.Client("no-port")
        # Above the server's --max-ttl (60 s by default): the server's ERROR.
        with self.assertRaises(shardlock.ServerError) as error:
            a.lock("py/k", ttl=3600)
        self.assertEqual(error.exception.code, 4)


class Watchdog(ServerTestCase):
    def test_the_watchdog_keeps_a_one_second_lease_past_three_seconds(self):
        a, b = self.client(), self.client()
        lost = []
        with a.lock("py/watched", ttl=1, on_lost=lambda lease, why: lost.append(why)) as lease:
            time.sleep(3.2)
            self.assertTrue(lease.valid)
            with self.assertRaises(shardlock.BusyError):
                b.lock("py/watched", ttl=1, wait=0)
        self.assertEqual(lost, [])

    def test_on_lost_fires_once_when_the_server_is_killed(self):
        a = self.client(request_timeout=0.5)
        calls = []
        fired = threading.Event()

        def on_lost(lease, reason):
            calls.append((lease.key, reason, threading.current_thread().name))
            fired.set()

        with self.assertRaises(shardlock.LeaseLostError) as lost:
            with a.lock("py/lost", ttl=1, on_lost=on_lost) as lease:
                self.daemon.kill()
                self.assertTrue(fired.wait(5))
                self.assertFalse(lease.valid)
                time.sleep(0.5)
        self.assertEqual(len(calls), 1)
        key, reason, thread_name = calls[0]
        self.assertEqual(key, "py/lost")
        self.assertIsInstance(reason, shardlock.LeaseExpiredError)
        self.assertEqual(thread_name, "shardlock-watchdog")
        self.assertIsInstance(lost.exception.reason, shardlock.LeaseExpiredError)
        # And with the server gone, calls are unreachable by their deadline.
        start = time.monotonic()
        with self.assertRaises(shardlock.UnreachableError):
            a.lock("py/lost", ttl=1, wait=0)
        self.assertLess(time.monotonic() - start, 5)


class RidingThroughRecovering(unittest.TestCase):
    """A wait covers a fresh daemon's lock-delay."""

    def test_a_waiting_acquire_is_granted_when_the_lock_delay_ends(self):
        started = time.monotonic()
        daemon = Daemon(lock_delay="3s")
        try:
            with shardlock.Client(daemon.address) as client:
                if time.monotonic() - started < 2.5:
                    with self.assertRaises(shardlock.RecoveringError):
                        client.acquire("fresh", ttl=5)
                lease = client.acquire("fresh", ttl=5, wait=30)
                self.assertTrue(lease.valid)
                self.assertGreaterEqual(time.monotonic() - started, 3.0)
                lease.release()
        finally:
            daemon.stop()


class RecoveringRenewals(unittest.TestCase):
    """A RENEW answered RECOVERING waits retry_after_ms."""

    def test_renewals_answered_recovering_back_off(self):
        server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        server.bind(("127.0.0.1", 0))
        server.settimeout(0.05)
        renewals = []
        stop = threading.Event()
        header = p._HEADER

        def serve():
            while not stop.is_set():
                try:
                    data, peer = server.recvfrom(2048)
                except socket.timeout:
                    continue
                request = p.decode(data)
                m = request.messages[0]
                lo, hi = request.client_id
                if m.type == p.ACQUIRE:
                    body = (struct.pack("<H", len(m.key)) + m.key +
                            struct.pack("<QI", 1, m.ttl_ms))
                    reply_type = p.GRANTED
                else:
                    renewals.append(time.monotonic())
                    body = struct.pack("<I", 100)
                    reply_type = p.RECOVERING
                server.sendto(header.pack(p.MAGIC, p.VERSION, 0, reply_type, 1, m.request_id,
                                          lo, hi) + body, peer)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with shardlock.Client("127.0.0.1:%d" % server.getsockname()[1]) as client:
                lease = client.acquire("k", ttl=3, renew_fraction=0.05)  # renews from 150 ms
                time.sleep(1.0)
                count = len(renewals)
                del lease
        finally:
            stop.set()
            thread.join()
            server.close()
        # 1000 ms / 100 ms = 10, with slack; without the backoff, thousands.
        self.assertGreaterEqual(count, 1)
        self.assertLessEqual(count, 12)


class Wire(ServerTestCase):
    """Raw datagrams to the server: the package's codec, nothing else."""

    def exchange(self, data):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(5)
            s.sendto(data, ("127.0.0.1", self.daemon.port))
            return p.decode(s.recv(2048)).messages[0]

    def test_a_request_must_be_padded_to_the_size_the_server_requires(self):
        client_id = (int.from_bytes(os.urandom(8), "little"), 1)
        m = p.Message(type=p.ACQUIRE, request_id=1, key=b"py/wire", ttl_ms=5000)
        short = p.encode_request(m, client_id, pad=False)
        padded = p.encode_request(m, client_id)
        self.assertEqual(len(short), p.HEADER_SIZE + 2 + 7 + 8)
        self.assertEqual(len(padded), p.HEADER_SIZE + 14 + 7)  # a GRANTED of this key
        self.assertEqual(len(padded), p.max_reply_size(m))
        reply = self.exchange(short)
        self.assertEqual((reply.type, reply.error), (p.ERROR, p.ERROR_REQUEST_TOO_SMALL))
        one_short = padded[:-1]
        reply = self.exchange(one_short)
        self.assertEqual((reply.type, reply.error), (p.ERROR, p.ERROR_REQUEST_TOO_SMALL))
        m.request_id = 2
        reply = self.exchange(p.encode_request(m, client_id))
        self.assertEqual((reply.type, reply.key, reply.ttl_ms), (p.GRANTED, b"py/wire", 5000))
        self.assertGreater(reply.token, 0)

    def test_a_lost_reply_is_recovered_by_retransmitting_the_same_request_id(self):
        relay = DroppingRelay(("127.0.0.1", self.daemon.port), drop_replies=2)
        try:
            a = shardlock.Client("127.0.0.1:%d" % relay.port)
            self.clients.append(a)
            with a.lock("py/retransmit", ttl=5) as lease:
                self.assertEqual(self.client().query("py/retransmit").token, lease.token)
            acquires = [d for d in relay.requests if d.messages[0].type == p.ACQUIRE]
            self.assertGreaterEqual(len(acquires), 3)
            self.assertEqual(len({d.request_id for d in acquires}), 1)
        finally:
            relay.close()


class Holders(ServerTestCase):
    """Client.holders(): each holder of a key, oldest grant first."""

    def test_each_shared_holder_and_the_waiters(self):
        readers = [self.client() for _ in range(3)]
        leases = [c.lock_shared("py/who", ttl=20) for c in readers]
        writer = self.client()
        thread = threading.Thread(target=lambda: writer.lock("py/who", ttl=5, wait=10).release())
        thread.start()
        self.assertTrue(wait_until(lambda: writer.query("py/who").waiters == 1))
        r = writer.holders("py/who")
        self.assertTrue(r.listed)
        self.assertTrue(r.held)
        self.assertEqual((r.mode, r.holders, r.waiters, r.permits), ("shared", 3, 1, 0))
        self.assertEqual([h.owner for h in r.holder_list], [lease.owner for lease in leases])
        self.assertEqual([h.token for h in r.holder_list], [lease.token for lease in leases])
        for h in r.holder_list:
            self.assertEqual(h.mode, "shared")
            self.assertTrue(0 < h.ttl_left_ms <= 20000)
            self.assertFalse(h.pending)
            self.assertEqual(h.value, b"")
        self.assertEqual(r.token, leases[-1].token)
        for lease in leases:
            lease.release()
        thread.join(10)

    def test_many_holders_come_in_pages(self):
        count = 50  # more than one reply datagram lists
        clients = [self.client() for _ in range(count)]
        leases = [c.lock("py/pool", ttl=20, permits=count) for c in clients]
        r = self.client().holders("py/pool")
        self.assertEqual((r.mode, r.holders, r.permits), ("permit", count, count))
        self.assertEqual([h.token for h in r.holder_list], [lease.token for lease in leases])
        for lease in leases:
            lease.release()

    def test_a_value_stays_with_its_holder(self):
        leader, other = self.client(), self.client()
        with leader.lock("py/leader", ttl=1.2, value="10.0.0.7:5432") as lease:
            waiter = threading.Thread(
                target=lambda: other.lock("py/leader", ttl=5, wait=10, value=b"next").release())
            waiter.start()
            self.assertTrue(wait_until(lambda: other.query("py/leader").waiters == 1))
            time.sleep(0.6)  # the watchdog renews (at ttl/3): the value stays
            r = other.holders("py/leader")
            self.assertEqual([(h.owner, h.token, h.value) for h in r.holder_list],
                             [(lease.owner, lease.token, b"10.0.0.7:5432")])
        waiter.join(10)
        with self.assertRaises(ValueError):
            leader.lock("py/leader", ttl=1, value=b"v" * 257)

    def test_a_free_key_has_no_holders_and_no_mode(self):
        r = self.client().holders("py/nobody")
        self.assertTrue(r.listed)
        self.assertFalse(r.held)
        self.assertIsNone(r.mode)
        self.assertEqual((r.holders, r.holder_list), (0, []))

    def test_an_older_server_gets_the_query_summary(self):
        relay = DroppingRelay(("127.0.0.1", self.daemon.port), drop_replies=0,
                              drop_types=(p.QUERY_HOLDERS,))
        try:
            holder = self.client()
            lease = holder.lock("py/old", ttl=20)
            a = shardlock.Client("127.0.0.1:%d" % relay.port, request_timeout=0.3)
            self.clients.append(a)
            r = a.holders("py/old")
            self.assertFalse(r.listed)
            self.assertTrue(r.held)
            self.assertEqual((r.mode, r.holders, r.token), ("exclusive", 1, lease.token))
            self.assertEqual(r.holder_list, [])
            lease.release()
        finally:
            relay.close()


class DroppingRelay:
    """A UDP relay between one client and the server that loses the first
    `drop_replies` replies, and every request of a type in `drop_types` (as
    a server whose codec predates the type), and records every request."""

    def __init__(self, server, drop_replies, drop_types=()):
        self.server = server
        self.drop_replies = drop_replies
        self.drop_types = drop_types
        self.requests = []
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.1", 0))
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.port = self.front.getsockname()[1]
        self.peer = None
        self.running = True
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while self.running:
            readable, _, _ = select.select([self.front, self.back], [], [], 0.05)
            for s in readable:
                data, source = s.recvfrom(2048)
                if s is self.front:
                    self.peer = source
                    request = p.decode(data)
                    self.requests.append(request)
                    if request.messages[0].type not in self.drop_types:
                        self.back.sendto(data, self.server)
                elif self.drop_replies > 0:
                    self.drop_replies -= 1
                elif self.peer is not None:
                    self.front.sendto(data, self.peer)

    def close(self):
        self.running = False
        self.thread.join()
        self.front.close()
        self.back.close()


if __name__ == "__main__":
    unittest.main()
