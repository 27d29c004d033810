"""The client's decisions without a server or a socket (shardlock/_policy.py):
each generator is stepped by hand, fed made-up replies, and its steps and
ends are asserted. Client and AsyncClient drive these same generators; the
other test files drive them against a real shardlockd."""

import os
import socket
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from shardlock import _policy as policy  # noqa: E402
from shardlock import protocol as p  # noqa: E402
from shardlock import router  # noqa: E402
from shardlock._routing import MAX_REDIRECTS, ClusterMap, Node, Routing  # noqa: E402
from shardlock.errors import GrantExpiredError, NotOwnerError, UnreachableError  # noqa: E402

NODE_A = Node("127.0.0.1:7001", ("127.0.0.1", 7001))
NODE_B = Node("127.0.0.1:7002", ("127.0.0.1", 7002))
KEY = b"orders/42"


def core(*nodes, request_timeout=2.0):
    """A ClientCore routed over `nodes` (one: the server), no socket."""
    c = policy.ClientCore(nodes[0].text, request_timeout=request_timeout)
    c._routing = Routing(list(nodes), socket.AF_INET, None)
    return c


def cluster_core(epoch=5, request_timeout=2.0):
    """A ClientCore in cluster mode over NODE_A and NODE_B, map `epoch`."""
    c = policy.ClientCore(NODE_A.text, discover=True, request_timeout=request_timeout)
    c._routing = Routing([NODE_A], socket.AF_INET, None)
    c._routing.map = ClusterMap(epoch, [(b"a", NODE_A.text, 1), (b"b", NODE_B.text, 1)],
                                {NODE_A.text: NODE_A, NODE_B.text: NODE_B})
    return c


def start(steps):
    return next(steps)


def finish(steps, outcome):
    """Sends `outcome`; the generator's return value (it must end)."""
    with unittest.TestCase().assertRaises(StopIteration) as end:
        steps.send(outcome)
    return end.exception.value


class RoutedCall(unittest.TestCase):
    def test_a_reply_ends_the_call_where_it_was_sent(self):
        c = core(NODE_A)
        steps = c._routed_steps(p.ACQUIRE, KEY, ttl_ms=30000, wait_ms=0)
        action, request = start(steps)
        self.assertEqual(action, policy.SEND)
        self.assertEqual((request.message_type, request.key, request.values),
                         (p.ACQUIRE, KEY, (30000, 0)))
        self.assertIs(request.node, NODE_A)
        self.assertFalse(request.watch_silence)  # no map: silence is only the deadline
        self.assertAlmostEqual(request.timeout, 2.0, delta=0.05)
        granted = p.Message(p.GRANTED, key=KEY, token=7, ttl_ms=30000)
        sent, reply, node = finish(steps, granted)
        self.assertIs(reply, granted)
        self.assertIs(node, NODE_A)
        self.assertEqual(sent, request.sent)

    def test_no_answer_ends_it_with_none(self):
        steps = core(NODE_A)._routed_steps(p.QUERY, KEY)
        start(steps)
        self.assertIsNone(finish(steps, None).reply)

    def test_recovering_without_a_wait_is_the_answer(self):
        steps = core(NODE_A)._routed_steps(p.ACQUIRE, KEY, ttl_ms=1000, wait_ms=0)
        start(steps)
        recovering = p.Message(p.RECOVERING, key=KEY, retry_after_ms=500)
        self.assertIs(finish(steps, recovering).reply, recovering)

    def test_a_wait_rides_through_recovering_with_a_fresh_request_for_the_wait_left(self):
        steps = core(NODE_A)._routed_steps(p.ACQUIRE, KEY, ttl_ms=1000, wait_ms=5000)
        _, first = start(steps)
        action, delay = steps.send(p.Message(p.RECOVERING, key=KEY, retry_after_ms=100))
        self.assertEqual(action, policy.PAUSE)
        self.assertGreaterEqual(delay, 0.100)  # the hint, plus at most a quarter of it
        self.assertLessEqual(delay, 0.125)
        action, second = steps.send(None)
        self.assertEqual(action, policy.SEND)
        self.assertLessEqual(second.values[1], 5000)  # the wait left
        self.assertGreater(second.values[1], 4000)
        self.assertGreaterEqual(second.sent, first.sent)

    def test_a_hint_past_the_wait_is_cut_to_a_last_try_before_its_end(self):
        steps = core(NODE_A)._routed_steps(p.ACQUIRE, KEY, ttl_ms=1000, wait_ms=200)
        start(steps)
        action, delay = steps.send(p.Message(p.RECOVERING, key=KEY, retry_after_ms=60000))
        self.assertEqual(action, policy.PAUSE)
        self.assertLess(delay, 0.200)

    def test_a_static_list_routes_each_key_to_its_owner(self):
        if router._xxhash is None:
            self.skipTest("needs xxhash (python3-xxhash)")
        from shardlock._routing import StaticRoute
        c = core(NODE_A, NODE_B)
        c._routing.static = StaticRoute([NODE_A, NODE_B])
        _, request = start(c._routed_steps(p.QUERY, KEY))
        self.assertIs(request.node, c._routing.static.owner_of(KEY))


@unittest.skipIf(router._xxhash is None, "needs xxhash (python3-xxhash)")
class ClusterCall(unittest.TestCase):
    def test_a_redirect_from_a_newer_map_refreshes_from_that_node_first(self):
        c = cluster_core(epoch=5)
        steps = c._routed_steps(p.QUERY, KEY)
        _, request = start(steps)
        self.assertTrue(request.watch_silence)
        owner = request.node
        action, refresh = steps.send(p.Message(p.REDIRECT, key=KEY, epoch=6))
        self.assertEqual(action, policy.REFRESH)
        self.assertIs(refresh.sources[0], owner)
        self.assertIs(refresh.routed_by, c._routing.map)
        # No newer map was found: ask again shortly.
        action, delay = steps.send(None)
        self.assertEqual(action, policy.PAUSE)
        self.assertLessEqual(delay, 0.020)
        action, again = steps.send(None)
        self.assertEqual(action, policy.SEND)
        self.assertIs(again.node, owner)

    def test_redirects_are_followed_at_most_max_redirects_times(self):
        c = cluster_core(epoch=5)
        steps = c._routed_steps(p.QUERY, KEY)
        start(steps)
        redirect = p.Message(p.REDIRECT, key=KEY, epoch=5)  # same map: the node is mid-change
        for _ in range(MAX_REDIRECTS):
            self.assertEqual(steps.send(redirect)[0], policy.PAUSE)
            self.assertEqual(steps.send(None)[0], policy.SEND)
        self.assertIs(finish(steps, redirect).reply, redirect)

    def test_a_node_behind_our_map_is_no_hop(self):
        c = cluster_core(epoch=5)
        steps = c._routed_steps(p.QUERY, KEY)
        start(steps)
        behind = p.Message(p.REDIRECT, key=KEY, epoch=4)
        for _ in range(MAX_REDIRECTS + 3):  # never counted, never refreshed
            self.assertEqual(steps.send(behind)[0], policy.PAUSE)
            self.assertEqual(steps.send(None)[0], policy.SEND)

    def test_silence_refreshes_from_the_others_first_and_moves_when_the_key_moved(self):
        c = cluster_core(epoch=5)
        steps = c._routed_steps(p.QUERY, KEY)
        _, request = start(steps)
        silent_node = request.node
        action, refresh = steps.send(policy.SILENT)
        self.assertEqual(action, policy.REFRESH)
        self.assertIs(refresh.sources[-1], silent_node)  # the silent node last
        self.assertNotIn(silent_node, refresh.sources[:-1])
        # The refresh found a map without the silent node: the key moved.
        other = NODE_B if silent_node is NODE_A else NODE_A
        c._routing.adopt(ClusterMap(6, [(b"x", other.text, 1)], {other.text: other}))
        self.assertEqual(steps.send(None), (policy.ABANDON, True))
        # The abandoned request's outcome is None: a new request at the new owner.
        action, moved = steps.send(None)
        self.assertEqual(action, policy.SEND)
        self.assertIs(moved.node, other)

    def test_silence_with_the_key_in_place_goes_on_sending(self):
        c = cluster_core(epoch=5)
        steps = c._routed_steps(p.QUERY, KEY)
        start(steps)
        self.assertEqual(steps.send(policy.SILENT)[0], policy.REFRESH)
        self.assertEqual(steps.send(None), (policy.ABANDON, False))
        reply = p.Message(p.QUERY_REPLY, key=KEY)
        self.assertIs(finish(steps, reply).reply, reply)


@unittest.skipIf(router._xxhash is None, "needs xxhash (python3-xxhash)")
class MapRefresh(unittest.TestCase):
    def test_pages_are_gathered_and_a_newer_map_adopted(self):
        c = core(NODE_A)
        steps = c._refresh_steps(policy.MapRefresh([NODE_A], 1e18, None))
        action, request = start(steps)
        self.assertEqual((action, request.message_type, request.values),
                         (policy.SEND, p.MAP, (0,)))
        page = p.Message(p.MAP_REPLY, epoch=3, first_member=0, member_count=2,
                         members=[(b"a", NODE_A.text, 1)])
        _, request = steps.send(page)
        self.assertEqual(request.values, (1,))  # the next page from member 1
        page = p.Message(p.MAP_REPLY, epoch=3, first_member=1, member_count=2,
                         members=[(b"b", NODE_B.text, 1)])
        self.assertEqual(finish(steps, page), [])
        self.assertEqual(c._routing.map.epoch, 3)
        self.assertEqual([m[0] for m in c._routing.map.members], [b"a", b"b"])

    def test_a_source_that_gives_none_is_a_reason_and_the_next_is_asked(self):
        c = core(NODE_A)
        steps = c._refresh_steps(policy.MapRefresh([NODE_A, NODE_B], 1e18, None))
        start(steps)
        _, request = steps.send(p.Message(p.MAP_REPLY, epoch=0))  # not a cluster node
        self.assertIs(request.node, NODE_B)
        failures = finish(steps, None)
        self.assertEqual(len(failures), 2)
        self.assertIn("not a cluster node", failures[0])
        self.assertIn("no answer", failures[1])
        self.assertIsNone(c._routing.map)

    def test_a_refresh_another_caller_did_meanwhile_is_not_done_again(self):
        c = cluster_core(epoch=5)
        stale = c._routing.map
        c._routing.adopt(ClusterMap(6, [(b"a", NODE_A.text, 1)], {NODE_A.text: NODE_A}))
        self.assertEqual(finish(c._refresh_steps(policy.MapRefresh([NODE_A], 1e18, stale)),
                                None), [])


def lease_state(c, ttl_ms=3000, expiry=None, sent=None):
    now = policy.now()
    return policy.LeaseState(c, KEY, 9, p.MODE_EXCLUSIVE, ttl_ms,
                             now + 100.0 if expiry is None else expiry,
                             now if sent is None else sent, True, None, 1 / 3, NODE_A, (1, 2))


class Renewal(unittest.TestCase):
    def test_renewed_counts_the_expiry_from_the_send_less_the_drift_margin(self):
        c = core(NODE_A)
        lease = lease_state(c)
        steps = lease._renewal(3000, 1.0, 11, c._drift_margin)
        action, request = start(steps)
        self.assertEqual((action, request.message_type, request.values, request.request_id,
                          request.node, request.owner),
                         (policy.SEND, p.RENEW, (9, 3000), 11, NODE_A, (1, 2)))
        # Pulled in on sending: the server may apply the TTL at once.
        self.assertLessEqual(lease._expiry, request.sent + 3.0)
        finish(steps, p.Message(p.RENEWED, key=KEY, ttl_ms=3000))
        self.assertAlmostEqual(lease._expiry, request.sent + 3.0 - c._drift_margin(3000))
        self.assertEqual(lease._confirmed_sent, request.sent)
        self.assertEqual(lease._pending, {})

    def test_an_older_renewal_answered_last_cannot_outlast_a_newer_one_in_flight(self):
        c = core(NODE_A)
        lease = lease_state(c, ttl_ms=60000)
        older = lease._renewal(60000, 1.0, 20, c._drift_margin)
        start(older)
        newer = lease._renewal(1000, 1.0, 21, c._drift_margin)  # asks for a shorter TTL
        _, newer_request = start(newer)
        finish(older, p.Message(p.RENEWED, key=KEY, ttl_ms=60000))
        self.assertLessEqual(lease._expiry, newer_request.sent + 1.0)
        self.assertEqual(lease._confirmed_id, 20)

    def test_not_owner_loses_the_lease_says_so_then_raises(self):
        c = core(NODE_A)
        lease = lease_state(c)
        steps = lease._renewal(3000, 1.0, 12, c._drift_margin)
        start(steps)
        action, error = steps.send(p.Message(p.NOT_OWNER, key=KEY))
        self.assertEqual(action, policy.LOST)
        self.assertIsInstance(error, NotOwnerError)
        self.assertFalse(lease.valid)
        with self.assertRaises(NotOwnerError):
            steps.send(None)
        self.assertIs(lease._lost_while_held(), error)

    def test_no_answer_raises_and_leaves_the_lease_held(self):
        c = core(NODE_A)
        lease = lease_state(c)
        steps = lease._renewal(3000, 1.0, 13, c._drift_margin)
        start(steps)
        with self.assertRaises(UnreachableError):
            steps.send(None)
        self.assertTrue(lease.valid)
        self.assertEqual(lease._pending, {})


class WatchdogLook(unittest.TestCase):
    def test_a_lease_not_due_is_looked_at_again_when_due(self):
        c = core(NODE_A)
        sent = policy.now()
        lease = lease_state(c, ttl_ms=30000, sent=sent)
        when = finish(lease._watchdog_look(2.0, c._new_request_id, c._drift_margin), None)
        self.assertAlmostEqual(when, sent + 10.0)  # ttl / 3 after the grant's send

    def test_a_due_lease_renews_and_a_recovering_node_is_asked_after_its_hint(self):
        c = core(NODE_A)
        lease = lease_state(c, ttl_ms=3000, sent=policy.now() - 2.0)
        steps = lease._watchdog_look(2.0, c._new_request_id, c._drift_margin)
        action, request = start(steps)
        self.assertEqual((action, request.message_type), (policy.SEND, p.RENEW))
        when = finish(steps, p.Message(p.RECOVERING, key=KEY, retry_after_ms=200))
        self.assertGreaterEqual(when - policy.now(), 0.150)
        self.assertTrue(lease.valid)

    def test_a_passed_expiry_is_a_loss(self):
        c = core(NODE_A)
        lease = lease_state(c, expiry=policy.now() - 0.001)
        steps = lease._watchdog_look(2.0, c._new_request_id, c._drift_margin)
        action, error = start(steps)
        self.assertEqual(action, policy.LOST)
        self.assertIsNone(finish(steps, None))
        self.assertIsNotNone(lease._lost_while_held())


class Acquire(unittest.TestCase):
    def steps(self, c, wait):
        return c._acquire_steps(KEY, 30, wait, False, 0, True, True, 1 / 3, b"v", None)

    def test_a_grant_becomes_the_lease_with_a_fresh_owner(self):
        c = core(NODE_A)
        steps = self.steps(c, 0)
        _, request = start(steps)
        self.assertEqual(request.value, b"v")
        self.assertNotEqual(request.owner, c._client_id)  # each acquire its own owner
        self.assertEqual(request.owner[1], c._client_id[1])
        grant = finish(steps, p.Message(p.GRANTED, key=KEY, token=44, ttl_ms=30000))
        self.assertEqual((grant.token, grant.ttl_ms, grant.node, grant.owner),
                         (44, 30000, NODE_A, request.owner))
        self.assertAlmostEqual(grant.first_look, request.sent + 10.0)

    def test_a_timeout_inside_the_wait_asks_another_round(self):
        c = core(NODE_A)
        steps = self.steps(c, 600)
        _, first = start(steps)
        _, second = steps.send(p.Message(p.TIMEOUT, key=KEY))
        self.assertEqual(second.message_type, p.ACQUIRE)
        self.assertEqual(second.owner, first.owner)  # the same owner asks again
        self.assertLessEqual(second.values[1], first.values[1])

    def test_a_grant_past_its_expiry_is_proved_by_a_renew_or_given_back(self):
        c = core(NODE_A)
        steps = c._acquire_steps(KEY, 0.001, 0, False, 0, True, True, 1 / 3, None, None)
        start(steps)
        # A 1 ms TTL is past its client-side expiry when it arrives.
        action, renew = steps.send(p.Message(p.GRANTED, key=KEY, token=45, ttl_ms=1))
        self.assertEqual((action, renew.message_type), (policy.SEND, p.RENEW))
        action, release = steps.send(p.Message(p.NOT_OWNER, key=KEY))
        self.assertEqual(action, policy.LOST)
        action, release = steps.send(None)
        self.assertEqual((action, release.message_type, release.values),
                         (policy.SEND, p.RELEASE, (45,)))
        with self.assertRaises(GrantExpiredError):
            steps.send(p.Message(p.RELEASED, key=KEY))


if __name__ == "__main__":
    unittest.main()
