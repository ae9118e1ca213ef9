#!/usr/bin/env bash
# Smoke test of bench/compare against fake benchmarks (no MPI, Gloo or plait build needed).
# The fakes check the options compare passes and write bench_report.hpp's JSON; one of
# them fails (mpich over tcp) and one hangs (gloo broadcast, 4 ranks) to exercise the
# skip paths. Run from anywhere: bash bench/compare_test.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail() { echo "compare_test: FAIL: $*" >&2; exit 1; }

mkdir -p "$tmp/build/tools" "$tmp/build/bench/peers/gloo"
cat >"$tmp/fakebench.py" <<'EOF'
#!/usr/bin/env python3
"""Writes a bench_report.hpp JSON for: fakebench.py LIBRARY RANKS TRANSPORT [bench options]."""
import json, os, sys, time
lib, n, transport, args = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
o = dict(zip(args[0::2], args[1::2]))
need = ["-b", "-e", "-f", "-o", "-d", "-r", "-w", "-n", "-c", "-J"]
if len(args) % 2 or any(k not in o for k in need) or o["-d"] != "float" or o["-r"] != "sum":
    sys.exit(f"fakebench: bad options {args}")
if lib == "mpich" and transport == "tcp":
    sys.exit("fakebench: mpich tcp is broken on purpose")
if lib == "gloo" and o["-o"] == "broadcast" and n == 4:
    time.sleep(60)
size = lambda s: int(float(s[:-1]) * {"K": 1024, "M": 1 << 20}[s[-1]]) if s[-1] in "KM" else int(s)
sizes, b = [], size(o["-b"])
while b <= size(o["-e"]):
    sizes.append(b)
    b = max(int(b * float(o["-f"])), b + 1)
hugetlb = "hugetlb=1" in os.environ.get("GLIBC_TUNABLES", "")
speed = {"plait": 2.5, "tcp-ceiling": 3.0, "shm-ceiling": 3.0}.get(lib, 1.2 if hugetlb else 1.0)
speed = float(os.environ.get("FAKE_SPEED_" + lib.upper().replace("-", "_"), speed))
factor = {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0}.get(o["-o"], (n - 1) / n)
rows = []
calls = int(o["-w"]) + int(o["-n"])
for s in sizes:
    busbw = speed * s / (s + 65536) * 10
    t = s / (busbw / factor * 1e9) * 1e6
    rows.append({"bytes": s, "count": s // 4, "root": 0, "time_us": t, "algbw": busbw / factor, "busbw": busbw,
                 "wrong": 0, "minflt": 0 if lib == "plait" else 1.5, "bound_gbps": 12.0 if lib == "plait" else 0,
                 "calls_us": ([3 * t, 2 * t] + [t] * calls)[:calls]})
doc = {"library": lib, "version": "0.fake", "collective": o["-o"], "algorithm": o.get("-a", "auto"),
       "transport": transport, "ranks": n, "type": "float", "redop": "sum",
       "settings": "fake" + (" hugetlb" if hugetlb else ""), "warmup": int(o["-w"]), "iters": int(o["-n"]),
       "bound": "copy" if lib == "plait" else "", "avg_busbw": 0, "rows": rows}
with open(o["-J"], "w") as f:
    json.dump(doc, f)
print(f"# {lib} fake: {len(rows)} sizes")
EOF
cat >"$tmp/build/tools/plaitrun" <<EOF
#!/usr/bin/env bash
[ "\$1" = -n ] || exit 2
PLAIT_WORLD_SIZE=\$2 exec "\${@:3}"
EOF
cat >"$tmp/build/bench/plait-bench" <<EOF
#!/usr/bin/env bash
[ "\$1" = -t ] || exit 2
exec python3 "$tmp/fakebench.py" plait "\$PLAIT_WORLD_SIZE" "\$2" "\${@:3}"
EOF
cat >"$tmp/build/bench/peers/gloo/peer-gloo-bench" <<EOF
#!/usr/bin/env bash
[ "\$1" = -N ] || exit 2
exec python3 "$tmp/fakebench.py" gloo "\$2" tcp "\${@:3}"
EOF
cat >"$tmp/run.sh" <<EOF
#!/usr/bin/env bash
# run.sh LIB TRANSPORT N BUILD -- bench options
[ "\$5" = -- ] && [ -d "\$4" ] || exit 2
exec python3 "$tmp/fakebench.py" "\$1" "\$3" "\$2" "\${@:6}"
EOF
cat >"$tmp/build/bench/tcp-ceiling" <<EOF
#!/usr/bin/env bash
[ "\$1" = -N ] && [ "\$2" -ge 2 ] || exit 2
exec python3 "$tmp/fakebench.py" tcp-ceiling "\$2" tcp "\${@:3}"
EOF
cat >"$tmp/build/bench/shm-ceiling" <<EOF
#!/usr/bin/env bash
[ "\$1" = -N ] && [ "\$2" -ge 2 ] || exit 2
exec python3 "$tmp/fakebench.py" shm-ceiling "\$2" shm "\${@:3}"
EOF
chmod +x "$tmp/build/tools/plaitrun" "$tmp/build/bench/plait-bench" "$tmp/build/bench/peers/gloo/peer-gloo-bench" \
  "$tmp/build/bench/tcp-ceiling" "$tmp/build/bench/shm-ceiling"

# 1. The CI run: every library, both transports, 2 and 4 ranks, all collectives.
out=$tmp/quick
"$here/compare" --quick --build "$tmp/build" --mpi-run "$tmp/run.sh" --timeout 3 --out "$out" 2>"$tmp/quick.err" ||
  { cat "$tmp/quick.err" >&2; fail "compare --quick exited $?"; }
md=$out/compare.md
[ -s "$md" ] || fail "no compare.md"
grep -q '^### shm, 2 ranks, all_reduce$' "$md" || fail "no shm all_reduce table"
grep -q '^### tcp, 4 ranks, broadcast$' "$md" || fail "no tcp broadcast table"
grep -q '^| size | plait GB/s | plait %bound | openmpi GB/s' "$md" || fail "no table header"
grep -q '^| 64K | 12.50 | 104% | 5.00 |' "$md" || fail "no 64K row with the fakes' busbw"
grep -q '^| 4K time (us) |' "$md" || fail "no time row"
! grep -q '^| 1M ' "$md" || fail "a size that was not asked for"
grep -q '^| minflt per call | plait | openmpi' "$md" || fail "no minflt table"
grep -q 'plait/best peer' "$md" || fail "no best-peer ratio"
grep -q '^## Targets$' "$md" || fail "no targets section"
grep -q '^- 1c\. .*→ met$' "$md" || fail "target 1c (time at 4K) not evaluated as met"
grep -q '^- 1a\. .*→ not measured$' "$md" || fail "target 1a should be not measured at 4K/64K"
grep -q '^- 5\. .*0 at all .*→ met$' "$md" || fail "minflt target not met"
grep -q 'mpich: exit 1 (fakebench: mpich tcp is broken on purpose)' "$md" || fail "mpich failure not noted"
grep -q 'gloo: timed out after 3 s: r1 tcp n=4 broadcast' "$md" || fail "gloo timeout not noted"
[ -s "$out/raw/1_shm_2_all_reduce_plait.json" ] || fail "no raw plait JSON"
[ -s "$out/raw/1_tcp_4_all_reduce_gloo-halving_doubling.json" ] || fail "no raw gloo JSON"
[ -s "$out/raw/1_shm_4_broadcast_openmpi+hugetlb.json" ] || fail "no raw hugetlb JSON"
ls "$out"/raw/1_tcp_*_mpich.log >/dev/null || fail "no log of the failed runs"
head -c 8 "$out/compare.png" | grep -q PNG || fail "no compare.png"
grep -q 'FAILED, exit 1' "$tmp/quick.err" || fail "no failure on stderr"
# The ceiling: tcp only, at every rank count, its own columns, never a peer.
# in_table TITLE PATTERN: a line of that table matches (read whole first: grep -q
# quitting early would break the pipe, and pipefail would take that for no match).
in_table() {
  local t
  t=$(sed -n "/^### $1\$/,/^### /p" "$md")
  grep -q -- "$2" <<<"$t"
}
in_table 'tcp, 2 ranks, broadcast' '^| size .*| tcp-ceiling GB/s | .*| plait/best peer | plait/tcp-ceiling |$' ||
  fail "no tcp-ceiling columns in the 2-rank tcp table"
in_table 'tcp, 2 ranks, broadcast' '^| 64K | 12.50 | 104% | 5.00 | .* | 15.00 | .* | 2.08x | 0.83x |$' ||
  fail "the ceiling is counted as a peer, or its ratio is wrong"
in_table 'tcp, 4 ranks, broadcast' '^| size .*| tcp-ceiling GB/s | .*| plait/best peer | plait/tcp-ceiling |$' ||
  fail "no tcp-ceiling columns in the 4-rank tcp table"
in_table 'tcp, 4 ranks, broadcast' '^| 64K | 12.50 | 104% | .* | 15.00 | .* | 0.83x |$' ||
  fail "the 4-rank ceiling did not run, or its ratio is wrong"
in_table 'shm, 2 ranks, broadcast' 'tcp-ceiling' && fail "tcp-ceiling ran over shm"
# shm-ceiling: shm only, plain and +hugetlb, each held against plait under the same setting.
in_table 'shm, 2 ranks, all_gather' '^| size .*| shm-ceiling GB/s | shm-ceiling+hugetlb GB/s | .*| plait/best peer | plait/shm-ceiling | plait+hugetlb/shm-ceiling+hugetlb |$' ||
  fail "no shm-ceiling columns in the 2-rank shm table"
in_table 'shm, 4 ranks, all_gather' '^| 64K | 12.50 | 104% | .* | 15.00 | 15.00 | .* | 0.83x | 0.83x |$' ||
  fail "the shm ceiling is counted as a peer, or its ratio is wrong"
in_table 'tcp, 2 ranks, broadcast' 'shm-ceiling' && fail "shm-ceiling ran over tcp"

# 2. Filter, a missing binary, uneven sizes (4K..12K by 3, then 40K alone, then 2M: the
#    latency-bound sizes below 1M with 10x the calls), two rounds rotating.
rm "$tmp/build/bench/peers/gloo/peer-gloo-bench"
out=$tmp/small
"$here/compare" --build "$tmp/build" --mpi-run "$tmp/run.sh" --out "$out" --libraries plait,openmpi,gloo \
  --transports shm --ranks 2 --collectives all_reduce --sizes 4K,12K,40K,2M --rounds 2 --warmup 0 2>"$tmp/small.err" ||
  { cat "$tmp/small.err" >&2; fail "filtered compare exited $?"; }
md=$out/compare.md
grep -q 'gloo-ring: skipped, .*peer-gloo-bench does not exist' "$tmp/small.err" || fail "missing gloo not on stderr"
grep -q 'gloo-ring: skipped, .*peer-gloo-bench does not exist' "$md" || fail "missing gloo not in compare.md"
grep -q 'mpich GB/s' "$md" && fail "mpich ran although --libraries left it out"
grep -q '^| 12K |' "$md" || fail "no 12K row"
[ -s "$out/raw/2_shm_2_all_reduce_openmpi+hugetlb_4K.json" ] && [ -s "$out/raw/2_shm_2_all_reduce_openmpi+hugetlb_40K.json" ] || fail "no raw JSON per sweep (4K..12K by 3, then 40K)"
iters() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["iters"])' "$out/raw/$1.json"; }
[ "$(iters 1_shm_2_all_reduce_plait_4K)" = 200 ] && [ "$(iters 1_shm_2_all_reduce_plait_40K)" = 200 ] &&
  [ "$(iters 1_shm_2_all_reduce_plait_2M)" = 20 ] || fail "sizes below 1M do not run 10x the calls (-n 200, 20 from 1M)"
grep -q -- '-w 0 -n 20 (sizes below 1M: -w 0 -n 200)' "$md" || fail "the calls per size are not stated"
[ "$(grep -m1 'round 1/2 .*\.\.\.$' "$tmp/small.err" | grep -o '[a-z+]*\ \.\.\.$')" = "plait ..." ] ||
  fail "round 1 does not start with plait"
[ "$(grep -m1 'round 2/2 .*\.\.\.$' "$tmp/small.err" | grep -o '[a-z+]*\ \.\.\.$')" = "openmpi ..." ] ||
  fail "round 2 does not run the cycle backwards, from the configuration after the first"

# 3. A tcp target missed where the ceiling itself is below the target ratio over the peer.
out=$tmp/cap
FAKE_SPEED_PLAIT=1.2 FAKE_SPEED_TCP_CEILING=1.4 "$here/compare" --build "$tmp/build" --mpi-run "$tmp/run.sh" \
  --out "$out" --libraries plait,openmpi,tcp-ceiling --transports tcp --ranks 2 --collectives broadcast \
  --sizes 1M --rounds 1 --warmup 0 --iters 1 2>"$tmp/cap.err" || { cat "$tmp/cap.err" >&2; fail "ceiling compare exited $?"; }
grep -q '^- 4\. tcp broadcast busbw >= 1.5x openmpi .*n=2 1M 1.20 (<1.5; ceiling 1.40, beyond it).*→ \*\*not met\*\* (1 of the 1 failing points beyond the ceiling)$' \
  "$out/compare.md" || fail "a target beyond the ceiling is not said so"
# ... and where plait passed the ceiling, the ceiling is no bound.
FAKE_SPEED_PLAIT=1.2 FAKE_SPEED_TCP_CEILING=1.1 "$here/compare" --build "$tmp/build" --mpi-run "$tmp/run.sh" \
  --out "$out" --libraries plait,openmpi,tcp-ceiling --transports tcp --ranks 2 --collectives broadcast \
  --sizes 1M --rounds 1 --warmup 0 --iters 1 2>"$tmp/cap.err" || { cat "$tmp/cap.err" >&2; fail "ceiling compare exited $?"; }
grep -q '^- 4\. tcp broadcast busbw >= 1.5x openmpi .*n=2 1M 1.20 (<1.5; ceiling 1.10, passed: no bound here).*→ \*\*not met\*\*$' \
  "$out/compare.md" || fail "a ceiling plait passed is taken for a bound"
# 4. An shm target missed where the ceiling is below it: a +hugetlb peer is held
#    against shm-ceiling+hugetlb (FAKE_SPEED is per library, so both ceilings are 1.5).
FAKE_SPEED_PLAIT=1.2 FAKE_SPEED_SHM_CEILING=1.5 "$here/compare" --build "$tmp/build" --mpi-run "$tmp/run.sh" \
  --out "$out" --libraries plait,openmpi,shm-ceiling --transports shm --ranks 2 --collectives all_gather \
  --sizes 16M --rounds 1 --warmup 0 --iters 1 2>"$tmp/cap.err" || { cat "$tmp/cap.err" >&2; fail "shm ceiling compare exited $?"; }
grep -q '^- 3\. shm all_gather .*n=2 16M vs openmpi+hugetlb 1.00 (<1.5; ceiling 1.25, beyond it).*→ \*\*not met\*\* (1 of the 1 failing points beyond the ceiling)$' \
  "$out/compare.md" || fail "an shm target beyond the ceiling is not said so"
# 5. The first calls of each run against its median (calls_us): call 1, call 2 and the last
#    warm-up call (the 30th at 64K, the 3rd at 1M); the fakes' first two calls take 3x and
#    2x the rest; the ceiling has no column.
out=$tmp/first
"$here/compare" --build "$tmp/build" --mpi-run "$tmp/run.sh" --out "$out" --libraries plait,openmpi,tcp-ceiling \
  --transports tcp --ranks 2 --collectives broadcast --sizes 64K,1M --rounds 1 --warmup 3 --iters 2 2>"$tmp/first.err" ||
  { cat "$tmp/first.err" >&2; fail "first-calls compare exited $?"; }
grep -q '^| first calls (us) | plait | openmpi | openmpi+hugetlb |$' "$out/compare.md" || fail "no first-calls table"
grep -q '^| 64K | 16 / 10 / 5 → 5 | 39 / 26 / 13 → 13 | 33 / 22 / 11 → 11 |$' "$out/compare.md" &&
  grep -q '^| 1M | 134 / 89 / 45 → 45 | 334 / 223 / 111 → 111 | 279 / 186 / 93 → 93 |$' "$out/compare.md" ||
  fail "a first-calls row is wrong"
# ... and --from-raw rebuilds the same tables from raw/ without running anything.
cp "$out/compare.md" "$tmp/first.md"
rm "$tmp/build/bench/plait-bench" "$tmp/build/bench/tcp-ceiling"  # nothing may run: no benchmark, no MPI launcher
"$here/compare" --from-raw --build "$tmp/build" --mpi-run "$tmp/no-run.sh" --out "$out" --libraries plait,openmpi,tcp-ceiling \
  --transports tcp --ranks 2 --collectives broadcast --sizes 64K,1M --rounds 1 --warmup 3 --iters 2 2>"$tmp/raw.err" ||
  { cat "$tmp/raw.err" >&2; fail "compare --from-raw exited $?"; }
diff <(grep '^|' "$tmp/first.md") <(grep '^|' "$out/compare.md") >/dev/null || fail "--from-raw gave other tables"
grep -q -- '--from-raw' "$out/compare.md" || fail "a rebuilt compare.md does not say so"
echo "compare_test: OK"
