#!/usr/bin/env bash
# GPU validation on a machine with NVIDIA GPUs: the GPU test suites, kernel benchmarks next to
# their anchors (same GPU, same job), and prefill figures. Writes logs and JSON lines to OUT_DIR.
#
#   cluster/gpu_validate.sh BIN_DIR OUT_DIR [tests] [bench] [anchors] [prefill1] [prefill2]
#
# BIN_DIR holds hydra, test_cuda and test_parallel_gpu. Stages (default: all):
#   tests     GPU unit tests (1 GPU) and the multi-GPU suite (mpirun -np 2 when 2 GPUs are present)
#   bench     hydra bench: GEMM ceiling, FA (8K×16, 32K×16, 128K×2, 512K×2), GDN (32K/128K/512K ×14)
#   anchors   PyTorch SDPA (cuDNN, FA2) and flash-linear-attention on the same shapes
#   prefill1  hydrahead-1.7b prefill at 128K and 512K on one GPU
#   prefill2  hydrahead-1.7b prefill at 512K and 1M on two GPUs
set -uo pipefail
bin=$(cd "$1" && pwd); out=$2; shift 2
stages=${*:-tests bench anchors prefill1 prefill2}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "== $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1) x $gpus"
has() { [[ " $stages " == *" $1 "* ]]; }

if has tests; then
  echo "== GPU unit tests"
  (cd "$root" && "$bin/test_cuda" 2>&1 | tee "$out/test_cuda.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==|rel error|Failure|Expected|Which|error" | head -60)
  if [ "$gpus" -ge 2 ]; then
    echo "== multi-GPU tests (2 ranks)"
    (cd "$root" && timeout 240 mpirun --oversubscribe -np 2 "$bin/test_parallel_gpu" 2>&1 | tee "$out/test_parallel_gpu.log" |
      grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==|GPUs vs|rank [0-9]\]|Failure|mpi \]" | head -40)
  fi
fi
if has bench; then
  echo "== hydra bench"
  b="$out/bench.jsonl"; : > "$b"
  "$bin/hydra" bench --op gemm --json-out "$b" > /dev/null
  for spec in 8192x16 32768x16 131072x2 524288x2; do
    "$bin/hydra" bench --op attention --seq-len ${spec%x*} --heads ${spec#*x} --repeat 5 --json-out "$b" > /dev/null || echo "bench attention $spec failed"
  done
  for spec in 32768x14 131072x14 524288x14; do
    "$bin/hydra" bench --op gdn --seq-len ${spec%x*} --heads ${spec#*x} --repeat 5 --json-out "$b" > /dev/null || echo "bench gdn $spec failed"
  done
  cat "$b"
fi
if has anchors; then
  echo "== anchors (PyTorch SDPA, flash-linear-attention)"
  python3 "$root/cluster/bench/anchors.py" --repeat 5 > "$out/anchors.jsonl" 2> "$out/anchors.err"; tail -3 "$out/anchors.err"
  cat "$out/anchors.jsonl"
  [ -s "$out/bench.jsonl" ] && python3 "$root/cluster/bench/compare.py" "$out/bench.jsonl" "$out/anchors.jsonl" | tee "$out/compare.md"
fi
if has prefill1; then
  echo "== prefill, 1 GPU"
  for n in 128K 512K; do
    timeout 900 "$bin/hydra" prefill --preset hydrahead-1.7b --seq-len $n --device cuda --json-out "$out/prefill.jsonl" 2>&1 |
      grep -vE "^\[hydra .*layer " | tail -4
  done
fi
if has prefill2 && [ "$gpus" -ge 2 ]; then
  echo "== prefill, 2 GPUs"
  for n in 512K 1M; do
    timeout 900 mpirun --oversubscribe -np 2 -x NCCL_NVLS_ENABLE "$bin/hydra" prefill --preset hydrahead-1.7b --seq-len $n \
      --device cuda --json-out "$out/prefill.jsonl" 2>&1 | grep -vE "^\[hydra .*layer " | tail -4
  done
fi
echo "== done"
