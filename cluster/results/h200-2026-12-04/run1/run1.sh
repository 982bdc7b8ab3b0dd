#!/usr/bin/env bash
# Run 1 of 2026-12-04: the new element-wise kernels and the kept MLP gate/up on one H200.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
mkdir -p /tmp/b && tar -C /tmp/b -xJf .device/s1/bins.tar.xz
export LD_LIBRARY_PATH=/tmp/b
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 )) s] $*" >> $out/run.log; }
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv >> $out/run.log 2>&1
python3 - /tmp/tok.h5 <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["input_ids"] = np.random.default_rng(0).integers(0, 151936, size=4 * 131072 + 1, dtype=np.int32)
PY
st tokens
(cd /tmp && timeout -k 5 170 /tmp/b/test_cuda > $out/test_cuda.log 2>&1); st "test_cuda rc=$?"
train() {  # label len extra...
  local label=$1 len=$2; shift 2
  rm -rf /tmp/tr; echo "== $label $len $*" >> $out/train.log
  timeout -k 5 100 /tmp/b/hydra train --stage finetune --preset hydrahead-1.7b --data /tmp/tok.h5 --seq-len $len --steps ${STEPS:-4} \
    --device cuda --out-dir /tmp/tr --save-every -1 "$@" 2>&1 | grep -E "memory plan|step [0-9]|steps 1\.\.|rror" >> $out/train.log
  st "train $label $len"
}
train new 64K
train new 64K --kept-activations gdn+proj
train new 128K
(export CUDA_INJECTION64_PATH=/tmp/b/libhydra_kernel_profile.so HYDRA_KERNEL_PROFILE=$out/prof64k.tsv STEPS=2; train prof 64K)
for kv in 1 2; do
  timeout -k 5 60 /tmp/b/hydra bench --op attention-bwd --seq-len 128K --heads 2 --kv-heads $kv --repeat 5 2>&1 | tail -2 >> $out/bench.log
done
st bench
if command -v ncu >/dev/null || [ -x /usr/local/cuda/bin/ncu ]; then
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout -k 5 120 $NCU --set detailed -k regex:attention_backward_ws -c 1 /tmp/b/hydra bench --op attention-bwd --seq-len 32K --heads 4 --kv-heads 2 --repeat 1 --warmup 0 > $out/ncu_fa_bwd.txt 2>&1
  st "ncu rc=$?"
else
  st "no ncu"
fi
