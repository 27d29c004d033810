"""The envelope's key-id forms (protocol.Envelope) against the C++ one, no
server: the vectors tools/shardlock_wire_vectors.cc prints into the shared
clients/java/src/test/resources/wire_vectors.tsv (ctest
wire_vectors_tool_test keeps it current). Each "keyid", "encrypted",
"keyid-aes" and "encrypted-aes" vector is a datagram the C++ seal_for()
sealed, with the key id it names and the plain datagram open_with() gave
back: here it opens to that plain datagram, seals back to the same bytes
(the nonce forms with the nonce field they carry), and every truncation
and every bit flip of it is refused. The "cipherkey" and "aeskey" lines are
libsodium's crypto_kdf subkeys of the key, which protocol.cipher_key() and
protocol.aes_key() must equal. The legacy "sealed" vectors open and seal
back too. The encrypted ones need PyNaCl (python3-nacl), the AES ones the
cryptography package (python3-cryptography, here an implementation of
AES-GCM and BLAKE2b independent of libsodium's); each is skipped without
its package."""

import importlib.util
import os
import struct
import sys
import threading
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from shardlock import protocol as p  # noqa: E402

VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "java", "src",
                       "test", "resources", "wire_vectors.tsv")
HAVE_NACL = importlib.util.find_spec("nacl") is not None
HAVE_CRYPTOGRAPHY = importlib.util.find_spec("cryptography") is not None
NEEDS_NACL = "encryption needs PyNaCl: apt-get install python3-nacl"
NEEDS_CRYPTOGRAPHY = "the AES-GCM forms need cryptography: apt-get install python3-cryptography"
# Each vector kind: its form, and the cipher an Envelope takes for it.
KINDS = {
    "keyid": (p.AUTHENTICATED, "portable"),
    "encrypted": (p.ENCRYPTED, "portable"),
    "keyid-aes": (p.AUTHENTICATED_AES, "aes"),
    "encrypted-aes": (p.ENCRYPTED_AES, "aes"),
}
NONCE_KINDS = ("encrypted", "keyid-aes", "encrypted-aes")


def load():
    """(auth key, cipher key, aes key, [(kind, name, sealed, key id, plain)],
    [(name, legacy sealed)])."""
    key = cipher = aes = None
    envelopes, legacy = [], []
    with open(VECTORS, encoding="ascii") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "authkey":
                key = bytes.fromhex(fields[1])
            elif fields[0] == "cipherkey":
                cipher = bytes.fromhex(fields[1])
            elif fields[0] == "aeskey":
                aes = bytes.fromhex(fields[1])
            elif fields[0] in KINDS:
                words = dict(word.split("=") for word in fields[3].split())
                envelopes.append((fields[0], fields[1], bytes.fromhex(fields[2]),
                                  int(words["key_id"]), bytes.fromhex(words["plain"])))
            elif fields[0] == "sealed":
                legacy.append((fields[1], bytes.fromhex(fields[2])))
    return key, cipher, aes, envelopes, legacy


KEY, CIPHER_KEY, AES_KEY, ENVELOPES, LEGACY_SEALED = load()


def usable(kind):
    """Whether this interpreter has what `kind` needs."""
    if kind == "encrypted":
        return HAVE_NACL
    if KINDS[kind][1] == "aes":
        return HAVE_CRYPTOGRAPHY
    return True


def envelope_of(kind, key_id, key=KEY):
    form, cipher = KINDS[kind]
    return p.Envelope(key, key_id, encrypt=form in (p.ENCRYPTED, p.ENCRYPTED_AES), cipher=cipher)


def unsealed(plain):
    """A plain datagram as an encoder writes it: FLAG_AUTHENTICATED clear."""
    return plain[:5] + bytes((plain[5] & ~p.FLAG_AUTHENTICATED,)) + plain[6:]


def nonce_field(sealed):
    return sealed[-p.AUTH_TAG_SIZE - p.NONCE_SIZE:-p.AUTH_TAG_SIZE]


class CppVectors(unittest.TestCase):
    def vectors(self, kinds=tuple(KINDS)):
        """The vectors of `kinds` this interpreter can check; the test is
        skipped if that leaves none."""
        found = [v for v in ENVELOPES if v[0] in kinds and usable(v[0])]
        if not found:
            self.skipTest(NEEDS_NACL if "encrypted" in kinds else NEEDS_CRYPTOGRAPHY)
        return found

    def test_the_file_has_every_form(self):
        self.assertIsNotNone(KEY)
        kinds = {(kind, key_id) for kind, _, _, key_id, _ in ENVELOPES}
        for kind in KINDS:
            for key_id in (0, 7, 0xFEDCBA98):
                self.assertIn((kind, key_id), kinds)
        self.assertGreater(len(LEGACY_SEALED), 5)

    def test_the_cipher_subkeys_are_libsodiums_crypto_kdf(self):
        self.assertEqual(p.cipher_key(KEY).hex(), CIPHER_KEY.hex())
        self.assertEqual(p.aes_key(KEY).hex(), AES_KEY.hex())
        self.assertNotEqual(CIPHER_KEY, AES_KEY)

    def test_each_opens_to_the_cpp_plain_datagram_and_decodes(self):
        for kind, name, sealed, key_id, plain in self.vectors():
            form = KINDS[kind][0]
            self.assertEqual(p.peek_key_id(sealed), (key_id, form), name)
            self.assertEqual(sealed[5] & ~p.FLAG_EPOCH, p._FORM_FLAGS[form], name)
            self.assertEqual(sealed[5] & p.FLAG_EPOCH, plain[5] & p.FLAG_EPOCH, name)
            self.assertEqual(len(sealed), len(plain) + p.envelope_overhead(form), name)
            envelope = envelope_of(kind, key_id)
            self.assertEqual(envelope.open(sealed), plain, "%s %s" % (kind, name))
            datagram = p.decode(sealed, envelope)
            if "permission_denied" in name:
                self.assertEqual(datagram.messages[0].error, p.ERROR_PERMISSION_DENIED)
            if "epoch" in name:
                self.assertEqual(datagram.epoch, 42)

    def test_an_authenticated_one_seals_back_to_the_same_bytes(self):
        for _, name, sealed, key_id, plain in self.vectors(("keyid",)):
            envelope = p.Envelope(KEY, key_id, cipher="portable")
            self.assertEqual(envelope.seal(unsealed(plain)).hex(), sealed.hex(), name)

    def test_an_encrypted_one_seals_back_to_the_same_bytes_with_its_nonce(self):
        for _, name, sealed, key_id, plain in self.vectors(("encrypted",)):
            envelope = p.Envelope(KEY, key_id, encrypt=True, cipher="portable")
            with mock.patch.object(p.os, "urandom", return_value=nonce_field(sealed)):
                self.assertEqual(envelope.seal(unsealed(plain)).hex(), sealed.hex(), name)

    def test_an_aes_one_seals_back_to_the_same_bytes_with_its_stream(self):
        for kind, name, sealed, key_id, plain in self.vectors(("keyid-aes", "encrypted-aes")):
            envelope = envelope_of(kind, key_id)
            nonce = nonce_field(sealed)
            aead = envelope._opening_aead(nonce[:16])[0]
            flagged = bytearray(unsealed(plain))
            flagged[5] |= envelope.flags
            self.assertEqual(envelope._seal_aes(bytes(flagged), nonce, aead).hex(), sealed.hex(),
                             "%s %s" % (kind, name))

    def test_the_cpp_aes_streams_count_from_zero_per_key_id(self):
        counters = {}
        for kind, name, sealed, key_id, _ in self.vectors(("keyid-aes", "encrypted-aes")):
            nonce = nonce_field(sealed)
            prefix, (counter,) = nonce[:16], struct.unpack("<Q", nonce[16:])
            seen = counters.setdefault(key_id, [prefix, -1])
            self.assertEqual(prefix, seen[0], name)  # one thread, one stream per key id
            self.assertEqual(counter, seen[1] + 1, name)
            seen[1] = counter

    def test_every_truncation_is_refused(self):
        for kind, name, sealed, key_id, _ in self.vectors():
            envelope = envelope_of(kind, key_id)
            for n in range(len(sealed)):
                self.assertIsNone(envelope.open(sealed[:n]), "%s %s cut to %d" % (kind, name, n))

    def test_every_bit_flip_is_refused(self):
        for kind, name, sealed, key_id, _ in self.vectors():
            envelope = envelope_of(kind, key_id)
            flipped = bytearray(sealed)
            for i in range(len(sealed)):
                for bit in range(8):
                    flipped[i] ^= 1 << bit
                    self.assertIsNone(envelope.open(bytes(flipped)),
                                      "%s %s byte %d bit %d" % (kind, name, i, bit))
                    flipped[i] ^= 1 << bit
            self.assertIsNotNone(envelope.open(sealed), name)  # no forgery evicted its stream

    def test_another_key_another_key_id_or_another_form_is_refused(self):
        other_key = bytes([KEY[0] ^ 1]) + KEY[1:]
        for kind, name, sealed, key_id, _ in self.vectors():
            others = [envelope_of(kind, key_id, other_key),
                      envelope_of(kind, (key_id + 1) & p.MAX_KEY_ID),
                      p.Envelope(KEY)]  # the legacy form, which names no key id
            others += [envelope_of(k, key_id) for k in KINDS if k != kind and usable(k)]
            for envelope in others:
                self.assertIsNone(envelope.open(sealed), "%s %s" % (kind, name))
            with self.assertRaises(p.ProtocolError):
                p.decode(sealed, KEY)

    def test_the_legacy_vectors_open_and_seal_back(self):
        envelope = p.Envelope(KEY)
        for name, sealed in LEGACY_SEALED:
            self.assertEqual(p.peek_key_id(sealed), (0, p.LEGACY), name)
            plain = envelope.open(sealed)
            self.assertEqual(plain, p.open_sealed(sealed, KEY), name)
            self.assertEqual(envelope.seal(unsealed(plain)), sealed, name)
            self.assertIsNone(p.Envelope(KEY, 0).open(sealed), name)  # key id 0, but legacy


class Sealing(unittest.TestCase):
    M = p.Message(type=p.ACQUIRE, request_id=9, key=b"tenant-a/x", ttl_ms=1000, wait_ms=5)

    def forms(self):
        yield p.Envelope(KEY, 3, cipher="portable")
        if HAVE_NACL:
            yield p.Envelope(KEY, 3, encrypt=True, cipher="portable")
        if HAVE_CRYPTOGRAPHY:
            yield p.Envelope(KEY, 3, cipher="aes")
            yield p.Envelope(KEY, 3, encrypt=True, cipher="aes")

    def encrypting(self):
        if HAVE_NACL:
            yield p.Envelope(KEY, 3, encrypt=True, cipher="portable")
        if HAVE_CRYPTOGRAPHY:
            yield p.Envelope(KEY, 3, encrypt=True, cipher="aes")

    def test_a_sealed_request_is_the_padded_datagram_and_the_forms_trailer(self):
        plain = p.encode_request(self.M, (1, 2))
        for envelope in self.forms():
            sealed = p.encode_request(self.M, (1, 2), auth_key=envelope)
            self.assertEqual(len(sealed), len(plain) + envelope.overhead)
            self.assertEqual(sealed[5], envelope.flags)
            self.assertEqual(sealed[-envelope.overhead:][:4], (3).to_bytes(4, "little"))
            self.assertEqual(envelope.open(sealed), plain[:5] + b"\x01" + plain[6:])
            back = p.decode(sealed, envelope).messages[0]
            self.assertEqual((back.key, back.ttl_ms, back.wait_ms), (b"tenant-a/x", 1000, 5))

    def test_encryption_hides_everything_after_the_flags(self):
        envelopes = list(self.encrypting())
        if not envelopes:
            self.skipTest(NEEDS_NACL)
        for envelope in envelopes:
            plain = p.encode_request(self.M, (0xAAAA, 0xBBBB))
            first = p.encode_request(self.M, (0xAAAA, 0xBBBB), auth_key=envelope)
            second = p.encode_request(self.M, (0xAAAA, 0xBBBB), auth_key=envelope)
            self.assertNotEqual(first, second)  # a fresh nonce each time
            self.assertEqual(first[:5], plain[:5])
            self.assertNotIn(b"tenant-a", first)
            self.assertEqual(envelope.open(first), envelope.open(second))

    def test_paged_and_valued_requests_fit_in_every_form(self):
        for envelope in self.forms():
            for m in (p.Message(type=p.MAP), p.Message(type=p.WATCH, key=b"k", wait_ms=1)):
                sealed = p.encode_request(m, (1, 2), auth_key=envelope)
                self.assertEqual(len(sealed), p.SEALED_PAYLOAD_LIMIT + envelope.overhead)
                self.assertLessEqual(len(sealed), p.MAX_DATAGRAM_SIZE)
            valued = p.pack_request(p.ACQUIRE, 5, (1, 2), b"k", (1000, 0), auth_key=envelope,
                                    value=b"v" * 256)
            self.assertEqual(p.decode(valued, envelope).messages[0].value, b"v" * 256)

    def test_seal_wants_a_plain_client_datagram(self):
        envelope = p.Envelope(KEY, 3)
        plain = p.encode_request(self.M, (1, 2))
        aes_flagged = plain[:5] + bytes((plain[5] | p.FLAG_AES,)) + plain[6:]
        for bad in (plain[:p.HEADER_SIZE - 1], b"XXXX" + plain[4:], envelope.seal(plain),
                    aes_flagged):
            with self.assertRaises(p.ProtocolError):
                envelope.seal(bad)

    def test_bad_arguments(self):
        for bad in (dict(key=b"short"), dict(key_id=-1), dict(key_id=1 << 32),
                    dict(key_id=True), dict(key_id="1"), dict(encrypt=True),
                    dict(cipher="aes"), dict(key_id=1, cipher="gcm")):
            with self.assertRaises(ValueError, msg=bad):
                p.Envelope(bad.pop("key", KEY), **bad)

    def test_without_pynacl_only_portable_encryption_fails_and_says_how_to_install_it(self):
        with mock.patch.object(p.importlib, "import_module", side_effect=ImportError("no nacl")):
            p.Envelope(KEY, 3, cipher="portable").seal(p.encode_request(self.M, (1, 2)))
            with self.assertRaises(ImportError) as caught:
                p.Envelope(KEY, 3, encrypt=True, cipher="portable")
            with self.assertRaises(ImportError) as aes:
                p.Envelope(KEY, 3, cipher="aes")
        self.assertIn("python3-nacl", str(caught.exception))
        self.assertIn("python3-cryptography", str(aes.exception))

    def test_auto_picks_aes_exactly_where_this_host_has_it(self):
        envelope = p.Envelope(KEY, 3)
        self.assertEqual(envelope.cipher, "aes" if p.aes_gcm_available() else "portable")
        self.assertEqual(p.Envelope(KEY).cipher, "portable")  # the legacy form has one suite
        with mock.patch.object(p, "_aes_available", False):
            self.assertEqual(p.Envelope(KEY, 3).form, p.AUTHENTICATED)
        if HAVE_CRYPTOGRAPHY:
            with mock.patch.object(p, "_aes_available", True):
                self.assertEqual(p.Envelope(KEY, 3).form, p.AUTHENTICATED_AES)


@unittest.skipUnless(HAVE_CRYPTOGRAPHY, NEEDS_CRYPTOGRAPHY)
class AesStreams(unittest.TestCase):
    """The AES forms' nonce field: a stream's prefix and counter. One
    Envelope counts under one prefix from every thread, never twice; a
    forked child starts a stream of its own; a stream ends after
    AES_STREAM_SEALS seals; and the opening cache holds only streams that
    verified, so more streams than it keeps still open."""

    M = Sealing.M

    def nonces(self, envelope, n):
        out = []
        for _ in range(n):
            sealed = p.encode_request(self.M, (1, 2), auth_key=envelope)
            self.assertIsNotNone(envelope.open(sealed))
            out.append(nonce_field(sealed))
        return out

    def test_one_envelope_counts_under_one_prefix_across_threads(self):
        for encrypt in (False, True):
            envelope = p.Envelope(KEY, 3, encrypt=encrypt, cipher="aes")
            per_thread = [[] for _ in range(4)]
            threads = [threading.Thread(target=lambda out=out: out.extend(
                self.nonces(envelope, 50))) for out in per_thread]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            every = [n for out in per_thread for n in out]
            self.assertEqual(len(set(every)), 200)
            self.assertEqual({n[:16] for n in every}, {every[0][:16]})
            self.assertEqual(sorted(struct.unpack("<Q", n[16:])[0] for n in every),
                             list(range(200)))

    def test_a_forked_child_starts_a_stream_of_its_own(self):
        envelope = p.Envelope(KEY, 3, encrypt=True, cipher="aes")
        parent_prefix = self.nonces(envelope, 2)[0][:16]
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.write(write_end, self.nonces(envelope, 1)[0])
            finally:
                os._exit(0)
        os.close(write_end)
        childs = os.read(read_end, p.NONCE_SIZE)
        os.close(read_end)
        os.waitpid(pid, 0)
        self.assertEqual(len(childs), p.NONCE_SIZE)
        self.assertNotEqual(childs[:16], parent_prefix)
        self.assertEqual(struct.unpack("<Q", childs[16:])[0], 0)
        self.assertEqual(self.nonces(envelope, 1)[0][:16], parent_prefix)

    def test_a_stream_ends_after_its_last_seal(self):
        envelope = p.Envelope(KEY, 3, cipher="aes")
        first = self.nonces(envelope, 1)[0]
        with mock.patch.object(p, "AES_STREAM_SEALS", 3):
            later = self.nonces(envelope, 4)
        self.assertEqual([n[:16] == first[:16] for n in later], [True, True, False, False])
        self.assertEqual(struct.unpack("<Q", later[2][16:])[0], 0)

    def test_more_streams_than_the_cache_keeps_all_open(self):
        sealers = [p.Envelope(KEY, 3, encrypt=True, cipher="aes") for _ in range(150)]
        sealed = [p.encode_request(self.M, (1, 2), auth_key=s) for s in sealers]
        opener = p.Envelope(KEY, 3, encrypt=True, cipher="aes")
        for _ in range(2):
            for datagram in sealed + sealed[::-1]:
                self.assertIsNotNone(opener.open(datagram))
        self.assertLessEqual(len(opener._opened), p._AES_OPEN_CACHE)
        forged = bytearray(sealed[0])
        forged[-1] ^= 1
        stranger = bytearray(sealed[1])
        stranger[-p.AUTH_TAG_SIZE - p.NONCE_SIZE] ^= 1  # another prefix
        for bad in (forged, stranger):
            self.assertIsNone(opener.open(bytes(bad)))
        self.assertNotIn(bytes(stranger[-p.AUTH_TAG_SIZE - p.NONCE_SIZE:][:16]), opener._opened)


if __name__ == "__main__":
    unittest.main()
