#!/usr/bin/env bash
# Builds the Debian package of a build tree with cpack and checks what it
# installs: the tools, the systemd unit and its flags file (a conffile), the
# headers, the static libraries and the CMake package, and that its
# dependencies were worked out from the binaries.
#   packaging_test.sh BUILD_DIR
set -euo pipefail
build_dir=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cpack -G DEB --config "$build_dir/CPackConfig.cmake" -B "$work" >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log" >&2; exit 1; }
deb=$(ls "$work"/*.deb)
echo "package: $(basename "$deb")"
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' >"$work/files"
dpkg-deb -I "$deb" >"$work/info"

fail=0
expect_file() {
  if ! grep -qx -- "$1" "$work/files"; then echo "missing from the package: $1" >&2; fail=1; fi
}
expect_match() {
  if ! grep -qE -- "$1" "$work/files"; then echo "nothing in the package matches: $1" >&2; fail=1; fi
}
for tool in shardlockd shardlockctl shardlock-bench shardlock-route; do expect_file "/usr/bin/$tool"; done
expect_file /usr/lib/systemd/system/shardlockd.service
expect_file /etc/default/shardlockd
expect_file /usr/include/shardlock/lease/client/client.h
expect_file /usr/include/shardlock/lease/client.h  # the forwarding header, for one release
expect_file /usr/include/shardlock/mutex.h
expect_match '^/usr/lib/(x86_64-linux-gnu/)?libshardlock\.a$'
expect_match '^/usr/lib/(x86_64-linux-gnu/)?libshardlock_lease\.a$'
expect_match '^/usr/lib/(x86_64-linux-gnu/)?cmake/shardlock/shardlockConfig\.cmake$'
expect_file /usr/share/doc/shardlock/README.md
expect_file /usr/include/shardlock/lease/client/c_api.h
expect_match '^/usr/lib/(x86_64-linux-gnu/)?libshardlock_c\.so\.1$'
if grep -q shardlock-torture "$work/files"; then echo "the test harness is packaged" >&2; fail=1; fi
grep -q '^ *Depends:.*liburing' "$work/info" || { echo "Depends lacks liburing:" >&2; grep Depends "$work/info" >&2; fail=1; }
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/default/shardlockd ||
  { echo "/etc/default/shardlockd is not a conffile" >&2; fail=1; }

# The unit as shipped: systemd's own parser, against the packaged binary.
if command -v systemd-analyze >/dev/null; then
  dpkg-deb -x "$deb" "$work/root"
  if ! systemd-analyze verify --man=no --root="$work/root" /usr/lib/systemd/system/shardlockd.service \
      >"$work/verify.log" 2>&1; then
    # Outside a booted systemd some checks cannot run; fail only on unit syntax.
    if grep -qiE 'unknown (key|section)|invalid|failed to parse' "$work/verify.log"; then
      cat "$work/verify.log" >&2
      fail=1
    fi
  fi
fi
[ "$fail" -eq 0 ] && echo "packaging: ok ($(wc -l <"$work/files") paths)"
exit "$fail"
