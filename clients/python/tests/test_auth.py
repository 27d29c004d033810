"""Datagram authentication: the codec's sealing (no server), and the sync
and asyncio clients against a real `shardlockd --auth-key` (skipped without
$SHARDLOCKD)."""

import asyncio
import os
import sys
import tempfile
import threading
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shardlock  # noqa: E402
from shardlock import auth  # noqa: E402
from shardlock import protocol as p  # noqa: E402
from test_client import DAEMON, Daemon  # noqa: E402

KEY_HEX = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
KEY = bytes.fromhex(KEY_HEX)


class Sealing(unittest.TestCase):
    def test_a_sealed_request_is_the_padded_datagram_flag_set_plus_its_tag(self):
        m = p.Message(type=p.ACQUIRE, request_id=7, key=b"k", ttl_ms=1000)
        plain = p.encode_request(m, (1, 2))
        sealed = p.encode_request(m, (1, 2), auth_key=KEY)
        self.assertEqual(len(sealed), len(plain) + p.AUTH_TAG_SIZE)
        self.assertEqual(sealed[5], plain[5] | p.FLAG_AUTHENTICATED)
        self.assertEqual(sealed, p.seal(plain, KEY))
        self.assertEqual(p.open_sealed(sealed, KEY), sealed[:-p.AUTH_TAG_SIZE])

    def test_every_tampered_byte_and_other_keys_are_refused(self):
        sealed = p.seal(p.encode_request(p.Message(type=p.QUERY, key=b"k"), (1, 2)), KEY)
        for i in range(len(sealed)):
            tampered = bytearray(sealed)
            tampered[i] ^= 0x10
            self.assertIsNone(p.open_sealed(bytes(tampered), KEY), i)
        self.assertIsNone(p.open_sealed(sealed, bytes(32)))
        self.assertIsNone(p.open_sealed(sealed[:p.HEADER_SIZE + 15], KEY))

    def test_decode_wants_sealed_with_a_key_and_unsealed_without(self):
        reply = p.Message(type=p.QUERY, request_id=3, key=b"k")
        plain = p.encode_request(reply, (1, 2), pad=False)
        with self.assertRaises(p.ProtocolError):
            p.decode(plain, KEY)
        with self.assertRaises(p.ProtocolError):
            p.decode(p.seal(plain, KEY))
        self.assertEqual(p.decode(p.seal(plain, KEY), KEY).messages[0].key, b"k")

    def test_a_sealed_paged_request_is_padded_to_what_a_server_with_a_key_answers_into(self):
        # 1400 less the largest seal (44), as the C++ client's
        # payload_limit(), whatever this datagram's own seal.
        for m in (p.Message(type=p.MAP), p.Message(type=p.QUERY_HOLDERS, key=b"k"),
                  p.Message(type=p.WATCH, key=b"k", wait_ms=1000)):
            sealed = p.encode_request(m, (1, 2), auth_key=KEY)
            self.assertEqual(len(sealed), 1356 + p.AUTH_TAG_SIZE, p.type_name(m.type))


class KeyFiles(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(auth.parse_auth_key(" %s\n" % KEY_HEX.upper()), KEY)
        for bad in ("", KEY_HEX[:-1], "g" + KEY_HEX[1:], KEY_HEX + "00"):
            with self.assertRaises(ValueError):
                auth.parse_auth_key(bad)

    def test_resolve(self):
        with tempfile.NamedTemporaryFile("w", suffix=".key") as f:
            f.write(KEY_HEX + "\n")
            f.flush()
            self.assertEqual(auth.resolve_auth_key(None, f.name), KEY)
            with mock.patch.dict(os.environ, {auth.KEY_FILE_ENVIRONMENT: f.name}):
                self.assertEqual(auth.resolve_auth_key(None, None), KEY)
        with mock.patch.dict(os.environ, {}, clear=True):
            self.assertIsNone(auth.resolve_auth_key(None, None))
        self.assertEqual(auth.resolve_auth_key(KEY_HEX, None), KEY)
        self.assertEqual(auth.resolve_auth_key(KEY, None), KEY)
        with self.assertRaises(ValueError):
            auth.resolve_auth_key(b"short", None)
        with self.assertRaises(ValueError):
            auth.resolve_auth_key(KEY, "/x")
        with tempfile.NamedTemporaryFile("w") as f:
            f.write("not a key\n")
            f.flush()
            with self.assertRaises(ValueError) as caught:
                auth.load_auth_key(f.name)
            self.assertIn("keygen", str(caught.exception))


@unittest.skipUnless(DAEMON, "set SHARDLOCKD to the shardlockd binary")
class AgainstAnAuthServer(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.key_file = os.path.join(self.dir.name, "auth.key")
        with open(os.open(self.key_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(KEY_HEX + "\n")
        self.daemon = Daemon(extra=("--auth-key", self.key_file))

    def tearDown(self):
        self.daemon.stop()
        self.dir.cleanup()

    def test_the_sync_client_with_the_key_gets_leases(self):
        with shardlock.Client(self.daemon.address, auth_key_file=self.key_file) as c:
            with c.lock("auth/a", ttl=5) as lease:
                self.assertTrue(lease.valid)
                self.assertTrue(c.query("auth/a").held)
                lease.renew()
            self.assertFalse(c.query("auth/a").held)

    def test_a_sealed_watch_is_parked_and_woken(self):
        # Padded to 1356 bytes (and sealed), its later answer fits.
        with shardlock.Client(self.daemon.address, auth_key_file=self.key_file) as a, \
                shardlock.Client(self.daemon.address, auth_key_file=self.key_file) as b:
            lease = a.acquire("auth/w", 30, value="sealed")
            held = b.watch_once("auth/w")
            self.assertEqual(held.holders[-1].value, b"sealed")
            releaser = threading.Timer(0.3, lease.release)
            releaser.start()
            self.assertEqual(b.watch_once("auth/w", since=held.version, wait=60).version, (0, 0))
            releaser.join()

    def test_a_full_holder_page_comes_back_whole(self):
        # 60 shared holders with 34-byte values: a page of 20 (1357 bytes)
        # would fill a request padded to 1384 bytes, past the 1356 the
        # server encodes sealed replies into. Padded so, the server answered
        # with no holders at all; padded to 1356, it sends a shorter page.
        with shardlock.Client(self.daemon.address, auth_key_file=self.key_file) as c:
            leases = [c.acquire("auth/page", 30, shared=True, value="v" * 34, watchdog=False)
                      for _ in range(60)]
            self.assertEqual(len(c.holders("auth/page").holder_list), 60)
            event = c.watch_once("auth/page")
            self.assertGreater(len(event.holders), 0)
            self.assertEqual(event.holders[-1].token, leases[-1].token)

    def test_no_key_or_another_key_gets_no_answer(self):
        for options in ({}, {"auth_key": bytes(32)}):
            with shardlock.Client(self.daemon.address, request_timeout=0.3, **options) as c:
                with self.assertRaises(shardlock.UnreachableError):
                    c.lock("auth/b", ttl=5, wait=0)

    def test_the_asyncio_client_with_the_key_gets_leases(self):
        async def run():
            async with shardlock.AsyncClient(self.daemon.address, auth_key=KEY_HEX) as c:
                async with c.lock("auth/c", ttl=5) as lease:
                    self.assertTrue(lease.valid)
                    self.assertTrue((await c.query("auth/c")).held)
            async with shardlock.AsyncClient(self.daemon.address, request_timeout=0.3) as c:
                with self.assertRaises(shardlock.UnreachableError):
                    await c.lock("auth/c", ttl=5, wait=0)
        asyncio.run(run())


if __name__ == "__main__":
    unittest.main()
