#!/usr/bin/env bash
# Runs every fault-test case (tests/faults) RUNS times and prints, per case and
# survivor, the median and maximum measured time, the bound, and pass/fail, as a
# Markdown table (the table in docs/errors.md comes from here).
#
#   tools/fault-repeat.sh [BUILD_DIR [RUNS [TEST ...]]]
#   BUILD_DIR  a configured build (default: build); the fault tests are built first
#   RUNS       runs per case (default 20)
#   TEST       kill, stop, join (default: all three)
#
# The times: kill = from SIGKILL to the survivor's call throwing (peer_lost naming
# the dead rank); stopped = from the start of the call that fails to its timeout;
# never connected = from the start of from_env() to its timeout; slow = the longest
# call of a rank that waited for the late one (no error allowed). A row passes when
# every run was within the bound and correct (right code, right rank, clean
# afterwards). Takes about 15 minutes with 20 runs; run it on an otherwise idle host.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
runs=${2:-20}
shift $(($# > 2 ? 2 : $#))
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(kill stop join)

targets=()
for t in "${tests[@]}"; do targets+=("tests/faults/test_faults_$t"); done
ninja -C "$build" "${targets[@]}" >/dev/null

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
for t in "${tests[@]}"; do
  exe="$build/tests/faults/test_faults_$t"
  echo "running $exe, $runs runs per case ..." >&2
  start=$(date +%s)
  # The exit status says whether every bound held; the table says where not.
  if ! PLAIT_FAULT_REPEAT=$runs PLAIT_FAULT_LOG="$log" "$exe" >/dev/null 2>&1; then status=1; fi
  echo "  done in $(($(date +%s) - start)) s" >&2
done

# Log lines: fault, case, survivor, ms, lo, hi, correct, detail (tab-separated).
sort -t "$(printf '\t')" -k2,2 -k3,3n -k4,4n "$log" | awk -F'\t' '
  function flush() {
    if (n == 0) return
    med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    bound = (lo > 0) ? sprintf("%d..%d", lo, hi) : sprintf("<= %d", hi)
    result = (over == 0 && wrong == 0) ? "pass" : sprintf("FAIL (%d out of bound, %d wrong)", over, wrong)
    printf("| %s | %d | %d | %.0f | %.0f | %s | %s |\n", name, who, n, med, v[n], bound, result)
    if (wrong > 0 && example != "") printf("|   | | | | | | first wrong: %s |\n", example)
    n = 0; over = 0; wrong = 0; example = ""
  }
  BEGIN {
    print "| case | survivor | runs | median ms | max ms | bound ms | result |"
    print "|---|---|---|---|---|---|---|"
  }
  {
    if ($2 != name || $3 != who) { flush(); name = $2; who = $3 }
    v[++n] = $4 + 0; lo = $5 + 0; hi = $6 + 0
    if ($4 + 0 < lo || $4 + 0 > hi) over++
    if ($7 != 1) { wrong++; if (example == "") example = $8 }
  }
  END { flush() }'
exit $status
