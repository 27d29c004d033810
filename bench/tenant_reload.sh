#!/usr/bin/env bash
# Reloading a large tenant file under load: shardlockd serves TENANTS
# tenants (default 1,000) from a file, shardlock-bench drives CLIENTS (50)
# clients of one of them against it, and the file is swapped between two
# versions and SIGHUPed RELOADS times (default 20) while the bench runs.
# The two versions differ in half of the other tenants (500 removed, 500
# added, so both reloads add and remove tenants), in the bench tenant's
# rights (acquire,query vs acquire) and in a next key it gains and loses;
# both permit everything the bench sends. The security issue's goal: no
# request refused that the old or the new file permits, so the bench must
# see no error at all (no permission_denied, no timeout from a datagram
# dropped as unverifiable). A run without reloads comes first, for the
# pairs/s the reloads cost (same machine, same minute).
#
#   bench/tenant_reload.sh [BUILD_DIR]      (default build/release)
#
# Environment: TENANTS, RELOADS, CLIENTS, DURATION (each run, default 10s),
# BASELINE=0 to skip the run without reloads (make test's short run).
# Exit 1 when a reload failed or the bench saw an error.
set -euo pipefail

build=${1:-build/release}
daemon=$build/tools/shardlockd
bench=$build/tools/shardlock-bench
tenants=${TENANTS:-1000}
reloads=${RELOADS:-20}
clients=${CLIENTS:-50}
duration=${DURATION:-10s}

for tool in "$daemon" "$bench"; do
  [ -x "$tool" ] || { echo "tenant_reload: $tool not built (make build-release)" >&2; exit 1; }
done
[ "$tenants" -ge 4 ] || { echo "tenant_reload: TENANTS must be at least 4" >&2; exit 1; }

dir=$(mktemp -d)
daemon_pid=
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT

# Both versions of the file, with every key inline (key=HEX): version a has
# tenants 2..TENANTS, version b the upper half of them and as many new ones.
python3 - "$dir" "$tenants" <<'EOF'
import os, secrets, sys
out, n = sys.argv[1], int(sys.argv[2])
keys = {i: secrets.token_hex(32) for i in range(1, n + n // 2 + 1)}
next_key = secrets.token_hex(32)
with open(os.path.join(out, "bench.key"), "w") as f:
    f.write(keys[1] + "\n")
os.chmod(os.path.join(out, "bench.key"), 0o600)
def write(name, ids, bench_rights, with_next):
    lines = ["tenant bench id=1 key=%s%s" % (keys[1], " next=" + next_key if with_next else ""),
             'allow bench "" %s' % bench_rights]
    for i in ids:
        lines.append("tenant t%d id=%d key=%s max-leases=100" % (i, i, keys[i]))
        lines.append('allow t%d "t%d/" acquire,query' % (i, i))
    path = os.path.join(out, name)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(path, 0o600)
write("tenants.a", range(2, n + 1), "acquire,query", False)
write("tenants.b", range(n // 2 + 1, n + n // 2 + 1), "acquire", True)
EOF
cp "$dir/tenants.a" "$dir/tenants"

port=$(python3 -c "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
"$daemon" --listen "127.0.0.1:$port" --data-dir "$dir/data" --tenants "$dir/tenants" \
  >"$dir/daemon.out" 2>"$dir/daemon.log" &
daemon_pid=$!
for _ in $(seq 100); do
  grep -q '"event":"ready"' "$dir/daemon.out" 2>/dev/null && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$dir/daemon.log" >&2; exit 1; }
  sleep 0.1
done
grep -q '"event":"ready"' "$dir/daemon.out" || { echo "tenant_reload: shardlockd never got ready" >&2; exit 1; }

# A field of a JSON document given on stdin (python3, so no jq is needed).
field() { python3 -c "import json, sys; v = json.load(sys.stdin).get(sys.argv[1]); print(json.dumps(v, separators=(',', ':')) if isinstance(v, (dict, list, bool)) or v is None else v)" "$1"; }

run_bench() {
  "$bench" --server "127.0.0.1:$port" --auth-key "$dir/bench.key" --tenant 1 --json \
    --duration "$duration" --pack 1 --batch 1 --theta 0 --clients "$clients"
}

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(lscpu | grep 'Model name' | sed 's/Model name: *//'), $(nproc) CPUs, kernel $(uname -r)"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $tenants tenants in the file, $clients clients of one, $duration per run, --pack 1"
if [ "${BASELINE:-1}" = 0 ]; then
  quiet='{"pairs_per_s":"-","errors":0,"errors_by_kind":{}}'
else
  quiet=$(run_bench)
fi

run_bench >"$dir/bench.json" &
bench_pid=$!
seconds=$(python3 -c "import re, sys; v, u = re.fullmatch(r'(\d+)(ms|s|m)', sys.argv[1]).groups(); print(int(v) * {'ms': 0.001, 's': 1, 'm': 60}[u])" "$duration")
interval=$(python3 -c "print(max(0.05, $seconds * 0.8 / $reloads))")
sleep "$(python3 -c "print($seconds * 0.1)")"
sent=0
for i in $(seq "$reloads"); do
  kill -0 "$bench_pid" 2>/dev/null || break
  version=$([ $((i % 2)) -eq 1 ] && echo b || echo a)
  cp "$dir/tenants.$version" "$dir/tenants.new" && mv "$dir/tenants.new" "$dir/tenants"
  kill -HUP "$daemon_pid"
  sent=$((sent + 1))
  sleep "$interval"
done
wait "$bench_pid" || true
sleep 0.2  # the last reload's log line

reloaded=$(grep -c "reloaded .* tenant(s)" "$dir/daemon.log" || true)
bad=$(grep -c "kept the tenants in force" "$dir/daemon.log" || true)
loaded=$(field ok <"$dir/bench.json" 2>/dev/null || echo false)
errors=$(field errors <"$dir/bench.json" 2>/dev/null || echo "?")
printf '| run | pairs/s | errors | errors by kind | reloads |\n|---|---|---|---|---|\n'
printf '| no reload | %s | %s | %s | 0 |\n' "$(field pairs_per_s <<<"$quiet")" \
  "$(field errors <<<"$quiet")" "$(field errors_by_kind <<<"$quiet")"
printf '| %d SIGHUPs | %s | %s | %s | %d of %d applied |\n' "$sent" \
  "$(field pairs_per_s <"$dir/bench.json")" "$errors" "$(field errors_by_kind <"$dir/bench.json")" \
  "$reloaded" "$sent"
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$loaded" != true ] || [ "$errors" != 0 ] || [ "$bad" != 0 ] || [ "$reloaded" != "$sent" ] ||
   [ "$(field errors <<<"$quiet")" != 0 ]; then
  echo "tenant_reload: FAILED (bench ok=$loaded errors=$errors, $reloaded of $sent reloads applied, $bad refused)" >&2
  tail -5 "$dir/daemon.log" >&2
  exit 1
fi
echo "tenant_reload: every request answered across $reloaded reloads of a $tenants-tenant file"
