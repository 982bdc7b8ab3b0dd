#!/usr/bin/env bash
# One device job for the attention and GDN kernels on one H200 (about 4-5 minutes):
#   1. GPU tests, one filter per process (a crash or hang in one cannot hide the others' results):
#      attention forward; GDN forward; GDN backward; attention backward per kernel (ws = the
#      warp-specialised default, mma) and the strided-view case;
#   2. hydra bench: attention-bwd (32K×16, 128K×2, 512K×2) with the warp-specialised backward and
#      the mma.sync one; gdn forward (32K/128K/512K × 14); gdn-bwd (128K and 512K × 14), GDN stage
#      times at 512K;
#   3. anchors (PyTorch SDPA-cuDNN forward + backward, flash-linear-attention forward and forward +
#      backward), the PyTorch layer reference at 512K (forward) and hydra prefill 512K;
#   4. a compact table: test verdicts, then cluster/bench/summary.py's targets.
#
#   OUT=DIR bash cluster/gpu_kernels_check.sh      # from the repository root, on the device machine
#
# A job of the GPU harness (cluster/gpu_job_lib.sh: the carried binaries or a build of hydra and
# test_cuda, each step under its time limit and the call's deadline, logs in $R and $OUT/kernels.tgz
# after every step, one timeline line a step). QUICK=1 keeps what a short device slot needs (about 3
# minutes): the tests, attention-bwd at 32K×16 and 128K×2, gdn-bwd at 128K and 512K, the fused GDN
# forward at 512K, the cuDNN/fla backward anchors at those shapes, the 512K layer reference and the
# prefill.
#
# If flash-linear-attention is not importable and FLA_WHEELS names a folder of .whl files, they are
# installed first (pip, no index, no dependencies). Nothing is piped through head (a reader that
# exits early would SIGPIPE the writer and lose the log). A failed GDN test is said next to the GDN
# figures; a failed or hung warp-specialised backward test skips that kernel's benches.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_job_lib.sh"
gpu_job_start kernels "${DEADLINE:-585}" "hydra test_cuda" || exit 1
out=$R

# ---- 1. GPU tests -----------------------------------------------------------------------------
declare -A verdict
test_filter() {  # name filter limit
  local log="$out/test_$1.log"
  run_job "test_$1" "$3" "$T/test_cuda --gtest_filter='$2'" > /dev/null
  local rc=$?
  if [ $rc -eq 0 ] && grep -q "^\[  PASSED  \]" "$log" && ! grep -q "^\[  FAILED  \]" "$log"; then
    verdict[$1]=passed
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    verdict[$1]="TIMED OUT after $3 s (last case: $(grep -E '^case |^delta rule' "$log" | tail -1))"
  elif [ $rc -gt 128 ]; then
    verdict[$1]="DIED (signal $((rc - 128)); last line: $(tail -1 "$log"))"
  else
    verdict[$1]="FAILED (exit $rc: $(grep -c 'Failure' "$log") failures)"
  fi
  echo "test $1: ${verdict[$1]}"
}
echo "== GPU tests"
test_filter attention_fwd '*FlashAttention*' 90
test_filter gdn_fwd 'CudaOps.ChunkedDeltaRule*' 150
test_filter gdn_bwd 'CudaDeltaRuleBackward.*' 90
test_filter attention_bwd_ws 'CudaAttentionBackward.WarpSpecialized*' 60
test_filter attention_bwd_mma 'CudaAttentionBackward.MmaKernel*' 60
test_filter attention_bwd_strided 'CudaAttentionBackward.StridedViews' 60
prefill_env=()
[ "${verdict[gdn_fwd]}" != passed ] && echo "!! the GDN kernels failed their test: the GDN figures below are of a failing kernel"

# ---- 2. hydra bench ---------------------------------------------------------------------------
echo "== hydra bench"
b="$out/bench.jsonl"; : > "$b"
bench() {  # name limit [VAR=value ...] -- bench args...
  local name=$1 limit=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  run_job "bench_$name" "$limit" "env ${envs[*]} $H bench $* --json-out $b" > /dev/null ||
    echo "bench $name FAILED (see bench_$name.log)"
}
bwd_kernels=(mma)
[ "${verdict[attention_bwd_ws]}" = passed ] && bwd_kernels+=(ws)
quick=${QUICK:-0}
for kernel in "${bwd_kernels[@]}"; do
  bench attn_bwd_${kernel}_32k 60 HYDRA_ATTENTION_BWD_KERNEL=$kernel -- --op attention-bwd --seq-len 32768 --heads 16 --repeat 5
  bench attn_bwd_${kernel}_128k 60 HYDRA_ATTENTION_BWD_KERNEL=$kernel -- --op attention-bwd --seq-len 131072 --heads 2 --repeat 5
  [ "$quick" = 1 ] || bench attn_bwd_${kernel}_512k 90 HYDRA_ATTENTION_BWD_KERNEL=$kernel -- --op attention-bwd --seq-len 524288 \
    --heads 2 --warmup 1 --repeat 3
done
# Stage times (HYDRA_GDN_PROFILE=1, a host synchronisation per call) only where a call takes tens of
# milliseconds; the shorter runs are timed without them.
gdn_kernels=(fused)
for kernel in "${gdn_kernels[@]}"; do
  if [ "$quick" != 1 ]; then
    for t in 32768 131072; do
      bench gdn_${kernel}_$t 60 HYDRA_GDN_KERNEL=$kernel -- --op gdn --seq-len $t --heads 14 --repeat 5
    done
  fi
  bench gdn_${kernel}_524288 60 HYDRA_GDN_KERNEL=$kernel HYDRA_GDN_PROFILE=1 -- --op gdn --seq-len 524288 --heads 14 --repeat 5
done
bench gdn_bwd_131072 60 "${prefill_env[@]}" -- --op gdn-bwd --seq-len 131072 --heads 14 --repeat 5
bench gdn_bwd_524288 60 "${prefill_env[@]}" HYDRA_GDN_PROFILE=1 -- --op gdn-bwd --seq-len 524288 --heads 14 --repeat 5

# ---- 3. anchors, the PyTorch layer, the prefill -----------------------------------------------
echo "== anchors, PyTorch layer reference, prefill"
if ! python3 -c "import fla" 2> /dev/null && [ -n "${FLA_WHEELS:-}" ]; then
  run_job fla_wheels 120 "python3 -m pip install --no-index --no-deps $FLA_WHEELS/*.whl" > /dev/null ||
    echo "fla wheel install FAILED (fla_wheels.log)"
fi
if [ "$quick" = 1 ]; then anchor_shapes="--gdn 524288x14 --attention-bwd 32768x16,131072x2"
else anchor_shapes="--gdn 32768x14,131072x14,524288x14 --attention-bwd 32768x16,131072x2,524288x2"; fi
run_job anchors 150 "python3 cluster/bench/anchors.py --warmup 2 --repeat 5 --sdpa-backends cudnn --attention '' \
  $anchor_shapes --gdn-bwd 131072x14,524288x14 > $out/anchors.jsonl" > /dev/null || echo "anchors FAILED (anchors.log)"
run_job layer 120 "python3 cluster/bench/layer_reference.py --seq-len 524288 --repeat 3 > $out/layer.jsonl" > /dev/null ||
  echo "layer reference FAILED (layer.log)"
: > "$out/prefill.jsonl"
run_job prefill 120 "env ${prefill_env[*]} $H prefill --preset hydrahead-1.7b --seq-len 512K --device cuda --progress off \
  --json-out $out/prefill.jsonl" > /dev/null || echo "prefill FAILED (prefill.log)"

# ---- 4. the table -----------------------------------------------------------------------------
echo "== results"
echo "| GPU test | verdict |"
echo "| --- | --- |"
for name in attention_fwd gdn_fwd gdn_bwd attention_bwd_ws attention_bwd_mma attention_bwd_strided; do
  echo "| $name | ${verdict[$name]} |"
done
echo
grep -hE "stages:" "$out"/bench_gdn_*.log | sed -E 's/^\[hydra +[0-9.]+s\] //' | awk '!seen[$0]++' | tail -8
grep -hE "RMS error ratio|check " "$out"/bench_attn_bwd_*.log | sed -E 's/^\[hydra +[0-9.]+s\] //' | sort -u | head -20
echo
python3 cluster/bench/summary.py "$b" "$out/anchors.jsonl" "$out/layer.jsonl" "$out/prefill.jsonl" | tee "$out/summary.md"
[ ${#prefill_env[@]} -gt 0 ] && echo "(prefill and gdn-bwd ran with ${prefill_env[*]})"
echo "step times:"; cat "$R/timeline.txt"
gpu_job_end
