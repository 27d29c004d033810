#!/usr/bin/env python3
"""The source tree's rooms, checked (docs/lease-server.md, "the request path,
room by room"; docs/cluster.md): which part may include which.

- The lease layer is three rooms, in include/shardlock/lease/ and src/lease/
  alike: wire (what every side agrees on), server and client. Server and
  client both use wire; neither includes the other; wire includes neither.
- Beside the rooms, at the top of include/shardlock/lease/ and src/lease/,
  sits what no datagram carries but more than one side uses (the duration
  parser, the protected resource's FencingValidator, the tenant table): a
  src/lease/<name>.cc only where include/shardlock/lease/<name>.h
  is its real header, not a forwarder. The top level may use wire, never
  server or client; wire never includes it. Anything else in src/lease/
  lies outside the rooms; include/shardlock/lease/ holds the rooms, those
  headers and the one-release forwarding headers, nothing else.
- Moved headers are included by their new paths: an old path only by its
  own forwarding header (MOVED).
- The core library (shardlock::shardlock: src/*.cc, and the headers
  outside include/shardlock/lease/ and include/shardlock/cluster/) includes
  nothing from the lease layer, and src/CMakeLists.txt compiles nothing but
  src/*.cc into it (core_problems()): a locks-only consumer needs no lease
  code. The cluster map's values, which use the wire's limits, are in
  shardlock::lease.
- The cluster layer's gRPC-free code (src/cluster/, include/shardlock/cluster/)
  includes nothing from src/cluster/etcd/ and no gRPC or protobuf header.
- No two units include each other (unit = a .h/.cc pair by stem, within
  src/lease/ and src/cluster/).
- The server's internal headers (include/shardlock/lease/server/internal/,
  and src/lease/server/'s own headers) never include the server.h facade:
  the types they need are in server_types.h.
- The cluster control facet (internal/cluster_control.h, LeaseServer's
  cluster hooks) is included only by the cluster layer (src/cluster/), the
  tests, and server.cc, which implements it.
- The client's and the wire's edges (client_and_wire_problems()): the
  reply decisions (src/lease/client/reply.*) do no I/O and take no lock; the
  lease layer takes its PRNG from shardlock/internal/random.h, never from the
  workload generators; the token format is included from the wire room, its
  old cluster/ path only by its forwarding header.

Usage: layout_test.py SOURCE_DIR. Prints every violation; exit 1 if any.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
ROOMS = ("wire", "server", "client")
ETCD_HEADERS = {"etcd_client.h", "etcd_call.h", "membership.h", "cluster_node.h"}


def sources(root, top):
    for dirpath, _, names in os.walk(os.path.join(root, top)):
        for name in sorted(names):
            if name.endswith((".h", ".cc", ".c")):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, root)


def includes(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return INCLUDE.findall(f.read())


def is_forwarder(root, path):
    """A one-release forwarding header: its only include is the new path."""
    with open(os.path.join(root, path), encoding="utf-8") as f:
        text = COMMENT.sub("", f.read())
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return len(lines) == 2 and lines[0] == "#pragma once" and len(INCLUDE.findall(text)) == 1


def top_level_unit(root, path):
    """A lease top-level unit: include/shardlock/lease/<name>.h that is not a
    forwarder, or src/lease/<name>.cc beside such a header."""
    if path.startswith("include/shardlock/lease/") and path.count("/") == 3:
        return path.endswith(".h") and not is_forwarder(root, path)
    if path.startswith("src/lease/") and path.count("/") == 2 and path.endswith(".cc"):
        header = "include/shardlock/lease/" + os.path.basename(path)[:-3] + ".h"
        return os.path.exists(os.path.join(root, header)) and not is_forwarder(root, header)
    return False


def room_of(path):
    """The lease room a file belongs to, or None."""
    for prefix in ("src/lease/", "include/shardlock/lease/"):
        if path.startswith(prefix):
            first = path[len(prefix):].split("/")[0]
            return first if first in ROOMS else None
    return None


def top_level_include(root, target):
    """Whether an include names a lease top-level unit's header."""
    return target.startswith("shardlock/lease/") and target.count("/") == 2 and \
        top_level_unit(root, "include/" + target)


def room_of_include(target):
    """The lease room an include names: a public "shardlock/lease/<room>/..."
    path, or a private "<room>/..." one from src/lease/."""
    for prefix in ("shardlock/lease/", ""):
        if target.startswith(prefix):
            first = target[len(prefix):].split("/")[0]
            if first in ROOMS and "/" in target[len(prefix):]:
                return first
    return None


SYSTEM_INCLUDE = re.compile(r'^\s*#\s*include\s*<([^>]+)>', re.MULTILINE)
# Headers that mean I/O, threads or locks: not in a pure decision.
IMPURE_HEADERS = re.compile(r"^(sys/|poll\.h|unistd\.h|thread$|mutex$|condition_variable$|"
                            r"atomic$|shardlock/mutex\.h|shardlock/lock_guard\.h|client/call_engine|"
                            r"client/transport|wire/udp)")
OLD_EPOCH_TOKEN = "shardlock/cluster/epoch_token.h"
# Old path -> new path of a header that moved out of a room; the old path is
# a one-release forwarding header that nothing else includes.
MOVED = {
    "shardlock/lease/wire/duration.h": "shardlock/lease/duration.h",
    "shardlock/lease/wire/fencing.h": "shardlock/lease/fencing.h",
}
TOP = "top level"


def client_and_wire_problems(root):
    """The client and wire rooms' own rules (see the module docstring)."""
    problems = []
    for path in sources(root, "src/lease/client"):
        if os.path.basename(path).split(".")[0] != "reply":
            continue
        with open(os.path.join(root, path), encoding="utf-8") as f:
            text = f.read()
        for target in INCLUDE.findall(text) + SYSTEM_INCLUDE.findall(text):
            if IMPURE_HEADERS.match(target):
                problems.append(f"{path}: a pure decision includes {target}")
    for top in ("src/lease", "include/shardlock/lease"):
        for path in sources(root, top):
            for target in includes(root, path):
                if target.startswith("shardlock/workload/"):
                    problems.append(f"{path}: the lease layer includes {target} "
                                    "(its PRNG is shardlock/internal/random.h)")
    for top in ("src", "include", "tools", "tests", "bench"):
        for path in sources(root, top):
            if path == "include/" + OLD_EPOCH_TOKEN:
                continue
            if OLD_EPOCH_TOKEN in includes(root, path):
                problems.append(f"{path}: includes {OLD_EPOCH_TOKEN} "
                                "(now shardlock/lease/wire/epoch_token.h)")
    return problems


CORE_TARGET_SOURCES = re.compile(r"target_sources\(shardlock\s+PRIVATE\s+([^)]*)\)")


def core_problems(root):
    """The core library: its sources and headers include no lease header."""
    problems = []
    core = [p for p in sources(root, "src") if p.count("/") == 1]
    core += [p for p in sources(root, "include/shardlock")
             if not p.startswith(("include/shardlock/lease/", "include/shardlock/cluster/"))]
    for path in core:
        for target in includes(root, path):
            if target.startswith("shardlock/lease/") or room_of_include(target) is not None:
                problems.append(f"{path}: the core library includes {target}")
    with open(os.path.join(root, "src/CMakeLists.txt"), encoding="utf-8") as f:
        listed = CORE_TARGET_SOURCES.findall(f.read())
    if listed != ["${core_sources}"]:
        problems.append("src/CMakeLists.txt: the core library's sources should be "
                        f"${{core_sources}} (src/*.cc) alone, not {listed}")
    return problems


def moved_problems(root):
    """MOVED: each old path is a forwarder to its new one, included by nothing else."""
    problems = []
    for old, new in sorted(MOVED.items()):
        old_file = "include/" + old
        if not os.path.exists(os.path.join(root, old_file)):
            continue  # its release is over and the forwarder gone
        if not is_forwarder(root, old_file) or includes(root, old_file) != [new]:
            problems.append(f"{old_file}: should only forward to {new}")
    for top in ("src", "include", "tools", "tests", "bench"):
        for path in sources(root, top):
            for target in includes(root, path):
                if target in MOVED and path != "include/" + target:
                    problems.append(f"{path}: includes {target} (now {MOVED[target]})")
    return problems


def main():
    root = sys.argv[1]
    problems = client_and_wire_problems(root) + moved_problems(root) + core_problems(root)

    allowed = {"wire": {"wire"}, "server": {"wire", "server", TOP},
               "client": {"wire", "client", TOP}, TOP: {"wire", TOP}}
    for top in ("src/lease", "include/shardlock/lease"):
        for path in sources(root, top):
            if path.endswith(".h") and is_forwarder(root, path):
                continue  # a one-release forwarding header
            room = room_of(path)
            if room is None:
                if not top_level_unit(root, path):
                    problems.append(f"{path}: outside the rooms ({', '.join(ROOMS)}), "
                                    "neither a top-level unit nor a forwarder")
                    continue
                room = TOP
            for target in includes(root, path):
                other = room_of_include(target)
                if other is None and top_level_include(root, target):
                    other = TOP
                if other is not None and other not in allowed[room]:
                    problems.append(f"{path}: the {room} room includes {target} ({other})")

    for top in ("src/cluster", "include/shardlock/cluster"):
        for path in sources(root, top):
            if path.startswith("src/cluster/etcd/"):
                continue
            for target in includes(root, path):
                name = os.path.basename(target)
                if (name in ETCD_HEADERS or target.startswith("etcd/") or "grpc" in target
                        or target.endswith(".pb.h")):
                    problems.append(f"{path}: gRPC-free code includes {target}")

    # Units: stem -> the stems of the project headers its .h and .cc include.
    units = {}
    for top in ("src/lease", "src/cluster"):
        for path in sources(root, top):
            stem = os.path.splitext(path)[0]
            deps = units.setdefault(stem, set())
            folder = os.path.dirname(path)
            for target in includes(root, path):
                for base in (folder, "src/lease", "src/cluster", "src/cluster/etcd", "include"):
                    candidate = os.path.normpath(os.path.join(base, target))
                    if os.path.exists(os.path.join(root, candidate)):
                        deps.add(os.path.splitext(candidate)[0])
                        break
    for stem, deps in sorted(units.items()):
        for other in sorted(deps):
            if other != stem and other < stem and stem in units.get(other, set()):
                problems.append(f"{stem} and {other} include each other")

    facade = "shardlock/lease/server/server.h"
    for top in ("include/shardlock/lease/server/internal", "src/lease/server"):
        for path in sources(root, top):
            if not path.endswith(".h"):
                continue
            for target in includes(root, path):
                if target == facade:
                    problems.append(f"{path}: an internal header includes the facade {target}")

    control = "shardlock/lease/server/internal/cluster_control.h"
    control_users = ("src/cluster/", "tests/")
    for top in ("src", "include", "tools", "bench", "tests"):
        for path in sources(root, top):
            if path.startswith(control_users) or path == "src/lease/server/server.cc":
                continue
            if control in includes(root, path):
                problems.append(f"{path}: includes {control} (the cluster layer's and tests' only)")

    for p in problems:
        print(p)
    print(f"layout: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
