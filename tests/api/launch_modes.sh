#!/usr/bin/env bash
# from_env() under each launch mode of DESIGN.md section 5, with the launchers'
# variables set by hand: by hand (PLAIT_*), torchrun, Open MPI, PMI (MPICH) and
# Slurm. Three ranks run the section-4 contract program; rank 0 serves the store.
set -u
prog=$1
export XDG_CONFIG_HOME=$(mktemp -d)   # per-user key file for loopback jobs without a token
trap 'rm -rf "$XDG_CONFIG_HOME"' EXIT
fail=0

# Store ports below the kernel's ephemeral range (32768 up here), so no connection of a
# test running alongside takes one; a port that is still taken (another job listening
# there) is a fresh draw, at most three times per mode.
new_port_base() { port_base=$((20000 + RANDOM % 12000)); }

run_mode() {  # name, then a function that exports the variables for rank $1
  local name=$1 setvars=$2 pids rc try
  for try in 1 2 3; do
    new_port_base
    pids=() rc=0
    for r in 0 1 2; do
      ( $setvars $r; exec timeout 60 "$prog" ) >"$XDG_CONFIG_HOME/$name.$r.log" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    [ $rc -ne 0 ] && grep -q "Address already in use" "$XDG_CONFIG_HOME"/$name.*.log || break
    echo "note: $name: the store port was taken, again with another ($try of 3)"
  done
  if [ $rc -ne 0 ] || [ "$(cat "$XDG_CONFIG_HOME"/$name.*.log | grep -c "contract ok")" -ne 3 ]; then
    echo "FAIL: $name"; cat "$XDG_CONFIG_HOME"/$name.*.log; fail=1
  else
    echo "ok: $name"
  fi
}

plait_vars() { export PLAIT_RANK=$1 PLAIT_WORLD_SIZE=3 PLAIT_STORE=127.0.0.1:$((port_base + 1)); }
torchrun_vars() { export RANK=$1 LOCAL_RANK=$1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port_base + 10)); }
ompi_vars() { export OMPI_COMM_WORLD_RANK=$1 OMPI_COMM_WORLD_SIZE=3 OMPI_COMM_WORLD_LOCAL_RANK=$1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port_base + 20)); }
pmi_vars() { export PMI_RANK=$1 PMI_SIZE=3 PLAIT_STORE=127.0.0.1:$((port_base + 31)); }
slurm_vars() { export SLURM_PROCID=$1 SLURM_NTASKS=3 SLURM_LOCALID=$1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port_base + 40)); }

run_mode by-hand plait_vars
run_mode torchrun torchrun_vars
run_mode openmpi ompi_vars
run_mode pmi pmi_vars
run_mode slurm slurm_vars
exit $fail
