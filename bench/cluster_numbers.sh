#!/usr/bin/env bash
# The cluster's numbers, on loopback with a real etcd:
#   1. acquire+release pairs/s and p99 at 50 clients against a plain
#      shardlockd, a 1-node cluster, a 3-node cluster and a 3-node cluster
#      with `--replicas 2` (shardlock-bench --discover routes every key to
#      its owner), in one run; then the cost of replication: the replicated
#      cluster's 50-client pairs/s and 1-client p50 (of one request, and of
#      an acquire+release pair) against the 3-node cluster without it, from
#      the same interleaved rounds;
#   2. etcd requests per second at rest, under that lock load (with and
#      without replication), and per membership change (a node joining),
#      read from etcd's own /metrics
#      (grpc_server_msg_received_total: every request message, streams
#      included);
#   3. the unavailability window of a key whose node is killed with -9: from
#      the kill to the first grant by the new owner, next to its bound
#      (etcd lease TTL + lock-delay, where lock-delay = max TTL + etcd lease
#      TTL + 0.5 s drift margin).
#
#   bench/cluster_numbers.sh [BUILD_DIR]      (default build/release)
#
# Environment: DURATION (each bench run, default 10s), ROUNDS (interleaved
# rounds of the throughput runs, default 3; the table has each round
# and the medians), CLIENTS (default 50),
# MAX_TTL (the nodes' --max-ttl and the bench's --ttl, default 2s),
# ETCD_TTL (--etcd-lease-ttl, default 2s), BUSY_POLL (the nodes' --busy-poll-us,
# default 50), REPLICA_TIMEOUT (the replicated cluster's --replica-timeout,
# default 300ms, shardlockd's default), REPLICATED_FLAGS (more flags for the
# replicated cluster's nodes, e.g. `--replies-from primary`), COST_ONLY=1
# (only the 3-node rows and the cost of replication: no plain or 1-node
# rows, no sections 2 and 3). Everything binds 127.0.0.1, runs
# under `timeout`, and is killed on exit.
set -euo pipefail

build=${1:-build/release}
daemon=$build/tools/shardlockd
bench=$build/tools/shardlock-bench
ctl=$build/tools/shardlockctl
duration=${DURATION:-10s}
rounds=${ROUNDS:-3}
clients=${CLIENTS:-50}
max_ttl=${MAX_TTL:-2s}
etcd_ttl=${ETCD_TTL:-2s}
busy_poll=${BUSY_POLL:-50}
replica_timeout=${REPLICA_TIMEOUT:-300ms}

for tool in etcd curl jq python3; do
  command -v "$tool" >/dev/null || { echo "cluster_numbers: $tool not found (tools/install-deps.sh)" >&2; exit 1; }
done
for binary in "$daemon" "$bench" "$ctl"; do
  [ -x "$binary" ] || { echo "cluster_numbers: $binary not built (make build-release)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/shardlock-cluster-numbers-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  pkill -9 -f "$work" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
seconds_of() { python3 -c "import sys,re; v,u=re.fullmatch(r'(\d+)(ms|s)', sys.argv[1]).groups(); print(int(v)/(1000 if u=='ms' else 1))" "$1"; }
now() { date +%s.%N; }

etcd_port=$(free_port)
peer_port=$(free_port)
timeout 900 etcd --name=bench --data-dir="$work/etcd" \
  --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
  --listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
  --initial-cluster="bench=http://127.0.0.1:$peer_port" --log-level=warn >"$work/etcd.log" 2>&1 &
pids+=($!)
disown $!  # no job notices when the trap kills it
for _ in $(seq 100); do
  curl -fs "http://127.0.0.1:$etcd_port/health" | grep -q '"health":"true"' && break
  sleep 0.1
done

# Sum of etcd's request message counter.
etcd_requests() {
  curl -fs "http://127.0.0.1:$etcd_port/metrics" |
    awk '/^grpc_server_msg_received_total/ {sum += $NF} END {printf "%d\n", sum}'
}

declare -A node_pid node_addr
# start_node CLUSTER ID [FLAGS...]: a node of cluster CLUSTER (empty: a plain
# shardlockd), with FLAGS added.
start_node() {
  local cluster=$1 id=$2 port
  shift 2
  port=$(free_port)
  local args=(--listen "127.0.0.1:$port" --data-dir "$work/$cluster-$id" --max-ttl "$max_ttl")
  if [ -n "$cluster" ]; then
    # Cluster mode refuses a --lock-delay below --max-ttl; the default is it.
    args+=(--cluster "etcd://127.0.0.1:$etcd_port" --cluster-name "$cluster" --node-id "$id"
           --etcd-lease-ttl "$etcd_ttl")
  else
    args+=(--lock-delay 0)
  fi
  # Not under `timeout`: node_pid must be shardlockd itself, which kill -9
  # below aims at; the EXIT trap kills every node.
  "$daemon" "${args[@]}" "$@" --busy-poll-us "$busy_poll" >"$work/$cluster-$id.out" \
    2>"$work/$cluster-$id.err" &
  node_pid[$cluster-$id]=$!
  pids+=($!)
  disown $!
  node_addr[$cluster-$id]="127.0.0.1:$port"
  for _ in $(seq 300); do
    grep -q '"event":"ready"' "$work/$cluster-$id.out" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "cluster_numbers: node $cluster-$id did not start:" >&2
  cat "$work/$cluster-$id.err" >&2
  exit 1
}

# wait_grantable SERVERS: until every node of the cluster grants (a probe
# key per node, through discovery), at most 60 s.
wait_grantable() {
  local servers=$1 deadline=$((SECONDS + 60)) ok
  while [ $SECONDS -lt $deadline ]; do
    ok=1
    for i in $(seq 0 15); do
      if ! "$ctl" --server "$servers" --discover --timeout 500ms acquire "probe-$i" --ttl 1s >/dev/null 2>&1; then
        ok=0
        break
      fi
    done
    [ $ok = 1 ] && return 0
    sleep 0.2
  done
  echo "cluster_numbers: the cluster at $servers did not become grantable" >&2
  exit 1
}

# run_bench LABEL SERVERS CLIENTS [--discover]: one line of the throughput table.
declare -A pairs p99 p50 pair_p50
run_bench() {
  local label=$1 servers=$2 count=$3
  shift 3
  local json
  json=$(timeout 300 "$bench" --server "$servers" --clients "$count" "$@" --duration "$duration" \
           --ttl "$max_ttl" --json)
  pairs[$label]=$(jq -r '.pairs_per_s' <<<"$json")
  p99[$label]=$(jq -r '.pair_latency_us.p99' <<<"$json")
  p50[$label]=$(jq -r '.latency_us.p50' <<<"$json")
  pair_p50[$label]=$(jq -r '.pair_latency_us.p50' <<<"$json")
  echo "$json" >"$work/bench-$label.json"
}

echo "== 1. throughput at $clients clients ($duration each, $rounds interleaved rounds)"
cost_only=${COST_ONLY:-0}
if [ "$cost_only" != 1 ]; then
  start_node "" plain
  start_node one n1
  wait_grantable "${node_addr[one-n1]}"
fi
for id in n1 n2 n3; do start_node three "$id"; done
three="${node_addr[three-n1]},${node_addr[three-n2]},${node_addr[three-n3]}"
wait_grantable "$three"
# The same three nodes with replication: every bucket on a primary and a
# backup, a grant answered once the backup has it.
read -r -a replicated_flags <<<"${REPLICATED_FLAGS:-}"
for id in r1 r2 r3; do
  start_node replicated "$id" --replicas 2 --replica-timeout "$replica_timeout" "${replicated_flags[@]}"
done
replicated="${node_addr[replicated-r1]},${node_addr[replicated-r2]},${node_addr[replicated-r3]}"
wait_grantable "$replicated"
declare -A all_pairs all_p99 all_p50 all_pair_p50
labels=(plain one-node three-nodes replicated)
[ "$cost_only" = 1 ] && labels=(three-nodes replicated)
for _ in $(seq "$rounds"); do
  if [ "$cost_only" != 1 ]; then
    run_bench plain "${node_addr[-plain]}" "$clients"
    run_bench one-node "${node_addr[one-n1]}" "$clients" --discover
  fi
  run_bench three-nodes "$three" "$clients" --discover
  run_bench replicated "$replicated" "$clients" --discover
  # One client: the latency a grant pays for the backup's acknowledgement.
  run_bench three-nodes-1c "$three" 1 --discover
  run_bench replicated-1c "$replicated" 1 --discover
  for label in "${labels[@]}" three-nodes-1c replicated-1c; do
    all_pairs[$label]+="${pairs[$label]} "
    all_p99[$label]+="${p99[$label]} "
    all_p50[$label]+="${p50[$label]} "
    all_pair_p50[$label]+="${pair_p50[$label]} "
  done
done
median() { python3 -c "import statistics, sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
printf '| %-12s | %-30s | %-30s | %12s | %14s | %8s |\n' "servers" "pairs/s per round" \
  "pair p99 (us) per round" "median pairs/s" "median p99 (us)" "vs ${labels[0]}"
plain_median=$(median ${all_pairs[${labels[0]}]})
for label in "${labels[@]}"; do
  m=$(median ${all_pairs[$label]})
  printf '| %-12s | %-30s | %-30s | %12.0f | %14.0f | %7.2fx |\n' "$label" "${all_pairs[$label]}" \
    "${all_p99[$label]}" "$m" "$(median ${all_p99[$label]})" "$(python3 -c "print($m / $plain_median)")"
done
echo
echo "cost of replication (3 nodes --replicas 2 against 3 nodes without; medians of the rounds above):"
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
printf '| %-40s | %-30s | %-30s | %8s | %-12s |\n' "metric" "without replication, per round" \
  "--replicas 2, per round" "ratio" "goal"
printf '| %-40s | %-30s | %-30s | %7sx | %-12s |\n' "$clients-client pairs/s" "${all_pairs[three-nodes]}" \
  "${all_pairs[replicated]}" "$(ratio "$(median ${all_pairs[replicated]})" "$(median ${all_pairs[three-nodes]})")" ">= 0.5x"
printf '| %-40s | %-30s | %-30s | %7sx | %-12s |\n' "1-client p50 of one request (us)" "${all_p50[three-nodes-1c]}" \
  "${all_p50[replicated-1c]}" "$(ratio "$(median ${all_p50[replicated-1c]})" "$(median ${all_p50[three-nodes-1c]})")" "<= 2x"
printf '| %-40s | %-30s | %-30s | %7sx | %-12s |\n' "1-client p50 of an acquire+release (us)" \
  "${all_pair_p50[three-nodes-1c]}" "${all_pair_p50[replicated-1c]}" \
  "$(ratio "$(median ${all_pair_p50[replicated-1c]})" "$(median ${all_pair_p50[three-nodes-1c]})")" ""
[ "$cost_only" = 1 ] && exit 0

echo
echo "== 2. etcd requests (3-node clusters 'three' and 'replicated' plus the idle 1-node cluster 'one')"
kill -TERM "${node_pid[-plain]}" 2>/dev/null || true
wait "${node_pid[-plain]}" 2>/dev/null || true
sleep 2
r0=$(etcd_requests); t0=$(now)
sleep 20
r1=$(etcd_requests); t1=$(now)
rest=$(python3 -c "print(($r1 - $r0) / ($t1 - $t0))")
run_bench three-nodes-again "$three" "$clients" --discover
r2=$(etcd_requests); t2=$(now)
loaded=$(python3 -c "print(($r2 - $r1) / ($t2 - $t1))")
run_bench replicated-again "$replicated" "$clients" --discover
r2=$(etcd_requests); t2b=$(now)
loaded_replicated=$(python3 -c "print(($r2 - $r1 - $loaded * ($t2 - $t1)) / ($t2b - $t2))")
t2=$t2b
start_node three n4
settle=$((${etcd_ttl%s} * 4 + 6))
sleep "$settle"
r3=$(etcd_requests); t3=$(now)
join=$(python3 -c "print(($r3 - $r2) - $rest * ($t3 - $t2))")
printf 'at rest: %.1f requests/s; under %s pairs/s of lock load: %.1f requests/s; under %s pairs/s on the replicated cluster: %.1f requests/s\n' \
  "$rest" "${pairs[three-nodes-again]}" "$loaded" "${pairs[replicated-again]}" "$loaded_replicated"
printf 'a fourth node joining: %.0f requests beyond the resting rate (over %d s)\n' "$join" "$settle"

echo
echo "== 3. unavailability of a killed node's key"
four="$three,${node_addr[three-n4]}"
wait_grantable "$four"
# A key the victim owns: it grants it when asked directly.
victim="three-n2"
key=
for i in $(seq 0 500); do
  if out=$("$ctl" --server "${node_addr[$victim]}" --timeout 500ms --json acquire "victim-$i" --ttl 1s 2>/dev/null); then
    key=victim-$i
    "$ctl" --server "${node_addr[$victim]}" --timeout 500ms release "$key" \
      --token "$(jq -r .token <<<"$out")" --owner "$(jq -r .owner <<<"$out")" >/dev/null 2>&1 || true
    break
  fi
done
[ -n "$key" ] || { echo "cluster_numbers: no key of $victim found" >&2; exit 1; }
survivors="${node_addr[three-n1]},${node_addr[three-n3]},${node_addr[three-n4]}"
killed=$(now)
kill -9 "${node_pid[$victim]}"
wait "${node_pid[$victim]}" 2>/dev/null || true
granted=
while [ -z "$granted" ]; do
  if "$ctl" --server "$survivors" --discover --timeout 200ms acquire "$key" --ttl 1s >/dev/null 2>&1; then
    granted=$(now)
  elif python3 -c "import sys; sys.exit(0 if $(now) - $killed > 60 else 1)"; then
    echo "cluster_numbers: $key was not granted within 60 s" >&2
    exit 1
  else
    sleep 0.02
  fi
done
window=$(python3 -c "print($granted - $killed)")
bound=$(python3 -c "print(2 * $(seconds_of "$etcd_ttl") + $(seconds_of "$max_ttl") + 0.5)")
printf 'kill -9 to the first grant elsewhere: %.2f s (bound: etcd lease TTL + lock-delay = %.1f s, plus the time to notice)\n' \
  "$window" "$bound"
