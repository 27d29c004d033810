"""The pure codec: bytes pinned against the C++ codec's own test, padding
sizes, and every truncation of every reply."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from shardlock import protocol as p  # noqa: E402

KEY = b"orders/42"
CLIENT = (0xAAAA, 0xBBBB)
REQUEST_ID = 0x1122334455667700


class PinnedBytes(unittest.TestCase):
    """The same messages as tests/lease/protocol_test.cc WireBytesArePinned,
    which pins the C++ encoder's bytes."""

    def test_acquire_matches_the_cpp_codec(self):
        m = p.Message(type=p.ACQUIRE, request_id=REQUEST_ID, key=KEY, ttl_ms=30000, wait_ms=500)
        data = p.encode_request(m, CLIENT, pad=False)
        self.assertEqual(data[:p.HEADER_SIZE].hex(),
                         "53484c4b010001010077665544332211aaaa000000000000bbbb000000000000")
        self.assertEqual(data[p.HEADER_SIZE:].hex(), "09006f72646572732f343230750000f4010000")

    def test_other_request_bodies_match(self):
        cases = [
            (p.Message(type=p.RENEW, key=KEY, token=77, ttl_ms=1000),
             "09006f72646572732f34324d00000000000000e8030000"),
            (p.Message(type=p.RELEASE, key=KEY, token=78),
             "09006f72646572732f34324e00000000000000"),
            (p.Message(type=p.QUERY, key=KEY), "09006f72646572732f3432"),
            (p.Message(type=p.ACQUIRE_SHARED, key=KEY, ttl_ms=30000, wait_ms=500),
             "09006f72646572732f343230750000f4010000"),
            (p.Message(type=p.ACQUIRE_PERMIT, key=KEY, ttl_ms=30000, wait_ms=500, permits=3),
             "09006f72646572732f343230750000f401000003000000"),
        ]
        for message, body in cases:
            with self.subTest(p.type_name(message.type)):
                data = p.encode_request(message, CLIENT, pad=False)
                self.assertEqual(data[p.HEADER_SIZE:].hex(), body)

    def test_requests_are_padded_to_the_pinned_reply_sizes(self):
        # max_reply_size() of each request in WireBytesArePinned.
        cases = [
            (p.Message(type=p.ACQUIRE, key=KEY, ttl_ms=30000, wait_ms=500), 55),
            (p.Message(type=p.RENEW, key=KEY, token=77, ttl_ms=1000), 47),
            (p.Message(type=p.RELEASE, key=KEY, token=78), 34),
            (p.Message(type=p.QUERY, key=KEY), 69),
            (p.Message(type=p.ACQUIRE_SHARED, key=KEY, ttl_ms=30000, wait_ms=500), 55),
            (p.Message(type=p.ACQUIRE_PERMIT, key=KEY, ttl_ms=30000, wait_ms=500, permits=3), 55),
        ]
        for message, size in cases:
            with self.subTest(p.type_name(message.type)):
                self.assertEqual(p.max_reply_size(message), size)
                padded = p.encode_request(message, CLIENT)
                self.assertEqual(len(padded), max(size, len(p.encode_request(
                    message, CLIENT, pad=False))))
                self.assertFalse(any(padded[len(p.encode_request(message, CLIENT, pad=False)):]))

    def test_replies_decode_from_the_pinned_bytes(self):
        header = ("53484c4b0100%02x01" "0077665544332211"
                  "aaaa000000000000bbbb000000000000")
        cases = [
            (p.GRANTED, "09006f72646572732f3432f0ffffffffffffff30750000",
             dict(key=KEY, token=0xFFFFFFFFFFFFFFF0, ttl_ms=30000)),
            (p.BUSY, "09006f72646572732f3432d2040000", dict(key=KEY, ttl_ms=1234)),
            (p.TIMEOUT, "09006f72646572732f3432", dict(key=KEY)),
            (p.RENEWED, "09006f72646572732f3432e7030000", dict(key=KEY, ttl_ms=999)),
            (p.RELEASED, "", {}),
            (p.NOT_OWNER, "", {}),
            (p.EXPIRED, "", {}),
            (p.RECOVERING, "e1100000", dict(retry_after_ms=4321)),
            (p.ERROR, "0300", dict(error=3)),
            (p.REDIRECT, "0200000001000000", dict(epoch=0x0000000100000002)),
            (p.QUERY_REPLY,
             "09006f72646572732f34320105000000000000001100000003000000020200000004000000",
             dict(key=KEY, held=1, token=5, ttl_ms=17, waiters=3, mode=2, holders=2,
                  permits=4)),
        ]
        for message_type, body, fields in cases:
            with self.subTest(p.type_name(message_type)):
                data = bytes.fromhex(header % message_type + body)
                d = p.decode(data)
                self.assertEqual(d.request_id, REQUEST_ID)
                self.assertEqual(d.client_id, CLIENT)
                self.assertEqual(len(d.messages), 1)
                m = d.messages[0]
                self.assertEqual(m.type, message_type)
                self.assertEqual(m.request_id, REQUEST_ID)
                for name, value in fields.items():
                    self.assertEqual(getattr(m, name), value, name)
                # Zero padding is allowed, anything else is not.
                self.assertEqual(p.decode(data + bytes(7)).messages[0], m)
                with self.assertRaises(p.ProtocolError):
                    p.decode(data + b"\x00\x01")
                # Every truncation is refused, never misread.
                for n in range(len(data)):
                    with self.assertRaises(p.ProtocolError):
                        p.decode(data[:n])


class Decoding(unittest.TestCase):
    def test_rejects_bad_headers(self):
        good = bytes.fromhex("53484c4b01008501" "0100000000000000") + bytes(16)
        self.assertEqual(p.decode(good).messages[0].type, p.RELEASED)
        for at, value in ((0, 0x00), (4, 2), (5, 1), (6, 0x42), (7, 2)):
            with self.subTest(at=at):
                bad = bytearray(good)
                bad[at] = value
                with self.assertRaises(p.ProtocolError):
                    p.decode(bytes(bad))

    def test_a_batch_reply_decodes_every_item(self):
        header = bytes.fromhex("53484c4b0100ff02" "0900000000000000") + bytes(16)
        released = bytes.fromhex("8500" "0000" "0100000000000000")
        renewed = bytes.fromhex("8400" "0700" "0200000000000000") + \
            bytes.fromhex("0100") + b"k" + bytes.fromhex("e8030000")
        d = p.decode(header + released + renewed)
        self.assertEqual([(m.type, m.request_id) for m in d.messages],
                         [(p.RELEASED, 1), (p.RENEWED, 2)])
        self.assertEqual(d.messages[1].key, b"k")
        self.assertEqual(d.messages[1].ttl_ms, 1000)
        whole = header + released + renewed
        for n in range(p.HEADER_SIZE, len(whole)):
            with self.assertRaises(p.ProtocolError):
                p.decode(whole[:n])

    def test_reply_matching_follows_the_request_table(self):
        self.assertTrue(p.reply_answers(p.ACQUIRE, p.GRANTED))
        self.assertTrue(p.reply_answers(p.RENEW, p.RECOVERING))
        self.assertTrue(p.reply_answers(p.ACQUIRE, p.REDIRECT))
        self.assertTrue(p.reply_answers(p.RENEW, p.REDIRECT))
        self.assertFalse(p.reply_answers(p.RELEASE, p.REDIRECT))
        self.assertFalse(p.reply_answers(p.ACQUIRE, p.RENEWED))
        self.assertFalse(p.reply_answers(p.RELEASE, p.GRANTED))
        self.assertTrue(p.reply_carries_key(p.BUSY))
        self.assertFalse(p.reply_carries_key(p.RELEASED))


# The MAP_REPLY of one_of_each_type() in tests/lease/protocol_test.cc.
MAP_REPLY_BODY = ("0700000000000000" "03000000" "01000000" "02"
                  "0200" "6e32" "0d00" "31302e302e302e323a37303030" "01000000"
                  "0600" "6e6f64652d33" "0a00" "5b3a3a315d3a37303031" "2c010000")


class ClusterMessages(unittest.TestCase):
    """MAP, MAP_REPLY and the map epoch, pinned to WireBytesArePinned."""

    def test_map_and_the_epoch_match_the_cpp_codec(self):
        m = p.Message(type=p.MAP, first_member=5)
        self.assertEqual(p.encode_request(m, CLIENT, pad=False)[p.HEADER_SIZE:].hex(), "05000000")
        self.assertEqual(p.max_reply_size(m), 49)
        # A MAP asks for a whole datagram of members.
        self.assertEqual(len(p.encode_request(m, CLIENT)), p.MAX_DATAGRAM_SIZE)
        acquire = p.Message(type=p.ACQUIRE, request_id=REQUEST_ID, key=KEY, ttl_ms=30000,
                            wait_ms=500)
        data = p.encode_request(acquire, CLIENT, pad=False, epoch=0x0102030405060708)
        self.assertEqual(data.hex(),
                         "53484c4b010201010077665544332211aaaa000000000000bbbb000000000000"
                         "0807060504030201" "09006f72646572732f343230750000f4010000")
        # The reply carries no epoch: the padding target is unchanged (55),
        # so the 59 bytes the epoch makes need no padding at all.
        self.assertEqual(len(p.encode_request(acquire, CLIENT, epoch=1)), len(data))
        d = p.decode(p.encode_request(acquire, CLIENT, epoch=9))
        self.assertEqual((d.epoch, d.messages[0].key), (9, KEY))

    def test_map_reply_decodes_from_the_pinned_bytes(self):
        header = bytes.fromhex("53484c4b01008f01" "0100000000000000") + bytes(16)
        data = header + bytes.fromhex(MAP_REPLY_BODY)
        m = p.decode(data).messages[0]
        self.assertEqual((m.type, m.epoch, m.member_count, m.first_member),
                         (p.MAP_REPLY, 7, 3, 1))
        self.assertEqual(m.members, [(b"n2", "10.0.0.2:7000", 1), (b"node-3", "[::1]:7001", 300)])
        self.assertTrue(p.reply_answers(p.MAP, p.MAP_REPLY))
        self.assertTrue(p.reply_answers(p.MAP, p.RECOVERING))
        self.assertFalse(p.reply_carries_key(p.MAP_REPLY))
        for n in range(len(data)):
            with self.assertRaises(p.ProtocolError):
                p.decode(data[:n])

    def test_a_bad_member_is_refused(self):
        header = bytes.fromhex("53484c4b01008f01" "0100000000000000") + bytes(16)
        fixed = "0700000000000000" "01000000" "00000000" "01"
        for member in ("0000" "0100" "61" "01000000",      # empty id
                       "0100" "61" "0000" "01000000",      # empty address
                       "0100" "61" "0100" "61" "00000000"):  # weight 0
            with self.subTest(member=member):
                with self.assertRaises(p.ProtocolError):
                    p.decode(header + bytes.fromhex(fixed + member))


# HOLDERS_REPLY's body in WireBytesArePinned (protocol_test.cc).
HOLDERS_REPLY_BODY = ("09006f72646572732f3432" "01" "00000000" "03000000" "05000000" "02000000"
                      "02"
                      "1100000000000000" "2200000000000000" "2800000000000000" "84030000" "00"
                      "0b00" "31302e302e302e373a3830"
                      "3300000000000000" "4400000000000000" "2900000000000000" "00000000" "01"
                      "0000")


class HolderMessages(unittest.TestCase):
    """QUERY_HOLDERS and HOLDERS_REPLY, pinned to WireBytesArePinned."""

    def test_query_holders_matches_the_cpp_codec(self):
        m = p.Message(type=p.QUERY_HOLDERS, key=KEY, first_holder=2)
        self.assertEqual(p.encode_request(m, CLIENT, pad=False)[p.HEADER_SIZE:].hex(),
                         "09006f72646572732f343202000000")
        self.assertEqual(p.max_reply_size(m), 61)
        # It asks for a whole datagram of holders, as MAP does for members.
        self.assertEqual(len(p.encode_request(m, CLIENT)), p.MAX_DATAGRAM_SIZE)
        self.assertEqual(p.type_name(p.QUERY_HOLDERS), "QUERY_HOLDERS")

    def test_holders_reply_decodes_from_the_pinned_bytes(self):
        header = bytes.fromhex("53484c4b01009001" "0100000000000000") + bytes(16)
        data = header + bytes.fromhex(HOLDERS_REPLY_BODY)
        m = p.decode(data).messages[0]
        self.assertEqual((m.type, m.key, m.mode, m.permits, m.waiters, m.holders, m.first_holder),
                         (p.HOLDERS_REPLY, KEY, p.MODE_SHARED, 0, 3, 5, 2))
        self.assertEqual(m.holder_list, [
            p.Holder((0x11, 0x22), 40, 900, 0, b"10.0.0.7:80"),
            p.Holder((0x33, 0x44), 41, 0, p.HOLDER_FLAG_PENDING, b""),
        ])
        self.assertTrue(p.reply_answers(p.QUERY_HOLDERS, p.HOLDERS_REPLY))
        self.assertTrue(p.reply_answers(p.QUERY_HOLDERS, p.REDIRECT))
        self.assertTrue(p.reply_carries_key(p.HOLDERS_REPLY))
        for n in range(len(data)):
            with self.assertRaises(p.ProtocolError):
                p.decode(data[:n])

    def test_a_bad_holder_is_refused(self):
        header = bytes.fromhex("53484c4b01009001" "0100000000000000") + bytes(16)
        fixed = "0100" "6b" "00" "00000000" "00000000" "01000000" "00000000" "01"
        entry = "00" * 28
        for tail in ("02" "0000",                          # a reserved flag
                     "00" "0101" + "76" * 257):            # a value of 257 bytes
            with self.subTest(tail=tail[:8]):
                with self.assertRaises(p.ProtocolError):
                    p.decode(header + bytes.fromhex(fixed + entry + tail))
        longest = "00" "0001" + "76" * 256
        m = p.decode(header + bytes.fromhex(fixed + entry + longest)).messages[0]
        self.assertEqual(len(m.holder_list[0].value), p.MAX_HOLDER_VALUE_LENGTH)

    def test_watch_matches_the_cpp_codec_and_asks_for_a_whole_datagram(self):
        m = p.Message(type=p.WATCH, key=KEY, token=41, holders=2, wait_ms=30000)
        self.assertEqual(p.encode_request(m, CLIENT, pad=False)[p.HEADER_SIZE:].hex(),
                         "09006f72646572732f3432290000000000000002000000" "30750000")
        self.assertEqual(p.max_reply_size(m), 61)
        self.assertEqual(p.type_name(p.WATCH), "WATCH")
        # Its answer may come later, as a tail page of holders: a whole
        # datagram, with or without an epoch; sealed, what a server with a
        # key encodes replies into (SEALED_PAYLOAD_LIMIT), and the tag.
        self.assertEqual(len(p.encode_request(m, CLIENT)), p.MAX_DATAGRAM_SIZE)
        self.assertEqual(len(p.encode_request(m, CLIENT, epoch=3)), p.MAX_DATAGRAM_SIZE)
        sealed = p.encode_request(m, CLIENT, auth_key=bytes(32))
        self.assertEqual(len(sealed), p.SEALED_PAYLOAD_LIMIT + p.AUTH_TAG_SIZE)
        back = p.decode(sealed, bytes(32)).messages[0]
        self.assertEqual((back.type, back.key, back.token, back.holders, back.wait_ms),
                         (p.WATCH, KEY, 41, 2, 30000))
        for reply in (p.HOLDERS_REPLY, p.ERROR, p.REDIRECT, p.RECOVERING):
            self.assertTrue(p.reply_answers(p.WATCH, reply), p.type_name(reply))
        for reply in (p.QUERY_REPLY, p.GRANTED, p.TIMEOUT):
            self.assertFalse(p.reply_answers(p.WATCH, reply), p.type_name(reply))
        none_seen = p.pack_request(p.WATCH, 1, CLIENT, KEY, (p.NO_VERSION_TOKEN, 0, 0))
        self.assertEqual(p.decode(none_seen).messages[0].token, 2 ** 64 - 1)

    def test_an_acquire_carries_its_value_in_a_batch_of_one(self):
        for wait_ms, size in ((0, 32 + 12 + 14 + len(KEY)), (500, 32 + 12 + 14 + len(KEY) + 20)):
            with self.subTest(wait_ms=wait_ms):
                data = p.pack_request(p.ACQUIRE, 9, CLIENT, KEY, (30000, wait_ms),
                                      value=b"10.0.0.7:80")
                self.assertEqual(data[6], p.BATCH)
                self.assertEqual(data[p.HEADER_SIZE + 1], p.ITEM_FLAG_VALUE)
                self.assertEqual(len(data), max(size, 32 + 12 + 2 + 11 + 2 + len(KEY) + 8))
                m = p.decode(data).messages[0]
                self.assertEqual((m.type, m.request_id, m.key, m.ttl_ms, m.wait_ms, m.value),
                                 (p.ACQUIRE, 9, KEY, 30000, wait_ms, b"10.0.0.7:80"))
        with self.assertRaises(p.ProtocolError):
            p.pack_request(p.RENEW, 9, CLIENT, KEY, (1, 1000), value=b"v")
        with self.assertRaises(p.ProtocolError):
            p.pack_request(p.ACQUIRE, 9, CLIENT, KEY, (1000, 0), value=b"v" * 257)


if __name__ == "__main__":
    unittest.main()
