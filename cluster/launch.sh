#!/usr/bin/env bash
# Launches a hydra command on GPUs with mpirun, one rank per GPU, single node or several.
#
#   cluster/launch.sh -g GPUS_PER_NODE [-n NODES] [-H HOSTFILE] [-s RANKS_PER_GPU] -- hydra prefill --preset hydrahead-1.7b --seq-len 1M
#
# Ranks are placed node by node (ppr:GPUS:node); each rank takes GPU = its local rank (hydra picks
# it). -s K (testing) starts K ranks per GPU with HYDRA_SHARE_GPUS=1: local rank r takes GPU r mod G
# and the ranks talk over host-staged MPI (DESIGN.md §3.5; speed figures then mean nothing). The
# environment NCCL needs is exported to every rank. NVLink multicast (NVLS) stays off
# unless NCCL_NVLS_ENABLE is set by the caller: some shared machines must never use it.
#
# SIGTERM or SIGINT to this script reach the ranks as SIGUSR1, which mpirun forwards without ending
# the job: a `hydra train` saves its step and every rank exits 75, which this script returns (Open
# MPI's mpirun, sent SIGTERM itself, ends the job on its own terms and exits 1 whatever the ranks
# did: README "Time limits and signals").
set -euo pipefail
gpus=1 nodes=1 hostfile="" share=1
while getopts "g:n:H:s:" opt; do
  case $opt in
    g) gpus=$OPTARG ;;
    n) nodes=$OPTARG ;;
    H) hostfile=$OPTARG ;;
    s) share=$OPTARG ;;
    *) echo "usage: $0 -g GPUS_PER_NODE [-n NODES] [-H HOSTFILE] [-s RANKS_PER_GPU] -- command ..." >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "usage: $0 -g GPUS_PER_NODE [-n NODES] [-H HOSTFILE] [-s RANKS_PER_GPU] -- command ..." >&2; exit 2; }
[[ "$share" =~ ^[1-9][0-9]*$ ]] || { echo "$0: -s takes a rank count per GPU (got '$share')" >&2; exit 2; }
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
per_node=$((gpus * share))
args=(-np $((per_node * nodes)) --map-by "ppr:${per_node}:node" --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x PATH)
if (( share > 1 )); then
  export HYDRA_SHARE_GPUS=1
  args+=(-x HYDRA_SHARE_GPUS)
fi
for v in NCCL_DEBUG NCCL_SOCKET_IFNAME NCCL_IB_HCA CUDA_VISIBLE_DEVICES HYDRA_ATTENTION_KERNEL; do
  [ -n "${!v:-}" ] && args+=(-x "$v")
done
[ -n "$hostfile" ] && args+=(--hostfile "$hostfile")
mpirun "${args[@]}" "$@" &
pid=$!
trap 'kill -USR1 "$pid" 2>/dev/null || true' TERM INT
while true; do
  code=0
  wait "$pid" || code=$?
  kill -0 "$pid" 2>/dev/null || break  # wait came back for a trapped signal: mpirun still runs
done
exit "$code"
