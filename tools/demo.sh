#!/usr/bin/env bash
# The demo: builds plait and runs a 4-rank all-reduce sweep (8 B to 64 MiB) over
# shared memory on this machine, printed like nccl-tests. Extra arguments go to plait-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-debian.sh
[ -d build-release ] || meson setup build-release --buildtype=release -Dtests=false >/dev/null
ninja -C build-release tools/plaitrun bench/plait-bench >/dev/null
exec build-release/tools/plaitrun -n 4 build-release/bench/plait-bench -t shm -o all_reduce -b 8 -e 64M -f 2 "$@"
