#!/usr/bin/env bash
# Puts etcd's v3 API .proto files, and the .proto files they import, into
# OUTDIR, laid out the way their import lines expect:
#
#   OUTDIR/etcd/etcdserver/etcdserverpb/rpc.proto   the KV, Lease and Watch services
#   OUTDIR/etcd/mvcc/mvccpb/kv.proto                KeyValue, Event
#   OUTDIR/etcd/auth/authpb/auth.proto              User, Role (rpc.proto imports it)
#   OUTDIR/gogoproto/gogo.proto                     Go code-generation options only
#   OUTDIR/google/api/annotations.proto, http.proto the JSON gateway's options only
#
# google/protobuf/descriptor.proto comes from libprotobuf-dev (/usr/include).
#
#   tools/fetch-etcd-protos.sh OUTDIR
#
# tools/install-deps.sh runs it into .deps/etcd-protos (git ignores it), where
# configure reads them; configure never fetches. The files are never
# committed to the repository. Debian ships them in three
# Go source packages (golang-etcd-server-dev, golang-github-gogo-protobuf-dev,
# golang-github-grpc-ecosystem-grpc-gateway-dev); installing those would pull
# in ~146 Go packages, so this script `apt-get download`s the three .debs into
# a temporary directory and unpacks them with `dpkg-deb -x` instead. Where
# the packages happen to be installed already, it copies from
# /usr/share/gocode and downloads nothing.
#
# Idempotent: exits at once when every file is already in OUTDIR. A partial
# run leaves OUTDIR untouched (files land in a staging directory first).
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
out=$1

# "<path in OUTDIR> <path under /usr/share/gocode/src>"
files=(
  "etcd/etcdserver/etcdserverpb/rpc.proto go.etcd.io/etcd/etcdserver/etcdserverpb/rpc.proto"
  "etcd/mvcc/mvccpb/kv.proto go.etcd.io/etcd/mvcc/mvccpb/kv.proto"
  "etcd/auth/authpb/auth.proto go.etcd.io/etcd/auth/authpb/auth.proto"
  "gogoproto/gogo.proto github.com/gogo/protobuf/gogoproto/gogo.proto"
  "google/api/annotations.proto github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis/google/api/annotations.proto"
  "google/api/http.proto github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis/google/api/http.proto"
)
packages=(golang-etcd-server-dev golang-github-gogo-protobuf-dev golang-github-grpc-ecosystem-grpc-gateway-dev)

complete=1
for entry in "${files[@]}"; do
  [ -s "$out/${entry%% *}" ] || complete=0
done
if [ "$complete" -eq 1 ]; then
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/etcd-protos.XXXXXX")
trap 'rm -rf "$work"' EXIT

gocode=/usr/share/gocode/src
installed=1
for entry in "${files[@]}"; do
  [ -s "$gocode/${entry##* }" ] || installed=0
done
if [ "$installed" -eq 0 ]; then
  gocode=$work/root/usr/share/gocode/src
  mkdir -p "$work/debs" "$work/root"
  # apt-get download needs the package lists (apt-get update) and the network;
  # it works without root.
  if ! (cd "$work/debs" && apt-get download "${packages[@]}") >"$work/apt.log" 2>&1; then
    cat "$work/apt.log" >&2
    echo "fetch-etcd-protos: 'apt-get download ${packages[*]}' failed (output above)." >&2
    echo "fetch-etcd-protos: it needs the Debian package lists (run 'apt-get update' as root)" \
         "and access to the archive. Or configure with -DSHARDLOCK_BUILD_CLUSTER=OFF." >&2
    exit 1
  fi
  for deb in "$work"/debs/*.deb; do
    dpkg-deb -x "$deb" "$work/root"
  done
fi

stage=$work/stage
for entry in "${files[@]}"; do
  dest=${entry%% *}
  src=$gocode/${entry##* }
  if [ ! -s "$src" ]; then
    echo "fetch-etcd-protos: $src is missing from the unpacked packages" \
         "(did a package move it?)" >&2
    exit 1
  fi
  mkdir -p "$stage/$(dirname "$dest")"
  cp "$src" "$stage/$dest"
done

mkdir -p "$out"
for entry in "${files[@]}"; do
  dest=${entry%% *}
  mkdir -p "$out/$(dirname "$dest")"
  # Same file system as OUTDIR, then rename: a reader never sees half a file.
  cp "$stage/$dest" "$out/$dest.tmp.$$"
  mv -f "$out/$dest.tmp.$$" "$out/$dest"
done
echo "fetch-etcd-protos: etcd's .proto files are in $out" >&2
