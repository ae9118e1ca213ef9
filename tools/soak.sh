#!/usr/bin/env bash
# Soak: a long random sequence of collectives on 4 ranks over shm, tcp and
# hybrid<shm, tcp>, each result checked bit for bit; a run fails on a wrong element, a
# plait::error, or growth of open descriptors or resident memory (bench/plait_soak.cpp).
#
#   bash tools/soak.sh [COUNT]      COUNT collectives per transport (default 10000)
#
# First it checks itself: a short run with one output bit flipped on purpose (-x) must
# fail, naming the call. Then one run per transport; every line is printed as it comes,
# then a summary. Exits non-zero if any run failed.
#
# Environment: BUILD (a configured and built build directory holding bench/plait-soak and
# tools/plaitrun; default build), SOAK_SEED (default 1), SOAK_MAX_BYTES (default 1M),
# PLAIT_TIMEOUT (default 60 s here, so a hang fails in a minute, not in ten).
# Reproduce a failure with the command the script prints for that run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

count=${1:-10000}
case $count in '' | *[!0-9]*)
  echo "usage: $0 [COUNT]   (COUNT: collectives per transport, default 10000)" >&2
  exit 2
  ;;
esac
build=${BUILD:-build}
seed=${SOAK_SEED:-1}
max_bytes=${SOAK_MAX_BYTES:-1M}
export PLAIT_TIMEOUT=${PLAIT_TIMEOUT:-60}
soak=$build/bench/plait-soak
plaitrun=$build/tools/plaitrun
for f in "$soak" "$plaitrun"; do
  if [ ! -x "$f" ]; then
    echo "soak.sh: $f not found; build it first: meson setup $build && ninja -C $build bench/plait-soak tools/plaitrun" >&2
    exit 2
  fi
done

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

# The self-check: the flipped bit must be reported as a wrong element, with exit 1.
"$plaitrun" -n 4 "$soak" -t shm -n 300 -s "$seed" -m "$max_bytes" -x 150 >"$log/self" 2>&1
rc=$?
if [ $rc -eq 0 ] || ! grep -q 'plait-soak: FAILED at op .*: rank 3, element' "$log/self"; then
  cat "$log/self"
  echo "soak.sh: self-check FAILED: a corrupted output was not reported (exit $rc)" >&2
  exit 1
fi
echo "soak: self-check ok (a flipped output bit is reported: $(grep -o 'FAILED at op [0-9]*' "$log/self" | head -1))"

failed=0
summary=()
for t in shm tcp hybrid; do
  cmd="$plaitrun -n 4 $soak -t $t -n $count -s $seed -m $max_bytes"
  echo "soak: $cmd"
  start=$(date +%s.%N)
  $cmd 2>&1 | tee "$log/$t"
  rc=${PIPESTATUS[0]}
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  if [ "$rc" -eq 0 ] && grep -q 'soak ok:' "$log/$t"; then
    summary+=("$(printf '%-7s ok      %6.1f s  %s' "$t" "$secs" "$(grep -o 'rss .*' "$log/$t" | tail -1)")")
  else
    failed=1
    summary+=("$(printf '%-7s FAILED  %6.1f s  exit %s; reproduce: %s' "$t" "$secs" "$rc" "$cmd")")
  fi
done

echo "soak: summary ($count collectives per transport, seed $seed, up to $max_bytes per buffer, 4 ranks)"
for line in "${summary[@]}"; do echo "  $line"; done
exit $failed
