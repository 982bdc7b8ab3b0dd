#!/usr/bin/env bash
# Configures and builds into build/ (or $HYDRA_BUILD_DIR). CUDA is built when nvcc is found.
#
#   cluster/build.sh [TARGET ...]     # no target: everything (hydra, the tests)
#
# Knobs (environment):
#   HYDRA_BUILD_DIR    build folder (default: build/ in the checkout)
#   HYDRA_CMAKE_FLAGS  extra CMake flags, e.g. -DHYDRA_CUDA=OFF (a CPU-only build of the same sources)
#   HYDRA_BUILD_LOG    when set, the compiler's output goes to this file and only a summary line is
#                      printed (the quickstart does this; on failure the log's tail is shown)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${HYDRA_BUILD_DIR:-$root/build}"
# nvcc may be installed but not on PATH.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
targets=()
for t in "$@"; do targets+=(--target "$t"); done
run() {
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release ${HYDRA_CMAKE_FLAGS:-} >/dev/null
  cmake --build "$build" -j "$(nproc)" "${targets[@]}"
}
if [ -n "${HYDRA_BUILD_LOG:-}" ]; then
  start=$(date +%s)
  echo "build: compiling ${*:-everything} into $build (log: $HYDRA_BUILD_LOG) ..."
  if ! run > "$HYDRA_BUILD_LOG" 2>&1; then
    tail -30 "$HYDRA_BUILD_LOG"
    echo "build: FAILED (full log: $HYDRA_BUILD_LOG)" >&2
    exit 1
  fi
  echo "build: done in $(( $(date +%s) - start )) s"
else
  run
fi
