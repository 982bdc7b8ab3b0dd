#!/usr/bin/env bash
# Configures and builds into build/ (or $HYDRA_BUILD_DIR). CUDA is built when nvcc is found;
# pass -DHYDRA_CUDA=OFF in $HYDRA_CMAKE_FLAGS for a CPU-only build.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${HYDRA_BUILD_DIR:-$root/build}"
# nvcc may be installed but not on PATH.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release ${HYDRA_CMAKE_FLAGS:-} >/dev/null
cmake --build "$build" -j "$(nproc)"
