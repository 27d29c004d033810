#!/usr/bin/env bash
# ZooKeeper's own Java client running the standard lock recipe
# (src/bench/zookeeper/.../ZkLockBenchmark.java: an ephemeral sequential znode,
# a watch on the predecessor) against a 3-server ensemble it starts on
# loopback from Debian's zookeeper package (the sample zoo.cfg's timings, as
# bench/failover_numbers.sh): pairs/s and p50/p99 at 1 and 16 threads of one
# session, the shape of bench.sh. bench-compare.sh --zookeeper runs it.
#
#   clients/java/bench-zookeeper.sh [SECONDS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
seconds=${1:-5}
zk=/usr/share/java/zookeeper.jar
[ -r "$zk" ] || { echo "bench-zookeeper.sh: no $zk (apt-get install zookeeper)" >&2; exit 1; }
out=${BENCH_OUT:-$(mktemp -d)}
# shellcheck source=bench-common.sh
. "$here/bench-common.sh"
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
mode() {  # mode PORT: leader, follower or nothing
  { exec 3<>"/dev/tcp/127.0.0.1/$1" && echo srvr >&3 && sed -n 's/^Mode: //p' <&3; } 2>/dev/null || true
}

declare -a client_port quorum_port election_port
hosts=""
for i in 1 2 3; do
  client_port[i]=$(free_port)
  quorum_port[i]=$(free_port)
  election_port[i]=$(free_port)
  hosts+="127.0.0.1:${client_port[i]},"
done
hosts=${hosts%,}
for i in 1 2 3; do
  mkdir -p "$work/z$i"
  echo "$i" >"$work/z$i/myid"
  {
    echo "tickTime=2000"
    echo "initLimit=10"
    echo "syncLimit=5"
    echo "dataDir=$work/z$i"
    echo "clientPort=${client_port[i]}"
    echo "clientPortAddress=127.0.0.1"
    echo "admin.enableServer=false"
    echo "4lw.commands.whitelist=srvr"
    for j in 1 2 3; do echo "server.$j=127.0.0.1:${quorum_port[j]}:${election_port[j]}"; done
  } >"$work/z$i.cfg"
  java -Xmx256m -cp "$zk" org.apache.zookeeper.server.quorum.QuorumPeerMain "$work/z$i.cfg" \
    >"$work/z$i.log" 2>&1 &
  pids+=($!)
done
ready=0
for _ in $(seq 300); do
  leaders=0 followers=0
  for i in 1 2 3; do
    case $(mode "${client_port[i]}") in
      leader) leaders=$((leaders + 1)) ;;
      follower) followers=$((followers + 1)) ;;
    esac
  done
  if [ "$leaders" = 1 ] && [ "$followers" = 2 ]; then ready=1; break; fi
  sleep 0.1
done
[ "$ready" = 1 ] || { echo "bench-zookeeper.sh: no leader with two followers in 30 s" >&2; exit 1; }

bcprov=${BCPROV_JAR:-/usr/share/java/bcprov.jar}
mkdir -p "$out/classes"
javac --release 17 -encoding UTF-8 -d "$out/classes" -cp "$bcprov:$zk" \
  $(find "$here/src/main/java" "$here/src/bench/java" "$here/src/bench/zookeeper" -name '*.java')
java -cp "$out/classes:$zk:/usr/share/java/slf4j-nop.jar" io.shardlock.bench.ZkLockBenchmark \
  "$hosts" "$seconds"
