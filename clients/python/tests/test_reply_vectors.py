"""The Python client's reply classification against the C++ client's.

reply_vectors.json comes from tests/lease/client/reply_vectors_test.cc:
reply datagrams the C++ codec encoded, each with the call it answers and
what the C++ client's pure decisions (src/lease/client/reply.h) make of it
(ignore, malformed, redirect, ride_through, complete with an error and a
result), and REDIRECTs with the epochs that decide where they lead. Here
the Python client reads the same bytes: protocol.decode(), answers() and
raise_for_reply() (_requests.py), and the routed call's steps
(_policy.ClientCore._routed_steps) for the ride-through and the redirects.
If the two disagree, one client would complete, retry or follow a reply
the other would not.

Not checked here, because the Python client has no such call: ACQUIRE_MANY
(GRANTED_MANY, BUSY_MANY, the "malformed" verdicts). A RENEW's REDIRECT is
checked only as an answer: the C++ watchdog follows it to the key's new
owner, the Python renewal reports the lease lost (RedirectedError). The
redirects whose call was routed under an older map than the current one
(the map refreshed while it was out) are C++ only: the Python routed call
compares the REDIRECT's epoch with the map it routed by, and then routes
under the current one.
"""

import json
import os
import socket
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from shardlock import _policy as policy  # noqa: E402
from shardlock import protocol as p  # noqa: E402
from shardlock import router  # noqa: E402
from shardlock._requests import answers, raise_for_reply  # noqa: E402
from shardlock._routing import REDIRECT_RETRY, ClusterMap, Node, Routing  # noqa: E402
from shardlock.errors import (BusyError, LeaseExpiredError, NotOwnerError,  # noqa: E402
                              RecoveringError, ServerError, WaitTimeoutError)

VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reply_vectors.json")

# The calls the Python client makes, by the C++ names the vectors use.
CALLS = {name: getattr(p, name) for name in (
    "ACQUIRE", "ACQUIRE_SHARED", "ACQUIRE_PERMIT", "RENEW", "RELEASE", "QUERY",
    "QUERY_HOLDERS", "WATCH", "MAP")}
# Those that go through the routed call (riding through and following).
ROUTED = {"ACQUIRE", "ACQUIRE_SHARED", "ACQUIRE_PERMIT", "QUERY", "QUERY_HOLDERS", "WATCH"}
ERRORS = {"busy": BusyError, "timeout": WaitTimeoutError, "recovering": RecoveringError,
          "not_owner": NotOwnerError, "expired": LeaseExpiredError,
          "server_error": ServerError}
# CallResult's field names where the Python Message's differ.
FIELD_NAMES = {"wire_error": "error"}

NODE_A = Node("127.0.0.1:7001", ("127.0.0.1", 7001))
NODE_B = Node("127.0.0.1:7002", ("127.0.0.1", 7002))
NOW = 1000.0


def load():
    with open(VECTORS, encoding="utf-8") as f:
        return json.load(f)


def decoded(vector):
    datagram = p.decode(bytes.fromhex(vector["reply"]))
    assert len(datagram.messages) == 1
    return datagram.messages[0]


def core(epoch=None):
    """A ClientCore over NODE_A alone, or in cluster mode with a map of
    `epoch`; no socket."""
    c = policy.ClientCore(NODE_A.text, discover=epoch is not None)
    c._routing = Routing([NODE_A], socket.AF_INET, None)
    if epoch is not None:
        c._routing.map = cluster_map(epoch)
    return c


def cluster_map(epoch):
    return ClusterMap(epoch, [(b"a", NODE_A.text, 1), (b"b", NODE_B.text, 1)],
                      {NODE_A.text: NODE_A, NODE_B.text: NODE_B})


def step_after(steps, reply):
    """The routed call's step after `reply`: (action, argument), or
    ("end", Routed) when it ends."""
    try:
        return steps.send(reply)
    except StopIteration as end:
        return "end", end.value


try:
    router.require_xxhash()
    NO_XXHASH = ""
except ImportError as missing:
    NO_XXHASH = str(missing)
# Cluster mode (a ClusterMap) routes with xxhash.
needs_xxhash = unittest.skipIf(NO_XXHASH, NO_XXHASH)


class Replies(unittest.TestCase):
    def test_the_vectors_cover_every_verdict(self):
        data = load()
        self.assertEqual(data["last_try_margin_ms"] / 1000.0, policy.LAST_TRY_MARGIN)
        self.assertEqual({v["verdict"] for v in data["replies"]},
                         {"ignore", "malformed", "redirect", "ride_through", "complete"})

    def test_answers_and_results_match(self):
        checked = 0
        for vector in load()["replies"]:
            if vector["call"] not in CALLS:
                continue
            with self.subTest(vector["name"]):
                reply = decoded(vector)
                self.assertEqual(reply.request_id, load()["request_id"])
                call = CALLS[vector["call"]]
                key = vector["key"].encode("utf-8")
                self.assertEqual(answers(call, key, reply), vector["verdict"] != "ignore")
                if vector["verdict"] == "complete":
                    self.check_result(reply, vector)
                checked += 1
        self.assertGreater(checked, 25)

    def check_result(self, reply, vector):
        for name, expected in vector["result"].items():
            actual = getattr(reply, FIELD_NAMES.get(name, name))
            if name == "members":
                actual = [[m.decode("utf-8"), address, weight] for m, address, weight in actual]
            elif name == "holder_list":
                actual = [["%016x%016x" % (h.owner[1], h.owner[0]), h.token, h.ttl_left_ms,
                           bool(h.flags & p.HOLDER_FLAG_PENDING), h.value.decode("utf-8")]
                          for h in actual]
            self.assertEqual(actual, expected, name)
        error = ERRORS.get(vector["error"])
        if vector["call"] == "MAP":
            # MapPages reads MAP answers: a MAP_REPLY is a page, anything
            # else an error.
            self.assertEqual(reply.type == p.MAP_REPLY, vector["error"] == "ok")
        elif error is None:
            self.assertEqual(vector["error"], "ok")
            raise_for_reply(reply, vector["key"])
        else:
            with self.assertRaises(error):
                raise_for_reply(reply, vector["key"])

    @needs_xxhash
    def test_the_routed_call_rides_through_follows_and_completes_alike(self):
        checked = 0
        for vector in load()["replies"]:
            if vector["call"] not in ROUTED or vector["verdict"] == "ignore":
                continue
            with self.subTest(vector["name"]), mock.patch.object(policy, "now",
                                                                 return_value=NOW):
                reply = decoded(vector)
                # In cluster mode at the REDIRECT's own epoch: a redirect is
                # then followed (asked again soon), whatever it says.
                c = core(reply.epoch if vector["verdict"] == "redirect" else None)
                wait_ms = vector["wait_left_ms"] or 0
                steps = c._routed_steps(CALLS[vector["call"]], vector["key"].encode("utf-8"),
                                        ttl_ms=1000, wait_ms=wait_ms)
                self.assertEqual(next(steps)[0], policy.SEND)
                action, argument = step_after(steps, reply)
                if vector["verdict"] == "complete":
                    self.assertEqual(action, "end")
                    self.assertIs(argument.reply, reply)
                elif vector["verdict"] == "ride_through":
                    self.assertEqual(action, policy.PAUSE)
                    self.assertGreater(argument, 0)
                    self.assertLessEqual(argument, vector["latest_retry_ms"] / 1000.0 + 1e-9)
                else:
                    self.assertEqual(action, policy.PAUSE)
                    self.assertAlmostEqual(argument, REDIRECT_RETRY)
                checked += 1
        self.assertGreater(checked, 12)


class Redirects(unittest.TestCase):
    @needs_xxhash
    def test_each_redirect_leads_where_the_cpp_client_goes(self):
        data = load()
        checked = 0
        for vector in data["redirects"]:
            if vector["call_epoch"] != vector["map_epoch"]:
                continue  # C++ only: see the module's docstring
            with self.subTest(vector["name"]), mock.patch.object(policy, "now",
                                                                 return_value=NOW):
                self.assertEqual(self.python_step(vector), vector["step"])
                checked += 1
        self.assertGreaterEqual(checked, 7)

    def python_step(self, vector):
        epoch = vector["map_epoch"]
        vector_request_id = decoded(vector).request_id
        c = core(epoch)
        steps = c._routed_steps(p.ACQUIRE, b"k", ttl_ms=1000, wait_ms=0)
        self.assertEqual(next(steps)[0], policy.SEND)
        # The hops it followed before: a REDIRECT of its own map's epoch
        # (another owner under the same map) each, asked again after a pause.
        same_map = p.Message(p.REDIRECT, vector_request_id, epoch=epoch or 0)
        for _ in range(vector["redirects"]):
            self.assertEqual(step_after(steps, same_map)[0], policy.PAUSE)
            self.assertEqual(step_after(steps, None)[0], policy.SEND)
        action, argument = step_after(steps, decoded(vector))
        if action == "end":
            return "give_up"
        if action == policy.PAUSE and abs(argument - REDIRECT_RETRY) < 1e-9:
            return "ask_again_soon"
        if action == policy.REFRESH:
            self.assertIs(argument.sources[0], c._routes().route(b"k")[0])
            return "await_newer_map"
        if action == policy.SEND:
            return "go_to_owner"
        return "%s %r" % (action, argument)


if __name__ == "__main__":
    unittest.main()
