#!/usr/bin/env bash
# Run 1 (2026-12-02 session): the one-launch GDN fold, the one-sync grad norm; host-API profile of the idle gaps.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
mkdir -p /tmp/b && tar -C /tmp/b -xJf .device/s2/bins.tar.xz
export LD_LIBRARY_PATH=/tmp/b
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 )) s] $*" >> $out/run.log; }
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv >> $out/run.log 2>&1
python3 - /tmp/tok.h5 <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["input_ids"] = np.random.default_rng(0).integers(0, 151936, size=4 * 131072 + 1, dtype=np.int32)
PY
st tokens
(cd /tmp && timeout -k 5 120 /tmp/b/test_cuda > $out/test_cuda.log 2>&1); st "test_cuda rc=$?"
train() {  # label len extra...
  local label=$1 len=$2; shift 2
  rm -rf /tmp/tr; echo "== $label $len $* $(env | grep -E '^HYDRA_GDN_BWD|^HYDRA_KERNEL_PROFILE_HOST' | tr '\n' ' ')" >> $out/train.log
  timeout -k 5 100 /tmp/b/hydra train --stage finetune --preset hydrahead-1.7b --data /tmp/tok.h5 --seq-len $len --steps ${STEPS:-4} \
    --device cuda --out-dir /tmp/tr --save-every -1 "$@" 2>&1 | grep -E "memory plan|step [0-9]|steps 1\.\.|rror" >> $out/train.log
  st "train $label $len"
}
train new 64K
train new 128K
(export HYDRA_GDN_BWD_COLUMNS=32; train cols32 128K)
for len in 64K 128K; do
  (export CUDA_INJECTION64_PATH=/tmp/b/libhydra_kernel_profile.so HYDRA_KERNEL_PROFILE=$out/prof$len.tsv HYDRA_KERNEL_PROFILE_HOST=1 STEPS=2; train prof $len)
done
