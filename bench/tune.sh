#!/usr/bin/env bash
# Measures plait's all_reduce busbw for each pipeline slice size and FIFO depth
# (PLAIT_SLICE_BYTES x PLAIT_DEPTH), so the defaults come from measurements. Rounds
# alternate over the grid; the table gives the median busbw over rounds per cell.
#
#   bash bench/tune.sh [BUILD_DIR [TRANSPORT [RANKS [SIZES [ROUNDS]]]]]
#   defaults: build-release shm "2 4" "1M 16M" 3
#   SLICES="32K 64K 128K 256K 512K" DEPTHS="2 4 8" override the grid.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-release}
transport=${2:-shm}
ranks=${3:-"2 4"}
sizes=${4:-"1M 16M"}
rounds=${5:-3}
slices=${SLICES:-"32K 64K 128K 256K 512K"}
depths=${DEPTHS:-"2 4 8"}
ninja -C "$build" tools/plaitrun bench/plait-bench >/dev/null
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for r in $(seq "$rounds"); do
  for n in $ranks; do
    for s in $sizes; do
      for slice in $slices; do
        for depth in $depths; do
          busbw=$(PLAIT_SLICE_BYTES=$slice PLAIT_DEPTH=$depth "$build/tools/plaitrun" -n "$n" \
            "$build/bench/plait-bench" -t "$transport" -b "$s" -e "$s" -w 3 -n 10 -c 0 2>/dev/null |
            awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ {print $9}')
          echo "$n $s $slice $depth ${busbw:-nan}" >>"$raw"
          echo "round $r: n=$n size=$s slice=$slice depth=$depth busbw=${busbw:-failed}" >&2
        done
      done
    done
  done
done
echo "# plait all_reduce float sum over $transport: busbw GB/s, median of $rounds rounds ($(date -u +%F), $(nproc) cores)"
python3 - "$raw" "$depths" <<'PY'
import statistics, sys
from collections import defaultdict
cells = defaultdict(list)
for line in open(sys.argv[1]):
    n, size, slice_, depth, bw = line.split()
    if bw != "nan":
        cells[(n, size, slice_, depth)].append(float(bw))
depths = sys.argv[2].split()
rows = sorted({k[:3] for k in cells}, key=lambda k: (int(k[0]), k[1], k[2]))
print("| ranks | size | slice | " + " | ".join(f"depth {d}" for d in depths) + " |")
print("|---|---|---|" + "---|" * len(depths))
for n, size, slice_ in rows:
    vals = [cells.get((n, size, slice_, d)) for d in depths]
    print(f"| {n} | {size} | {slice_} | " + " | ".join(f"{statistics.median(v):.2f}" if v else "-" for v in vals) + " |")
PY
