#!/usr/bin/env bash
# Builds plait and runs every test (Meson reports tests whose hardware is absent as SKIP).
# Extra arguments go to `meson test` (e.g. --suite shm).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-debian.sh
[ -d build ] || meson setup build --buildtype=debugoptimized -Dwerror=true >/dev/null
ninja -C build
meson test -C build --print-errorlogs "$@"
