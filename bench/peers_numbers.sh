#!/usr/bin/env bash
# shardlock beside the lock recipes people use today, in one run, each row
# at equal batching, so no row wins by batching more than its peer:
#
#   1. one request per datagram (shardlock-bench --pack 1 --batch 1) against
#      Redis unpipelined (redis-benchmark -P 1), 50 clients;
#   2. 16 requests per datagram (--pack 16 --batch 16) against Redis with 16
#      commands pipelined per connection (-P 16), 50 clients;
#   3. shardlock's default (--pack 64: up to 64 clients' requests share a
#      datagram) against Redis unpipelined, the README's old headline, so
#      it is labelled as what it is;
#   4. 16 lockers, one request in flight each: shardlock --pack 1 against
#      etcd's own Go lock (clientv3/concurrency.Mutex, 16 goroutines with a
#      session each, bench/etcd_mutex), built here from Debian's
#      golang-etcd-server-dev against a one-member etcd.
#
# Redis: acquire = SET key owner NX PX 30000, release = EVALSHA of the
# compare-and-delete script; pairs/s = 1 / (1/SET rps + 1/EVALSHA rps), as in
# bench/redis_side_by_side.sh. Every process binds 127.0.0.1, runs under
# `timeout`, and is stopped on exit.
#
#   bench/peers_numbers.sh [BUILD_DIR]     (default build/release)
#
# Environment: DURATION (each shardlock and etcd run, default 5s), KEYS (key
# space, default 100000), REDIS_PORT (default 16392), ETCD_PORT (default
# 23790; the peer port is the next one).
set -euo pipefail

build=${1:-build/release}
bench=$build/tools/shardlock-bench
duration=${DURATION:-5s}
keys=${KEYS:-100000}
redis_port=${REDIS_PORT:-16392}
etcd_port=${ETCD_PORT:-23790}
step_timeout=120
here=$(cd "$(dirname "$0")" && pwd)

die() { echo "peers_numbers: $*" >&2; exit 1; }
for tool in redis-server redis-cli redis-benchmark etcd go python3 timeout; do
  command -v "$tool" >/dev/null || die "$tool not found (tools/install-deps.sh --peers)"
done
[ -d /usr/share/gocode/src/go.etcd.io/etcd/clientv3/concurrency ] ||
  die "etcd's Go client sources not found (golang-etcd-server-dev; tools/install-deps.sh --peers)"
[ -x "$bench" ] || die "$bench not built (make build-release)"

work=$(mktemp -d /tmp/shardlock-peers-numbers-XXXXXX)
pids=()
cli() { timeout 10 redis-cli -h 127.0.0.1 -p "$redis_port" "$@"; }
cleanup() {
  cli shutdown nosave >/dev/null 2>&1 || true
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

cli ping >/dev/null 2>&1 && die "something already answers on 127.0.0.1:$redis_port; set REDIS_PORT"
timeout 900 redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
  --protected-mode yes --dir "$work" --logfile "$work/redis.log" &
pids+=($!)
timeout 900 etcd --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
  --initial-cluster "default=http://127.0.0.1:$((etcd_port + 1))" >"$work/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  cli ping >/dev/null 2>&1 && timeout 2 etcdctl --endpoints "127.0.0.1:$etcd_port" endpoint health \
    >/dev/null 2>&1 && break
  sleep 0.1
done
cli ping >/dev/null || die "redis-server did not start ($(tail -3 "$work/redis.log"))"

echo "building bench/etcd_mutex against Debian's etcd client sources ..." >&2
GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$work/gocache" GOFLAGS= \
  timeout 300 go build -o "$work/etcd_mutex" "$here/etcd_mutex/main.go"

release_lua="if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
sha=$(cli script load "$release_lua")

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "CPU: $cpu ($(nproc) cores), $(uname -sr), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2

shardlock() {  # NAME CLIENTS PACK BATCH
  echo "shardlock-bench: $2 clients, --pack $3 --batch $4, $duration ..." >&2
  timeout "$step_timeout" "$bench" --json --clients "$2" --pack "$3" --batch "$4" \
    --keys "$keys" --duration "$duration" >"$work/shardlock_$1.json"
}
redis() {  # NAME CLIENTS PIPELINE REQUESTS
  echo "redis-benchmark: $2 clients, -P $3, $4 SET NX PX and $4 EVALSHA ..." >&2
  cli flushall >/dev/null
  timeout "$step_timeout" redis-benchmark -h 127.0.0.1 -p "$redis_port" -c "$2" -P "$3" -n "$4" \
    -r "$keys" --csv SET 'lock:__rand_int__' owner NX PX 30000 >"$work/redis_set_$1.csv"
  timeout "$step_timeout" redis-benchmark -h 127.0.0.1 -p "$redis_port" -c "$2" -P "$3" -n "$4" \
    -r "$keys" --csv EVALSHA "$sha" 1 'lock:__rand_int__' owner >"$work/redis_release_$1.csv"
}

shardlock pack1 50 1 1
redis p1 50 1 200000
shardlock batch16 50 16 16
redis p16 50 16 1000000
shardlock default 50 64 1
shardlock pack1_16 16 1 1
echo "etcd concurrency.Mutex: 16 goroutines, $duration ..." >&2
timeout "$step_timeout" "$work/etcd_mutex" -endpoints "127.0.0.1:$etcd_port" -goroutines 16 \
  -keys "$keys" -duration "$duration" >"$work/etcd_mutex.txt"

python3 - "$work" "$cpu" <<'PY'
import csv, json, sys

work, cpu = sys.argv[1], sys.argv[2]

def shardlock(name):
    return json.load(open(f"{work}/shardlock_{name}.json"))["pairs_per_s"]

def redis(name):
    def rps(path):
        with open(path) as f:
            return float(list(csv.DictReader(f))[-1]["rps"])
    return 1.0 / (1.0 / rps(f"{work}/redis_set_{name}.csv") +
                  1.0 / rps(f"{work}/redis_release_{name}.csv"))

fields = open(f"{work}/etcd_mutex.txt").read().split()
etcd = float(fields[fields.index("pairs_per_s") + 1])

rows = [
    ("one request per datagram / unpipelined", "shardlock --pack 1, 50 clients",
     shardlock("pack1"), "Redis SET NX PX + Lua release, -P 1, 50 clients", redis("p1")),
    ("16 requests per datagram / 16 pipelined", "shardlock --pack 16 --batch 16, 50 clients",
     shardlock("batch16"), "Redis, -P 16, 50 clients", redis("p16")),
    ("unequal: shardlock packs clients' requests", "shardlock default (--pack 64), 50 clients",
     shardlock("default"), "Redis, -P 1, 50 clients", redis("p1")),
    ("one request in flight per locker", "shardlock --pack 1, 16 clients",
     shardlock("pack1_16"), "etcd clientv3/concurrency.Mutex, 16 goroutines", etcd),
]
print()
print(f"== peers: acquire+release pairs/s on loopback, one run (CPU: {cpu})")
print(f"| batching | shardlock | pairs/s | peer | pairs/s | ratio |")
print(f"|---|---|---|---|---|---|")
for batching, mine_name, mine, theirs_name, theirs in rows:
    print(f"| {batching} | {mine_name} | {mine:,.0f} | {theirs_name} | {theirs:,.0f} | "
          f"{mine / theirs:.2f}x |")
print()
print("goal: >= 3x at --pack 1 against Redis -P 1")
PY
