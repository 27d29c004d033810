# Sourced by bench-compare.sh and bench-zookeeper.sh: a scratch directory
# ($work) and the processes started into $pids, both gone when the script
# exits (only those pids are killed).
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
