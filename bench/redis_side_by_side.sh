#!/usr/bin/env bash
# shardlock-bench side by side with Redis's lock recipe, on loopback.
#
#   bench/redis_side_by_side.sh [PATH/TO/shardlock-bench [PATH/TO/udp-echo-floor]]
#
# Redis: acquire = SET key owner NX PX 30000, release = EVALSHA of the
# compare-and-delete Lua script (GET == owner -> DEL), each through
# redis-benchmark, unpipelined. shardlock: shardlock-bench acquire+release
# pairs against its embedded server. Both at 1 and at 50 clients over the
# same key space. Prints pairs/s and per-request p50/p99 with ratios, and in
# the same run the bare UDP echo floor (udp-echo-floor, blocking and
# busy-polling) that bounds any one-client round trip on this host.
#
# Environment: DURATION (shardlock run per client count, default 5s),
# KEYS (key space, default 100000), REDIS_PORT (default 16391; never the
# default 6379, so a real Redis on this host is left alone), THETA (Zipf skew
# for shardlock-bench, default 0.99; redis-benchmark draws keys uniformly).
#
# redis-server runs on 127.0.0.1 only, without persistence, under `timeout`,
# and is shut down on exit whatever happens. Every step is bounded in time.
set -euo pipefail

bench=${1:-build/release/tools/shardlock-bench}
echo_floor=${2:-$(dirname "$(dirname "$bench")")/bench/udp-echo-floor}
duration=${DURATION:-5s}
keys=${KEYS:-100000}
port=${REDIS_PORT:-16391}
theta=${THETA:-0.99}
client_counts=(1 50)
# redis-benchmark runs a request count, not a duration; these take a few
# seconds each on a small machine and are hard-capped by `timeout` below.
declare -A redis_requests=([1]=30000 [50]=200000)
step_timeout=120

for tool in redis-server redis-cli redis-benchmark python3; do
  command -v "$tool" >/dev/null || { echo "redis_side_by_side: $tool not found (make bench-redis installs it)" >&2; exit 1; }
done
[ -x "$bench" ] || { echo "redis_side_by_side: $bench not built (make build-release)" >&2; exit 1; }
[ -x "$echo_floor" ] || { echo "redis_side_by_side: $echo_floor not built (make build-release)" >&2; exit 1; }

cli() { timeout 10 redis-cli -h 127.0.0.1 -p "$port" "$@"; }

if cli ping >/dev/null 2>&1; then
  echo "redis_side_by_side: something already answers on 127.0.0.1:$port; set REDIS_PORT" >&2
  exit 1
fi

workdir=$(mktemp -d)
redis_pid=""
cleanup() {
  if [ -n "$redis_pid" ] && kill -0 "$redis_pid" 2>/dev/null; then
    cli shutdown nosave >/dev/null 2>&1 || kill "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
  fi
  rm -rf "$workdir"
}
trap cleanup EXIT INT TERM

# At most 15 minutes of Redis, whatever happens to this script.
timeout 900 redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
  --protected-mode yes --dir "$workdir" --logfile "$workdir/redis.log" &
redis_pid=$!
for _ in $(seq 1 50); do
  cli ping >/dev/null 2>&1 && break
  sleep 0.1
done
cli ping >/dev/null || { echo "redis_side_by_side: redis-server did not start" >&2; cat "$workdir/redis.log" >&2; exit 1; }

release_lua="if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
sha=$(cli script load "$release_lua")

echo "machine: $(nproc) CPUs, $(uname -sr), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "redis: $(redis-server --version | cut -d' ' -f3) on 127.0.0.1:$port; key space $keys; shardlock theta $theta, redis uniform" >&2

floor_seconds=${duration%s}
case "$floor_seconds" in ''|*[!0-9]*) floor_seconds=5 ;; esac
for mode in blocking busy-poll; do
  echo "udp-echo-floor: $mode, ${floor_seconds}s ..." >&2
  timeout "$step_timeout" "$echo_floor" --mode "$mode" --duration "$floor_seconds" --json \
    >"$workdir/floor_$mode.json"
done

for c in "${client_counts[@]}"; do
  echo "shardlock-bench: $c client(s), $duration ..." >&2
  timeout "$step_timeout" "$bench" --json --clients "$c" --keys "$keys" --theta "$theta" --duration "$duration" \
    >"$workdir/shardlock_$c.json"
  n=${redis_requests[$c]}
  echo "redis-benchmark: $c client(s), $n SET NX PX and $n EVALSHA ..." >&2
  cli flushall >/dev/null
  timeout "$step_timeout" redis-benchmark -h 127.0.0.1 -p "$port" -c "$c" -n "$n" -r "$keys" --csv \
    SET 'lock:__rand_int__' owner NX PX 30000 >"$workdir/redis_set_$c.csv"
  timeout "$step_timeout" redis-benchmark -h 127.0.0.1 -p "$port" -c "$c" -n "$n" -r "$keys" --csv \
    EVALSHA "$sha" 1 'lock:__rand_int__' owner >"$workdir/redis_release_$c.csv"
done

python3 - "$workdir" "${client_counts[@]}" <<'PY'
import csv, json, sys

workdir, counts = sys.argv[1], sys.argv[2:]

def redis_row(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    r = rows[-1]
    return {k: float(r[k]) for k in ("rps", "p50_latency_ms", "p99_latency_ms")}

def fmt_ratio(x):
    return f"{x:6.2f}x"

print()
print("shardlock vs Redis lock recipe, loopback, unpipelined (one request in flight per client)")
print("  pairs/s: acquire+release pairs per second. Redis: 1 / (1/SET rps + 1/EVALSHA rps),")
print("           since each client alternates the two commands.")
print("  p50/p99: one request's round trip, in microseconds. Redis: the mean of the SET and")
print("           EVALSHA percentiles (a request in an even mix of the two).")
print()
print(f"  {'clients':>7}  {'metric':<10} {'shardlock':>12} {'redis':>12} {'ratio':>8}")
summary = {}
for c in counts:
    s = json.load(open(f"{workdir}/shardlock_{c}.json"))
    set_ = redis_row(f"{workdir}/redis_set_{c}.csv")
    rel = redis_row(f"{workdir}/redis_release_{c}.csv")
    redis_pairs = 1.0 / (1.0 / set_["rps"] + 1.0 / rel["rps"])
    redis_p50 = 1000 * (set_["p50_latency_ms"] + rel["p50_latency_ms"]) / 2
    redis_p99 = 1000 * (set_["p99_latency_ms"] + rel["p99_latency_ms"]) / 2
    rows = [
        ("pairs/s", s["pairs_per_s"], redis_pairs, s["pairs_per_s"] / redis_pairs),
        ("p50 us", s["latency_us"]["p50"], redis_p50, s["latency_us"]["p50"] / redis_p50),
        ("p99 us", s["latency_us"]["p99"], redis_p99, s["latency_us"]["p99"] / redis_p99),
    ]
    for name, mine, theirs, ratio in rows:
        print(f"  {c:>7}  {name:<10} {mine:12.1f} {theirs:12.1f} {fmt_ratio(ratio):>8}")
    print(f"  {'':>7}  (redis SET {set_['rps']:.0f}/s p50 {1000*set_['p50_latency_ms']:.0f} us p99 {1000*set_['p99_latency_ms']:.0f} us;"
          f" EVALSHA {rel['rps']:.0f}/s p50 {1000*rel['p50_latency_ms']:.0f} us p99 {1000*rel['p99_latency_ms']:.0f} us;"
          f" shardlock busy {s['busy']}, errors {s['errors']}, retransmissions {s['retransmissions']})")
    summary[c] = rows
print()
print("  the floor: a bare UDP echo on loopback, one datagram in flight (udp-echo-floor), same run")
floor = {m: json.load(open(f"{workdir}/floor_{m}.json")) for m in ("blocking", "busy-poll")}
print(f"  {'':>7}  {'metric':<10} {'echo':>12} {'shardlock/echo':>16}")
one = json.load(open(f"{workdir}/shardlock_1.json")) if "1" in counts else None
for m in ("blocking", "busy-poll"):
    for q in ("p50", "p99"):
        e = floor[m]["latency_us"][q]
        ratio = f"{one['latency_us'][q] / e:6.2f}x" if one and e > 0 else "-"
        print(f"  {m:>9}  {q + ' us':<10} {e:12.1f} {ratio:>16}")
if one:
    print(f"  shardlock at 1 client: busy-poll {one.get('busy_poll_us', 0)} us, "
          f"{one.get('cpu_cores', 0):.2f} CPU cores (server + client, one process)")
print()
print("  goals: pairs/s ratio >= 3.00x at 50 clients; at 1 client p99 <= 0.50x Redis "
      "and <= 1.50x the busy-poll echo")
if "50" in summary:
    print(f"  measured: pairs/s at 50 clients {fmt_ratio(summary['50'][0][3]).strip()}", end="")
if "1" in summary:
    e99 = floor["busy-poll"]["latency_us"]["p99"]
    print(f", p99 at 1 client {fmt_ratio(summary['1'][2][3]).strip()} of Redis, "
          f"{one['latency_us']['p99'] / e99:.2f}x the busy-poll echo")
PY
