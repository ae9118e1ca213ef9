#!/usr/bin/env bash
# Runs a subset of the test suite under sanitizers, each in its own Meson setup:
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer), in build-asan:
#         unit, sim, shm, tcp, bootstrap, and of the collectives misuse, mismatch (guard
#         elements past every buffer), types_ops_shm and collectives_shm (the tcp and
#         hybrid matrices and the api tests are left out)
#   tsan  ThreadSanitizer, in build-tsan: the threaded parts that do not fork: executor, sim (ranks
#         as threads: executor, progress engine, requests), tcp_frames (progress thread,
#         socketpairs), bootstrap socket/store/context (the store server thread)
#   all   both (the default); a failure in one does not skip the other
# Only the test executables of the subset are built (-j2). Each stage prints its time.
# Suppressions, each with the reason it is not a bug, live in tests/sanitizers/.
#
# Usage: bash tools/sanitize.sh [asan|tsan|all]     (PLAIT_SANITIZE_JOBS=N for -jN)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mode=${1:-all}
case $mode in asan | tsan | all) ;; *)
  echo "usage: $0 [asan|tsan|all]" >&2
  exit 2
  ;;
esac
jobs=${PLAIT_SANITIZE_JOBS:-2}

start=$(date +%s)
last=$start
stage() { # prints the stage that just ended, its time and the total
  local now
  now=$(date +%s)
  echo "== $1: $((now - last)) s (total $((now - start)) s)"
  last=$now
}
failed=()

# -Og with line tables only (-g1) instead of debugoptimized's -O2 -g: about three times
# as fast to compile (the instrumented test matrices dominate the time), the tests still
# run at a usable speed, and reports still name file and line.
options=(-Db_lundef=false -Dcuda=disabled -Dbench=false -Dexamples=false -Dvectorize_check=false
  -Doptimization=g -Ddebug=true -Dcpp_args=-g1)

setup() { # dir, sanitizers
  if [ -f "$1/build.ninja" ]; then
    meson configure "$1" -Db_sanitize="$2" "${options[@]}" >/dev/null
  else
    meson setup "$1" -Db_sanitize="$2" "${options[@]}" >/dev/null
  fi
}

# run_tests label dir [meson test args...]; only the subset was built, so no rebuild.
# Test filters go with --warn NoTests, so that a filter matching nothing fails.
run_tests() {
  local label=$1 dir=$2
  shift 2
  meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes "$jobs" "$@" || failed+=("$label")
}

run_asan() {
  local b=build-asan
  setup $b address,undefined
  stage "asan: setup"
  ninja -C $b -j"$jobs" \
    tests/unit/test_types tests/unit/test_ops tests/unit/test_kernel tests/unit/test_executor \
    tests/sim/test_sim \
    tests/shm/test_shm_mesh tests/shm/test_shm_fifo tests/shm/test_shm_faults tests/shm/test_shm_single_copy \
    tests/tcp/tcp_mesh_test tests/tcp/tcp_frames_test tests/tcp/tcp_faults_test \
    tests/bootstrap/test_bootstrap_auth tests/bootstrap/test_bootstrap_socket \
    tests/bootstrap/test_bootstrap_store tests/bootstrap/test_bootstrap_launch \
    tests/bootstrap/test_bootstrap_token_env tests/bootstrap/test_bootstrap_context \
    tests/bootstrap/test_bootstrap_plaitrun tests/bootstrap/bootstrap_rank_prog tools/plaitrun \
    tests/collectives/misuse tests/collectives/mismatch tests/collectives/types_ops_shm \
    tests/collectives/collectives_shm
  stage "asan: build"

  local supp=$root/tests/sanitizers
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export LSAN_OPTIONS=suppressions=$supp/lsan.supp
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp
  run_tests asan $b types ops kernel executor sim shm_mesh shm_fifo shm_faults shm_single_copy tcp_mesh tcp_frames \
    bootstrap_auth bootstrap_socket bootstrap_store bootstrap_launch bootstrap_token_env \
    bootstrap_context bootstrap_plaitrun misuse mismatch types_ops_shm
  # Timing bounds (peer_lost within 1 s) are asserted: alone, as in the plain suite.
  run_tests asan $b tcp_faults
  # All of it: every collective x algorithm (ranks 1..8, up to 1 Mi elements), and 16 MiB.
  run_tests asan $b collectives_shm
  stage "asan: tests"
  unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
}

run_tsan() {
  local b=build-tsan
  setup $b thread
  stage "tsan: setup"
  ninja -C $b -j"$jobs" tests/unit/test_executor tests/sim/test_sim tests/tcp/tcp_frames_test tests/bootstrap/test_bootstrap_socket \
    tests/bootstrap/test_bootstrap_store tests/bootstrap/test_bootstrap_context
  stage "tsan: build"

  export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/sanitizers/tsan.supp
  run_tests tsan $b executor sim tcp_frames bootstrap_socket
  # TSan does not follow fork(); the test cases that fork are left out:
  #   bootstrap_store   "forked processes share the store"
  #   bootstrap_context "join_world by hand: rank 0 serves the store, every rank connects"
  run_tests tsan $b bootstrap_store --test-args '~forked* --warn NoTests'
  run_tests tsan $b bootstrap_context --test-args '~join_world* --warn NoTests'
  stage "tsan: tests"
  unset TSAN_OPTIONS
}

case $mode in
asan) run_asan ;;
tsan) run_tsan ;;
all)
  run_asan
  run_tsan
  ;;
esac
if [ ${#failed[@]} -gt 0 ]; then
  echo "== sanitizers FAILED: ${failed[*]} (total $(($(date +%s) - start)) s)"
  exit 1
fi
echo "== sanitizers passed (total $(($(date +%s) - start)) s)"
