#!/usr/bin/env bash
# The README's first command: install what is missing, build, and run the main job on its
# built-in default — a sequence-parallel CPU forward of the built-in hydrahead-tiny model over
# 4K random tokens on 2 MPI ranks, printing a summary (human line on stderr, JSON on stdout).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/cluster/install_deps.sh"
"$root/cluster/build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # containers often run as root
exec mpirun --oversubscribe -np "${HYDRA_RANKS:-2}" "${HYDRA_BUILD_DIR:-$root/build}/bin/hydra" forward \
  --preset hydrahead-tiny --seq-len "${HYDRA_SEQ_LEN:-4K}" "$@"
