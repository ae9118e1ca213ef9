#!/usr/bin/env bash
# Runs peer-openmpi-bench or peer-mpich-bench on this host over the library's
# shared-memory or TCP path, with that library's own settings for the path:
#
#   bash bench/peers/mpi/run.sh IMPL TRANSPORT NRANKS BUILD_DIR -- bench-args...
#     IMPL openmpi|mpich, TRANSPORT shm|tcp, e.g.
#   bash bench/peers/mpi/run.sh mpich tcp 4 build -- -o all_reduce -b 4K -e 16M -f 4 -J out.json
#
# The settings are exported in PLAIT_PEER_SETTINGS, which the bench prints in its
# table and JSON; -t TRANSPORT is appended to the bench arguments so the label is
# what was set up. All traffic stays on loopback. The run is bounded by `timeout`
# (PEER_TIMEOUT seconds, default 600): MPI's own waits are unbounded; and once every
# rank has finished, MPI_Finalize gets PEER_FINALIZE_GRACE seconds (default 15).
# GLIBC_TUNABLES, if set, reaches the ranks and is stated in the settings.
#
# Open MPI 4.1 (Debian): shm = pml ob1 + btl self,vader, which is also Debian's
#   default (its openmpi-mca-params.conf excludes pml ucx); tcp = btl self,tcp on lo
#   (btl_tcp_if_exclude leaves lo out by default). More ranks than cores:
#   --oversubscribe and mpi_yield_when_idle 1 (Open MPI's "degraded" mode, which its
#   FAQ recommends when oversubscribed).
# MPICH 4.0 (Debian, ch4:ucx): shm = the defaults, i.e. UCX's shared-memory
#   transports (sysv/posix, cma single copy); tcp = MPIR_CVAR_NOLOCAL=1 (every rank
#   treated as on another node: no intra-node shortcuts) and UCX_TLS=tcp,self.
#   UCX_NET_DEVICES=lo keeps UCX off other interfaces. MPICH ch4 busy-polls and has
#   no run-time yield option (MPIR_CVAR_POLLS_BEFORE_YIELD is ch3:nemesis only).
#   With no more ranks than cores, -bind-to core: Open MPI binds so by default, and so
#   does plaitrun; hydra binds nothing unless told.
set -euo pipefail

usage() {
  echo "usage: bash bench/peers/mpi/run.sh openmpi|mpich shm|tcp NRANKS BUILD_DIR -- bench-args..." >&2
  echo "  $1" >&2
  exit 2
}

[[ $# -ge 4 ]] || usage "missing arguments"
impl=$1 transport=$2 nranks=$3 build=$4
shift 4
if [[ $# -gt 0 ]]; then
  [[ $1 == -- ]] || usage "expected -- before the bench arguments, got '$1'"
  shift
fi
[[ $impl == openmpi || $impl == mpich ]] || usage "IMPL must be openmpi or mpich, not '$impl'"
[[ $transport == shm || $transport == tcp ]] || usage "TRANSPORT must be shm or tcp, not '$transport'"
[[ $nranks =~ ^[1-9][0-9]*$ ]] || usage "NRANKS must be a positive integer, not '$nranks'"
limit=${PEER_TIMEOUT:-600}
[[ $limit =~ ^[1-9][0-9]*$ ]] || usage "PEER_TIMEOUT must be a positive number of seconds, not '$limit'"

bench=$build/bench/peers/mpi/peer-$impl-bench
if [[ ! -x $bench ]]; then
  echo "run.sh: $bench not found; build it with: ninja -C $build bench/peers/mpi/peer-$impl-bench" >&2
  exit 2
fi

cores=$(nproc)
oversubscribed=0
if ((nranks > cores)); then oversubscribed=1; fi

launch=()    # launcher and its options
stated=()    # what the settings string says, in order
case $impl in
  openmpi)
    launcher=mpirun.openmpi
    command -v $launcher >/dev/null || { echo "run.sh: $launcher not found (Debian package openmpi-bin)" >&2; exit 2; }
    mca=(--mca oob_tcp_if_include lo)  # the runtime's own TCP stays on loopback too
    if [[ $transport == shm ]]; then
      mca+=(--mca pml ob1 --mca btl "self,vader")
    else
      mca+=(--mca pml ob1 --mca btl "self,tcp" --mca btl_tcp_if_include lo)
    fi
    if ((oversubscribed)); then mca+=(--mca mpi_yield_when_idle 1); fi
    launch=("$launcher" -np "$nranks" --oversubscribe "${mca[@]}" -x PLAIT_PEER_SETTINGS)
    if [[ -n ${GLIBC_TUNABLES:-} ]]; then launch+=(-x GLIBC_TUNABLES); fi
    if [[ $(id -u) == 0 ]]; then launch+=(--allow-run-as-root); fi
    stated=("$launcher --oversubscribe ${mca[*]}")
    if [[ $transport == shm ]]; then stated+=("ob1 + vader is Debian's default; vader single copy via cma"); fi
    if ((!oversubscribed)); then stated+=("mpi_yield_when_idle left at 0: no more ranks than cores"); fi
    stated+=("its default binding: to a core each up to 2 ranks, else to the socket")
    ;;
  mpich)
    launcher=mpiexec.mpich
    command -v $launcher >/dev/null || { echo "run.sh: $launcher not found (Debian package mpich)" >&2; exit 2; }
    device=$(mpichversion 2>/dev/null | awk -F'\t' '/^MPICH Device:/ {print $2}')
    if [[ $device != ch4:ucx ]]; then
      # The TCP settings below are UCX's; another device needs its own (ch4:ofi: FI_PROVIDER).
      echo "run.sh: this MPICH is built for device '${device:-unknown}'; run.sh knows ch4:ucx only" >&2
      exit 2
    fi
    export UCX_NET_DEVICES=lo
    env_set=(UCX_NET_DEVICES=lo)
    unset MPIR_CVAR_NOLOCAL UCX_TLS  # shm: the defaults, whatever the caller had set
    if [[ $transport == tcp ]]; then
      export MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self
      env_set+=(MPIR_CVAR_NOLOCAL=1 "UCX_TLS=tcp,self")
    fi
    # hydra forwards the whole environment to the ranks by default.
    launch=("$launcher" -launcher fork -iface lo -n "$nranks")
    # Bound like Open MPI and plaitrun: one core per rank where they fit (hydra binds
    # nothing by default).
    if ((!oversubscribed)); then launch+=(-bind-to core); fi
    stated=("$launcher ($device) -launcher fork -iface lo ${env_set[*]}")
    if ((!oversubscribed)); then stated+=("-bind-to core: one core per rank, as Open MPI's and plaitrun's defaults do"); fi
    if [[ $transport == shm ]]; then stated+=("the defaults: UCX shared memory (sysv/posix, cma single copy)"); fi
    stated+=("busy-polls: ch4 has no run-time yield option")
    ;;
esac
stated+=("$nranks ranks on $cores cores")
if [[ -n ${GLIBC_TUNABLES:-} ]]; then stated+=("GLIBC_TUNABLES=$GLIBC_TUNABLES"); fi
PLAIT_PEER_SETTINGS=${stated[0]}
for part in "${stated[@]:1}"; do PLAIT_PEER_SETTINGS+="; $part"; done
export PLAIT_PEER_SETTINGS

# Rank 0 writes the exit status here once every rank has finished, just before
# MPI_Finalize. If MPI_Finalize then does not return within PEER_FINALIZE_GRACE s
# (MPICH 4.0.2 ch4:ucx over UCX tcp can deadlock there: pmodels/mpich#6596), the job
# is ended and that status returned, with a warning, instead of waiting for the timeout.
done_file=$(mktemp "${TMPDIR:-/tmp}/plait-peer-done.XXXXXX")
trap 'rm -f "$done_file"' EXIT
: >"$done_file"
export PLAIT_PEER_DONE_FILE=$done_file
grace=${PEER_FINALIZE_GRACE:-15}
[[ $grace =~ ^[0-9]+$ ]] || usage "PEER_FINALIZE_GRACE must be a number of seconds, not '$grace'"

timeout --kill-after=15 "$limit" "${launch[@]}" "$bench" "$@" -t "$transport" &
job=$!
finished_at=0
while kill -0 "$job" 2>/dev/null; do
  if [[ -s $done_file ]] && ((finished_at == 0)); then finished_at=$SECONDS; fi
  if ((finished_at > 0 && SECONDS - finished_at >= grace)); then
    kill -TERM "$job" 2>/dev/null || true
    wait "$job" || true
    echo "run.sh: warning: MPI_Finalize of $impl over $transport did not return within $grace s after all" \
         "ranks finished; the job was ended. The results above are complete; the hang is the library's" \
         "teardown (MPICH 4.0 ch4:ucx over UCX tcp: pmodels/mpich#6596)" >&2
    status=$(<"$done_file")
    [[ $status =~ ^[0-9]+$ ]] || status=1
    exit "$status"
  fi
  sleep 0.2
done
status=0
wait "$job" || status=$?
if ((status == 124 || status == 137)); then
  echo "run.sh: $impl over $transport with $nranks ranks did not finish within $limit s (PEER_TIMEOUT)" >&2
fi
exit $status
