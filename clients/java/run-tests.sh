#!/usr/bin/env bash
# Builds the Java client with the JDK alone and runs its JUnit 5 suite with
# the console launcher Debian's junit5 package ships (no Maven, no network):
#
#   clients/java/run-tests.sh OUT_DIR [launcher options...]
#
# OUT_DIR gets classes/, test-classes/ and shardlock-client.jar. The tests
# that need a server start $SHARDLOCKD (ctest sets it) on loopback and are
# skipped without it. JUNIT_CONSOLE overrides the launcher's path, BCPROV_JAR
# Bouncy Castle's (the datagram MAC's keyed BLAKE2b; Debian's libbcprov-java).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: run-tests.sh OUT_DIR [launcher options...]}
shift
junit=${JUNIT_CONSOLE:-/usr/share/java/junit-platform-console-standalone.jar}
if [ ! -r "$junit" ]; then
  echo "run-tests.sh: no JUnit console launcher at $junit (apt-get install junit5, or tools/install-deps.sh --java)" >&2
  exit 1
fi
bcprov=${BCPROV_JAR:-/usr/share/java/bcprov.jar}
if [ ! -r "$bcprov" ]; then
  echo "run-tests.sh: no Bouncy Castle at $bcprov (apt-get install libbcprov-java, or tools/install-deps.sh --java)" >&2
  exit 1
fi
rm -rf "$out/classes" "$out/test-classes"
mkdir -p "$out/classes" "$out/test-classes"
mapfile -t main_sources < <(find "$here/src/main/java" -name '*.java' | sort)
mapfile -t test_sources < <(find "$here/src/test/java" -name '*.java' | sort)
# -Xlint:-path: Debian's bcprov.jar names javax.mail jars in its manifest's Class-Path.
javac --release 17 -encoding UTF-8 -Xlint:all,-path -Werror -d "$out/classes" -cp "$bcprov" "${main_sources[@]}"
jar --create --file "$out/shardlock-client.jar" -C "$out/classes" .
# The benchmark main (bench.sh runs it) is compiled too, so it cannot rot.
rm -rf "$out/bench-classes"
mkdir -p "$out/bench-classes"
mapfile -t bench_sources < <(find "$here/src/bench/java" -name '*.java' | sort)
javac --release 17 -encoding UTF-8 -Xlint:all,-path -Werror -d "$out/bench-classes" -cp "$out/classes:$bcprov" "${bench_sources[@]}"
javac --release 17 -encoding UTF-8 -d "$out/test-classes" -cp "$out/classes:$bcprov:$junit" "${test_sources[@]}"
cp -r "$here/src/test/resources/." "$out/test-classes/"
exec java -Dshardlock.clients="$here/.." -jar "$junit" --class-path "$out/shardlock-client.jar:$bcprov:$out/test-classes" \
  --scan-class-path --disable-banner --disable-ansi-colors --details=tree --fail-if-no-tests "$@"
