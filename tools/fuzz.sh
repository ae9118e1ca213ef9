#!/usr/bin/env bash
# Builds the libFuzzer harnesses in tests/fuzz/ and runs each for a bounded time.
#
#   bash tools/fuzz.sh [SECONDS] [TARGET...]     fuzz (default 60 s split across all targets)
#   bash tools/fuzz.sh --merge SECONDS [TARGET...]  fuzz, then add the inputs that reach new
#                                   coverage to the kept corpus (tests/fuzz/corpus/<target>/)
#
# Targets: tcp_frames (the TCP transport's receive path), store_requests (the bootstrap
# store's request handling), auth_handshake (the auth handshake's state machine).
# Each run works on a copy of the kept corpus, so fuzzing never changes the repository
# (except with --merge). On a crash, leak, timeout or broken invariant the script
# prints the reproducer's path and the start of the report and exits non-zero;
# reproduce with: build-fuzz/<target> <reproducer>.
#
# Needs clang++ with libFuzzer (Debian 12: packages clang and libclang-rt-14-dev;
# llvm-14 for symbolized stack traces) and libssl-dev.
# Environment: CXX (default clang++), FUZZ_BUILD (where binaries, logs and crash
# reproducers go; default build-fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

merge=0
if [ "${1:-}" = "--merge" ]; then
  merge=1
  shift
fi
total=${1:-60}
shift || true
case $total in '' | *[!0-9]*)
  echo "usage: $0 [--merge] [SECONDS] [TARGET...]" >&2
  exit 2
  ;;
esac
all_targets=(tcp_frames store_requests auth_handshake)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")

# Longest input per target: a few frames of the largest slot size; a few requests;
# a whole handshake with some trailing bytes.
max_len_of() {
  case $1 in
    tcp_frames) echo 9000 ;;
    store_requests) echo 8192 ;;
    auth_handshake) echo 256 ;;
    *)
      echo "unknown fuzz target '$1' (known: ${all_targets[*]})" >&2
      exit 2
      ;;
  esac
}
for t in "${targets[@]}"; do max_len_of "$t" >/dev/null; done

cxx=${CXX:-clang++}
out=${FUZZ_BUILD:-$root/build-fuzz}
mkdir -p "$out/artifacts"
flags=(-std=c++20 -O1 -g "-fsanitize=fuzzer,address,undefined" -fno-sanitize-recover=undefined
  -I"$root/include" -I"$root/transports" -I"$root/kernels")

# libFuzzer's runtime is a separate package on Debian; say which one when it is missing.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe/p.cpp"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" 2>"$probe/err"; then
  cat "$probe/err" >&2
  echo "fuzz: $cxx cannot build a libFuzzer binary; on Debian 12 install clang and libclang-rt-14-dev" >&2
  exit 2
fi

for t in "${targets[@]}"; do
  echo "== build $t"
  "$cxx" "${flags[@]}" "$root/tests/fuzz/$t.cpp" -o "$out/$t" -lcrypto -pthread
done

if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ]; then
  for s in llvm-symbolizer llvm-symbolizer-14 /usr/lib/llvm-14/bin/llvm-symbolizer; do
    if command -v "$s" >/dev/null 2>&1; then
      ASAN_SYMBOLIZER_PATH=$(command -v "$s")
      export ASAN_SYMBOLIZER_PATH
      break
    fi
  done
fi
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

count() { find "$1" -maxdepth 1 -type f | wc -l; }

per=$((total / ${#targets[@]}))
[ "$per" -ge 1 ] || per=1
status=0
for t in "${targets[@]}"; do
  kept=$root/tests/fuzz/corpus/$t
  work=$probe/corpus-$t
  mkdir -p "$work"
  [ -d "$kept" ] && cp -r "$kept/." "$work/"
  log=$out/$t.log
  echo "== fuzz $t for $per s ($(count "$work") inputs in the kept corpus)"
  set +e
  "$out/$t" "$work" -max_total_time="$per" -max_len="$(max_len_of "$t")" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=64 -print_final_stats=1 \
    -artifact_prefix="$out/artifacts/$t-" >"$log" 2>&1
  rc=$?
  set -e
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  echo "   $t: ${runs:-?} runs, ${speed:-?} exec/s, corpus $(count "$work") inputs"
  if [ $rc -ne 0 ]; then
    status=1
    repro=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    echo "FUZZ FAILURE in $t (exit $rc); reproducer: ${repro:-none written} ; full log: $log" >&2
    echo "reproduce: $out/$t ${repro:-<input>}" >&2
    # The report: from the first error line on.
    awk '/ERROR: |fuzz invariant broken|unexpected exception|runtime error|==[0-9]+==/ {on=1} on && n < 40 {print; n++}' \
      "$log" >&2
    continue
  fi
  if [ $merge -eq 1 ]; then  # adds the inputs that reach new coverage; the seeds stay
    mkdir -p "$kept"
    before=$(count "$kept")
    "$out/$t" -merge=1 -max_len="$(max_len_of "$t")" "$kept" "$work" >"$out/$t.merge.log" 2>&1
    echo "   kept corpus of $t: $before -> $(count "$kept") inputs, $(du -sb "$kept" | cut -f1) bytes"
  fi
done
exit $status
