"""Tenants (docs/security.md): the sync and asyncio clients as tenants of a
real `shardlockd --tenants FILE` (skipped without $SHARDLOCKD; the
encrypted tenant's tests in each suite this host has: AES-GCM with AES-NI
and python3-cryptography, the portable suite with PyNaCl), and the
options' checks.

The file: alpha (key id 1) may use "alpha/" and "shared/", beta (2)
"beta/" and "shared/", gamma (3) "gamma/" and must encrypt. A tenant is
served inside its prefixes and refused outside them with permission denied;
gamma is served encrypted and gets no answer otherwise; and beta, naming
alpha's lease's owner, can neither release nor renew nor take it, since the
server forces every owner beta names into beta's own."""

import asyncio
import importlib.util
import os
import sys
import tempfile
import time
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shardlock  # noqa: E402
from shardlock import auth  # noqa: E402
from shardlock import protocol as p  # noqa: E402
from test_client import DAEMON, Daemon  # noqa: E402

HAVE_NACL = importlib.util.find_spec("nacl") is not None
HAVE_AES = p.aes_gcm_available()
# The suites an encrypting client can use here.
ENCRYPTING_CIPHERS = (["aes"] if HAVE_AES else []) + (["portable"] if HAVE_NACL else [])
NEEDS_A_CIPHER = ("encryption needs AES-NI and python3-cryptography, or PyNaCl: "
                  "apt-get install python3-cryptography python3-nacl")
KEYS = {"alpha": "a1" * 32, "beta": "b2" * 32, "gamma": "c3" * 32}
IDS = {"alpha": 1, "beta": 2, "gamma": 3}
TENANT_FILE = """\
tenant alpha id=1 key-file=alpha.key
tenant beta  id=2 key-file=beta.key
tenant gamma id=3 key-file=gamma.key encrypt=yes
allow alpha "alpha/"  acquire,query
allow alpha "shared/" acquire,query
allow beta  "beta/"   acquire,query
allow beta  "shared/" acquire,query
allow gamma "gamma/"  acquire,query
"""


def tenant_of(owner_hex):
    """The key id in an owner's top 32 bits (32 hex digits, hi first)."""
    return int(owner_hex[:8], 16)


class Options(unittest.TestCase):
    def test_a_tenant_seals_in_the_key_id_form_and_scopes_its_ids(self):
        c = shardlock.Client("127.0.0.1:1", auth_key=KEYS["beta"], tenant=2,
                             client_id=bytes(range(16)))
        try:
            self.assertEqual(c._auth_key.form,
                             p.AUTHENTICATED_AES if HAVE_AES else p.AUTHENTICATED)
            self.assertEqual(c._auth_key.key_id, 2)
            # The top 32 bits of hi are the key id; the rest are client_id's.
            self.assertEqual(c.client_id, "00000002" + bytes(range(8, 12))[::-1].hex() +
                             bytes(range(8))[::-1].hex())
        finally:
            c.close()
        c = shardlock.Client("127.0.0.1:1", auth_key=KEYS["beta"], tenant=2, cipher="portable")
        try:
            self.assertEqual((c._auth_key.form, c._auth_key.cipher), (p.AUTHENTICATED, "portable"))
        finally:
            c.close()

    def test_bad_combinations_are_refused(self):
        with mock.patch.dict(os.environ, {}, clear=True):
            for options in (dict(tenant=1), dict(encrypt=True),
                            dict(auth_key=KEYS["alpha"], encrypt=True),
                            dict(auth_key=KEYS["alpha"], tenant=-1),
                            dict(auth_key=KEYS["alpha"], tenant=1 << 32),
                            dict(auth_key=KEYS["alpha"], cipher="aes"),
                            dict(auth_key=KEYS["alpha"], tenant=1, cipher="AES")):
                with self.assertRaises(ValueError, msg=options):
                    shardlock.Client("127.0.0.1:1", **options)

    def test_the_environment_names_the_tenant_with_the_key_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "k.key")
            with open(path, "w") as f:
                f.write(KEYS["gamma"] + "\n")
            env = {auth.KEY_FILE_ENVIRONMENT: path, auth.TENANT_ENVIRONMENT: "3"}
            with mock.patch.dict(os.environ, env, clear=True):
                envelope = auth.resolve_envelope(None, None, None, False)
                self.assertEqual((envelope.key_id, envelope.form),
                                 (3, p.AUTHENTICATED_AES if HAVE_AES else p.AUTHENTICATED))
                os.environ[auth.CIPHER_ENVIRONMENT] = "portable"
                self.assertEqual(auth.resolve_envelope(None, None, None, False).form,
                                 p.AUTHENTICATED)
                # An argument wins over the environment.
                if HAVE_AES:
                    self.assertEqual(auth.resolve_envelope(None, None, None, False, "aes").form,
                                     p.AUTHENTICATED_AES)
                del os.environ[auth.CIPHER_ENVIRONMENT]
                # A key given outright brings no tenant from the environment.
                self.assertEqual(auth.resolve_envelope(None, path, None, False).form, p.LEGACY)
                os.environ[auth.TENANT_ENVIRONMENT] = "x"
                with self.assertRaises(ValueError):
                    auth.resolve_envelope(None, None, None, False)
            if HAVE_AES or HAVE_NACL:
                env[auth.ENCRYPT_ENVIRONMENT] = "1"
                with mock.patch.dict(os.environ, env, clear=True):
                    self.assertEqual(auth.resolve_envelope(None, None, None, False).form,
                                     p.ENCRYPTED_AES if HAVE_AES else p.ENCRYPTED)

    def test_permission_denied_is_its_own_server_error(self):
        error = shardlock.PermissionDeniedError("beta/x")
        self.assertIsInstance(error, shardlock.ServerError)
        self.assertEqual(error.code, p.ERROR_PERMISSION_DENIED)
        self.assertIn("permission denied", str(error))
        self.assertIn("permission denied", p.WIRE_ERRORS[16])


@unittest.skipUnless(DAEMON, "set SHARDLOCKD to the shardlockd binary")
class AgainstATenantServer(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.key_files = {}
        for name, key in KEYS.items():
            path = os.path.join(self.dir.name, name + ".key")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(key + "\n")
            self.key_files[name] = path
        tenants = os.path.join(self.dir.name, "tenants")
        with open(tenants, "w") as f:
            f.write(TENANT_FILE)
        self.daemon = Daemon(extra=("--tenants", tenants))

    def tearDown(self):
        self.daemon.stop()
        self.dir.cleanup()

    def options(self, name, **more):
        """A client's arguments as tenant `name`, its key by file."""
        options = dict(auth_key_file=self.key_files[name], tenant=IDS[name])
        options.update(more)
        return options

    def client(self, name, **more):
        return shardlock.Client(self.daemon.address, **self.options(name, **more))

    def test_a_tenant_is_served_inside_its_prefixes(self):
        with self.client("alpha") as alpha:
            self.assertEqual(tenant_of(alpha.client_id), 1)
            with alpha.lock("alpha/x", ttl=5, value="a") as lease:
                self.assertEqual(tenant_of(lease.owner), 1)
                lease.renew()
                # The server kept the owner the client chose.
                self.assertEqual([h.owner for h in alpha.holders("alpha/x").holder_list],
                                 [lease.owner])
                self.assertEqual(alpha.watch_once("alpha/x").holders[-1].value, b"a")
            self.assertFalse(alpha.query("alpha/x").held)

    def test_outside_its_prefixes_it_is_refused_with_permission_denied(self):
        with self.client("alpha") as alpha:
            for call in (lambda: alpha.acquire("beta/x", 5),
                         lambda: alpha.acquire("gamma/x", 5, shared=True),
                         lambda: alpha.query("beta/x"),
                         lambda: alpha.holders("beta/x"),
                         lambda: alpha.watch_once("beta/x"),
                         lambda: alpha.release("beta/x", 1)):
                with self.assertRaises(shardlock.PermissionDeniedError) as caught:
                    call()
                self.assertEqual(caught.exception.code, 16)
                self.assertIn("permission denied", str(caught.exception))

    @unittest.skipUnless(ENCRYPTING_CIPHERS, NEEDS_A_CIPHER)
    def test_an_encrypting_tenant_is_served_encrypted_and_only_so(self):
        for cipher in ENCRYPTING_CIPHERS:
            with self.subTest(cipher=cipher), self.client("gamma", encrypt=True,
                                                          cipher=cipher) as gamma:
                self.assertEqual(gamma._auth_key.cipher, cipher)
                with gamma.lock("gamma/x", ttl=5) as lease:
                    self.assertTrue(gamma.query("gamma/x").held)
                    self.assertEqual(gamma.watch_once("gamma/x").version, (lease.token, 1))
                with self.assertRaises(shardlock.PermissionDeniedError):
                    gamma.acquire("alpha/x", 5)
        # Only authenticated, in either suite: dropped, as a datagram of no
        # tenant would be.
        for cipher in (["aes"] if HAVE_AES else []) + ["portable"]:
            with self.subTest(cipher=cipher), self.client("gamma", request_timeout=0.3,
                                                          cipher=cipher) as plain:
                with self.assertRaises(shardlock.UnreachableError):
                    plain.acquire("gamma/y", 5)

    @unittest.skipUnless(HAVE_AES, "the AES-GCM suite needs AES-NI and python3-cryptography")
    def test_a_tenant_is_served_in_both_suites_at_once(self):
        with self.client("alpha", cipher="aes") as fast, \
                self.client("alpha", cipher="portable") as portable:
            self.assertEqual((fast._auth_key.form, portable._auth_key.form),
                             (p.AUTHENTICATED_AES, p.AUTHENTICATED))
            lease = fast.acquire("alpha/both", 30, watchdog=False)
            held = portable.query("alpha/both")
            self.assertEqual((held.held, held.token), (True, lease.token))
            with self.assertRaises(shardlock.BusyError):
                portable.acquire("alpha/both", 5)
            fast.release("alpha/both", lease.token, owner=lease.owner)
            with portable.lock("alpha/both", ttl=5):
                self.assertTrue(fast.query("alpha/both").held)

    def test_another_tenant_cannot_release_renew_or_take_a_lease_by_its_owner(self):
        with self.client("alpha") as alpha, self.client("beta") as beta:
            lease = alpha.acquire("shared/k", 30, watchdog=False)
            with self.assertRaises(shardlock.NotOwnerError):
                beta.release("shared/k", lease.token, owner=lease.owner)
            with self.assertRaises(shardlock.NotOwnerError):
                beta.renew("shared/k", lease.token, 60, owner=lease.owner)
            # Acquired as alpha's owner, it is beta's own contender.
            with self.assertRaises(shardlock.BusyError):
                beta.acquire("shared/k", 5, owner=lease.owner)
            held = alpha.query("shared/k")
            self.assertTrue(held.held)
            self.assertEqual(held.token, lease.token)
            # The same calls from another client of alpha's: the refusals
            # above were the tenant's, not the owner's. Started a
            # millisecond after the acquire, its request ids are above it,
            # so the server does not take its renewal as stale.
            time.sleep(0.002)
            with self.client("alpha") as tool:
                self.assertEqual(tool.renew("shared/k", lease.token, 60, owner=lease.owner), 60)
                tool.release("shared/k", lease.token, owner=lease.owner)
            self.assertFalse(alpha.query("shared/k").held)

    def test_a_key_without_its_tenant_or_under_another_tenants_id_gets_no_answer(self):
        for options in (dict(tenant=None), dict(tenant=IDS["beta"])):
            with self.client("alpha", request_timeout=0.3, **options) as c:
                with self.assertRaises(shardlock.UnreachableError):
                    c.acquire("alpha/x", 5)

    def test_the_asyncio_client_as_tenants(self):
        async def run():
            async with shardlock.AsyncClient(self.daemon.address,
                                             **self.options("alpha")) as alpha, \
                    shardlock.AsyncClient(self.daemon.address, **self.options("beta")) as beta:
                async with alpha.lock("shared/a", ttl=5) as lease:
                    self.assertEqual(tenant_of(lease.owner), 1)
                    with self.assertRaises(shardlock.PermissionDeniedError):
                        await beta.acquire("alpha/a", 5)
                    with self.assertRaises(shardlock.NotOwnerError):
                        await beta.release("shared/a", lease.token, owner=lease.owner)
                    self.assertTrue((await alpha.query("shared/a")).held)
            for cipher in ENCRYPTING_CIPHERS:
                async with shardlock.AsyncClient(
                        self.daemon.address,
                        **self.options("gamma", encrypt=True, cipher=cipher)) as gamma:
                    async with gamma.lock("gamma/a", ttl=5):
                        self.assertTrue((await gamma.query("gamma/a")).held)
            async with shardlock.AsyncClient(self.daemon.address, request_timeout=0.3,
                                             **self.options("gamma")) as plain:
                with self.assertRaises(shardlock.UnreachableError):
                    await plain.acquire("gamma/b", 5)
        asyncio.run(run())


if __name__ == "__main__":
    unittest.main()
