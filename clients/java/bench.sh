#!/usr/bin/env bash
# The Java client's benchmark (src/bench/.../LockBenchmark.java) against a
# running shardlockd: acquire+release pairs/s and p50/p99 at 1 and 16
# threads of one client.
#
#   clients/java/bench.sh HOST:PORT [SECONDS]
#
# Measure against a release build (make build-release), not the dev
# preset's sanitizer build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out/classes"
bcprov=${BCPROV_JAR:-/usr/share/java/bcprov.jar}
javac --release 17 -encoding UTF-8 -d "$out/classes" -cp "$bcprov" \
  $(find "$here/src/main/java" "$here/src/bench/java" -name '*.java')
exec java -cp "$out/classes:$bcprov" io.shardlock.bench.LockBenchmark "$@"
