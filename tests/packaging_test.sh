#!/usr/bin/env bash
# Installs a build tree with `cmake --install --prefix` (all of it, then
# each install component alone) and checks that every file lands under the
# prefix and in exactly one component. Then builds the Debian packages of the
# tree with cpack (shardlockd, shardlock-tools, libshardlock-dev,
# libshardlock-c1) and checks each: its files (dpkg-deb -c), control fields
# (dpkg-deb -I: dependencies between the packages and from the binaries,
# shlibs, the ldconfig trigger, the conffile), /usr/share/doc/<package>,
# archives with machine code and no LTO bytecode, lintian (an error fails),
# and the maintainer scripts run against stubs of deb-systemd-helper and
# deb-systemd-invoke; dpkg unpacks all of them into a scratch root (as root).
# Unpacked together, as installed: the tests/consumer
# project builds against them with g++ and clang++, a C program with
# shardlock_c.pc, the man pages, copyright file, dashboard, alert rules and
# the systemd unit (systemd-analyze verify, alone and with the credential
# drop-in) are checked.
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
mkdir -p "$work/install"
installed "$work/install/all" >"$work/install/all.files"
grep -qx etc/default/shardlockd "$work/install/all.files" ||
  { echo "cmake --install put no etc/default/shardlockd under the prefix" >&2; fail=1; }
: >"$work/install/components.files"
for component in runtime dev daemon tools; do
  installed "$work/install/$component" "$component" >"$work/install/$component.files"
  cat "$work/install/$component.files" >>"$work/install/components.files"
done
# Every file in exactly one component.
if ! diff <(sort "$work/install/components.files") "$work/install/all.files" >"$work/diff"; then
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
  grep -qE -- "$pattern" "$work/install/dev.files" || { echo "the dev component lacks $pattern" >&2; fail=1; }
done
if grep -E '^(bin|etc|share/man)/' "$work/install/dev.files"; then
  echo "the dev component installs programs or configuration (above)" >&2; fail=1
fi
grep -qx bin/shardlockd "$work/install/daemon.files" || { echo "the daemon component lacks bin/shardlockd" >&2; fail=1; }

# The Debian packages: one per component, each listed (dpkg-deb -c), its
# control fields read (dpkg-deb -I, -f) and linted.
cpack -G DEB --config "$build_dir/CPackConfig.cmake" -B "$work/debs" >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log" >&2; exit 1; }
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)  # libraries in /usr/lib/<triplet>
packages=(shardlockd shardlock-tools libshardlock-dev)
if grep -q CPACK_DEBIAN_RUNTIME_PACKAGE_NAME "$build_dir/CPackConfig.cmake"; then
  packages+=(libshardlock-c1)  # the C ABI is built (SHARDLOCK_BUILD_C_API)
fi
declare -A deb
mkdir -p "$work/pkg"
for package in "${packages[@]}"; do
  deb[$package]=$(ls "$work/debs/${package}"_*.deb 2>/dev/null || true)
  if [ -z "${deb[$package]}" ]; then echo "cpack built no $package package" >&2; fail=1; continue; fi
  echo "package: $(basename "${deb[$package]}") ($(du -k "${deb[$package]}" | cut -f1) kB)"
  dpkg-deb -c "${deb[$package]}" | awk '{print $6}' | sed 's|^\./|/|' | grep -v '/$' \
    >"$work/pkg/$package.files"
  dpkg-deb -I "${deb[$package]}" >"$work/pkg/$package.info"
done
if [ "$(ls "$work/debs"/*.deb | wc -l)" -ne "${#packages[@]}" ]; then
  echo "cpack built other packages than ${packages[*]}:" >&2; ls "$work/debs" >&2; fail=1
fi
[ "$fail" -eq 0 ] || exit 1

expect_file() {  # expect_file PACKAGE PATH
  if ! grep -qx -- "$2" "$work/pkg/$1.files"; then echo "missing from $1: $2" >&2; fail=1; fi
}
expect_match() {  # expect_match PACKAGE REGEX
  if ! grep -qE -- "$2" "$work/pkg/$1.files"; then echo "nothing in $1 matches: $2" >&2; fail=1; fi
}
field() { dpkg-deb -f "${deb[$1]}" "$2"; }
version=$(field shardlockd Version)

expect_file shardlockd /usr/bin/shardlockd
expect_file shardlockd /usr/lib/systemd/system/shardlockd.service
expect_file shardlockd /etc/default/shardlockd
expect_file shardlockd /usr/share/man/man8/shardlockd.8.gz
expect_file shardlockd /usr/share/doc/shardlockd/README.md
for page in leases lease-server client cluster operations; do  # the README links them
  expect_file shardlockd "/usr/share/doc/shardlockd/docs/$page.md"
done
for example in auth-key.conf grafana-dashboard.json prometheus-alerts.yml; do
  expect_file shardlockd "/usr/share/doc/shardlockd/examples/$example"
done
for tool in shardlockctl shardlock-bench shardlock-route; do
  expect_file shardlock-tools "/usr/bin/$tool"
  expect_file shardlock-tools "/usr/share/man/man1/$tool.1.gz"
done
expect_file libshardlock-dev /usr/include/shardlock/lease/client/client.h
expect_file libshardlock-dev /usr/include/shardlock/lease/client.h  # the forwarding header, for one release
expect_file libshardlock-dev /usr/include/shardlock/mutex.h
expect_file libshardlock-dev /usr/include/shardlock/lease/client/c_api.h
expect_file libshardlock-dev "/usr/lib/$multiarch/libshardlock.a"
expect_file libshardlock-dev "/usr/lib/$multiarch/libshardlock_lease.a"
expect_file libshardlock-dev "/usr/lib/$multiarch/cmake/shardlock/shardlockConfig.cmake"
if [ -n "${deb[libshardlock-c1]:-}" ]; then
  expect_file libshardlock-dev "/usr/lib/$multiarch/pkgconfig/shardlock_c.pc"
  expect_file libshardlock-dev "/usr/lib/$multiarch/libshardlock_c.so"
  expect_file libshardlock-c1 "/usr/lib/$multiarch/libshardlock_c.so.1"
  field libshardlock-dev Depends | grep -qF "libshardlock-c1 (= $version)" ||
    { echo "libshardlock-dev does not depend on libshardlock-c1 (= $version)" >&2; fail=1; }
  dpkg-deb --ctrl-tarfile "${deb[libshardlock-c1]}" | tar -xO ./shlibs 2>/dev/null |
    grep -qx "libshardlock_c 1 libshardlock-c1 (>= $version)" ||
    { echo "libshardlock-c1 has no shlibs line for libshardlock_c.so.1" >&2; fail=1; }
  dpkg-deb --ctrl-tarfile "${deb[libshardlock-c1]}" | tar -xO ./triggers 2>/dev/null |
    grep -qx 'activate-noawait ldconfig' ||
    { echo "libshardlock-c1 has no ldconfig trigger" >&2; fail=1; }
fi
for package in "${packages[@]}"; do
  # Debian's /usr/share/doc/<package>: copyright, changelogs; and a real
  # extended description (a synopsis and at least two more lines).
  for file in copyright changelog.gz changelog.Debian.gz; do
    expect_file "$package" "/usr/share/doc/$package/$file"
  done
  for relation in Breaks Replaces; do  # the single package of 0.1.0 split
    [ "$(field "$package" "$relation")" = "shardlock (<< 0.1.0-1)" ] ||
      { echo "$package does not say $relation: shardlock (<< 0.1.0-1)" >&2; fail=1; }
  done
  if [ "$(field "$package" Description | wc -l)" -lt 3 ]; then
    echo "$package has no extended description" >&2; fail=1
  fi
  if grep -qvE '^/usr/|^/etc/default/shardlockd$' "$work/pkg/$package.files"; then
    echo "$package has files outside /usr:" >&2
    grep -vE '^/usr/|^/etc/default/shardlockd$' "$work/pkg/$package.files" >&2; fail=1
  fi
done
# No file in two packages (dpkg would refuse to install the second), none
# left out of the split, and the test harness in none.
for package in "${packages[@]}"; do cat "$work/pkg/$package.files"; done | sort | uniq -d >"$work/twice"
if [ -s "$work/twice" ]; then echo "files in two packages:" >&2; cat "$work/twice" >&2; fail=1; fi
if grep -q shardlock-torture "$work"/pkg/*.files; then echo "the test harness is packaged" >&2; fail=1; fi
field shardlockd Depends | grep -q liburing ||
  { echo "shardlockd's Depends lacks liburing: $(field shardlockd Depends)" >&2; fail=1; }
field shardlockd Depends | grep -q init-system-helpers ||
  { echo "shardlockd's Depends lacks init-system-helpers (deb-systemd-helper)" >&2; fail=1; }
dpkg-deb --ctrl-tarfile "${deb[shardlockd]}" | tar -xO ./conffiles | grep -qx /etc/default/shardlockd ||
  { echo "/etc/default/shardlockd is not a conffile" >&2; fail=1; }

# The archives hold machine code and no LTO bytecode (stripped as dh_strip
# does): any compiler links them.
mkdir -p "$work/pkg/dev"
dpkg-deb -x "${deb[libshardlock-dev]}" "$work/pkg/dev"
for archive in "$work/pkg/dev/usr/lib/$multiarch"/*.a; do
  objdump -h "$archive" >"$work/sections"  # to a file: grep -q would cut the pipe
  if ! grep -qE '^ +[0-9]+ \.text' "$work/sections"; then
    echo "$(basename "$archive") holds no machine code" >&2; fail=1
  fi
  if grep -q '\.gnu\.lto_' "$work/sections"; then
    echo "$(basename "$archive") holds LTO bytecode" >&2; fail=1
  fi
done

# lintian on each package: an error fails the test; the warnings are listed
# with their reasons in docs/operations.md ("The packages and lintian").
if command -v lintian >/dev/null; then
  lintian --tag-display-limit 0 "${deb[@]}" >"$work/lintian.log" 2>&1 || true
  if grep -q '^E: ' "$work/lintian.log"; then
    echo "lintian errors:" >&2; grep '^E: ' "$work/lintian.log" >&2; fail=1
  fi
  echo "lintian: $(grep -c '^E: ' "$work/lintian.log" || true) errors, $(grep -c '^W: ' "$work/lintian.log" || true) warnings"
  grep '^W: ' "$work/lintian.log" || true
else
  echo "lintian not found (tools/install-deps.sh --release installs it): the packages were not linted"
fi

# The maintainer scripts, run with deb-systemd-helper, deb-systemd-invoke and
# systemctl replaced by stubs that log their arguments: dh_installsystemd's
# behaviour for a unit neither enabled nor started on install.
mkdir -p "$work/control" "$work/stubs"
dpkg-deb -e "${deb[shardlockd]}" "$work/control"
for stub in deb-systemd-helper deb-systemd-invoke systemctl; do
  printf '#!/bin/sh\necho "%s $*" >>"%s"\n[ "$1" != debian-installed ]\n' "$stub" "$work/calls" \
    >"$work/stubs/$stub"
  chmod +x "$work/stubs/$stub"
done
maintscript() {  # maintscript SCRIPT ARGS...: its stub calls into $work/calls, one a line
  : >"$work/calls"
  PATH="$work/stubs:$PATH" sh "$work/control/$1" "${@:2}" || { echo "$1 ${*:2} failed" >&2; fail=1; }
}
called() { grep -qx -- "$1" "$work/calls"; }
maintscript postinst configure
if grep -qE ' (enable|start|restart|try-restart)( |$)' "$work/calls"; then
  echo "postinst configure enables or starts the unit on install:" >&2; cat "$work/calls" >&2; fail=1
fi
called "deb-systemd-helper update-state shardlockd.service" ||
  { echo "postinst configure does not update deb-systemd-helper's state" >&2; fail=1; }
if [ -d /run/systemd/system ]; then
  maintscript postinst configure "$version"
  called "deb-systemd-invoke try-restart shardlockd.service" ||
    { echo "postinst does not restart a running server after an upgrade" >&2; fail=1; }
  maintscript prerm remove
  called "deb-systemd-invoke stop shardlockd.service" ||
    { echo "prerm remove does not stop the server" >&2; fail=1; }
fi
maintscript prerm upgrade "$version"
if [ -s "$work/calls" ]; then
  echo "prerm upgrade touches the unit (postinst restarts it)" >&2; fail=1
fi
maintscript postrm remove
called "deb-systemd-helper mask shardlockd.service" ||
  { echo "postrm remove does not mask the unit for deb-systemd-helper" >&2; fail=1; }
maintscript postrm purge
called "deb-systemd-helper purge shardlockd.service" ||
  { echo "postrm purge does not purge deb-systemd-helper's state" >&2; fail=1; }
if cat "$work"/control/{postinst,prerm,postrm} | grep -vE '^\s*#' | grep -E '(^|;|\s)systemctl\s' |
    grep -v daemon-reload; then
  echo "a maintainer script calls systemctl for more than daemon-reload (above)" >&2; fail=1
fi

# dpkg itself unpacks the four into a scratch root with a database of its
# own (no file in two packages, the conffile taken as one). --unpack runs no
# maintainer script (there is no preinst); dpkg wants root to set owners.
if [ "$(id -u)" -eq 0 ]; then
  dpkg_root=$work/dpkg-root
  mkdir -p "$dpkg_root/var/lib/dpkg/info" "$dpkg_root/var/lib/dpkg/updates"
  : >"$dpkg_root/var/lib/dpkg/status"
  if ! dpkg --root="$dpkg_root" --log=/dev/null --force-depends --unpack "${deb[@]}" \
      >"$work/dpkg.log" 2>&1; then
    echo "dpkg --unpack of the packages failed:" >&2; cat "$work/dpkg.log" >&2; fail=1
  fi
  [ -f "$dpkg_root/etc/default/shardlockd.dpkg-new" ] ||
    { echo "dpkg did not unpack /etc/default/shardlockd as a conffile" >&2; fail=1; }
else
  echo "not root: dpkg --unpack into a scratch root skipped"
fi

# All the packages unpacked into one root, as installed.
root=$work/root
for package in "${packages[@]}"; do dpkg-deb -x "${deb[$package]}" "$root"; done
docdir=$root/usr/share/doc/shardlockd

# The C++ consumer (tests/consumer) against the unpacked packages, with this
# build's compiler and the other of g++ and clang++ (not under a sanitizer,
# whose runtime the packaged archives would need).
compiler=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
if ! grep -q -- '-fsanitize=' "$build_dir/CMakeCache.txt"; then
  other=$(command -v clang++-14 || command -v clang++ || true)
  if "$compiler" --version | grep -qi clang; then other=$(command -v g++ || true); fi
  source_dir=$(cd "$(dirname "$0")/.." && pwd)
  cmake -DPREFIX="$root/usr" -DSOURCE_DIR="$source_dir/tests/consumer" -DWORK_DIR="$work/consumer" \
    -DCXX_COMPILER="$compiler" -DBUILD_TYPE=Release -DEXTRA_COMPILERS="$other" \
    -P "$source_dir/tests/consumer/run_consumer_test.cmake" >"$work/consumer.log" 2>&1 ||
    { echo "the consumer does not build against the packages:" >&2; cat "$work/consumer.log" >&2; fail=1; }
  echo "consumer built against the packages with: $compiler${other:+ and $other}"
fi

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
[ "$fail" -eq 0 ] && echo "packaging: ok (${#packages[@]} packages, $(cat "$work"/pkg/*.files | wc -l) paths)"
exit "$fail"
