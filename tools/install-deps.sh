#!/usr/bin/env bash
# Installs the Debian packages shardlock needs, and only the missing ones.
#
#   tools/install-deps.sh            required build, test and tool dependencies
#   tools/install-deps.sh --peers    also the optional benchmark peers
#   tools/install-deps.sh --redis    also redis-server and redis-tools
#
# Runs `apt-get update` at most once per call, and only when something is
# missing. When not root, prints the exact command to run instead and fails.
set -euo pipefail

required=(
  build-essential cmake pkg-config git
  clang-14 libclang-rt-14-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  liburing-dev libjemalloc-dev libxxhash-dev libcli11-dev libsodium-dev
)
peers=(libtbb-dev libabsl-dev libck-dev)
redis=(redis-server redis-tools)

want=("${required[@]}")
for arg in "$@"; do
  case "$arg" in
    --peers) want+=("${peers[@]}") ;;
    --redis) want+=("${redis[@]}") ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-deps: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

missing=()
for pkg in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
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
