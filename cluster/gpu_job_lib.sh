# The GPU job harness's functions, sourced (never run) by cluster/gpu_job.sh and by the GPU scripts
# that need more than a list of commands (cluster/gpu_kernels_check.sh, cluster/gpu_validate.sh,
# cluster/bench/decode_bench.sh), so that every GPU job gets its binaries, its time limits, its logs
# and its tarball the same way:
#
#   source cluster/gpu_job_lib.sh
#   gpu_job_start NAME [DEADLINE_S] [BUILD_TARGETS]   # from the repository root; OUT must be set
#   run_job LABEL SECONDS COMMAND                     # the command line as one string (bash -c)
#   gpu_job_end                                       # the final tarball; returns the jobs' status
#
# gpu_job_start: gets the binaries (unpacks the carried .device/dev.tar.xz into build/ when it is
# there, else builds BUILD_TARGETS with cluster/build.sh), exports what every job needs
# (NCCL_NVLS_ENABLE=0, mpirun as root, unbuffered Python, HYDRA_TEST_BINARY; H=build/bin/hydra,
# T=build/tests and R=/tmp/NAME, the result folder) and writes the GPU's name and driver into
# $R/gpu.txt. run_job: runs one job under `timeout` for the smaller of SECONDS and the time left
# before the deadline (a job with less than 10 s left is skipped and says so), its output in
# $R/LABEL.log; prints one timeline line (also in $R/timeline.txt) and the lines of its log worth
# keeping (GPU_JOB_KEEP, a regex; default: errors, gtest verdicts and JSON summary lines); tars $R
# into $OUT/NAME.tgz (a temporary name, then renamed), so a call cut short still returns what
# finished. It returns the job's exit status and records a failure in the job's status.

GPU_JOB_KEEP=${GPU_JOB_KEEP:-'error|Error|FAILED|PASSED|SKIPPED|"summary"|exit [0-9]|rc [0-9]'}
gpu_job_status=0

el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$R/timeline.txt"; }
save() { tar -czf "$OUT/$gpu_job_name.tgz.tmp" -C /tmp "$gpu_job_name" && mv "$OUT/$gpu_job_name.tgz.tmp" "$OUT/$gpu_job_name.tgz"; }

gpu_job_start() {
  gpu_job_name=$1 gpu_job_deadline=${2:-585}
  local build=${3:-}
  export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
  export H=build/bin/hydra T=build/tests R=/tmp/$gpu_job_name
  # The CLI tests inside test_cuda run this hydra, not the build path compiled into them.
  export HYDRA_TEST_BINARY=$PWD/build/bin/hydra
  mkdir -p "$R"
  T0=$(date +%s)
  if [[ -f .device/dev.tar.xz ]]; then
    mkdir -p build && tar -xJf .device/dev.tar.xz -C build || { el "unpacking .device/dev.tar.xz failed"; save; return 1; }
    el "binaries unpacked from .device/dev.tar.xz"
  elif [[ -n "$build" ]]; then
    # shellcheck disable=SC2086
    HYDRA_BUILD_DIR=build bash cluster/build.sh $build > "$R/build.log" 2>&1 || { el "build failed"; tail -20 "$R/build.log"; save; return 1; }
    el "built: $build"
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.txt" 2>&1 || echo "no nvidia-smi" > "$R/gpu.txt"
}

run_job() {
  local label=$1 seconds=$2 command=$3
  if ! [[ "$label" =~ ^[A-Za-z0-9_.:-]+$ && "$seconds" =~ ^[0-9]+$ && -n "$command" ]]; then
    el "bad job line: $label $seconds $command"; gpu_job_status=1; return 2
  fi
  local left=$(( gpu_job_deadline - ($(date +%s) - T0) ))
  if (( left < 10 )); then el "$label: skipped, ${left} s left before the deadline"; gpu_job_status=1; return 124; fi
  local limit=$(( seconds < left ? seconds : left ))
  timeout -k 5 "$limit" bash -c "$command" > "$R/$label.log" 2>&1 < /dev/null
  local rc=$?
  (( rc == 0 )) || gpu_job_status=1
  el "$label: rc $rc$( (( rc == 124 || rc == 137 )) && echo " (timed out after $limit s)")"
  grep -E "$GPU_JOB_KEEP" "$R/$label.log" | tail -20
  save
  return $rc
}

gpu_job_end() {
  save
  return $gpu_job_status
}
