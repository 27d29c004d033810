#!/usr/bin/env bash
# Installs the Debian packages shardlock needs, and only the missing ones,
# then puts etcd's .proto files into .deps/etcd-protos (configure reads them
# from there and never fetches anything, so a rebuild works offline).
#
#   tools/install-deps.sh            everything to build and test (make test, make lint)
#   tools/install-deps.sh --release  what the release build needs (make run, make package):
#                                    no test tools, but the cluster layer's gRPC
#   tools/install-deps.sh --peers    also the optional benchmark peers (make bench)
#   tools/install-deps.sh --redis    also redis-server and redis-tools
#   tools/install-deps.sh --cluster  the release set plus etcd (make bench-cluster)
#   tools/install-deps.sh --failover the cluster set plus ZooKeeper, kazoo and python3-xxhash
#                                    (make bench-failover)
#   tools/install-deps.sh --java     only the Java client's build and tests (JDK 17, JUnit 5, bcprov)
#   tools/install-deps.sh --lock-peers the release set plus Redis, etcd and Go with etcd's
#                                    client sources (make bench-peers)
#
# The default set includes etcd: the dev and tsan presets' cluster tests run
# a real etcd.
#
# Runs `apt-get update` at most once per call, and only when something is
# missing. When not root, prints the exact command to run instead and fails.
set -euo pipefail

# The release preset: libraries, tools and benchmarks, no tests.
release=(
  build-essential cmake ninja-build pkg-config
  libbenchmark-dev
  liburing-dev libjemalloc-dev libxxhash-dev libcli11-dev libsodium-dev
  nlohmann-json3-dev  # shardlockctl's JSON output
  prometheus-cpp-dev
  help2man  # the tools' man pages, from their --help (packaging/)
  lintian  # make package's packaging_test lints each .deb
)
# The dev, tsan and clang presets' tests, the fuzz targets and make lint.
testing=(
  git ccache clang-14 libclang-rt-14-dev clang-tidy-14
  libgtest-dev libgmock-dev
  python3-xxhash  # the Python client's cluster mode and its tests
  python3-nacl  # the Python client's portable encryption (XChaCha20-Poly1305) and its tests
  python3-cryptography  # the Python client's AES-256-GCM suite (cipher="aes", "auto") and its tests
  # The Python client's offline install test (venv --system-site-packages,
  # pip install --no-build-isolation).
  python3-venv python3-setuptools python3-wheel
  mypy  # python_client_mypy: mypy --strict over the Python client, which ships py.typed
)
# The etcd client (src/cluster/), which the release preset builds: gRPC,
# protobuf and their code generators, and OpenSSL's libcrypto (libgrpc-dev
# pulls it in; the client reads its TLS files with it). etcd's .proto files
# are not here: they come from tools/fetch-etcd-protos.sh (apt-get download,
# never installed).
grpc=(libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev)
# The Java client (clients/java) and its ctest: javac, jar, JUnit 5's
# console launcher and Bouncy Castle (the datagram MAC), all from Debian; no
# Maven.
java=(openjdk-17-jdk-headless junit5 libbcprov-java)
# etcd itself, for the cluster tests, the torture run and make bench-cluster;
# etcdctl (etcd-client) and openssl, with which the TLS cluster tests
# (etcd_tls_test) make their certificates and turn etcd's auth on.
etcd=(etcd-server etcd-client openssl)
peers=(libtbb-dev libabsl-dev libck-dev)
redis=(redis-server redis-tools)
# make bench-failover's peers: etcd (above) and a ZooKeeper ensemble, run
# from the zookeeper package's jars with the script's own configuration
# (zookeeperd would only add the system service, which the script never
# uses), and kazoo's lock recipe as its client.
zookeeper=(zookeeper python3-kazoo)
# make bench-failover's rolling restart: its probe is the Python client in
# cluster mode, which hashes with xxhash.
probe=(python3-xxhash)
# make bench-peers builds a Go program against etcd's own lock
# (clientv3/concurrency), from Debian's sources in /usr/share/gocode.
golang=(golang-go golang-etcd-server-dev)

want=("${release[@]}" "${grpc[@]}")
with_testing=1
java_only=0
for arg in "$@"; do
  case "$arg" in
    --release) with_testing=0 ;;
    --cluster) with_testing=0; want+=("${etcd[@]}") ;;
    --failover) with_testing=0; want+=("${etcd[@]}" "${zookeeper[@]}" "${probe[@]}") ;;
    --lock-peers) with_testing=0; want+=("${etcd[@]}" "${redis[@]}" "${golang[@]}") ;;
    --java) java_only=1 ;;
    --peers) want+=("${peers[@]}") ;;
    --redis) want+=("${redis[@]}") ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-deps: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done
if [ "$with_testing" -eq 1 ]; then
  want+=("${testing[@]}" "${etcd[@]}" "${java[@]}")
fi
if [ "$java_only" -eq 1 ]; then
  want=("${java[@]}")
fi

root=$(cd "$(dirname "$0")/.." && pwd)
proto_dir=$root/.deps/etcd-protos

# Needs no root: apt-get download of three .debs, unpacked with dpkg-deb.
# Does nothing when the files are there already.
fetch_protos() {
  if "$root/tools/fetch-etcd-protos.sh" "$proto_dir"; then
    return 0
  fi
  # Most often the package lists are missing (a fresh container).
  if [ "$(id -u)" -eq 0 ]; then
    echo "install-deps: retrying after apt-get update" >&2
    apt-get update -qq
    "$root/tools/fetch-etcd-protos.sh" "$proto_dir" && return 0
  fi
  echo "install-deps: could not put etcd's .proto files into $proto_dir (output above)" >&2
  return 1
}

missing=()
for pkg in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  fetch_protos
  exit 0
fi

cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing Debian packages: ${missing[*]}" >&2
  echo "install-deps: run as root:  sudo sh -c '$cmd'" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fetch_protos
