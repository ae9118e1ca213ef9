#!/usr/bin/env bash
# Installs what building and testing plait needs on Debian 12 (run as root, or with sudo).
set -euo pipefail
pkgs=(meson ninja-build g++ pkg-config libssl-dev catch2 clang-format iproute2 python3)
# Fuzzing (tools/fuzz.sh): clang with libFuzzer's runtime, and a symbolizer for its reports.
[ "${PLAIT_SETUP_FUZZ:-0}" = 1 ] && pkgs+=(clang libclang-rt-14-dev llvm)
# The peer benchmarks (bench/peers, bench/compare): Open MPI, MPICH, Gloo, matplotlib.
[ "${PLAIT_SETUP_PEERS:-0}" = 1 ] && pkgs+=(openmpi-bin libopenmpi-dev mpich libmpich-dev libgloo-dev python3-matplotlib)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
