#!/usr/bin/env bash
# The Java client beside the C++ client in one run, against one release
# shardlockd it starts on loopback: acquire+release pairs/s at 1 and 16
# threads, one request in flight per thread and one request per datagram on
# both sides (shardlock-bench --pack 1 --theta 0: uniform keys, so pairs are
# the client's and the server's path, not contention; the Java benchmark's
# threads each have keys of their own). With --zookeeper, the same shape
# through ZooKeeper's own client and the standard lock recipe against a
# 3-server ensemble on loopback (ZkLockBenchmark; Debian's zookeeper
# package).
#
#   clients/java/bench-compare.sh [--zookeeper] [SECONDS] [BUILD_DIR]
#
# BUILD_DIR is a release build (default build/release): its
# tools/shardlockd and tools/shardlock-bench.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
zookeeper=0
if [ "${1:-}" = "--zookeeper" ]; then
  zookeeper=1
  shift
fi
seconds=${1:-5}
build=${2:-$here/../../build/release}
# shellcheck source=bench-common.sh
. "$here/bench-common.sh"

grep -m1 "model name" /proc/cpuinfo || true
echo "cores: $(nproc); load: $(cut -d' ' -f1-3 /proc/loadavg)"

"$build/tools/shardlockd" --listen 127.0.0.1:0 --lock-delay 0ms >"$work/d.out" 2>"$work/d.err" &
pids+=($!)
for _ in $(seq 100); do
  grep -q '"ready"' "$work/d.out" 2>/dev/null && break
  sleep 0.1
done
server=$(grep -o '"listen":"[^"]*"' "$work/d.out" | cut -d'"' -f4)
[ -n "$server" ] || { echo "shardlockd did not start: $(cat "$work/d.err")" >&2; exit 1; }

echo "== C++ client (shardlock-bench --server $server --pack 1 --theta 0)"
for clients in 1 16; do
  "$build/tools/shardlock-bench" --server "$server" --clients "$clients" --pack 1 --theta 0 \
    --duration "${seconds}s" --json |
    python3 -c 'import json,sys; r=json.loads(sys.stdin.readlines()[-1]); p=r["pair_latency_us"]; print("%-8d %12.0f %10.1f %10.1f" % (r["clients"], r["pairs_per_s"], p["p50"], p["p99"]))'
done
echo "== Java client (clients/java/bench.sh $server $seconds)"
BENCH_OUT=$work/java "$here/bench.sh" "$server" "$seconds"

if [ "$zookeeper" -eq 1 ]; then
  echo "== ZooKeeper's Java client, the lock recipe, a 3-server ensemble on loopback"
  BENCH_OUT=$work/zk "$here/bench-zookeeper.sh" "$seconds"
fi
