#!/usr/bin/env bash
# TCP across hosts: two network namespaces joined by a veth pair (192.0.2.0/24),
# one rank in each, a checked all-reduce sweep between them. Needs root and
# `ip netns`; exits 77 (SKIP) when either is missing.
set -u
bench=$1
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "SKIP: needs root and iproute2 to create network namespaces"; exit 77
fi
a=plait-a-$$ b=plait-b-$$
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; }
trap cleanup EXIT
if ! ip netns add "$a" 2>/dev/null || ! ip netns add "$b"; then
  echo "SKIP: cannot create network namespaces here"; exit 77
fi
ip link add "va$$" type veth peer name "vb$$" || { echo "SKIP: no veth support"; exit 77; }
ip link set "va$$" netns "$a" && ip link set "vb$$" netns "$b"
ip -n "$a" addr add 192.0.2.1/24 dev "va$$" && ip -n "$b" addr add 192.0.2.2/24 dev "vb$$"
ip -n "$a" link set "va$$" up && ip -n "$b" link set "vb$$" up
ip -n "$a" link set lo up && ip -n "$b" link set lo up

export PLAIT_WORLD_SIZE=2 PLAIT_STORE=192.0.2.1:29517 PLAIT_TOKEN=netns-test-token-0123456789abcdef PLAIT_TIMEOUT=30
out=$(mktemp)
PLAIT_RANK=0 PLAIT_ADDR=192.0.2.1 timeout 120 ip netns exec "$a" "$bench" -t tcp -b 8 -e 4M -f 8 -w 1 -n 3 >"$out" 2>/dev/null &
p0=$!
PLAIT_RANK=1 PLAIT_ADDR=192.0.2.2 timeout 120 ip netns exec "$b" "$bench" -t tcp -b 8 -e 4M -f 8 -w 1 -n 3 >/dev/null 2>&1
s1=$?
wait $p0; s0=$?
cat "$out"
if [ $s0 -ne 0 ] || [ $s1 -ne 0 ]; then echo "FAIL: rank exit statuses $s0 $s1"; exit 1; fi
rows=$(grep -cE '^ +[0-9]+ ' "$out")
wrong=$(awk '/^ +[0-9]+ / && $9 != 0 {n++} END {print n+0}' "$out")
if [ "$rows" -lt 3 ] || [ "$wrong" -ne 0 ]; then echo "FAIL: $rows rows, $wrong with wrong elements"; exit 1; fi
echo "ok: $rows sizes all-reduced between 192.0.2.1 and 192.0.2.2 with no wrong element"
