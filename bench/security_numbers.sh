#!/usr/bin/env bash
# What security costs a lease: shardlock-bench's acquire+release pairs/s
# against its embedded server, one request per datagram, keyless, with the
# single shared key (--auth), as a tenant (--tenant: a tag naming a key id,
# the server's tenant and prefix checks) and as an encrypted tenant
# (--tenant --encrypt), the tenant modes in each cipher suite: portable
# (BLAKE2b tag, XChaCha20-Poly1305) and aes (AES-256-GCM, where the CPU has
# AES-NI), in one run. The modes alternate round by round, so every mode
# samples the same outside load; the table has each round, the medians and
# each median's ratio to keyless. Issue 36's goals: tenant >= 0.9x keyless,
# encrypt >= 0.8x. Beside pairs/s, pairs per CPU-second of the bench process
# (pairs/s over its cpu_cores): on a machine shared with other load the
# process gets a varying share of the CPUs, which moves pairs/s but much
# less what a pair costs.
#
#   bench/security_numbers.sh [BUILD_DIR]      (default build/release)
#
# Environment: DURATION (each run, default 5s), ROUNDS (default 3), CLIENTS
# (default 50), CIPHERS (the suites of the tenant modes, default "portable
# aes"; aes is left out where the CPU lacks AES-NI), FLAGS (more
# shardlock-bench flags for every run).
set -euo pipefail

build=${1:-build/release}
bench=$build/tools/shardlock-bench
duration=${DURATION:-5s}
rounds=${ROUNDS:-3}
clients=${CLIENTS:-50}
read -r -a ciphers <<<"${CIPHERS:-portable aes}"
read -r -a extra <<<"${FLAGS:-}"

command -v jq >/dev/null || { echo "security_numbers: jq not found (tools/install-deps.sh)" >&2; exit 1; }
[ -x "$bench" ] || { echo "security_numbers: $bench not built (make build-release)" >&2; exit 1; }

labels=(keyless auth)
declare -A mode_flags=([keyless]="" [auth]="--auth")
# Each label's report: its "security" and its "cipher" (null: no tenant).
declare -A want_security=([keyless]=keyless [auth]=auth)
declare -A want_cipher=([keyless]=null [auth]=null)
for cipher in "${ciphers[@]}"; do
  if [ "$cipher" = aes ] && ! grep -qw aes /proc/cpuinfo; then
    echo "# no AES-NI on this CPU: the aes suite is left out" >&2
    continue
  fi
  for security in tenant encrypt; do
    label=$security-$cipher
    labels+=("$label")
    mode_flags[$label]="--tenant 1 --cipher $cipher"
    [ "$security" = encrypt ] && mode_flags[$label]+=" --encrypt"
    want_security[$label]=$security
    want_cipher[$label]=$cipher
  done
done
common=(--json --duration "$duration" --pack 1 --batch 1 --theta 0 --clients "$clients" "${extra[@]}")
declare -A all_pairs all_p99 all_per_cpu

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(lscpu | grep 'Model name' | sed 's/Model name: *//'), $(nproc) CPUs, kernel $(uname -r)"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $bench ${common[*]} [--auth | --tenant 1 --cipher CIPHER [--encrypt]]"
for round in $(seq "$rounds"); do
  for label in "${labels[@]}"; do
    # shellcheck disable=SC2086  # the mode's flags are words
    json=$("$bench" "${common[@]}" ${mode_flags[$label]})
    if [ "$(jq -r .ok <<<"$json")" != true ] || [ "$(jq -r .errors <<<"$json")" != 0 ]; then
      echo "security_numbers: $label round $round failed: $json" >&2
      exit 1
    fi
    ran_as="$(jq -r .security <<<"$json") $(jq -r .cipher <<<"$json")"
    if [ "$ran_as" != "${want_security[$label]} ${want_cipher[$label]}" ]; then
      echo "security_numbers: $label ran as $ran_as" >&2
      exit 1
    fi
    all_pairs[$label]+="$(jq -r .pairs_per_s <<<"$json") "
    all_p99[$label]+="$(jq -r .pair_latency_us.p99 <<<"$json") "
    all_per_cpu[$label]+="$(jq -r '.pairs_per_s / .cpu_cores | floor' <<<"$json") "
    echo "# round $round $label: $(jq -r .pairs_per_s <<<"$json") pairs/s on $(jq -r .cpu_cores <<<"$json") cores, load $(cut -d' ' -f1 /proc/loadavg)" >&2
  done
done
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

# The median of a space-separated list.
median() { python3 -c "import statistics, sys; print(statistics.median(float(x) for x in sys.argv[1].split()))" "$1"; }
printf '| %s | %s | %s | %s | %s | %s | %s |\n|---|---|---|---|---|---|---|\n' \
  "security" "pairs/s per round" "median pairs/s" "vs keyless" "median pair p99 (us)" \
  "median pairs per CPU-second" "vs keyless"
base=$(median "${all_pairs[keyless]}")
base_per_cpu=$(median "${all_per_cpu[keyless]}")
for label in "${labels[@]}"; do
  m=$(median "${all_pairs[$label]}")
  c=$(median "${all_per_cpu[$label]}")
  printf '| %s | %s | %.0f | %.2fx | %s | %.0f | %.2fx |\n' "$label" "${all_pairs[$label]% }" "$m" \
    "$(python3 -c "print($m / $base)")" "$(median "${all_p99[$label]}")" "$c" \
    "$(python3 -c "print($c / $base_per_cpu)")"
done
