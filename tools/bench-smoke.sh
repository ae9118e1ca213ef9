#!/usr/bin/env bash
# Runs every benchmark once at small sizes with the result check on (-c 1), to prove
# they build, run and agree on results; no timing is asserted. Then bench/compare's
# own smoke test (fake benches) and a quick real comparison with 2 ranks.
#
#   bash tools/bench-smoke.sh [BUILD_DIR]      (default: build; peers built if installed)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
ninja -C "$build" tools/plaitrun bench/plait-bench bench/cma-rate bench/tcp-ceiling bench/shm-ceiling >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
small=(-b 4K -e 256K -f 8 -w 1 -n 3 -c 1)

for t in shm tcp; do
  for o in all_reduce all_gather reduce_scatter broadcast reduce all_to_all; do
    echo "== plait-bench -t $t -o $o, 3 ranks"
    "$build/tools/plaitrun" -n 3 "$build/bench/plait-bench" -t "$t" -o "$o" "${small[@]}" -J "$out/plait.json"
  done
done
python3 -m json.tool "$out/plait.json" >/dev/null
# Every row lists rank 0's time of each call, the warm-up call first (-w 1 -n 3).
python3 -c 'import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert rows and all(len(r["calls_us"]) == 4 and min(r["calls_us"]) > 0 for r in rows), rows' "$out/plait.json"
echo "== plait-bench: every algorithm by name, 4 ranks"
for a in ring tree recursive_doubling; do
  "$build/tools/plaitrun" -n 4 "$build/bench/plait-bench" -t shm -o all_reduce -a "$a" "${small[@]}"
done
for o in all_gather reduce_scatter; do
  "$build/tools/plaitrun" -n 4 "$build/bench/plait-bench" -t shm -o "$o" -a direct "${small[@]}"
done
echo "== bench/ab.sh, one round"
bash bench/ab.sh -B "$build" -r 1 -n 2 PLAIT_POLL 0,0.0001 -- -t shm -o all_reduce -b 4K -e 8K -w 1 -n 2 -c 1
echo "== cma-rate"
"$build/bench/cma-rate" 1M 256K
echo "== tcp-ceiling, 2 ranks (one connection) and 3 (every pattern, bound round robin and not)"
for n in 2 3; do
  for o in all_reduce all_gather reduce_scatter broadcast; do
    "$build/bench/tcp-ceiling" -N "$n" -o "$o" -b 4K -e 256K -f 8 -w 1 -n 3
  done
done
echo "== shm-ceiling, 2 and 3 ranks, outputs checked"
for n in 2 3; do
  for o in all_reduce all_gather reduce_scatter broadcast; do
    "$build/bench/shm-ceiling" -N "$n" -o "$o" "${small[@]}"
  done
done

for impl in openmpi mpich; do
  if [ -x "$build/bench/peers/mpi/peer-$impl-bench" ]; then
    for t in shm tcp; do
      echo "== $impl over $t, 2 ranks"
      PEER_TIMEOUT=120 bash bench/peers/mpi/run.sh "$impl" "$t" 2 "$build" -- -o all_reduce "${small[@]}"
    done
  else
    echo "== $impl: peer benchmark not built (install its -dev package)"
  fi
done
if [ -x "$build/bench/peers/gloo/peer-gloo-bench" ]; then
  for a in ring ring_chunked halving_doubling; do
    echo "== gloo $a, 2 ranks"
    PEER_TIMEOUT=120 "$build/bench/peers/gloo/peer-gloo-bench" -N 2 -o all_reduce -a "$a" "${small[@]}"
  done
else
  echo "== gloo: peer benchmark not built (apt-get install libgloo-dev)"
fi

echo "== bench/compare smoke test (fake benches)"
bash bench/compare_test.sh
echo "== bench/ab.sh smoke test (fake build)"
bash bench/ab_test.sh
echo "== bench/compare --quick, 2 ranks"
bench/compare --quick --strict --build "$build" --ranks 2 --out "$out/compare"
grep -q "^## Targets" "$out/compare/compare.md"
echo "bench-smoke: OK"
