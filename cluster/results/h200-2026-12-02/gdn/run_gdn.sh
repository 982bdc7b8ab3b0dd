#!/usr/bin/env bash
# GDN backward device job (run from the repository root on the device):
#   run_gdn.sh OUT NEW_BIN_DIR [BASE_BIN_DIR] [steps...]
# steps (default: tests bench anchors): tests = GDN GPU tests; model = whole-model GPU gradient tests;
# bench = hydra bench gdn-bwd 128K/512K x 14 (HYDRA_GDN_PROFILE=1, and =2 at 512K for stages 2/3
# apart) for NEW (and BASE); anchors = fla forward+backward at the same shapes.
set -u
out=$1; new=$2; base=${3:-}; shift 3 2>/dev/null || shift $#
steps=${*:-tests bench anchors}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
t0=$(date +%s)
for s in $steps; do
  case $s in
    tests)
      timeout -k 5 150 "$new/test_cuda" --gtest_filter='CudaDeltaRuleBackward.*:CudaOps.ChunkedDeltaRule*' > "$out/test_gdn.log" 2>&1
      echo "test_gdn rc=$? $(( $(date +%s) - t0 ))s" >> "$out/status.txt";;
    model)
      timeout -k 5 200 "$new/test_cuda" --gtest_filter='CudaModel.*:CudaBackward.*:CudaTraining.*' > "$out/test_model.log" 2>&1
      echo "test_model rc=$? $(( $(date +%s) - t0 ))s" >> "$out/status.txt";;
    bench)
      for which in new base; do
        b=$new; [ $which = base ] && b=$base
        [ -z "$b" ] && continue
        for t in 131072 524288; do
          HYDRA_GDN_PROFILE=1 timeout -k 5 90 "$b/hydra" bench --op gdn-bwd --seq-len $t --heads 14 --repeat 5 > "$out/bench_${which}_$t.log" 2>&1
          echo "bench_${which}_$t rc=$? $(( $(date +%s) - t0 ))s" >> "$out/status.txt"
        done
        HYDRA_GDN_PROFILE=2 timeout -k 5 90 "$b/hydra" bench --op gdn-bwd --seq-len 524288 --heads 14 --repeat 3 > "$out/bench_${which}_524288_serial.log" 2>&1
        echo "bench_${which}_524288_serial rc=$? $(( $(date +%s) - t0 ))s" >> "$out/status.txt"
      done;;
    anchors)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$out/pip.log" 2>&1
      PYTHONPATH=/tmp/site timeout -k 5 200 python3 cluster/bench/anchors.py --warmup 2 --repeat 5 --attention '' --gdn '' \
        --gdn-bwd 131072x14,524288x14 > "$out/anchors.jsonl" 2> "$out/anchors.err"
      echo "anchors rc=$? $(( $(date +%s) - t0 ))s" >> "$out/status.txt";;
  esac
done
grep -h "stages:\|backward alone\|rms\|ratio" "$out"/bench_*.log > "$out/summary.txt" 2>/dev/null
grep -h "^\[  \(PASSED\|FAILED\) \|tests ran" "$out"/test_*.log >> "$out/summary.txt" 2>/dev/null
cat "$out/anchors.jsonl" >> "$out/summary.txt" 2>/dev/null
cat "$out/status.txt" "$out/summary.txt"
