#!/usr/bin/env bash
# The harness of a GPU job on the device machine: what every job under cluster/results once copied
# as a ~20-line preamble. New jobs write only their list of commands and call this from the
# repository root (the functions are cluster/gpu_job_lib.sh's, which the GPU scripts with logic of
# their own source too):
#
#   bash cluster/gpu_job.sh --name r4 [--deadline 585] [--build "hydra test_cuda"] [--keep REGEX] JOBS
#
# JOBS is a file with one job a line, `LABEL SECONDS COMMAND...` ('#' starts a comment; LABEL is a
# file name). The harness
#  1. gets the binaries: unpacks the carried .device/dev.tar.xz into build/ when it is there (built
#     on the development machine as cluster/results/h200-2026-12-07/run1.sh's header shows), else
#     builds the --build targets with cluster/build.sh (HYDRA_BUILD_DIR=build);
#  2. exports what every job needs (NCCL_NVLS_ENABLE=0, mpirun as root, unbuffered Python,
#     HYDRA_TEST_BINARY for the tests that run hydra) and H=build/bin/hydra, T=build/tests and R (the
#     result folder, /tmp/NAME) to every command;
#  3. writes the GPU's name and driver into $R/gpu.txt;
#  4. runs the jobs in order, each under `timeout` for the smaller of its SECONDS and the time left
#     before the deadline (seconds since the harness started; a job with less than 10 s left is
#     skipped and says so), its output in $R/LABEL.log;
#  5. after every job tars $R into $OUT/NAME.tgz (written to a temporary name, then renamed), so a
#     call cut short still returns what finished;
#  6. prints one timeline line per job (also in $R/timeline.txt) and the lines of its log worth
#     keeping: --keep REGEX (default: errors, gtest verdicts and JSON summary lines).
# Exit status: 0 when every job ran and exited 0, 1 otherwise.
set -u
name="" deadline=585 build="" keep='error|Error|FAILED|PASSED|SKIPPED|"summary"|exit [0-9]|rc [0-9]'
while (( $# > 1 )); do
  case "$1" in
    --name) name=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    *) echo "gpu_job.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
jobs_file=${1:-}
[[ -n "$name" && "$name" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "gpu_job.sh: --name NAME (letters, digits, . _ -) is required" >&2; exit 2; }
[[ -n "$jobs_file" && -r "$jobs_file" ]] || { echo "gpu_job.sh: the jobs file '$jobs_file' is not readable" >&2; exit 2; }
[[ "$deadline" =~ ^[0-9]+$ ]] || { echo "gpu_job.sh: --deadline takes seconds (got '$deadline')" >&2; exit 2; }
: "${OUT:?gpu_job.sh: OUT (the folder that comes back) is not set}"

GPU_JOB_KEEP=$keep
source "$(dirname "${BASH_SOURCE[0]}")/gpu_job_lib.sh"
gpu_job_start "$name" "$deadline" "$build" || exit 1
while read -r label seconds command; do
  [[ -z "${label:-}" || "$label" == \#* ]] && continue
  run_job "$label" "$seconds" "$command"
done < "$jobs_file"
gpu_job_end
exit $?
