#!/usr/bin/env bash
# The README's second command (and CI's): install what is missing, build, run every test.
# GPU tests report "Not Run" (skipped) on machines without a GPU; multi-rank tests run under
# mpirun with --oversubscribe, so 2 cores suffice.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/cluster/install_deps.sh"
"$root/cluster/build.sh"
cd "${HYDRA_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "$(nproc)" "$@"
