#!/usr/bin/env bash
# Installs a build tree with `cmake --install --prefix` (all of it, then
# each install component alone) and checks that every file lands under the
# prefix and in exactly one component. Then builds the Debian package of the
# tree with cpack and checks what it installs: the tools and their man pages, the systemd unit (Type=notify,
# checked with systemd-analyze where it exists, alone and with the credential
# drop-in) and its flags file (a conffile), the headers, the static
# libraries, the CMake package, libshardlock_c.so.1 with a shardlock_c.pc
# that a C program builds and links with, the copyright file, the changelog,
# the Grafana dashboard and the Prometheus rules, and that its dependencies
# were worked out from the binaries.
#   packaging_test.sh BUILD_DIR
set -euo pipefail
build_dir=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0

# The install rules, as a user without root runs them: everything under the
# --prefix given (nothing in /etc), and each component alone. The manifests
# list every file written, wherever it went.
installed() {  # installed PREFIX [COMPONENT]: the files, relative to PREFIX
  local prefix=$1 manifest=$build_dir/install_manifest.txt
  if [ $# -gt 1 ]; then
    cmake --install "$build_dir" --prefix "$prefix" --component "$2" >"$work/install.log" 2>&1 ||
      { cat "$work/install.log" >&2; return 1; }
    manifest=$build_dir/install_manifest_$2.txt
  else
    cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log" 2>&1 ||
      { cat "$work/install.log" >&2; return 1; }
  fi
  if grep -v "^$prefix/" "$manifest" >"$work/outside"; then
    echo "cmake --install --prefix $prefix ${2:+--component $2 }wrote outside the prefix:" >&2
    cat "$work/outside" >&2
    fail=1
  fi
  sed "s|^$prefix/||" "$manifest" | sort
}
installed "$work/all" >"$work/all.files"
grep -qx etc/default/shardlockd "$work/all.files" ||
  { echo "cmake --install put no etc/default/shardlockd under the prefix" >&2; fail=1; }
: >"$work/components.files"
for component in runtime dev daemon tools; do
  installed "$work/$component" "$component" >"$work/$component.files"
  cat "$work/$component.files" >>"$work/components.files"
done
# Every file in exactly one component.
if ! diff <(sort "$work/components.files") "$work/all.files" >"$work/diff"; then
  echo "the components do not add up to the whole install (< components, > all):" >&2
  cat "$work/diff" >&2
  fail=1
fi
# The library alone: headers, archives, the CMake package, the .pc, and no
# program and no configuration.
libdir='lib/([a-z0-9_]+-linux-gnu/)?'
for pattern in '^include/shardlock/mutex\.h$' '^include/shardlock/lease/client/c_api\.h$' \
               "^${libdir}cmake/shardlock/shardlockConfig\\.cmake$" "^${libdir}libshardlock\\.a$" \
               "^${libdir}libshardlock_lease\\.a$" "^${libdir}pkgconfig/shardlock_c\\.pc$"; do
  grep -qE -- "$pattern" "$work/dev.files" || { echo "the dev component lacks $pattern" >&2; fail=1; }
done
if grep -E '^(bin|etc|share/man)/' "$work/dev.files"; then
  echo "the dev component installs programs or configuration (above)" >&2; fail=1
fi
grep -qx bin/shardlockd "$work/daemon.files" || { echo "the daemon component lacks bin/shardlockd" >&2; fail=1; }

cpack -G DEB --config "$build_dir/CPackConfig.cmake" -B "$work" >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log" >&2; exit 1; }
deb=$(ls "$work"/*.deb)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)  # libraries in /usr/lib/<triplet>
echo "package: $(basename "$deb")"
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' >"$work/files"
dpkg-deb -I "$deb" >"$work/info"

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
expect_match "^/usr/lib/$multiarch/libshardlock\.a$"
expect_match "^/usr/lib/$multiarch/libshardlock_lease\.a$"
expect_match "^/usr/lib/$multiarch/cmake/shardlock/shardlockConfig\.cmake$"
expect_file /usr/share/doc/shardlock/README.md
for page in leases lease-server client cluster operations; do  # the README links them
  expect_file "/usr/share/doc/shardlock/docs/$page.md"
done
expect_file /usr/include/shardlock/lease/client/c_api.h
expect_match "^/usr/lib/$multiarch/libshardlock_c\.so\.1$"
expect_file /usr/share/doc/shardlock/copyright
expect_file /usr/share/doc/shardlock/CHANGELOG.md
for example in auth-key.conf grafana-dashboard.json prometheus-alerts.yml; do
  expect_file "/usr/share/doc/shardlock/examples/$example"
done
expect_file /usr/share/man/man8/shardlockd.8.gz
for tool in shardlockctl shardlock-bench shardlock-route; do expect_file "/usr/share/man/man1/$tool.1.gz"; done
expect_match "^/usr/lib/$multiarch/pkgconfig/shardlock_c\.pc$"
if grep -q shardlock-torture "$work/files"; then echo "the test harness is packaged" >&2; fail=1; fi
grep -q '^ *Depends:.*liburing' "$work/info" || { echo "Depends lacks liburing:" >&2; grep Depends "$work/info" >&2; fail=1; }
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/default/shardlockd ||
  { echo "/etc/default/shardlockd is not a conffile" >&2; fail=1; }

dpkg-deb -x "$deb" "$work/root"
root=$work/root
docdir=$root/usr/share/doc/shardlock

# The copyright file in Debian's machine-readable format, under the licence
# of LICENSE.
copyright=$(cat "$docdir/copyright" 2>/dev/null || true)
for line in 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' \
            'Upstream-Name: shardlock' 'Copyright: 2026 the shardlock authors' 'License: Expat'; do
  grep -qxF -- "$line" <<<"$copyright" || { echo "copyright lacks the line: $line" >&2; fail=1; }
done

# Man pages: help2man's, naming the tool (not the build directory it ran in).
for page in man8/shardlockd.8 man1/shardlockctl.1 man1/shardlock-bench.1 man1/shardlock-route.1; do
  [ -f "$root/usr/share/man/$page.gz" ] || continue
  text=$(gzip -dc "$root/usr/share/man/$page.gz")
  name=$(basename "$page" | sed 's/\.[0-9]$//')
  grep -q "^\.TH \"\{0,1\}${name^^}\"\{0,1\} " <<<"$text" || { echo "$page: no .TH header for $name" >&2; fail=1; }
  grep -qF -- '\-\-help' <<<"$text" || { echo "$page: no options" >&2; fail=1; }
  if grep -qF -- "$build_dir" <<<"$text"; then echo "$page names the build directory" >&2; fail=1; fi
done
if [ -f "$root/usr/share/man/man8/shardlockd.8.gz" ] &&
    ! gzip -dc "$root/usr/share/man/man8/shardlockd.8.gz" | grep -q -- 'log\\-level'; then
  echo "shardlockd.8 does not document --log-level" >&2; fail=1
fi

# shardlock_c.pc: a C program builds against the unpacked package with
# nothing but what pkg-config says, and runs.
pc=$(find "$root/usr/lib" -name shardlock_c.pc | head -n 1)
if [ -n "$pc" ] && command -v pkg-config >/dev/null && command -v cc >/dev/null; then
  flags=$(PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_LIBDIR=$(dirname "$pc") \
    pkg-config --cflags --libs shardlock_c) || { echo "pkg-config cannot read $pc" >&2; fail=1; }
  cat >"$work/pc.c" <<'C'
#include <shardlock/lease/client/c_api.h>
#include <stdio.h>
int main(void) { puts(shardlock_strerror(SHARDLOCK_OK)); return 0; }
C
  # A sanitizer build's library needs its runtime first in the program
  # (ASan refuses to run otherwise): the program is built the same way.
  sanitize=$(grep -o -- '-fsanitize=[a-z,]*' "$build_dir/CMakeCache.txt" | head -n 1 || true)
  # shellcheck disable=SC2086  # the flags are words
  if cc -std=c11 $sanitize "$work/pc.c" -o "$work/pc" $flags >"$work/cc.log" 2>&1; then
    libdir=$(dirname "$(dirname "$pc")")
    LD_LIBRARY_PATH=$libdir "$work/pc" >/dev/null || { echo "the pkg-config test program fails" >&2; fail=1; }
  else
    echo "a C program does not build with pkg-config --cflags --libs shardlock_c ($flags):" >&2
    cat "$work/cc.log" >&2
    fail=1
  fi
fi

# The dashboard is JSON, and the rules are Prometheus rules where promtool
# exists (YAML otherwise, where python3 reads it).
if command -v python3 >/dev/null; then
  python3 -m json.tool "$docdir/examples/grafana-dashboard.json" >/dev/null 2>"$work/json.log" ||
    { echo "grafana-dashboard.json is not JSON:" >&2; cat "$work/json.log" >&2; fail=1; }
fi
rules=$docdir/examples/prometheus-alerts.yml
if command -v promtool >/dev/null; then
  promtool check rules "$rules" >"$work/promtool.log" 2>&1 ||
    { cat "$work/promtool.log" >&2; fail=1; }
elif command -v python3 >/dev/null && python3 -c 'import yaml' 2>/dev/null; then
  python3 - "$rules" <<'PY' || fail=1
import sys, yaml
rules = [r for g in yaml.safe_load(open(sys.argv[1]))["groups"] for r in g["rules"]]
names = {r["alert"] for r in rules}
want = {"ShardlockRecovering", "ShardlockAuthenticationFailures", "ShardlockLimitRejections",
        "ShardlockSendDrops"}
missing = want - names
if missing or not all(r.get("expr") for r in rules):
    sys.exit(f"prometheus-alerts.yml: missing {sorted(missing)} or a rule without expr")
PY
fi

# The unit as shipped: Type=notify, and systemd's own parser against the
# packaged binary, alone and with the credential drop-in installed.
unit=$root/usr/lib/systemd/system/shardlockd.service
grep -qx 'Type=notify' "$unit" || { echo "shardlockd.service is not Type=notify" >&2; fail=1; }
verify_unit() {
  if ! systemd-analyze verify --man=no --root="$root" /usr/lib/systemd/system/shardlockd.service \
      >"$work/verify.log" 2>&1; then
    # Outside a booted systemd some checks cannot run; fail only on unit syntax.
    if grep -qiE 'unknown (key|section)|invalid|failed to parse' "$work/verify.log"; then
      echo "systemd-analyze verify ($1):" >&2
      cat "$work/verify.log" >&2
      fail=1
    fi
  fi
}
if command -v systemd-analyze >/dev/null; then
  verify_unit "the unit"
  mkdir -p "$root/etc/systemd/system/shardlockd.service.d"
  cp "$docdir/examples/auth-key.conf" "$root/etc/systemd/system/shardlockd.service.d/"
  verify_unit "with examples/auth-key.conf"
else
  echo "systemd-analyze not found: the unit's syntax was not checked"
fi
[ "$fail" -eq 0 ] && echo "packaging: ok ($(wc -l <"$work/files") paths)"
exit "$fail"
