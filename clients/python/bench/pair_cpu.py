#!/usr/bin/env python3
"""Client CPU per acquire+release pair: shardlock's Python client against
redis-py's Lock, each library through its own server on loopback.

    python3 clients/python/bench/pair_cpu.py \
        --shardlockd build/release/tools/shardlockd [--redis-server /usr/bin/redis-server] \
        [--pairs 3000] [--processes 1,16] [--rounds 3]

Starts `shardlockd --listen 127.0.0.1:0 --lock-delay 0` and `redis-server`
on a free loopback port with `--save '' --appendonly no`, and stops both at
the end. For each process count P and each variant, P worker processes run
`--pairs` uncontended pairs each (worker i on its own key) after a warm-up,
and report the CPU time their whole process used (getrusage(RUSAGE_SELF):
every thread, user + system) divided by the pairs. Servers' CPU is not
counted. Variants run in turns, in a different order each round, and the
table shows each variant's median over the rounds, so the noise of a shared
machine hits them alike; compare the ratios, not the absolute numbers.

Variants (the idiomatic way to hold a lock for a block):
    redis-py Lock            with r.lock(key, timeout=10): ...
    shardlock Client         with client.lock(key, ttl=10): ...   (watchdog on)
    redis-py asyncio Lock    async with r.lock(key, timeout=10): ...
    shardlock AsyncClient    async with client.lock(key, ttl=10): ...

Needs python3-redis (Debian) for the redis rows; they are left out without it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import shutil
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)

VARIANTS = ["redis", "shardlock", "redis-async", "shardlock-async"]
LABELS = {
    "redis": "redis-py Lock (SET NX PX, EVALSHA release)",
    "shardlock": "shardlock Client.lock (watchdog on)",
    "redis-async": "redis-py asyncio Lock",
    "shardlock-async": "shardlock AsyncClient.lock",
}
PEER = {"shardlock": "redis", "shardlock-async": "redis-async"}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---- one worker process -------------------------------------------------------


def _sync_pairs(variant: str, address: str, key: str):
    """A function running n pairs, and a closer."""
    if variant == "redis":
        import redis
        host, port = address.rsplit(":", 1)
        r = redis.Redis(host=host, port=int(port))

        def run(n: int) -> None:
            for _ in range(n):
                with r.lock(key, timeout=10):
                    pass
        return run, r.close
    sys.path.insert(0, PACKAGE_ROOT)
    import shardlock
    client = shardlock.Client(address)

    def run(n: int) -> None:
        for _ in range(n):
            with client.lock(key, ttl=10):
                pass
    return run, client.close


async def _async_pairs(variant: str, address: str, key: str, warmup: int, pairs: int):
    if variant == "redis-async":
        import redis.asyncio as aioredis
        host, port = address.rsplit(":", 1)
        r = aioredis.Redis(host=host, port=int(port))

        async def run(n: int) -> None:
            for _ in range(n):
                async with r.lock(key, timeout=10):
                    pass
        closer = r.close
    else:
        sys.path.insert(0, PACKAGE_ROOT)
        import shardlock
        client = await shardlock.AsyncClient.connect(address)

        async def run(n: int) -> None:
            for _ in range(n):
                async with client.lock(key, ttl=10):
                    pass
        closer = client.close
    await run(warmup)
    _wait_for_go()
    cpu0, wall0 = _cpu(), time.perf_counter()
    await run(pairs)
    cpu1, wall1 = _cpu(), time.perf_counter()
    await closer()
    return cpu1 - cpu0, wall1 - wall0


def _wait_for_go() -> None:
    """Tells the parent this worker is warm, then waits for its go (so all
    P workers measure at once)."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()


def worker(variant: str, address: str, key: str, pairs: int, warmup: int) -> None:
    if variant.endswith("-async"):
        import asyncio
        cpu, wall = asyncio.run(_async_pairs(variant, address, key, warmup, pairs))
    else:
        run, close = _sync_pairs(variant, address, key)
        run(warmup)
        _wait_for_go()
        cpu0, wall0 = _cpu(), time.perf_counter()
        run(pairs)
        cpu, wall = _cpu() - cpu0, time.perf_counter() - wall0
        close()
    print(json.dumps({"cpu": cpu, "wall": wall, "pairs": pairs}))


# ---- the parent -------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(binary: str):
    port = _free_port()
    process = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                                "--appendonly", "no", "--protected-mode", "yes"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process, "127.0.0.1:%d" % port
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise SystemExit("redis-server did not start on port %d" % port)


def start_shardlockd(binary: str):
    process = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--lock-delay", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    ready, _, _ = select.select([process.stdout], [], [], 30)
    line = process.stdout.readline() if ready else b""
    if not line:
        process.kill()
        raise SystemExit("shardlockd did not start")
    return process, "127.0.0.1:%d" % json.loads(line)["port"]


def run_variant(variant: str, address: str, processes: int, pairs: int, warmup: int) -> float:
    """CPU microseconds per pair over `processes` workers run at once."""
    workers = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", variant,
                                 "--address", address, "--key", "bench/%d" % i,
                                 "--pairs", str(pairs), "--warmup", str(warmup)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for i in range(processes)]
    for w in workers:
        if w.stdout.readline().strip() != "ready":
            raise SystemExit("a %s worker failed" % variant)
    for w in workers:
        w.stdin.write("go\n")
        w.stdin.flush()
    cpu = total = 0.0
    for w in workers:
        out, _ = w.communicate()
        result = json.loads(out.strip().splitlines()[-1])
        cpu += result["cpu"]
        total += result["pairs"]
    return cpu / total * 1e6


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shardlockd", default=os.environ.get("SHARDLOCKD"))
    parser.add_argument("--redis-server", default=shutil.which("redis-server"))
    parser.add_argument("--pairs", type=int, default=3000, help="measured pairs per worker")
    parser.add_argument("--warmup", type=int, default=300, help="unmeasured pairs first")
    parser.add_argument("--processes", default="1,16", help="comma-separated process counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.address, args.key, args.pairs, args.warmup)
        return
    if not args.shardlockd:
        raise SystemExit("pass --shardlockd PATH (or set SHARDLOCKD)")
    variants = args.variants.split(",")
    try:
        import redis  # noqa: F401
        have_redis = args.redis_server is not None
    except ImportError:
        have_redis = False
    if not have_redis:
        print("python3-redis or redis-server missing: redis rows left out", file=sys.stderr)
        variants = [v for v in variants if not v.startswith("redis")]
    servers = []
    try:
        shardlockd, shardlock_address = start_shardlockd(args.shardlockd)
        servers.append(shardlockd)
        redis_address = None
        if have_redis:
            redis_process, redis_address = start_redis(args.redis_server)
            servers.append(redis_process)
        counts = [int(c) for c in args.processes.split(",")]
        results = {}
        for processes in counts:
            samples = {v: [] for v in variants}
            for round_number in range(args.rounds):
                order = variants[round_number % len(variants):] + \
                    variants[:round_number % len(variants)]
                for v in order:
                    address = redis_address if v.startswith("redis") else shardlock_address
                    samples[v].append(run_variant(v, address, processes, args.pairs,
                                                  args.warmup))
            results[processes] = {v: statistics.median(s) for v, s in samples.items()}
    finally:
        for process in servers:
            process.terminate()
            process.wait()
    print("CPU: %s, %d online; Python %s" % (cpu_model(), os.cpu_count() or 0,
                                             sys.version.split()[0]))
    print("client CPU per acquire+release pair, µs (median of %d rounds, %d pairs per process)"
          % (args.rounds, args.pairs))
    print()
    print("| variant | " + " | ".join("%d process%s" % (c, "" if c == 1 else "es")
                                     for c in counts) + " |")
    print("|---|" + "---:|" * len(counts))
    for v in variants:
        cells = []
        for c in counts:
            cell = "%.1f" % results[c][v]
            peer = PEER.get(v)
            if peer in results[c]:
                cell += " (%.2f×)" % (results[c][v] / results[c][peer])
            cells.append(cell)
        print("| %s | %s |" % (LABELS[v], " | ".join(cells)))
    print()
    print("(×: shardlock's CPU per pair over redis-py's, same run; below 1 is cheaper)")


if __name__ == "__main__":
    main()
