#!/usr/bin/env bash
# The README's first command: install what is missing, build the hydra executable, and run the
# main job on its built-in default:
#   - with NVIDIA GPUs (and a CUDA build): a sequence-parallel prefill of hydrahead-1.7b (random
#     weights) over 128K tokens on every local GPU (one rank each), with per-phase times and a
#     JSON summary;
#   - without: a sequence-parallel CPU forward of the built-in hydrahead-tiny model over 4K random
#     tokens on 2 MPI ranks, printing a summary (human line on stderr, JSON on stdout).
# Random weights score chance level: a mean next-token NLL of about ln(vocab) (ln 256 = 5.55 for
# hydrahead-tiny) is what an untrained model gives; README "Real models" says how to bring one in.
#
# Knobs (environment):
#   HYDRA_SEQ_LEN      tokens (default 128K on GPUs, 4K on the CPU)
#   HYDRA_RANKS        CPU ranks (default 2)
#   HYDRA_BUILD_DIR    build folder (default build/)
#   HYDRA_CMAKE_FLAGS  extra CMake flags (e.g. -DHYDRA_CUDA=OFF)
# Extra arguments go to hydra. The build's compiler output goes to $HYDRA_BUILD_DIR/build.log.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
build="${HYDRA_BUILD_DIR:-$root/build}"
"$root/cluster/install_deps.sh"
mkdir -p "$build"
HYDRA_BUILD_LOG="$build/build.log" "$root/cluster/build.sh" hydra  # only the executable: the tests are test.sh's
hydra="$build/bin/hydra"
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c "^GPU" || true)
if [ "$gpus" -gt 0 ] && ldd "$hydra" | grep -q libcudart; then  # GPUs here and a CUDA build
  echo "quickstart: hydra prefill of hydrahead-1.7b on $gpus GPU(s)"
  exec "$root/cluster/launch.sh" -g "$gpus" -- "$hydra" prefill --preset hydrahead-1.7b --seq-len "${HYDRA_SEQ_LEN:-128K}" \
    --device cuda "$@"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # containers often run as root
echo "quickstart: no GPU here: hydra forward of hydrahead-tiny on ${HYDRA_RANKS:-2} CPU ranks"
exec mpirun --oversubscribe -np "${HYDRA_RANKS:-2}" "$hydra" forward --preset hydrahead-tiny --seq-len "${HYDRA_SEQ_LEN:-4K}" "$@"
