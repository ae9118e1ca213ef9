#!/usr/bin/env bash
# The checks that need a GPU, for a machine that has one (DESIGN.md section 8: code for
# absent hardware is compiled in CI; this script runs its tests where the hardware is).
#
# Usage: bash tools/gpu-check.sh [build dir, default /tmp/plait-gpu]
#   GPU_ARCH=90  the one architecture to build for (default 90: Hopper)
#   CUDA_BW_MIB  MiB per array for the bandwidth table (default 1024)
# Needs nvcc and a C++20 host compiler only (no Meson): builds the CUDA kernel test and
# cuda-bw from this checkout, runs the test, runs it again under compute-sanitizer
# (memcheck) when that tool is there, then prints the bandwidth table. Exits non-zero if
# a build or a check failed; 77 if there is no device.
set -u
cd "$(dirname "$0")/.."
out=${1:-/tmp/plait-gpu}
arch=${GPU_ARCH:-90}
mkdir -p "$out"
flags=(-std=c++20 -O2 "-gencode=arch=compute_$arch,code=sm_$arch" -Iinclude -Itransports -Ikernels)

echo "== build (nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), sm_$arch)"
nvcc "${flags[@]}" tests/cuda/test_cuda_reduce_copy.cu -o "$out/test_cuda_reduce_copy" || exit 1
nvcc "${flags[@]}" bench/cuda_bw.cu -o "$out/cuda-bw" || exit 1

status=0
echo "== test_cuda_reduce_copy"
"$out/test_cuda_reduce_copy" >"$out/test.log"
rc=$?
grep -m 20 '^FAIL' "$out/test.log"
head -n 1 "$out/test.log"
tail -n 1 "$out/test.log"
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || status=1

if command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer --tool memcheck test_cuda_reduce_copy"
  compute-sanitizer --tool memcheck --error-exitcode 3 "$out/test_cuda_reduce_copy" | tail -n 3
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
  echo "== compute-sanitizer: not installed, memcheck not run"
fi

echo "== cuda-bw ${CUDA_BW_MIB:-1024} MiB per array"
"$out/cuda-bw" "${CUDA_BW_MIB:-1024}" || status=1
exit $status
