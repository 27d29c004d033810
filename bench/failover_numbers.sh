#!/usr/bin/env bash
# Failover side by side (shardlock replicated beside etcd and ZooKeeper), on
# loopback: kill -9 one server of three while a lock is held, and measure
#   - whether the holder(s) kept the lock, and
#   - the time from the kill until a new client's acquire+release of a free
#     lock works again (for shardlock: a free key owned by the killed node).
# Systems, each on 3 servers with its defaults unless a knob says otherwise:
#   etcd       3 members (etcd 3.4: heartbeat 100 ms, election timeout 1 s);
#              the leader is killed. Holder: `etcdctl lock` (a session lease
#              kept alive). Probe: a new lease, the lock, unlock, revoke, over
#              etcd's JSON gateway (etcdctl lock recipe, without the 60-80 ms
#              of starting etcdctl).
#   zookeeper  3 servers from the zookeeper package's jars, our own config
#              (tickTime 2000, initLimit 10, syncLimit 5: the sample zoo.cfg);
#              the leader is killed. Holder: kazoo's Lock (an ephemeral
#              sequential znode). Probe: a new session, Lock, release, close.
#   shardlock  3 nodes `--cluster --replicas 2` on one etcd; HOLDERS holders
#              (`shardlockctl --discover run KEY -- sleep`), VICTIM_HOLDERS of
#              them on the node that is killed. Lost: `run` exited 75. Probe:
#              `shardlockctl --discover run -n KEY -- true` (acquire, run,
#              release) on a free key of the killed node.
# A probe is tried every POLL_GAP; each try is bounded (TRY_TIMEOUT), so a
# figure can exceed the true window by up to one try. The table gives each
# system's healthy probe time, measured before the kill, next to it.
#
#   bench/failover_numbers.sh [BUILD_DIR]      (default build/release)
#
# Environment: TRIALS (per system, default 5), SYSTEMS (default
# "etcd zookeeper shardlock rolling"; rolling is one run of four steps, see
# rolling_trial), HOLDERS (shardlock holders, default 20),
# VICTIM_HOLDERS (of them on the killed node, default 10), MAX_TTL (the
# nodes' --max-ttl and the holders' --ttl, default 2s), REPLICA_TIMEOUT
# (--replica-timeout, default 300ms, shardlockd's default), ETCD_TTL
# (--etcd-lease-ttl, default 2s), TRY_TIMEOUT (one probe try, default 250ms;
# shardlock's --timeout), POLL_GAP (pause between tries, default 0.02 s),
# LOG_LEVEL (the nodes', default debug), KEEP_LOGS (a directory: every
# server's and client's log is copied there on exit). Everything binds 127.0.0.1, runs under
# `timeout`, and is killed on exit.
set -euo pipefail

build=${1:-build/release}
daemon=$build/tools/shardlockd
ctl=$build/tools/shardlockctl
trials=${TRIALS:-5}
systems=${SYSTEMS:-etcd zookeeper shardlock rolling}
holders=${HOLDERS:-20}
victim_holders=${VICTIM_HOLDERS:-10}
max_ttl=${MAX_TTL:-2s}
replica_timeout=${REPLICA_TIMEOUT:-300ms}
etcd_ttl=${ETCD_TTL:-2s}
try_timeout=${TRY_TIMEOUT:-250ms}
poll_gap=${POLL_GAP:-0.02}
log_level=${LOG_LEVEL:-debug}
keep_logs=${KEEP_LOGS:-}
# kazoo is a Debian package: the system Python, whatever python3 PATH finds.
kazoo_python=${KAZOO_PYTHON:-/usr/bin/python3}

die() { echo "failover_numbers: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null || die "$1 not found (tools/install-deps.sh --failover)"; }
for tool in etcd curl jq python3 timeout; do need "$tool"; done
for system in $systems; do
  case $system in
    etcd) need etcdctl ;;
    zookeeper)
      need java
      [ -r /usr/share/java/zookeeper.jar ] || die "/usr/share/java/zookeeper.jar not found (tools/install-deps.sh --failover)"
      "$kazoo_python" -c 'import kazoo' 2>/dev/null || die "$kazoo_python cannot import kazoo (python3-kazoo; tools/install-deps.sh --failover)"
      ;;
    shardlock|rolling)
      [ "$system" = shardlock ] || /usr/bin/python3 -c 'import xxhash' 2>/dev/null ||
        die "/usr/bin/python3 cannot import xxhash (python3-xxhash; tools/install-deps.sh --failover)"
      for binary in "$daemon" "$ctl"; do
        [ -x "$binary" ] || die "$binary not built (make build-release)"
      done
      ;;
    *) die "unknown system '$system' (SYSTEMS: etcd zookeeper shardlock rolling)" ;;
  esac
done

work=$(mktemp -d /tmp/shardlock-failover-numbers-XXXXXX)
# Every server and client runs under `timeout -s KILL`; these are the
# timeouts' pids, and killing one kills its group.
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 -- "-$pid" "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$keep_logs" ]; then
    mkdir -p "$keep_logs"
    # The logs only: etcd's data dirs preallocate 64 MB WAL files each.
    (cd "$work" && find . -type f \( -name '*.log' -o -name '*.err' -o -name '*.cfg' -o -name '*.json' \) \
       -exec cp --parents {} "$keep_logs"/ \;) 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "failover_numbers: a command failed at line $LINENO" >&2' ERR
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
seconds_of() { python3 -c "import sys,re; v,u=re.fullmatch(r'(\d+(?:\.\d+)?)(ms|s)', sys.argv[1]).groups(); print(float(v)/(1000 if u=='ms' else 1))" "$1"; }
now() { date +%s.%N; }
sub() { python3 -c "import sys; print(f'{float(sys.argv[1]) - float(sys.argv[2]):.3f}')" "$1" "$2"; }
try_seconds=$(seconds_of "$try_timeout")

# spawn LIMIT LOG COMMAND...: COMMAND in its own process group under
# `timeout -s KILL LIMIT`; sets $spawned to the timeout's pid. The command
# itself is its only child (server_pid finds it for kill -9).
spawn() {
  local limit=$1 log=$2
  shift 2
  setsid timeout -s KILL "$limit" "$@" >"$log" 2>&1 </dev/null &
  spawned=$!
  pids+=("$spawned")
  disown "$spawned"
}
server_pid() {
  local child
  for _ in $(seq 50); do
    child=$(pgrep -P "$1" | sed -n 1p) && [ -n "$child" ] && { echo "$child"; return 0; }
    sleep 0.02
  done
  die "no process under pid $1"
}
stop_all() {
  for pid in "${pids[@]}"; do kill -9 -- "-$pid" "$pid" 2>/dev/null || true; done
  pids=()
  sleep 0.2
}

# The probe clients of etcd and ZooKeeper: one Python process per trial, so
# that no try pays an interpreter's or a Go binary's start.
cat >"$work/probe.py" <<'EOF'
"""probe.py etcd|zookeeper HOSTS TRY_TIMEOUT GAP [COUNT]: try a new client's
acquire+release of a free lock until one works (or COUNT tries, each timed);
prints the start and end (epoch seconds) of the first that worked, or each
try's duration with COUNT."""
import base64, itertools, json, logging, sys, time, urllib.request

system, hosts, try_timeout, gap = sys.argv[1], sys.argv[2].split(","), float(sys.argv[3]), float(sys.argv[4])
count = int(sys.argv[5]) if len(sys.argv) > 5 else 0
logging.basicConfig(level=logging.CRITICAL)
b64 = lambda s: base64.b64encode(s.encode()).decode()
next_host = itertools.cycle(hosts)

def etcd_try(n):
    host = next(next_host)  # as a client would, the next endpoint on failure
    def call(path, body):
        req = urllib.request.Request(f"http://{host}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=try_timeout) as r:
            return json.load(r)
    lease = call("/v3/lease/grant", {"TTL": 10})["ID"]
    key = call("/v3/lock/lock", {"name": b64("probe"), "lease": lease})["key"]
    call("/v3/lock/unlock", {"key": key})
    call("/v3/lease/revoke", {"ID": lease})

def zookeeper_try(n):
    from kazoo.client import KazooClient
    c = KazooClient(hosts=",".join(hosts), timeout=max(try_timeout, 0.5),
                    connection_retry={"max_tries": 0}, command_retry={"max_tries": 0})
    try:
        c.start(timeout=try_timeout)
        lock = c.Lock("/probe", f"probe-{n}")
        if not lock.acquire(timeout=try_timeout):
            raise RuntimeError("not acquired")
        lock.release()
    finally:
        try:
            c.stop()
            c.close()
        except Exception:
            pass

attempt = etcd_try if system == "etcd" else zookeeper_try
for n in itertools.count(1):
    start = time.time()
    try:
        attempt(n)
    except Exception:
        if count and n >= count:
            sys.exit(1)
        time.sleep(gap)
        continue
    end = time.time()
    if count:
        print(f"{end - start:.6f}", flush=True)
        if n >= count:
            break
    else:
        print(f"{start:.6f} {end:.6f} {n}", flush=True)
        break
EOF

cat >"$work/zk_holder.py" <<'EOF'
"""zk_holder.py HOSTS: take kazoo's Lock on /held, print "held", then on
stdin EOF report whether the session survived and the lock's znode exists."""
import logging, sys
from kazoo.client import KazooClient
logging.basicConfig(level=logging.CRITICAL)
c = KazooClient(hosts=sys.argv[1], timeout=10)
states = []
c.add_listener(lambda s: states.append(str(s)))
c.start(timeout=10)
lock = c.Lock("/held", "holder")
lock.acquire(timeout=10)
print("held", flush=True)
sys.stdin.read()
node = f"{lock.path}/{lock.node}"
kept = "LOST" not in states and c.exists(node) is not None
print(f"kept={'yes' if kept else 'no'} states={','.join(states)}", flush=True)
EOF

median() { python3 -c "import statistics, sys; print(f'{statistics.median(float(x) for x in sys.argv[1:]):.3f}')" "$@"; }
maximum() { python3 -c "import sys; print(f'{max(float(x) for x in sys.argv[1:]):.3f}')" "$@"; }
declare -A windows kept_note probe_cost

# ---- etcd: 3 members, the leader killed -----------------------------------
etcd_trial() {
  local trial=$1
  local dir=$work/etcd-$trial cluster="" endpoints="" i
  local -a client_port peer_port timeout_pid
  mkdir -p "$dir"
  for i in 1 2 3; do
    client_port[i]=$(free_port)
    peer_port[i]=$(free_port)
    cluster+="e$i=http://127.0.0.1:${peer_port[i]},"
    endpoints+="127.0.0.1:${client_port[i]},"
  done
  cluster=${cluster%,}
  endpoints=${endpoints%,}
  for i in 1 2 3; do
    spawn 600 "$dir/e$i.log" etcd --name "e$i" --data-dir "$dir/e$i" \
      --listen-client-urls "http://127.0.0.1:${client_port[i]}" \
      --advertise-client-urls "http://127.0.0.1:${client_port[i]}" \
      --listen-peer-urls "http://127.0.0.1:${peer_port[i]}" \
      --initial-advertise-peer-urls "http://127.0.0.1:${peer_port[i]}" \
      --initial-cluster "$cluster" --initial-cluster-state new --log-level warn
    timeout_pid[i]=$spawned
  done
  local leader=
  for _ in $(seq 100); do
    leader=$(ETCDCTL_API=3 timeout 5 etcdctl --endpoints "$endpoints" endpoint status -w simple 2>/dev/null |
               awk -F', ' '$5 == "true" {print $1}') || true
    [ -n "$leader" ] && break
    sleep 0.1
  done
  [ -n "$leader" ] || die "etcd trial $trial: no leader"
  # The holder: etcdctl lock with every endpoint, as a client would have.
  spawn 600 "$dir/holder.log" env ETCDCTL_API=3 etcdctl --endpoints "$endpoints" lock held sleep 600
  local holder=$spawned
  for _ in $(seq 100); do
    [ "$(ETCDCTL_API=3 etcdctl --endpoints "$endpoints" get --prefix held/ --keys-only 2>/dev/null | grep -c .)" = 1 ] && break
    sleep 0.05
  done
  local held_key
  held_key=$(ETCDCTL_API=3 etcdctl --endpoints "$endpoints" get --prefix held/ --keys-only | sed -n 1p)
  [ -n "$held_key" ] || die "etcd trial $trial: the holder did not get the lock"
  local survivors victim=0
  survivors=$(tr , '\n' <<<"$endpoints" | grep -vx "$leader" | paste -sd,)
  for i in 1 2 3; do [ "127.0.0.1:${client_port[i]}" = "$leader" ] && victim=$i; done
  if [ "$trial" = 1 ]; then
    probe_cost[etcd]=$(timeout 60 python3 "$work/probe.py" etcd "$survivors" "$try_seconds" "$poll_gap" 20 | sort -n | sed -n 10p)
  fi
  local target killed out
  target=$(server_pid "${timeout_pid[victim]}")
  killed=$(now)
  kill -9 "$target"
  out=$(timeout 120 python3 "$work/probe.py" etcd "$survivors" "$try_seconds" "$poll_gap") ||
    die "etcd trial $trial: no lock within 120 s"
  local window
  window=$(python3 -c "import sys; s,e,n=sys.argv[1].split(); print(f'{float(e) - float(sys.argv[2]):.3f}')" "$out" "$killed")
  # Kept: the holder's key is still there, under the same name, and the
  # holder still runs.
  local kept=no
  if kill -0 "$holder" 2>/dev/null &&
     [ "$(ETCDCTL_API=3 etcdctl --endpoints "$survivors" get --prefix held/ --keys-only | grep -c .)" = 1 ] &&
     [ "$(ETCDCTL_API=3 etcdctl --endpoints "$survivors" get --prefix held/ --keys-only | sed -n 1p)" = "$held_key" ]; then
    kept=yes
  fi
  printf '  etcd trial %d: killed leader e%d; lock again after %s s (%s tries); holder kept its lock: %s\n' \
    "$trial" "$victim" "$window" "${out##* }" "$kept"
  windows[etcd]+="$window "
  kept_note[etcd]+="$kept "
  stop_all
}

# ---- ZooKeeper: 3 servers, the leader killed ------------------------------
zk_mode() {  # zk_mode PORT: leader, follower or nothing
  python3 - "$1" <<'EOF' 2>/dev/null || true
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
s.sendall(b"srvr")
data = b""
while chunk := s.recv(4096):
    data += chunk
for line in data.decode().splitlines():
    if line.startswith("Mode: "):
        print(line[6:])
EOF
}
zookeeper_trial() {
  local trial=$1
  local dir=$work/zookeeper-$trial hosts="" i j
  local -a client_port quorum_port election_port timeout_pid
  mkdir -p "$dir"
  for i in 1 2 3; do
    client_port[i]=$(free_port)
    quorum_port[i]=$(free_port)
    election_port[i]=$(free_port)
    hosts+="127.0.0.1:${client_port[i]},"
  done
  hosts=${hosts%,}
  for i in 1 2 3; do
    mkdir -p "$dir/z$i"
    echo "$i" >"$dir/z$i/myid"
    {
      echo "tickTime=2000"
      echo "initLimit=10"
      echo "syncLimit=5"
      echo "dataDir=$dir/z$i"
      echo "clientPort=${client_port[i]}"
      echo "clientPortAddress=127.0.0.1"
      echo "admin.enableServer=false"
      echo "4lw.commands.whitelist=srvr"
      for j in 1 2 3; do echo "server.$j=127.0.0.1:${quorum_port[j]}:${election_port[j]}"; done
    } >"$dir/z$i.cfg"
    spawn 600 "$dir/z$i.log" java -Xmx256m -cp /usr/share/java/zookeeper.jar \
      org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/z$i.cfg"
    timeout_pid[i]=$spawned
  done
  local victim=0 followers
  for _ in $(seq 300); do
    followers=0
    for i in 1 2 3; do
      case $(zk_mode "${client_port[i]}") in
        leader) victim=$i ;;
        follower) followers=$((followers + 1)) ;;
      esac
    done
    [ "$victim" != 0 ] && [ "$followers" = 2 ] && break
    victim=0
    sleep 0.1
  done
  [ "$victim" != 0 ] || die "zookeeper trial $trial: no leader with two followers"
  # The holder, with every server, as a client would have.
  mkfifo "$dir/holder.in"
  spawn 600 "$dir/holder.log" bash -c "exec '$kazoo_python' '$work/zk_holder.py' '$hosts' <'$dir/holder.in'"
  exec {holder_in}>"$dir/holder.in"
  for _ in $(seq 200); do grep -q held "$dir/holder.log" && break; sleep 0.05; done
  grep -q held "$dir/holder.log" || die "zookeeper trial $trial: the holder did not get the lock"
  local survivors
  survivors=$(tr , '\n' <<<"$hosts" | grep -vx "127.0.0.1:${client_port[victim]}" | paste -sd,)
  if [ "$trial" = 1 ]; then
    probe_cost[zookeeper]=$(timeout 60 "$kazoo_python" "$work/probe.py" zookeeper "$survivors" "$try_seconds" "$poll_gap" 20 | sort -n | sed -n 10p)
  fi
  local target killed out window kept
  target=$(server_pid "${timeout_pid[victim]}")
  killed=$(now)
  kill -9 "$target"
  out=$(timeout 120 "$kazoo_python" "$work/probe.py" zookeeper "$survivors" "$try_seconds" "$poll_gap") ||
    die "zookeeper trial $trial: no lock within 120 s"
  window=$(python3 -c "import sys; s,e,n=sys.argv[1].split(); print(f'{float(e) - float(sys.argv[2]):.3f}')" "$out" "$killed")
  exec {holder_in}>&-
  for _ in $(seq 100); do grep -q kept= "$dir/holder.log" && break; sleep 0.05; done
  kept=$(sed -n 's/^kept=\([a-z]*\).*/\1/p' "$dir/holder.log")
  printf '  zookeeper trial %d: killed leader z%d; lock again after %s s (%s tries); holder kept its lock: %s (%s)\n' \
    "$trial" "$victim" "$window" "${out##* }" "${kept:-unknown}" "$(grep -o 'states=.*' "$dir/holder.log")"
  windows[zookeeper]+="$window "
  kept_note[zookeeper]+="${kept:-unknown} "
  stop_all
}

# ---- shardlock: 3 nodes --replicas 2, one node killed ---------------------
# One etcd (the configuration master only: no lock traffic reaches it) for
# every trial; each trial is a new cluster name and three new nodes.
etcd_started=
start_config_etcd() {
  [ -n "$etcd_started" ] && return 0
  etcd_port=$(free_port)
  local peer
  peer=$(free_port)
  spawn 1800 "$work/config-etcd.log" etcd --name config --data-dir "$work/config-etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "config=http://127.0.0.1:$peer" --log-level warn
  config_etcd=$spawned
  for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$etcd_port/health" | grep -q '"health":"true"' && break
    sleep 0.1
  done
  etcd_started=1
}
# owned_at ADDRESS KEY: whether the node at ADDRESS grants KEY itself (it
# owns it; a non-owner answers REDIRECT); releases it again.
owned_at() {
  local out
  out=$("$ctl" --server "$1" --timeout 300ms --json acquire "$2" --ttl 1s 2>/dev/null) || return 1
  "$ctl" --server "$1" --timeout 300ms release "$2" --token "$(jq -r .token <<<"$out")" \
    --owner "$(jq -r .owner <<<"$out")" >/dev/null 2>&1 || true
}
# A node's log time (UTC, ms) as epoch seconds.
log_seconds() { python3 -c "import datetime, sys; print(datetime.datetime.strptime(sys.argv[1], '%Y-%m-%dT%H:%M:%S.%fZ').replace(tzinfo=datetime.timezone.utc).timestamp())" "$1"; }
# wait_grantable SERVERS SECONDS WHAT: until 16 keys in a row are granted
# through SERVERS (--discover), or die after SECONDS naming WHAT.
wait_grantable() {
  local deadline=$((SECONDS + $2)) ok i
  while :; do
    ok=1
    for i in $(seq 0 15); do
      "$ctl" --server "$1" --discover --timeout 500ms run -n "warm-$i" --ttl 1s -- true >/dev/null 2>&1 || { ok=0; break; }
    done
    [ $ok = 1 ] && return 0
    [ $SECONDS -lt $deadline ] || die "$3: the cluster did not become grantable"
    sleep 0.2
  done
}

shardlock_trial() {
  local trial=$1
  local dir=$work/shardlock-$trial i
  local -a port timeout_pid
  local -A addr
  mkdir -p "$dir"
  start_config_etcd
  for i in 1 2 3; do
    port[i]=$(free_port)
    addr[n$i]=127.0.0.1:${port[i]}
    spawn 600 "$dir/n$i.err" "$daemon" --listen "127.0.0.1:${port[i]}" --data-dir "$dir/n$i" \
      --max-ttl "$max_ttl" --cluster "etcd://127.0.0.1:$etcd_port" --cluster-name "failover-$trial" \
      --node-id "n$i" --etcd-lease-ttl "$etcd_ttl" --replicas 2 --replica-timeout "$replica_timeout" \
      --log-level "$log_level"
    timeout_pid[i]=$spawned
  done
  local all="${addr[n1]},${addr[n2]},${addr[n3]}" survivors="${addr[n1]},${addr[n3]}"
  # Grantable: every node grants its keys (its lock-delay after a start).
  wait_grantable "$all" 60 "shardlock trial $trial"
  # Keys: VICTIM_HOLDERS owned by n2 (the node to kill), the other holders'
  # on n1 and n3, and one more free key of n2 for the probe.
  local -a victim_keys=() other_keys=()
  local n=0 key
  while [ ${#victim_keys[@]} -le "$victim_holders" ] || [ ${#other_keys[@]} -lt $((holders - victim_holders)) ]; do
    key=t$trial-key-$n
    n=$((n + 1))
    [ $n -lt 2000 ] || die "shardlock trial $trial: could not place the holders' keys"
    if owned_at "${addr[n2]}" "$key"; then
      [ ${#victim_keys[@]} -le "$victim_holders" ] && victim_keys+=("$key")
    elif [ ${#other_keys[@]} -lt $((holders - victim_holders)) ]; then
      other_keys+=("$key")
    fi
  done
  local probe=${victim_keys[$victim_holders]}
  local -a held_keys=("${victim_keys[@]:0:$victim_holders}" "${other_keys[@]}")
  # The holders: a lease of MAX_TTL, renewed every third of it, held for
  # long enough to cover the kill and the probe.
  local -a holder_pid=()
  for i in "${!held_keys[@]}"; do
    spawn 120 "$dir/holder-$i.log" bash -c \
      "'$ctl' --server '$all' --discover run '${held_keys[i]}' --ttl '$max_ttl' -- sh -c 'echo held; sleep 8'; echo \"exit \$?\""
    holder_pid+=("$spawned")
  done
  for i in "${!held_keys[@]}"; do
    for _ in $(seq 200); do grep -q '^held' "$dir/holder-$i.log" && break; sleep 0.05; done
    grep -q '^held' "$dir/holder-$i.log" || die "shardlock trial $trial: holder $i did not get ${held_keys[i]}"
  done
  if [ "$trial" = 1 ]; then
    local costs=()
    for _ in $(seq 20); do
      local a b
      a=$(now)
      "$ctl" --server "$survivors" --discover --timeout "$try_timeout" run -n "$probe" --ttl "$max_ttl" -- true >/dev/null 2>&1
      b=$(now)
      costs+=("$(sub "$b" "$a")")
    done
    probe_cost[shardlock]=$(printf '%s\n' "${costs[@]}" | sort -n | sed -n 10p)
  fi
  # Let every lease renew once (ttl/3) after the last grant.
  sleep 1
  local target killed start end tries=0
  target=$(server_pid "${timeout_pid[2]}")
  killed=$(now)
  kill -9 "$target"
  # Bash only in this loop: a timestamp costs no interpreter start.
  while :; do
    tries=$((tries + 1))
    start=$(now)
    if "$ctl" --server "$survivors" --discover --timeout "$try_timeout" run -n "$probe" --ttl "$max_ttl" -- true \
         >/dev/null 2>>"$dir/probe.log"; then
      end=$(now)
      break
    fi
    [ "${start%.*}" -lt $(( ${killed%.*} + 60 )) ] || die "shardlock trial $trial: $probe not granted within 60 s"
    sleep "$poll_gap"
  done
  local window
  window=$(sub "$end" "$killed")
  # Exclusive: no new client gets a held key while its holder runs. Each
  # key is tried every ~0.25 s until 5 s after the kill (past the inherited
  # leases' hold, takeover + max TTL + drift); a key granted while its
  # holder's run has not exited is a violation.
  local violations=0 violation_list="" k
  local -A violated=()
  while [ "$(sub "$(now)" "$killed" | cut -d. -f1)" -lt 5 ]; do
    for k in "${!held_keys[@]}"; do
      [ -n "${violated[$k]:-}" ] && continue
      if "$ctl" --server "$survivors" --discover --timeout 200ms run -n "${held_keys[k]}" --ttl 1s -- true >/dev/null 2>&1 &&
         ! grep -q '^exit ' "$dir/holder-$k.log"; then
        violated[$k]=1
        violations=$((violations + 1))
        violation_list+=" ${held_keys[k]}($([ "$k" -lt "$victim_holders" ] && echo n2 || echo other))@+$(sub "$(now)" "$killed")s"
      fi
    done
    sleep 0.25
  done
  # Lost: run exited 75 (its lease was lost); kept: the command finished.
  local lost=0 lost_on_victim=0 other=0 status
  for i in "${!held_keys[@]}"; do
    for _ in $(seq 300); do grep -q '^exit ' "$dir/holder-$i.log" && break; sleep 0.05; done
    status=$(sed -n 's/^exit //p' "$dir/holder-$i.log")
    case $status in
      0) ;;
      75) lost=$((lost + 1)); [ "$i" -lt "$victim_holders" ] && lost_on_victim=$((lost_on_victim + 1)) ;;
      *) other=$((other + 1)) ;;
    esac
  done
  # Where the time went, from the survivors' logs (UTC, ms): the eviction
  # (the replica timeout after the last datagram heard), the takeover (etcd
  # revoke, the new map, its watch, the next tick), and the client after it.
  local evicted taken_over
  evicted=$(grep -h 'replica n2 silent' "$dir/n1.err" "$dir/n3.err" | awk '{print $1}' | sort | sed -n 1p)
  taken_over=$(grep -h 'took over' "$dir/n1.err" "$dir/n3.err" | awk '{print $1}' | sort | tail -1)
  local breakdown="eviction +? s, takeover +? s"
  if [ -n "$evicted" ] && [ -n "$taken_over" ]; then
    breakdown="evicted n2 at +$(sub "$(log_seconds "$evicted")" "$killed") s, both survivors took over by +$(sub "$(log_seconds "$taken_over")" "$killed") s"
  fi
  printf '  shardlock trial %d: killed n2; %s granted+released after %s s (%d tries); %s; holders lost: %d of %d (%d of %d on n2), other exits: %d; violations: %d%s\n' \
    "$trial" "$probe" "$window" "$tries" "$breakdown" "$lost" "$holders" "$lost_on_victim" "$victim_holders" "$other" \
    "$violations" "$violation_list"
  windows[shardlock]+="$window "
  kept_note[shardlock]+="$((holders - lost)) "
  shardlock_lost=$(( ${shardlock_lost:-0} + lost ))
  shardlock_violations=$(( ${shardlock_violations:-0} + violations ))
  # Everything but the configuration etcd.
  for pid in "${pids[@]}"; do
    [ "$pid" = "$config_etcd" ] || kill -9 -- "-$pid" "$pid" 2>/dev/null || true
  done
  pids=("$config_etcd")
  sleep 0.2
}

# ---- shardlock: a rolling restart of 3 nodes, then a join -----------------
# 3 nodes `--replicas 2` at ROLLING_MAX_TTL (default the daemon's 60 s, so
# that a start's lock-delay is long enough to see), HOLDERS holders for the
# whole run, and bench/availability_probe.py trying PROBE_KEYS free keys and
# the held ones over and over. Each node in turn is stopped with SIGTERM (a
# clean leave) and started again on its data dir under its id; then a fourth
# node joins. Each step ends STEP_SETTLE seconds after the node is an active
# member owning buckets again. Per step: the longest time any key was
# refused (RECOVERING, unanswered, any error but BUSY) to a new acquire, from
# the refused try's start to the end of the key's next answered one.
probe_keys=${PROBE_KEYS:-48}
step_settle=${STEP_SETTLE:-4}
rolling_max_ttl=${ROLLING_MAX_TTL:-60s}
# member_state ID: "STATE BUCKETS" of the member in etcd, or nothing while
# it is not registered.
member_state() {
  "$ctl" --timeout 1s --json members --cluster "etcd://127.0.0.1:$etcd_port" --cluster-name "$rolling_cluster" 2>/dev/null |
    jq -r --arg id "$1" '.nodes[] | select(.id == $id) | "\(.state) \(.buckets)"' 2>/dev/null || true
}
rolling_node() {  # rolling_node I: start node nI on its port and data dir
  local i=$1
  rolling_starts=$((rolling_starts + 1))
  spawn 1200 "$rolling_dir/n$i-start$rolling_starts.err" "$daemon" --listen "127.0.0.1:${rolling_port[i]}" \
    --data-dir "$rolling_dir/n$i" --max-ttl "$rolling_max_ttl" --cluster "etcd://127.0.0.1:$etcd_port" \
    --cluster-name "$rolling_cluster" --node-id "n$i" --etcd-lease-ttl "$etcd_ttl" --replicas 2 \
    --replica-timeout "$replica_timeout" --log-level "$log_level"
  rolling_pid[i]=$spawned
}
wait_active() {  # wait_active I: until nI is an active member owning buckets
  local deadline=$((SECONDS + 120)) state
  while :; do
    state=$(member_state "n$1")
    [[ "$state" == "active "* ]] && [ "${state#active }" -gt 0 ] && return 0
    [ $SECONDS -lt $deadline ] || die "rolling: n$1 not an active member within 120 s (state: ${state:-none})"
    sleep 0.1
  done
}
rolling_trial() {
  rolling_dir=$work/rolling
  rolling_cluster=rolling-$$
  rolling_starts=0
  rolling_port=()
  rolling_pid=()
  mkdir -p "$rolling_dir"
  start_config_etcd
  local i
  for i in 1 2 3 4; do rolling_port[i]=$(free_port); done
  for i in 1 2 3; do rolling_node "$i"; done
  echo "  rolling: n1..n4 on ports ${rolling_port[*]}"
  local all="127.0.0.1:${rolling_port[1]},127.0.0.1:${rolling_port[2]},127.0.0.1:${rolling_port[3]}"
  for i in 1 2 3; do wait_active "$i"; done
  # Grantable: the first start's lock-delay is over on every node.
  wait_grantable "$all" 180 rolling
  local -a held=() free=()
  for i in $(seq "$holders"); do held+=("held-$i"); done
  for i in $(seq "$probe_keys"); do free+=("free-$i"); done
  for i in "${!held[@]}"; do
    spawn 1200 "$rolling_dir/holder-$i.log" bash -c \
      "'$ctl' --server '$all' --discover run '${held[i]}' --ttl '$max_ttl' -- sh -c 'echo held; while [ ! -e \"$rolling_dir/stop-holders\" ]; do sleep 0.2; done'; echo \"exit \$?\""
  done
  for i in "${!held[@]}"; do
    for _ in $(seq 200); do grep -q '^held' "$rolling_dir/holder-$i.log" && break; sleep 0.05; done
    grep -q '^held' "$rolling_dir/holder-$i.log" || die "rolling: holder $i did not get ${held[i]}"
  done
  spawn 1200 "$rolling_dir/probe.err" "$kazoo_python" "$(dirname "$0")/availability_probe.py" "$all" \
    "$(IFS=,; echo "${free[*]}")" "$(IFS=,; echo "${held[*]}")" "$rolling_dir/stop-probe" "$rolling_dir/probe.json"
  sleep "$step_settle"
  local -a step_names=() step_start=() step_end=()
  local target
  for i in 1 2 3 4; do
    step_start+=("$(now)")
    if [ "$i" -le 3 ]; then
      step_names+=("restart n$i")
      target=$(server_pid "${rolling_pid[i]}")
      kill -TERM "$target"
      for _ in $(seq 200); do kill -0 "$target" 2>/dev/null || break; sleep 0.05; done
      ! kill -0 "$target" 2>/dev/null || die "rolling: n$i did not stop within 10 s of SIGTERM"
    else
      step_names+=("join n4")
    fi
    rolling_node "$i"
    wait_active "$i"
    echo "  rolling: ${step_names[-1]}: an active member again after $(sub "$(now)" "${step_start[-1]}") s"
    sleep "$step_settle"
    step_end+=("$(now)")
  done
  touch "$rolling_dir/stop-probe"
  for _ in $(seq 200); do [ -s "$rolling_dir/probe.json" ] && break; sleep 0.05; done
  [ -s "$rolling_dir/probe.json" ] || die "rolling: the probe wrote nothing ($(tail -3 "$rolling_dir/probe.err"))"
  touch "$rolling_dir/stop-holders"
  local lost=0 other=0 status
  for i in "${!held[@]}"; do
    for _ in $(seq 300); do grep -q '^exit ' "$rolling_dir/holder-$i.log" && break; sleep 0.05; done
    status=$(sed -n 's/^exit //p' "$rolling_dir/holder-$i.log")
    case $status in
      0) ;;
      75) lost=$((lost + 1)) ;;
      *) other=$((other + 1)) ;;
    esac
  done
  rolling_report=$(
    echo "== rolling restart and join, 3 nodes --replicas 2 (CPU: $cpu)"
    echo "--max-ttl $rolling_max_ttl, --replica-timeout $replica_timeout, --etcd-lease-ttl $etcd_ttl; $probe_keys free" \
      "and $holders held keys probed, each try bounded by ${PROBE_TIMEOUT:-0.25} s; each step ends ${step_settle} s after" \
      "the node is an active member"
    python3 "$(dirname "$0")/availability_report.py" "$rolling_dir/probe.json" \
      "$(IFS='|'; echo "${step_names[*]}")" "${step_start[*]}" "${step_end[*]}"
    echo "holders kept: $((holders - lost)) of $holders (lost: $lost, other exits: $other)"
  )
  echo "$rolling_report"
  for pid in "${pids[@]}"; do
    [ "$pid" = "$config_etcd" ] || kill -9 -- "-$pid" "$pid" 2>/dev/null || true
  done
  pids=("$config_etcd")
}

cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/^model name[[:space:]]*: //')
echo "CPU: $cpu ($(nproc) cores), kernel $(uname -r)"
echo "$trials trials per system; a probe try is bounded by $try_timeout, $poll_gap s apart"
for system in $systems; do
  echo "== $system"
  for trial in $(seq "$trials"); do
    case $system in
      etcd) etcd_trial "$trial" ;;
      zookeeper) zookeeper_trial "$trial" ;;
      shardlock) shardlock_trial "$trial" ;;
      rolling) [ "$trial" -gt 1 ] || rolling_trial ;;  # one run of four steps
    esac
  done
done

echo
echo "== failover: kill -9 of one of 3 servers, $trials trials each (CPU: $cpu)"
printf '| %-42s | %-28s | %-36s | %8s | %8s | %11s |\n' "system" "holder kept its lock" \
  "kill -> next acquire+release, per trial (s)" "median" "worst" "healthy try"
for system in $systems; do
  case $system in
    rolling) continue ;;  # its own table, below
    etcd) label="etcd 3.4, 3 members, leader killed"; kept="${kept_note[etcd]}" ;;
    zookeeper) label="ZooKeeper 3.8, 3 servers, leader killed"; kept="${kept_note[zookeeper]}" ;;
    shardlock) label="shardlock, 3 nodes --replicas 2, n2 killed"
      kept="$(( holders * trials - shardlock_lost )) of $(( holders * trials )) kept" ;;
  esac
  # shellcheck disable=SC2086  # word splitting wanted: one value per trial
  printf '| %-42s | %-28s | %-36s | %8s | %8s | %9s s |\n' "$label" "$kept" "${windows[$system]}" \
    "$(median ${windows[$system]})" "$(maximum ${windows[$system]})" "${probe_cost[$system]:-?}"
done
if [[ " $systems " == *" shardlock "* ]]; then
  echo "shardlock: --max-ttl $max_ttl (holders' --ttl), --replica-timeout $replica_timeout, --etcd-lease-ttl $etcd_ttl;" \
    "$holders holders, $victim_holders on n2; violations (a held key granted to a new client): ${shardlock_violations:-0}"
fi
[ -z "${rolling_report:-}" ] || { echo; echo "$rolling_report"; }
