"""Regenerates router_vectors.json: key owners computed by the C++ Router.

    python3 clients/python/tests/make_router_vectors.py build/dev/tools/shardlock-route

runs shardlock-route (tools/shardlock_route.cc) with the cluster's options
(--bucket-bits 16, the default seed: cluster_router_options() in
src/cluster/cluster_map.cc) over each map below and the same keys, and writes the
owners next to this file. test_router.py checks that shardlock.router agrees.
Only the data is checked in; regenerate it when the maps or keys change.
"""

import json
import os
import random
import subprocess
import sys
import tempfile

# Members as (id, weight): 1..5 members, weights 1..3, ids that sort
# differently as text and as bytes, share prefixes, or are long.
MAPS = [
    [("n1", 1)],
    [("n1", 1), ("n2", 1)],
    [("n1", 1), ("n2", 2)],
    [("n1", 1), ("n2", 1), ("n3", 1)],
    [("n1", 3), ("n10", 1), ("n2", 2)],
    [("10.0.0.7:7420", 1), ("10.0.0.8:7420", 2), ("10.0.0.10:7420", 3), ("Z", 1)],
    [("a", 2), ("B", 1), ("\u00fcber", 3), ("node-\u03c9", 1), ("x" * 100, 2)],
    [("alpha", 1), ("beta", 1), ("gamma", 1), ("delta", 1), ("epsilon", 1)],
    [("m-1", 3), ("m-2", 3), ("m-3", 3), ("m-4", 3), ("m-5", 3)],
]


def keys():
    rng = random.Random(21)
    out = ["key-%d" % i for i in range(200)]
    for _ in range(100):
        length = rng.randint(1, 64)
        out.append("".join(chr(rng.randint(33, 126)) for _ in range(length)))
    out += ["orders/42", "\u00e9t\u00e9", "x" * 256]
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_router_vectors.py PATH/TO/shardlock-route")
    tool = sys.argv[1]
    key_list = keys()
    vectors = []
    with tempfile.TemporaryDirectory() as directory:
        for i, members in enumerate(MAPS):
            path = os.path.join(directory, "map%d.txt" % i)
            with open(path, "w", encoding="utf-8") as f:
                for member_id, weight in members:
                    f.write("%s %d\n" % (member_id, weight))
            out = subprocess.run([tool, path, "--bucket-bits", "16"],
                                 input="\n".join(key_list).encode("utf-8") + b"\n",
                                 stdout=subprocess.PIPE, check=True).stdout.decode("utf-8")
            owners = {}
            for line in out.splitlines():
                key, _, owner = line.rpartition("\t")
                owners[key] = owner
            if sorted(owners) != sorted(key_list):
                sys.exit("shardlock-route did not answer every key")
            vectors.append({"members": [[m, w] for m, w in members],
                            "owners": [[k, owners[k]] for k in key_list]})
    target = os.path.join(os.path.dirname(os.path.abspath(__file__)), "router_vectors.json")
    with open(target, "w", encoding="utf-8") as f:
        # One map per line, so a diff shows which map changed.
        f.write('{"generated_by": "clients/python/tests/make_router_vectors.py", '
                '"bucket_bits": 16, "seed": "0x53484152444C4B31", "maps": [\n')
        f.write(",\n".join(json.dumps(v, ensure_ascii=False) for v in vectors))
        f.write("\n]}\n")

if __name__ == "__main__":
    main()
