#!/usr/bin/env bash
# GPU validation on a machine with NVIDIA GPUs, in one job: the GPU test suites, kernel benchmarks
# next to their anchors (same GPU, same job), the prefill scaling sweep and a NIAH cell at 512K.
# Writes logs, JSON lines and plots to OUT_DIR.
#
#   OUT=DIR bash cluster/gpu_validate.sh [kernels] [tests] [bench] [anchors] [sweep] [niah] [bwd] [train]
#
# From the repository root, a job of the GPU harness (cluster/gpu_job_lib.sh): the carried binaries
# or a build of hydra, test_cuda and test_parallel_gpu; every step under its time limit and the
# call's deadline (DEADLINE seconds, default 36000), its log in $R (/tmp/validate) and
# $OUT/validate.tgz after every step. Stages (default: tests bench anchors sweep niah bwd):
#   kernels  the forward kernels' targets in one stage: the attention and GDN GPU tests (every kernel variant against
#            the CPU reference), then bench, anchors, the PyTorch layer reference (cluster/bench/
#            layer_reference.py, one hydrahead-1.7b layer × 28) and hydra prefill at 512K on one GPU;
#            ends with the compact table of cluster/bench/summary.py
#   tests    GPU unit tests (every attention kernel: hopper, mma; the fused GDN kernels), multi-GPU
#            suite under mpirun -np 2 (when 2 GPUs are present)
#   bench    hydra bench: GEMM ceiling; FA 8K×16, 32K×16, 128K×2, 512K×2 with the default kernel;
#            GDN 32K/128K/512K × 14 heads (per-stage times) and the in-GPU split's segment counts;
#            the GDN input pass (gdn-input: conv, q/k backward, conv backward) at 64K/128K × 14 heads
#   anchors  PyTorch SDPA (cuDNN, FA2) and flash-linear-attention on the same shapes; table
#   sweep    hydrahead-1.7b prefill, 1 GPU × {128K,256K,512K}, 2 GPUs × {128K,256K,512K,1M}; plot
#   niah     eval-niah, hydrahead-1.7b (random weights), one 512K cell on 1 and on 2 GPUs
#   bwd      the backward kernels: their GPU tests, hydra bench --op attention-bwd (32K×16, 128K×2,
#            512K×2; also the mma.sync backward at 32K×16) and --op gdn-bwd (128K/512K × 14 heads),
#            forward + backward, with the anchors
#            (SDPA-cuDNN/FA2 and flash-linear-attention forward + backward) and the joined table
#   train    hydra gradients and hydra forward on the GPU against the CPU (hydrahead-tiny); hydra
#            train --stage finetune, hydrahead-1.7b (random weights, random tokens) at 64K and 128K
#            tokens per step on one GPU (step time, tokens/s, MFU, peak memory, phases), the 128K step
#            again under mpirun -np 1 (TRAIN_MPI1=0 skips it), next to the PyTorch autograd step of
#            the same layer × 28 (cluster/bench/layer_reference.py --backward); TRAIN_STEPS (4) steps,
#            TRAIN_LENGTHS ("64K 128K")
# If the Hopper attention kernel fails its test, later stages use the mma.sync kernel
# (HYDRA_ATTENTION_KERNEL=mma) and say so; the variable can also be set by hand.
set -uo pipefail
stages=${*:-tests bench anchors sweep niah bwd}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_job_lib.sh"
gpu_job_start validate "${DEADLINE:-36000}" "hydra test_cuda test_parallel_gpu" || exit 1
out=$R
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "== $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1) x $gpus"
has() { [[ " $stages " == *" $1 "* ]]; }
command -v cuobjdump > /dev/null && echo "HGMMA instructions in hydra: $(cuobjdump --dump-sass "$H" 2>/dev/null | grep -c HGMMA)"

# GPU test runs with a time limit (a kernel that hangs must not stall the job). kernel_tests runs
# the attention and GDN tests and, when the Hopper attention kernel failed (or died) without the
# mma.sync one failing, makes later stages use the latter (HYDRA_ATTENTION_KERNEL=mma).
show_test_log() { grep -E "^\[  (PASSED|FAILED|SKIPPED) |max rel error|Failure|max relative error|non-finite|lse \[head|error" "$1" | head -${2:-60}; }
kernel_tests() {
  run_job test_attention 300 "$T/test_cuda --gtest_filter='*FlashAttention*'" > /dev/null
  local rc=$?; show_test_log "$out/test_attention.log" 50
  if [ $rc -ne 0 ] && ! grep -qE "attention \[mma\].*(max relative error|non-finite|lse \[head)" "$out/test_attention.log"; then
    echo "!! the hopper attention kernel failed its test (exit $rc): later stages use HYDRA_ATTENTION_KERNEL=mma"
    export HYDRA_ATTENTION_KERNEL=mma
  fi
  run_job test_gdn 300 "$T/test_cuda --gtest_filter='*DeltaRule*'" > /dev/null
  rc=$?; show_test_log "$out/test_gdn.log" 50
  [ $rc -ne 0 ] && echo "!! the GDN kernels failed their test (exit $rc): the GDN figures below are of a failing kernel"
}

# bench NAME LIMIT_S COMMAND: one hydra bench (or any step) through the harness, its stderr kept in
# bench_NAME.log; a failure is said and the stage goes on.
bench() { run_job "bench_$1" "$2" "$3 > /dev/null" > /dev/null || echo "bench $1 FAILED (bench_$1.log)"; }
run_bench() {
  echo "== hydra bench"
  b="$out/bench.jsonl"; : > "$b"
  bench gemm 180 "$H bench --op gemm --json-out $b"
  for spec in 8192x16 32768x16 131072x2 524288x2; do
    bench "attention_$spec" 180 "$H bench --op attention --seq-len ${spec%x*} --heads ${spec#*x} --repeat 5 --json-out $b"
  done
  for spec in 32768x14 131072x14 524288x14; do
    bench "gdn_$spec" 180 "HYDRA_GDN_PROFILE=1 $H bench --op gdn --seq-len ${spec%x*} --heads ${spec#*x} --repeat 5 --json-out $b"
  done
  for len in 65536 131072; do  # the GDN input pass and its backwards: GB/s beside a device copy (not in bench.jsonl)
    bench "gdn_input_$len" 120 "$H bench --op gdn-input --seq-len $len --heads 14 --repeat 20"
  done
  for segments in 2 4 8; do  # the split of the fused state pass, for tuning its default
    bench "gdn_segments_$segments" 180 "HYDRA_GDN_PROFILE=1 HYDRA_GDN_SEGMENTS=$segments $H bench --op gdn --seq-len 524288 \
      --heads 14 --repeat 3 --json-out $out/bench_variants.jsonl"
  done
  cat "$out"/bench_*.log | grep -E "TFLOP/s =|GB/s =|gdn stages|check" | grep -v "ceiling:" | sed -E 's/^\[hydra +[0-9.]+s\] //' |
    awk '!seen[$0]++' | tail -30
}

run_anchors() {
  echo "== anchors (PyTorch SDPA, flash-linear-attention)"
  run_job anchors 900 "python3 cluster/bench/anchors.py --repeat 5 > $out/anchors.jsonl" > /dev/null; tail -2 "$out/anchors.log"
  [ -s "$out/bench.jsonl" ] && python3 cluster/bench/compare.py "$out/bench.jsonl" "$out/anchors.jsonl" | tee "$out/compare.md"
}

if has kernels; then
  echo "== GPU tests: attention and GDN kernels"
  kernel_tests
  run_bench
  run_anchors
  echo "== PyTorch reference layer (512K) and hydra prefill (512K, 1 GPU)"
  run_job layer 600 "python3 cluster/bench/layer_reference.py --seq-len 524288 --repeat 3 > $out/layer.jsonl" > /dev/null
  tail -2 "$out/layer.log"; cat "$out/layer.jsonl"
  : > "$out/prefill.jsonl"
  run_job prefill 300 "$H prefill --preset hydrahead-1.7b --seq-len 512K --device cuda --progress off \
    --json-out $out/prefill.jsonl" > /dev/null || echo "prefill 512K FAILED (see prefill.log)"
  echo "== summary (forward kernel targets)"
  python3 cluster/bench/summary.py "$out/bench.jsonl" "$out/anchors.jsonl" "$out/layer.jsonl" \
    "$out/prefill.jsonl" | tee "$out/summary.md"
fi
if has tests; then
  echo "== GPU unit tests"
  has kernels || kernel_tests
  run_job test_cuda "${TEST_TIMEOUT:-600}" "$T/test_cuda --gtest_filter='-*FlashAttention*:*DeltaRule*'" > /dev/null
  show_test_log "$out/test_cuda.log" 40
  if [ "$gpus" -ge 2 ]; then
    echo "== multi-GPU tests (2 ranks)"
    run_job test_parallel_gpu 300 "mpirun --oversubscribe -np 2 -x HYDRA_ATTENTION_KERNEL $T/test_parallel_gpu" > /dev/null
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |GPUs vs|rank [0-9]\]|Failure|mpi \]" "$out/test_parallel_gpu.log" | head -20
  fi
fi
has bench && run_bench
has anchors && run_anchors
if has sweep; then
  echo "== prefill sweep"
  lens2="128K,256K,512K,1M"; [ "$gpus" -ge 2 ] || lens2=""
  run_job sweep_1gpu 1800 "python3 cluster/sweep.py --hydra $H --gpus 1 --lengths 128K,256K,512K --out $out/sweep.jsonl" > /dev/null
  [ -n "$lens2" ] && run_job sweep_2gpu 1800 "python3 cluster/sweep.py --hydra $H --gpus 2 --lengths $lens2 --out $out/sweep.jsonl" > /dev/null
  python3 cluster/plot_sweep.py "$out/sweep.jsonl" --out "$out/sweep.png"
  python3 - "$out/sweep.jsonl" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    if "error" in r: print(r); continue
    ph = r["phases_rank0"]
    print(f"{r['ranks']} GPU(s) {r['seq_len']:>8}: {r['seconds']:7.3f} s  {r['tflops_per_rank']:5.0f} TFLOP/s/GPU  "
          f"gemm {ph['gemm']:.2f} fa {ph['fa']:.2f} gdn {ph['gdn']:.2f} comm {ph['comm']:.2f} other {ph['other']:.2f}  "
          f"mem {r['peak_memory_gib']:.1f} GiB")
PY
fi
if has niah; then
  echo "== eval-niah 512K cell"
  run_job niah_1gpu 900 "$H eval-niah --preset hydrahead-1.7b --lengths 512K --depths 50 --samples 1 --device cuda \
    --out $out/niah_1gpu.jsonl" > /dev/null; tail -3 "$out/niah_1gpu.log"
  if [ "$gpus" -ge 2 ]; then
    run_job niah_2gpu 900 "mpirun --oversubscribe -np 2 -x NCCL_NVLS_ENABLE -x HYDRA_ATTENTION_KERNEL -x LD_LIBRARY_PATH $H eval-niah \
      --preset hydrahead-1.7b --lengths 512K --depths 50 --samples 1 --device cuda --out $out/niah_2gpu.jsonl" > /dev/null
    tail -3 "$out/niah_2gpu.log"
  fi
fi
if has bwd; then
  echo "== backward kernels: GPU tests"
  # To a file first, then filtered: a `| head` behind tee would SIGPIPE the test and lose its log.
  run_job test_cuda_bwd 600 "$T/test_cuda --gtest_filter='*Backward*'" > /dev/null
  echo "(test_cuda *Backward* exit $?)"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |rms ratio|Failure|Expected|Which" "$out/test_cuda_bwd.log" | tail -80
  if grep -q "FAILED.*CudaAttentionBackward.WarpSpecialized" "$out/test_cuda_bwd.log"; then
    echo "!! the warp-specialised attention backward failed its test: the backward benches use the mma.sync kernel"
    export HYDRA_ATTENTION_BWD_KERNEL=mma
  fi
  echo "== backward kernels: hydra bench (forward + backward)"
  b="$out/bench_bwd.jsonl"; : > "$b"
  bench bwd_gemm 180 "$H bench --op gemm --json-out $b"
  for spec in 32768x16 131072x2 524288x2; do
    bench "attention_bwd_$spec" 300 "$H bench --op attention-bwd --seq-len ${spec%x*} --heads ${spec#*x} --repeat 5 --json-out $b"
  done
  bench attention_bwd_mma 300 "HYDRA_ATTENTION_BWD_KERNEL=mma $H bench --op attention-bwd --seq-len 32768 --heads 16 --repeat 5 \
    --json-out $out/bench_bwd_variants.jsonl"
  for spec in 131072x14 524288x14; do
    bench "gdn_bwd_$spec" 300 "HYDRA_GDN_PROFILE=1 $H bench --op gdn-bwd --seq-len ${spec%x*} --heads ${spec#*x} --repeat 5 --json-out $b"
  done
  cat "$out"/bench_bwd_*.log "$out"/bench_attention_bwd_*.log "$out"/bench_gdn_bwd_*.log 2> /dev/null |
    grep -E "check |TFLOP/s =|backward alone|stages:|FAILED|rror" | grep -v "ceiling:" | sed -E 's/^\[hydra +[0-9.]+s\] //' | tail -40
  echo "== backward anchors (SDPA, flash-linear-attention: forward + backward)"
  run_job anchors_bwd 900 "python3 cluster/bench/anchors.py --repeat 5 --attention '' --gdn '' --attention-bwd 32768x16,131072x2,524288x2 \
    --gdn-bwd 131072x14,524288x14 > $out/anchors_bwd.jsonl" > /dev/null; tail -2 "$out/anchors_bwd.log"
  [ -s "$b" ] && python3 cluster/bench/compare.py "$b" "$out/anchors_bwd.jsonl" | tee "$out/compare_bwd.md"
fi
if has train; then
  echo "== training: hydra gradients on the GPU vs the CPU (hydrahead-tiny, 4K tokens)"
  python3 - "$out/grad_tokens.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["input_ids"] = np.random.default_rng(1).integers(0, 256, size=4096, dtype=np.int32)
PY
  run_job tiny_init 60 "$H init --preset hydrahead-tiny --weight-seed 3 --out $out/tiny.h5" > /dev/null
  for dev in cpu cuda; do
    run_job "gradients_$dev" 300 "$H gradients --model $out/tiny.h5 --input $out/grad_tokens.h5 --device $dev --out $out/grads_$dev.h5" > /dev/null
    tail -1 "$out/gradients_$dev.log"
  done
  python3 - "$out/grads_cpu.h5" "$out/grads_cuda.h5" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
print(f"loss cpu {a.attrs['loss']:.6f} cuda {b.attrs['loss']:.6f}")
errs = sorted(((np.linalg.norm(b[k][:] - a[k][:]) / max(np.linalg.norm(a[k][:]), 1e-30), k) for k in a), reverse=True)
print("worst gradient RMS ratios (cuda vs cpu):", ", ".join(f"{k} {e:.2e}" for e, k in errs[:4]))
PY
  echo "== hydra forward on the GPU vs the CPU (hydrahead-tiny, 4K tokens)"
  for dev in cpu cuda; do
    run_job "forward_$dev" 300 "$H forward --model $out/tiny.h5 --input $out/grad_tokens.h5 --device $dev --output $out/logits_$dev.h5" > /dev/null
    tail -1 "$out/forward_$dev.log"
  done
  python3 - "$out/logits_cpu.h5" "$out/logits_cuda.h5" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1])["logits"][:], h5py.File(sys.argv[2])["logits"][:]
print(f"logits {a.shape}: cuda vs cpu max abs error {np.abs(a - b).max():.3g} of max |logit| {np.abs(a).max():.3g}, "
      f"arg-max agreement {(a.argmax(1) == b.argmax(1)).mean():.3f}")
PY
  echo "== training: hydrahead-1.7b finetune on one GPU"
  python3 - "$out/train_tokens.h5" <<'PY'
import sys, h5py, numpy as np
ids = np.random.default_rng(0).integers(0, 151936, size=6 * 131072 + 1, dtype=np.int32)
with h5py.File(sys.argv[1], "w") as f:
    f["input_ids"] = ids
PY
  train_run() {  # name, launcher prefix, seq len
    rm -rf "$out/train_$1"
    run_job "train_$1" 1800 "$2 $H train --stage finetune --preset hydrahead-1.7b --data $out/train_tokens.h5 --seq-len $3 \
      --steps ${TRAIN_STEPS:-4} --device cuda --out-dir $out/train_$1 --save-every -1" > /dev/null
    grep '^{' "$out/train_$1.log" | tee -a "$out/train.jsonl"
    grep -E "memory plan|step [0-9]|error" "$out/train_$1.log" | sed -E 's/^\[hydra +[0-9.]+s\] //' | tail -6
  }
  for len in ${TRAIN_LENGTHS:-64K 128K}; do train_run $len "" $len; done
  if [ "${TRAIN_MPI1:-1}" = 1 ]; then
    echo "== training: the same 128K step under mpirun -np 1 (the NCCL path, a world of one)"
    train_run 128K_mpi1 "mpirun --oversubscribe -np 1 -x NCCL_NVLS_ENABLE -x PATH -x LD_LIBRARY_PATH" 128K
  fi
  for t in 65536 131072; do
    run_job "layer_backward_$t" 900 "python3 cluster/bench/layer_reference.py --seq-len $t --backward --repeat 3" > /dev/null
    grep '^{' "$out/layer_backward_$t.log" | tee -a "$out/train.jsonl"
  done
fi
echo "== done"
gpu_job_end
