"""shardlock.router against owners the C++ Router computed.

router_vectors.json comes from make_router_vectors.py (it runs
tools/shardlock-route with the cluster's options); if the two disagree on a
single key, a Python cluster client would be redirected for it forever.
"""

import json
import os
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from shardlock import router  # noqa: E402

VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "router_vectors.json")


def needs_xxhash(test):
    try:
        router.require_xxhash()
    except ImportError as error:
        return unittest.skip(str(error))(test)
    return test


class GoldenVectors(unittest.TestCase):
    @needs_xxhash
    def test_every_owner_matches_the_cpp_router(self):
        with open(VECTORS, encoding="utf-8") as f:
            data = json.load(f)
        self.assertEqual(data["bucket_bits"], router.BUCKET_BITS)
        self.assertEqual(int(data["seed"], 16), router.SEED)
        self.assertGreaterEqual(len(data["maps"]), 5)
        checked = 0
        for vector in data["maps"]:
            members = [(m.encode("utf-8"), w) for m, w in vector["members"]]
            # Map order must not matter: the Router sorts by id.
            for order in (members, list(reversed(members))):
                r = router.Router(order)
                with self.subTest(members=vector["members"]):
                    for key, owner in vector["owners"]:
                        self.assertEqual(r.owner(key.encode("utf-8")), owner.encode("utf-8"),
                                         key)
                        checked += 1
        self.assertGreater(checked, 1000)


class Memberships(unittest.TestCase):
    @needs_xxhash
    def test_the_cpp_router_refusals_are_refused(self):
        for members in ([], [(b"", 1)], [(b"a", 0)], [(b"a", 1025)], [(b"a", 1), (b"a", 2)]):
            with self.subTest(members=members):
                with self.assertRaises(ValueError):
                    router.Router(members)

    @needs_xxhash
    def test_ids_are_sorted_bytewise(self):
        r = router.Router([(b"b", 1), (b"B", 1), (b"\xc3\xa9", 1)])
        self.assertEqual(r.ids, [b"B", b"b", b"\xc3\xa9"])

    def test_without_xxhash_the_error_names_the_package(self):
        with mock.patch.object(router, "_xxhash", None):
            with self.assertRaises(ImportError) as caught:
                router.Router([(b"a", 1)])
        self.assertIn("python3-xxhash", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
