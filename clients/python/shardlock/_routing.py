"""Where a call goes: server addresses, the static Router over several
servers, the cluster map and its MAP pages, and Routing, the state that
answers "which node owns this key now". No I/O but name resolution
(getaddrinfo) of addresses given or read from a map."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import protocol as p
from . import router as _router
from ._common import parse_server
from .errors import ShardlockError, UnreachableError

# A cluster call follows at most this many REDIRECTs (as the C++ client's
# kMaxRedirects), and refreshes its map after this many unanswered sends to
# one node (and again after as many more).
MAX_REDIRECTS = 8
SILENT_SENDS = 3
# A node whose map is behind the client's, or that redirects under the same
# map, is asked again after this long (kRedirectRetry).
REDIRECT_RETRY = 0.020
# A map that changes between two pages is read again from the start at most
# this often per source.
MAX_MAP_RESTARTS = 3


class Node:
    """A server address: as written ("HOST:PORT") and resolved."""

    __slots__ = ("text", "address")

    def __init__(self, text: str, address: Tuple[Any, ...]) -> None:
        self.text = text
        self.address = address

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and self.address == other.address

    def __hash__(self) -> int:
        return hash(self.address)

    def __repr__(self) -> str:
        return "Node(%r)" % self.text


def resolve(text: str, family: int = 0) -> Node:
    """ValueError if `text` is malformed or does not resolve (in `family`)."""
    host, port = parse_server(text)
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_DGRAM)
    except socket.gaierror as error:
        raise ValueError("%s does not resolve: %s" % (text, error)) from None
    return Node(text, infos[0][4])


def _family(node: Node) -> int:
    return socket.AF_INET6 if len(node.address) == 4 else socket.AF_INET


def server_texts(server: Union[str, Sequence[str], None]) -> List[str]:
    """The addresses in `server` (comma-separated text or a list), or
    $SHARDLOCK_SERVER; ValueError if there are none."""
    server = server or os.environ.get("SHARDLOCK_SERVER")
    if not server:
        raise ValueError("no server: pass HOST:PORT or set SHARDLOCK_SERVER")
    texts = [t.strip() for t in (server.split(",") if isinstance(server, str) else server)]
    if not texts or not all(texts):
        raise ValueError("an empty server address in %r" % (server,))
    return texts


class StaticRoute:
    """Several independent servers, no cluster: the Router over their
    addresses as written, weight 1 each (client_routing.cc)."""

    def __init__(self, nodes: List[Node]) -> None:
        self.router = _router.Router([(node.text.encode(), 1) for node in nodes])
        by_id = {node.text.encode(): node for node in nodes}
        self.nodes = [by_id[member_id] for member_id in self.router.ids]

    def owner_of(self, key: bytes) -> Node:
        return self.nodes[self.router.owner_index(key)]


def resolve_nodes(texts: List[str], discover: bool
                  ) -> Tuple[List[Node], int, Optional[StaticRoute]]:
    """The nodes named by `texts`, their address family, and without
    `discover` the static routing over them (None for one node). ValueError
    for a bad or unresolvable address, mixed families, or (without
    discover) one server listed twice, as the C++ client refuses them."""
    nodes = [resolve(t) for t in texts]
    family = _family(nodes[0])
    if any(_family(node) != family for node in nodes):
        raise ValueError("the servers must all be IPv4 or all IPv6")
    if discover or len(nodes) == 1:
        return nodes, family, None
    for i, node in enumerate(nodes):
        for other in nodes[:i]:
            if other.address == node.address:
                raise ValueError("servers %r and %r are the same address: each server must be "
                                 "listed once" % (other.text, node.text))
    return nodes, family, StaticRoute(nodes)


class ClusterMap:
    """One cluster map, immutable: its epoch, members sorted by id (the
    Router's order, so owner indices are member indices) and their nodes."""

    def __init__(self, epoch: int, members: List[Tuple[bytes, str, int]],
                 nodes: Dict[str, Node]) -> None:
        self.epoch = epoch
        self.router = _router.Router([(member_id, weight) for member_id, _, weight in members])
        by_id = {member_id: (address, weight) for member_id, address, weight in members}
        self.members = [(member_id, by_id[member_id][0], by_id[member_id][1])
                        for member_id in self.router.ids]
        self.nodes = [nodes[address] for _, address, _ in self.members]

    def owner_of(self, key: bytes) -> Node:
        return self.nodes[self.router.owner_index(key)]


class MapPages:
    """One source's map as its MAP_REPLY pages come in: checks and gathers
    them."""

    def __init__(self) -> None:
        self.members: List[Tuple[bytes, str, int]] = []
        self.epoch = self.count = self.restarts = 0

    def take(self, reply: Optional[p.Message]) -> bool:
        """Takes the answer to a MAP asking from len(members); True once the
        map is whole. Raises ShardlockError saying why the source gives none."""
        if reply is None:
            raise UnreachableError("no answer")
        if reply.type != p.MAP_REPLY:
            raise ShardlockError("no map (%s)" % p.type_name(reply.type))
        if reply.epoch == 0:
            raise ShardlockError("not a cluster node (its map has epoch 0)")
        if self.epoch and (reply.epoch != self.epoch or reply.member_count != self.count):
            # The map changed between two pages: read it again.
            self.restarts += 1
            if self.restarts > MAX_MAP_RESTARTS:
                raise ShardlockError("its map kept changing while it was read")
            self.members, self.epoch, self.count = [], 0, 0
            return False
        if not 0 < reply.member_count <= _router.MAX_MEMBERS:
            raise ShardlockError("a map of %d members" % reply.member_count)
        if (reply.first_member != len(self.members) or not reply.members or
                len(self.members) + len(reply.members) > reply.member_count):
            raise ShardlockError("a MAP_REPLY page that does not continue the map")
        self.epoch, self.count = reply.epoch, reply.member_count
        self.members += reply.members
        return len(self.members) == self.count


class Routing:
    """Where each key's calls go: the one server, the static Router over
    several, or (cluster mode) the owner under the current map. The map is
    swapped whole under a lock; a reader keeps the one it took. Each member
    address is resolved once per client."""

    def __init__(self, seeds: List[Node], family: int, static: Optional[StaticRoute]) -> None:
        self.seeds = seeds
        self.family = family
        self.static = static
        self.map: Optional[ClusterMap] = None
        self._lock = threading.Lock()
        self._nodes_by_text: Dict[str, Node] = {seed.text: seed for seed in seeds}

    def route(self, key: bytes) -> Tuple[Node, Optional[ClusterMap]]:
        """Where a call on `key` goes, and the map that said so (None: not
        in cluster mode)."""
        current = self.map
        if current is not None:
            return current.owner_of(key), current
        if self.static is not None:
            return self.static.owner_of(key), None
        return self.seeds[0], None

    @property
    def epoch(self) -> Optional[int]:
        """The epoch every request carries in cluster mode; None otherwise."""
        current = self.map
        return current.epoch if current is not None else None

    def members(self) -> List[Tuple[str, str, int]]:
        """The map's members as (id, "host:port", weight), sorted by id (as
        bytes); empty without a map."""
        current = self.map
        if current is None:
            return []
        return [(member_id.decode("utf-8", errors="replace"), address, weight)
                for member_id, address, weight in current.members]

    def refresh_sources(self, first: Optional[Node] = None,
                        last: Optional[Node] = None) -> List[Node]:
        """Whom to ask for a newer map, each once: `first` (a node that
        redirected: its map is newer), the current map's members, the seeds,
        then `last` (a node that stopped answering)."""
        sources: List[Node] = []
        current = self.map
        for node in [first] + (current.nodes if current else []) + self.seeds:
            if node is not None and node != last and node not in sources:
                sources.append(node)
        if last is not None:
            sources.append(last)
        return sources

    def build(self, pages: MapPages) -> ClusterMap:
        """The whole map `pages` gathered, each member address resolved once
        per client."""
        nodes: Dict[str, Node] = {}
        for _, address, _ in pages.members:
            node = self._nodes_by_text.get(address)
            if node is None:
                try:
                    node = resolve(address, self.family)
                except ValueError as error:
                    raise ShardlockError("member address: %s" % error) from None
                with self._lock:
                    node = self._nodes_by_text.setdefault(address, node)
            nodes[address] = node
        try:
            return ClusterMap(pages.epoch, pages.members, nodes)
        except ValueError as error:
            raise ShardlockError("a map the router refuses (%s)" % error) from None

    def adopt(self, fetched: ClusterMap) -> None:
        """Makes `fetched` the map if it is newer than the current one."""
        with self._lock:
            if self.map is None or fetched.epoch > self.map.epoch:
                self.map = fetched
