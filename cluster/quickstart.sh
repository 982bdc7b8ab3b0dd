#!/usr/bin/env bash
# The README's first command: install what is missing, build, and run the main job on its
# built-in default:
#   - with NVIDIA GPUs: a sequence-parallel prefill of hydrahead-1.7b (random weights) over 128K
#     tokens on every local GPU (one rank each), with per-phase times and a JSON summary;
#   - without: a sequence-parallel CPU forward of the built-in hydrahead-tiny model over 4K random
#     tokens on 2 MPI ranks, printing a summary (human line on stderr, JSON on stdout).
# HYDRA_SEQ_LEN and HYDRA_RANKS override the length and (CPU) rank count; extra arguments go to hydra.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/cluster/install_deps.sh"
"$root/cluster/build.sh"
hydra="${HYDRA_BUILD_DIR:-$root/build}/bin/hydra"
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c "^GPU" || true)
if [ "$gpus" -gt 0 ] && ldd "$hydra" | grep -q libcudart; then  # GPUs here and a CUDA build
  exec "$root/cluster/launch.sh" -g "$gpus" -- "$hydra" prefill --preset hydrahead-1.7b --seq-len "${HYDRA_SEQ_LEN:-128K}" \
    --device cuda "$@"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # containers often run as root
exec mpirun --oversubscribe -np "${HYDRA_RANKS:-2}" "$hydra" forward --preset hydrahead-tiny --seq-len "${HYDRA_SEQ_LEN:-4K}" "$@"
