#!/usr/bin/env bash
# GDN backward device job (run from the repository root on the device):
#   run_gdn.sh OUT NEW_BIN_DIR [BASE_BIN_DIR] [steps...]
# Logs go to /tmp/gdnlogs and come back as OUT/logs.tgz (plus OUT/summary.txt).
# steps (default: tests bench anchors): tests = GDN GPU tests; model = whole-model GPU gradient tests;
# bench = hydra bench gdn-bwd 128K/512K x 14 (HYDRA_GDN_PROFILE=1, and =2 at 512K for stages 2/3
# apart) for NEW (and BASE); anchors = fla forward+backward at the same shapes.
set -u
final=$1; new=$2; base=${3:-}; shift 3 2>/dev/null || shift $#
out=/tmp/gdnlogs; rm -rf $out; mkdir -p $out  # packed into $final/logs.tgz at the end (the tool returns few files)
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
      # plain: the fwd+bwd and backward times (no stage events); PROFILE=1: stage times (a host
      # synchronisation per call); PROFILE=2: stages 2 and 3 one after the other, timed apart.
      # BINS="name=dir ..." (default: new=NEW_BIN_DIR base=BASE_BIN_DIR)
      for pair in ${BINS:-new=$new base=$base}; do
        which=${pair%%=*}; b=${pair#*=}
        [ -z "$b" ] && continue
        for t in 131072 524288; do
          timeout -k 5 90 "$b/hydra" bench --op gdn-bwd --seq-len $t --heads 14 --repeat 5 > "$out/bench_${which}_$t.log" 2>&1
          echo "bench_${which}_$t rc=$? $(( $(date +%s) - t0 ))s" >> "$out/status.txt"
          HYDRA_GDN_PROFILE=1 timeout -k 5 90 "$b/hydra" bench --op gdn-bwd --seq-len $t --heads 14 --repeat 5 > "$out/bench_${which}_${t}_profile.log" 2>&1
          echo "bench_${which}_${t}_profile rc=$? $(( $(date +%s) - t0 ))s" >> "$out/status.txt"
        done
        HYDRA_GDN_PROFILE=2 timeout -k 5 90 "$b/hydra" bench --op gdn-bwd --seq-len 524288 --heads 14 --repeat 3 > "$out/bench_${which}_524288_serial.log" 2>&1
        echo "bench_${which}_524288_serial rc=$? $(( $(date +%s) - t0 ))s" >> "$out/status.txt"
        if [ -n "${EXTRA_ENV:-}" ] && [ "$b" = "$new" ]; then  # one more serial profile with EXTRA_ENV (a knob under test)
          env $EXTRA_ENV HYDRA_GDN_PROFILE=2 timeout -k 5 90 "$b/hydra" bench --op gdn-bwd --seq-len 524288 --heads 14 --repeat 3 > "$out/bench_${which}_524288_serial_extra.log" 2>&1
          env $EXTRA_ENV HYDRA_GDN_PROFILE=1 timeout -k 5 90 "$b/hydra" bench --op gdn-bwd --seq-len 131072 --heads 14 --repeat 3 > "$out/bench_${which}_131072_profile_extra.log" 2>&1
          echo "bench extra ($EXTRA_ENV) rc=$? $(( $(date +%s) - t0 ))s" >> "$out/status.txt"
        fi
      done;;
    anchors)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$out/pip.log" 2>&1
      PYTHONPATH=/tmp/site timeout -k 5 200 python3 cluster/bench/anchors.py --warmup 2 --repeat 5 --attention '' --gdn '' \
        --gdn-bwd 131072x14,524288x14 > "$out/anchors.jsonl" 2> "$out/anchors.err"
      echo "anchors rc=$? $(( $(date +%s) - t0 ))s" >> "$out/status.txt";;
  esac
done
for f in "$out"/bench_*.log; do
  echo "== $(basename $f): $(grep -ho 'backward alone [0-9.]* ms' $f) fwd+bwd $(grep -ho '"ms":[0-9.]*' $f)"
  grep -h "stages:" $f | tail -4
done > "$out/summary.txt" 2>/dev/null
grep -h "^\[  \(PASSED\|FAILED\) \|tests ran" "$out"/test_*.log >> "$out/summary.txt" 2>/dev/null
cat "$out/anchors.jsonl" >> "$out/summary.txt" 2>/dev/null
cat "$out/status.txt" "$out/summary.txt"
cp "$out/summary.txt" "$final/summary.txt"; tar -C /tmp -czf "$final/logs.tgz" gdnlogs
