#!/usr/bin/env bash
# Run 2: the host's runtime calls through the longest idle gaps (64K), and the serial-branches step time.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
mkdir -p /tmp/b && tar -C /tmp/b -xJf .device/s2/bins.tar.xz && tar -C /tmp/b -xJf .device/s2/prof.tar.xz
export LD_LIBRARY_PATH=/tmp/b
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 )) s] $*" >> $out/run.log; }
python3 - /tmp/tok.h5 <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["input_ids"] = np.random.default_rng(0).integers(0, 151936, size=4 * 131072 + 1, dtype=np.int32)
PY
train() {  # label len extra...
  local label=$1 len=$2; shift 2
  rm -rf /tmp/tr; echo "== $label $len $* $(env | grep -E '^HYDRA_SERIAL|^HYDRA_KERNEL_PROFILE_HOST' | tr '\n' ' ')" >> $out/train.log
  timeout -k 5 100 /tmp/b/hydra train --stage finetune --preset hydrahead-1.7b --data /tmp/tok.h5 --seq-len $len --steps ${STEPS:-4} \
    --device cuda --out-dir /tmp/tr --save-every -1 "$@" 2>&1 | grep -E "step [0-9]|steps 1\.\.|rror" >> $out/train.log
  st "train $label $len"
}
(export CUDA_INJECTION64_PATH=/tmp/b/libhydra_kernel_profile.so HYDRA_KERNEL_PROFILE=$out/prof64K.tsv HYDRA_KERNEL_PROFILE_HOST=1 STEPS=2; train prof 64K)
(export HYDRA_SERIAL_BRANCHES=1 STEPS=3; train serial 64K)
