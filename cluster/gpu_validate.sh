#!/usr/bin/env bash
# GPU validation on a machine with NVIDIA GPUs, in one job: the GPU test suites, kernel benchmarks
# next to their anchors (same GPU, same job), the prefill scaling sweep and a NIAH cell at 512K.
# Writes logs, JSON lines and plots to OUT_DIR.
#
#   cluster/gpu_validate.sh BIN_DIR OUT_DIR [tests] [bench] [anchors] [sweep] [niah] [bwd]
#
# BIN_DIR holds hydra, test_cuda and test_parallel_gpu. Stages (default: all):
#   tests    GPU unit tests (incl. the mma.sync attention kernel via HYDRA_ATTENTION_KERNEL=mma),
#            multi-GPU suite under mpirun -np 2 (when 2 GPUs are present)
#   bench    hydra bench: GEMM ceiling; FA 8K×16, 32K×16, 128K×2, 512K×2 (+ the other kernels at 32K);
#            GDN 32K/128K/512K × 14 heads with per-stage times (HYDRA_GDN_PROFILE)
#   anchors  PyTorch SDPA (cuDNN, FA2) and flash-linear-attention on the same shapes; table
#   sweep    hydrahead-1.7b prefill, 1 GPU × {128K,256K,512K}, 2 GPUs × {128K,256K,512K,1M}; plot
#   niah     eval-niah, hydrahead-1.7b (random weights), one 512K cell on 1 and on 2 GPUs
#   bwd      the backward kernels: their GPU tests, hydra bench --op attention-bwd (32K×16, 128K×2,
#            512K×2; also the mma.sync backward at 32K×16) and --op gdn-bwd (128K/512K × 14 heads),
#            forward + backward, with the anchors
#            (SDPA-cuDNN/FA2 and flash-linear-attention forward + backward) and the joined table
# If the default (wgmma) attention kernel fails its test, later stages fall back to the mma.sync
# kernel and say so. HYDRA_ATTENTION_KERNEL=mma selects the mma.sync kernel.
set -uo pipefail
bin=$(cd "$1" && pwd); out=$2; shift 2
stages=${*:-tests bench anchors sweep niah bwd}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "== $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1) x $gpus"
has() { [[ " $stages " == *" $1 "* ]]; }
command -v cuobjdump > /dev/null && echo "HGMMA instructions in hydra: $(cuobjdump --dump-sass "$bin/hydra" 2>/dev/null | grep -c HGMMA)"

if has tests; then
  echo "== GPU unit tests"
  (cd "$root" && "$bin/test_cuda" 2>&1 | tee "$out/test_cuda.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |rel error|Failure|Expected|Which|max relative" | head -40)
  if grep -q "FAILED.*FlashAttention" "$out/test_cuda.log"; then
    echo "!! wgmma attention failed its test: the remaining stages use the mma.sync kernel"
    export HYDRA_ATTENTION_KERNEL=mma
  fi
  for kernel in mma; do
    echo "== GPU attention test, $kernel kernel"
    (cd "$root" && HYDRA_ATTENTION_KERNEL=$kernel "$bin/test_cuda" --gtest_filter='*FlashAttention*' 2>&1 | tee "$out/test_cuda_$kernel.log" | grep -E "^\[  (PASSED|FAILED) |Failure" | head -10)
  done
  if [ "$gpus" -ge 2 ]; then
    echo "== multi-GPU tests (2 ranks)"
    (cd "$root" && timeout 300 mpirun --oversubscribe -np 2 -x HYDRA_ATTENTION_KERNEL "$bin/test_parallel_gpu" 2>&1 | tee "$out/test_parallel_gpu.log" |
      grep -E "^\[  (PASSED|FAILED|SKIPPED) |GPUs vs|rank [0-9]\]|Failure|mpi \]" | head -20)
  fi
fi
if has bench; then
  echo "== hydra bench"
  b="$out/bench.jsonl"; : > "$b"
  "$bin/hydra" bench --op gemm --json-out "$b" > /dev/null 2>> "$out/bench.log"
  for spec in 8192x16 32768x16 131072x2 524288x2; do
    "$bin/hydra" bench --op attention --seq-len ${spec%x*} --heads ${spec#*x} --repeat 5 --json-out "$b" > /dev/null 2>> "$out/bench.log" || echo "bench attention $spec FAILED"
  done
  for kernel in mma; do
    HYDRA_ATTENTION_KERNEL=$kernel "$bin/hydra" bench --op attention --seq-len 32768 --heads 16 --repeat 5 \
      --json-out "$out/bench_variants.jsonl" > /dev/null 2>> "$out/bench.log"
  done
  for spec in 32768x14 131072x14 524288x14; do
    HYDRA_GDN_PROFILE=1 "$bin/hydra" bench --op gdn --seq-len ${spec%x*} --heads ${spec#*x} --repeat 5 --json-out "$b" > /dev/null 2>> "$out/bench.log" || echo "bench gdn $spec FAILED"
  done
  grep -E "TFLOP/s =|gdn stages" "$out/bench.log" | grep -v "ceiling:" | sed -E 's/^\[hydra +[0-9.]+s\] //' | awk '!seen[$0]++' | tail -16
fi
if has anchors; then
  echo "== anchors (PyTorch SDPA, flash-linear-attention)"
  python3 "$root/cluster/bench/anchors.py" --repeat 5 > "$out/anchors.jsonl" 2> "$out/anchors.err"; tail -2 "$out/anchors.err"
  [ -s "$out/bench.jsonl" ] && python3 "$root/cluster/bench/compare.py" "$out/bench.jsonl" "$out/anchors.jsonl" | tee "$out/compare.md"
fi
if has sweep; then
  echo "== prefill sweep"
  lens2="128K,256K,512K,1M"; [ "$gpus" -ge 2 ] || lens2=""
  python3 "$root/cluster/sweep.py" --hydra "$bin/hydra" --gpus 1 --lengths 128K,256K,512K --out "$out/sweep.jsonl"
  [ -n "$lens2" ] && python3 "$root/cluster/sweep.py" --hydra "$bin/hydra" --gpus 2 --lengths "$lens2" --out "$out/sweep.jsonl"
  python3 "$root/cluster/plot_sweep.py" "$out/sweep.jsonl" --out "$out/sweep.png"
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
  "$bin/hydra" eval-niah --preset hydrahead-1.7b --lengths 512K --depths 50 --samples 1 --device cuda \
    --out "$out/niah_1gpu.jsonl" 2>&1 | tail -3
  [ "$gpus" -ge 2 ] && mpirun --oversubscribe -np 2 -x NCCL_NVLS_ENABLE -x HYDRA_ATTENTION_KERNEL -x LD_LIBRARY_PATH "$bin/hydra" eval-niah \
    --preset hydrahead-1.7b --lengths 512K --depths 50 --samples 1 --device cuda --out "$out/niah_2gpu.jsonl" 2>&1 | tail -3
fi
if has bwd; then
  echo "== backward kernels: GPU tests"
  (cd "$root" && "$bin/test_cuda" --gtest_filter='*Backward*' 2>&1 | tee "$out/test_cuda_bwd.log" |
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |rms ratio|Failure|Expected|Which" | head -80)
  if grep -q "FAILED.*CudaAttentionBackward.WgmmaKernel" "$out/test_cuda_bwd.log"; then
    echo "!! wgmma attention backward failed its test: the backward benches use the mma.sync kernel"
    export HYDRA_ATTENTION_BWD_KERNEL=mma
  fi
  echo "== backward kernels: hydra bench (forward + backward)"
  b="$out/bench_bwd.jsonl"; : > "$b"
  "$bin/hydra" bench --op gemm --json-out "$b" > /dev/null 2>> "$out/bench_bwd.log"
  for spec in 32768x16 131072x2 524288x2; do
    "$bin/hydra" bench --op attention-bwd --seq-len ${spec%x*} --heads ${spec#*x} --repeat 5 --json-out "$b" > /dev/null 2>> "$out/bench_bwd.log" || echo "bench attention-bwd $spec FAILED"
  done
  HYDRA_ATTENTION_BWD_KERNEL=mma "$bin/hydra" bench --op attention-bwd --seq-len 32768 --heads 16 --repeat 5 \
    --json-out "$out/bench_bwd_variants.jsonl" > /dev/null 2>> "$out/bench_bwd.log" || echo "bench attention-bwd mma.sync FAILED"
  for spec in 131072x14 524288x14; do
    HYDRA_GDN_PROFILE=1 "$bin/hydra" bench --op gdn-bwd --seq-len ${spec%x*} --heads ${spec#*x} --repeat 5 --json-out "$b" > /dev/null 2>> "$out/bench_bwd.log" || echo "bench gdn-bwd $spec FAILED"
  done
  grep -E "check |TFLOP/s =|backward alone|stages:|FAILED|rror" "$out/bench_bwd.log" | grep -v "ceiling:" | sed -E 's/^\[hydra +[0-9.]+s\] //' | tail -40
  echo "== backward anchors (SDPA, flash-linear-attention: forward + backward)"
  python3 "$root/cluster/bench/anchors.py" --repeat 5 --attention "" --gdn "" --attention-bwd 32768x16,131072x2,524288x2 \
    --gdn-bwd 131072x14,524288x14 > "$out/anchors_bwd.jsonl" 2> "$out/anchors_bwd.err"; tail -2 "$out/anchors_bwd.err"
  [ -s "$b" ] && python3 "$root/cluster/bench/compare.py" "$b" "$out/anchors_bwd.jsonl" | tee "$out/compare_bwd.md"
fi
echo "== done"
