#!/usr/bin/env bash
# Smoke test of bench/ab.sh against a fake build (no plait build needed): the fake
# plait-bench prints rank 0's table row with a time that depends on the setting, and
# ab.sh must take each way of naming the setting (-a, BUILD, an environment variable,
# with and without a leading --) and print one median per size and value.
# Run from anywhere: bash bench/ab_test.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "ab_test: FAIL: $*" >&2; exit 1; }

for b in b1 b2; do
  mkdir -p "$tmp/$b/tools" "$tmp/$b/bench"
  cat >"$tmp/$b/tools/plaitrun" <<'FAKE'
#!/usr/bin/env bash
[[ $1 == -n ]] || { echo "fake plaitrun: want -n N" >&2; exit 2; }
shift 2
exec "$@"
FAKE
  cat >"$tmp/$b/bench/plait-bench" <<FAKE
#!/usr/bin/env bash
# Time: 10 for -a ring, 20 for -a tree, 30 + FAKE_T otherwise; 100 more in build b2.
t=30
while ((\$#)); do
  if [[ \$1 == -a ]]; then [[ \$2 == ring ]] && t=10; [[ \$2 == tree ]] && t=20; fi
  shift
done
[[ -n \${FAKE_T-} ]] && t=\$((30 + FAKE_T))
[[ $b == b2 ]] && t=\$((t + 100))
echo "[0] #      size(B)        count     type  redop   root   time(us)"
echo "[0]         4096         1024    float    sum     -1       \$t.0     1.0     1.0       0      0.0    1.0    1%"
echo "[1]         4096         1024    float    sum     -1      999.0     1.0     1.0       0      0.0    1.0    1%"
FAKE
  chmod +x "$tmp/$b/tools/plaitrun" "$tmp/$b/bench/plait-bench"
done

check() {  # check WANT ab.sh-arguments...
  local want=$1 out
  shift
  out=$(bash "$here/ab.sh" "$@" 2>/dev/null) || fail "ab.sh $* exited $?"
  grep -qF -- "$want" <<<"$out" || fail "ab.sh $*: want '$want' in:"$'\n'"$out"
}
check "| 4096 | 10.0 (10.0-10.0) | 20.0 (20.0-20.0) |" -B "$tmp/b1" -r 2 -n 4 -a ring,tree -- -o all_reduce
check "| 4096 | 10.0 (10.0-10.0) | 20.0 (20.0-20.0) |" -r 1 -B "$tmp/b1" -- -a ring,tree -- -o all_reduce
check "| 4096 | 30.0 (30.0-30.0) | 130.0 (130.0-130.0) |" -r 1 BUILD "$tmp/b1,$tmp/b2" -- -o all_reduce
check "| 4096 | 31.0 (31.0-31.0) | 35.0 (35.0-35.0) |" -B "$tmp/b1" -r 1 FAKE_T 1,5 -- -o all_reduce
if bash "$here/ab.sh" -B "$tmp/b1" -r 1 -a ring 2>/dev/null; then fail "ab.sh without -- after the values ran"; fi
echo "ab_test: OK"
