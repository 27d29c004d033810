"""availability_probe.py SERVERS FREE_KEYS HELD_KEYS STOP_FILE OUT: how long
each key is refused to a new acquire while a cluster changes under it.

One asyncio task per key tries, over and over until STOP_FILE exists, an
acquire with no wait (and a release) through the project's Python client in
cluster mode (discover=True; REDIRECTs followed, the map refreshed):
  - FREE_KEYS (comma-separated) are free: a grant or a BUSY (a probe's own
    lease whose release was lost) is an answer; RECOVERING, no answer within
    the request timeout, or any other error is a refusal.
  - HELD_KEYS are held by other clients for the whole run: a BUSY is the
    answer; a grant is a violation (the key held twice), recorded and
    released at once.
A refusal window runs from the start of a key's first refused try to the end
of its next answered one. OUT gets one JSON line per window
{"key", "start", "end", "seconds", "reasons"} and per violation
{"violation", "key", "at"}, then a summary line {"tries", "answered"}.

Environment: PROBE_TIMEOUT (a try's request timeout, default 0.25 s),
PROBE_GAP (pause after each try, default 0.01 s), SHARDLOCK_PYTHON_PATH (the
client's directory, default clients/python beside this script's bench/).
"""
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.environ.get("SHARDLOCK_PYTHON_PATH",
                                  os.path.join(os.path.dirname(__file__), "..", "clients", "python")))
import shardlock  # noqa: E402

servers, free_text, held_text, stop_file, out_path = sys.argv[1:6]
timeout = float(os.environ.get("PROBE_TIMEOUT", "0.25"))
gap = float(os.environ.get("PROBE_GAP", "0.01"))
free_keys = [k for k in free_text.split(",") if k]
held_keys = [k for k in held_text.split(",") if k]
records = []
counts = {"tries": 0, "answered": 0}


async def probe(client, key, held):
    refused_since = None
    reasons = set()
    while not os.path.exists(stop_file):
        start = time.time()
        counts["tries"] += 1
        answered = True
        try:
            lease = await client.acquire(key, ttl=2.0, wait=0, watchdog=False)
            if held:
                records.append({"violation": True, "key": key, "at": time.time()})
            try:
                await lease.release()
            except shardlock.ShardlockError:
                pass  # the lease ends with its TTL; a later try may be BUSY
        except shardlock.BusyError:
            pass
        except shardlock.ShardlockError as error:
            answered = False
            reasons.add(type(error).__name__)
        end = time.time()
        if answered:
            counts["answered"] += 1
            if refused_since is not None:
                records.append({"key": key, "start": refused_since, "end": end,
                                "seconds": end - refused_since, "reasons": sorted(reasons)})
                refused_since = None
                reasons = set()
        elif refused_since is None:
            refused_since = start
        await asyncio.sleep(gap)
    if refused_since is not None:
        records.append({"key": key, "start": refused_since, "end": None,
                        "seconds": time.time() - refused_since, "reasons": sorted(reasons)})


async def main():
    client = await shardlock.AsyncClient.connect(servers, discover=True, request_timeout=timeout)
    try:
        await asyncio.gather(*[probe(client, k, False) for k in free_keys],
                             *[probe(client, k, True) for k in held_keys])
    finally:
        await client.close()
    with open(out_path, "w") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
        out.write(json.dumps(counts) + "\n")


asyncio.run(main())
