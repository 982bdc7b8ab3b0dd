#!/usr/bin/env bash
# Run 1: test_cuda with the new GDN input pass (tile kernels, shared RoPE angles) and the conv
# backward (two channels a thread, 16-row tiles, fast sigmoid); hydrahead-1.7b finetune at 64K and
# 128K, base (the kernels of HEAD 01b96d0) and new in the same job, 4 steps each; a per-kernel
# profile of the new build at both lengths.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
mkdir -p /tmp/b /tmp/base && tar -C /tmp/b -xJf .device/s1/new.tar.xz && tar -C /tmp/base -xJf .device/s1/base.tar.xz
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 )) s] $*" >> $out/run.log; }
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.sm --format=csv >> $out/run.log 2>&1
python3 - /tmp/tok.h5 <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["input_ids"] = np.random.default_rng(0).integers(0, 151936, size=4 * 131072 + 1, dtype=np.int32)
PY
st tokens
(cd /tmp && timeout -k 5 150 /tmp/b/test_cuda > $out/test_cuda.log 2>&1); st "test_cuda rc=$?"
train() {  # binary label len extra...
  local bin=$1 label=$2 len=$3; shift 3
  rm -rf /tmp/tr; echo "== $label $len $*" >> $out/train.log
  timeout -k 5 100 $bin train --stage finetune --preset hydrahead-1.7b --data /tmp/tok.h5 --seq-len $len --steps ${STEPS:-4} \
    --device cuda --out-dir /tmp/tr --save-every -1 "$@" 2>&1 | grep -E "MFU counts|memory plan|step [0-9]|steps 1\.\.|rror" >> $out/train.log
  st "train $label $len"
}
for len in 64K 128K; do
  train /tmp/base/hydra base $len
  train /tmp/b/hydra new $len
done
for len in 64K 128K; do
  (export CUDA_INJECTION64_PATH=/tmp/b/libhydra_kernel_profile.so HYDRA_KERNEL_PROFILE=$out/prof$len.tsv STEPS=2; train /tmp/b/hydra prof $len)
done
