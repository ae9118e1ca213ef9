#!/usr/bin/env bash
# Under plaitrun, a rank killed mid-job: plaitrun names it as the first failure and
# the survivors still print their own errors (peer_lost naming it) within the grace period.
set -u
plaitrun=$1 prog=$2
fail=0
for t in shm tcp; do
  out=$(timeout 60 "$plaitrun" -n 4 --grace 5 "$prog" "$t" 2>&1)
  status=$?
  echo "$out"
  [ $status -ne 0 ] || { echo "FAIL($t): plaitrun exited 0"; fail=1; }
  echo "$out" | grep -q "plaitrun: rank 3 failed first" || { echo "FAIL($t): plaitrun did not name rank 3"; fail=1; }
  for r in 0 1 2; do
    echo "$out" | grep -q "^\[$r\] survivor $r saw peer_lost naming rank 3" ||
      { echo "FAIL($t): rank $r did not report peer_lost naming rank 3"; fail=1; }
  done
done
exit $fail
