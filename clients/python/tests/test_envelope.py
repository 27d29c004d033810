"""The envelope's key-id forms (protocol.Envelope) against the C++ one, no
server: the vectors tools/shardlock_wire_vectors.cc prints into the shared
clients/java/src/test/resources/wire_vectors.tsv (ctest
wire_vectors_tool_test keeps it current). Each "keyid" and "encrypted"
vector is a datagram the C++ seal_for() sealed, with the key id it names and
the plain datagram open_with() gave back: here it opens to that plain
datagram, seals back to the same bytes (the encrypted ones with the nonce
they carry), and every truncation and every bit flip of it is refused. The
"cipherkey" line is libsodium's crypto_kdf subkey of the key, which
protocol.cipher_key() must equal. The legacy "sealed" vectors open and
seal back too. The encrypted ones need PyNaCl (python3-nacl) and are
skipped without it."""

import importlib.util
import os
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from shardlock import protocol as p  # noqa: E402

VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "java", "src",
                       "test", "resources", "wire_vectors.tsv")
HAVE_NACL = importlib.util.find_spec("nacl") is not None
NEEDS_NACL = "encryption needs PyNaCl: apt-get install python3-nacl"


def load():
    """(auth key, cipher key, [(kind, name, sealed, key id, plain)],
    [(name, legacy sealed)])."""
    key = cipher = None
    envelopes, legacy = [], []
    with open(VECTORS, encoding="ascii") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "authkey":
                key = bytes.fromhex(fields[1])
            elif fields[0] == "cipherkey":
                cipher = bytes.fromhex(fields[1])
            elif fields[0] in ("keyid", "encrypted"):
                words = dict(word.split("=") for word in fields[3].split())
                envelopes.append((fields[0], fields[1], bytes.fromhex(fields[2]),
                                  int(words["key_id"]), bytes.fromhex(words["plain"])))
            elif fields[0] == "sealed":
                legacy.append((fields[1], bytes.fromhex(fields[2])))
    return key, cipher, envelopes, legacy


KEY, CIPHER_KEY, ENVELOPES, LEGACY_SEALED = load()


def envelope_of(kind, key_id, key=KEY):
    return p.Envelope(key, key_id, encrypt=kind == "encrypted")


def unsealed(plain):
    """A plain datagram as an encoder writes it: FLAG_AUTHENTICATED clear."""
    return plain[:5] + bytes((plain[5] & ~p.FLAG_AUTHENTICATED,)) + plain[6:]


class CppVectors(unittest.TestCase):
    def vectors(self, kinds=("keyid", "encrypted")):
        for vector in ENVELOPES:
            if vector[0] not in kinds:
                continue
            if vector[0] == "encrypted" and not HAVE_NACL:
                self.skipTest(NEEDS_NACL)
            yield vector

    def test_the_file_has_every_form(self):
        self.assertIsNotNone(KEY)
        kinds = {(kind, key_id) for kind, _, _, key_id, _ in ENVELOPES}
        for kind in ("keyid", "encrypted"):
            for key_id in (0, 7, 0xFEDCBA98):
                self.assertIn((kind, key_id), kinds)
        self.assertGreater(len(LEGACY_SEALED), 5)

    def test_the_cipher_subkey_is_libsodiums_crypto_kdf(self):
        self.assertEqual(p.cipher_key(KEY).hex(), CIPHER_KEY.hex())

    def test_each_opens_to_the_cpp_plain_datagram_and_decodes(self):
        for kind, name, sealed, key_id, plain in self.vectors():
            form = p.ENCRYPTED if kind == "encrypted" else p.AUTHENTICATED
            self.assertEqual(p.peek_key_id(sealed), (key_id, form), name)
            self.assertEqual(sealed[5] & 0x0F, p.FLAG_AUTHENTICATED | p.FLAG_KEY_ID |
                             (p.FLAG_ENCRYPTED if kind == "encrypted" else 0) |
                             (plain[5] & p.FLAG_EPOCH), name)
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
            self.assertEqual(p.Envelope(KEY, key_id).seal(unsealed(plain)).hex(), sealed.hex(),
                             name)

    def test_an_encrypted_one_seals_back_to_the_same_bytes_with_its_nonce(self):
        for _, name, sealed, key_id, plain in self.vectors(("encrypted",)):
            nonce = sealed[-p.AUTH_TAG_SIZE - p.NONCE_SIZE:-p.AUTH_TAG_SIZE]
            envelope = p.Envelope(KEY, key_id, encrypt=True)
            with mock.patch.object(p.os, "urandom", return_value=nonce):
                self.assertEqual(envelope.seal(unsealed(plain)).hex(), sealed.hex(), name)

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

    def test_another_key_another_key_id_or_another_form_is_refused(self):
        other_key = bytes([KEY[0] ^ 1]) + KEY[1:]
        for kind, name, sealed, key_id, _ in self.vectors():
            others = [envelope_of(kind, key_id, other_key),
                      envelope_of(kind, (key_id + 1) & p.MAX_KEY_ID),
                      p.Envelope(KEY)]  # the legacy form, which names no key id
            if HAVE_NACL:
                others.append(envelope_of("keyid" if kind == "encrypted" else "encrypted", key_id))
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
        yield p.Envelope(KEY, 3)
        if HAVE_NACL:
            yield p.Envelope(KEY, 3, encrypt=True)

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
        if not HAVE_NACL:
            self.skipTest(NEEDS_NACL)
        envelope = p.Envelope(KEY, 3, encrypt=True)
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
        for bad in (plain[:p.HEADER_SIZE - 1], b"XXXX" + plain[4:], envelope.seal(plain)):
            with self.assertRaises(p.ProtocolError):
                envelope.seal(bad)

    def test_bad_arguments(self):
        for bad in (dict(key=b"short"), dict(key_id=-1), dict(key_id=1 << 32),
                    dict(key_id=True), dict(key_id="1"), dict(encrypt=True)):
            with self.assertRaises(ValueError, msg=bad):
                p.Envelope(bad.pop("key", KEY), **bad)

    def test_without_pynacl_only_encryption_fails_and_says_how_to_install_it(self):
        with mock.patch.object(p.importlib, "import_module", side_effect=ImportError("no nacl")):
            p.Envelope(KEY, 3).seal(p.encode_request(self.M, (1, 2)))  # needs none
            with self.assertRaises(ImportError) as caught:
                p.Envelope(KEY, 3, encrypt=True)
        self.assertIn("python3-nacl", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
