#!/usr/bin/env bash
# Checks the two ways programs outside the project consume plait:
#  1. `meson install` + pkg-config: headers under include/plait/, a pkg-config file
#     named plait, plaitrun on PATH; builds and runs examples/hello_all_reduce.cpp.
#  2. plait as a Meson subproject through plait_dep.
# Usage: tools/check-install.sh BUILD_DIR
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

DESTDIR="$tmp/root" meson install -C "$build" --quiet >/dev/null
pc=$(find "$tmp/root" -name plait.pc | head -n 1)
[ -n "$pc" ] || { echo "FAIL: no plait.pc installed"; exit 1; }
for h in plait/plait.hpp plait/transport/shm.hpp plait/transport/tcp.hpp plait/kernel/reduce_copy.hpp; do
  [ -n "$(find "$tmp/root" -path "*/include/$h")" ] || { echo "FAIL: $h not installed"; exit 1; }
done
export PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR="$tmp/root"
g++ -O2 "$top/examples/hello_all_reduce.cpp" $(pkg-config --cflags --libs plait) -o "$tmp/hello"
plaitrun=$(find "$tmp/root" -name plaitrun -type f | head -n 1)
"$plaitrun" -n 3 "$tmp/hello"
echo "ok: installed headers + pkg-config build and run"

mkdir -p "$tmp/consumer/subprojects"
ln -s "$top" "$tmp/consumer/subprojects/plait"
cat > "$tmp/consumer/meson.build" <<'MESON'
project('consumer', 'cpp', default_options: ['cpp_std=c++20'])
plait_dep = subproject('plait', default_options: ['tests=false', 'bench=false', 'examples=false', 'cuda=disabled']).get_variable('plait_dep')
executable('hello', 'hello.cpp', dependencies: plait_dep)
MESON
cp "$top/examples/hello_all_reduce.cpp" "$tmp/consumer/hello.cpp"
meson setup "$tmp/consumer/build" "$tmp/consumer" >/dev/null
ninja -C "$tmp/consumer/build" hello >/dev/null
"$plaitrun" -n 2 "$tmp/consumer/build/hello"
echo "ok: plait as a Meson subproject"
