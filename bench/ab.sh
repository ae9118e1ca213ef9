#!/usr/bin/env bash
# bench/ab.sh: before/after on this machine. Runs plait-bench once per value of one
# setting, alternating the values round after round, and prints the median time per
# call (us) for each size and value, with the range over rounds.
#
#   bash bench/ab.sh [-B build] [-r rounds] [-n ranks] SETTING VALUES -- plait-bench args
#
# SETTING is an environment variable (PLAIT_POLL, PLAIT_SLICE_BYTES, ...), -a (the
# algorithm) or BUILD (VALUES are build directories: a code change before and after,
# one of them built from a worktree of the earlier commit); VALUES are comma-separated.
# Example (the oversubscribed poll time):
#   bash bench/ab.sh -r 5 -n 4 PLAIT_POLL 0.000002,0.0001,0.0005 -- -t shm -o all_reduce -b 4K -e 16M -f 16 -n 20 -w 5
# The machines are shared and noisy: compare values only within one run.
set -euo pipefail

build=build-release rounds=3 ranks=2
# Parsed by hand, not with getopts: SETTING may itself be -a.
while (($# >= 2)) && [[ $1 == -[Brn] ]]; do
  case $1 in
    -B) build=$2 ;;
    -r) rounds=$2 ;;
    -n) ranks=$2 ;;
  esac
  shift 2
done
[[ ${1-} == -- ]] && shift  # also taken: ab.sh -r 3 -n 4 -- -a ring,tree -- ...
if (($# < 3)) || [[ $3 != -- ]]; then sed -n '2,13p' "$0" >&2; exit 2; fi
setting=$1 values=$2
shift 3
run=("$build/tools/plaitrun" -n "$ranks" "$build/bench/plait-bench")
for f in "${run[0]}" "${run[3]}"; do
  [[ -x $f ]] || { echo "ab.sh: $f is missing: build first (meson setup $build --buildtype=release)" >&2; exit 2; }
done

results=$(mktemp)
trap 'rm -f "$results"' EXIT
IFS=, read -ra vals <<<"$values"
for ((r = 1; r <= rounds; r++)); do
  for v in "${vals[@]}"; do
    echo "ab.sh: round $r/$rounds, $setting=$v" >&2
    if [[ $setting == -a ]]; then
      out=$("${run[@]}" "$@" -a "$v" 2>&1) || { echo "$out" >&2; exit 1; }
    elif [[ $setting == BUILD ]]; then
      out=$("$v/tools/plaitrun" -n "$ranks" "$v/bench/plait-bench" "$@" 2>&1) || { echo "$out" >&2; exit 1; }
    else
      out=$(env "$setting=$v" "${run[@]}" "$@" 2>&1) || { echo "$out" >&2; exit 1; }
    fi
    # Rank 0's table rows: size is column 2, time (us) column 7 (after the [0] tag).
    awk -v v="$v" '$1 == "[0]" && $2 ~ /^[0-9]+$/ {print v, $2, $7}' <<<"$out" >>"$results"
  done
done

python3 - "$results" "$setting" "$values" <<'PY'
import collections, statistics, sys
path, setting, values = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
times = collections.defaultdict(list)
for line in open(path):
    v, size, t = line.split()
    times[(int(size), v)].append(float(t))
sizes = sorted({s for s, _ in times})
print(f"# time per call, us: median (min-max) over rounds; {setting} =")
print("| size | " + " | ".join(values) + " |")
print("|---|" + "---|" * len(values))
for s in sizes:
    cells = []
    for v in values:
        t = times.get((s, v))
        cells.append(f"{statistics.median(t):.1f} ({min(t):.1f}-{max(t):.1f})" if t else "—")
    print(f"| {s} | " + " | ".join(cells) + " |")
PY
