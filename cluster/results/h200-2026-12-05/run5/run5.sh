#!/usr/bin/env bash
# Run 5: the refactored profiler report (one gap list) on a 2-step 64K run with host API records.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p /tmp/b && tar -C /tmp/b -xJf .device/s2/bins.tar.xz && tar -C /tmp/b -xJf .device/s2/prof.tar.xz
export LD_LIBRARY_PATH=/tmp/b
python3 - /tmp/tok.h5 <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["input_ids"] = np.random.default_rng(0).integers(0, 151936, size=2 * 65536 + 1, dtype=np.int32)
PY
CUDA_INJECTION64_PATH=/tmp/b/libhydra_kernel_profile.so HYDRA_KERNEL_PROFILE=$out/prof64K.tsv HYDRA_KERNEL_PROFILE_HOST=1 \
  timeout -k 5 60 /tmp/b/hydra train --stage finetune --preset hydrahead-1.7b --data /tmp/tok.h5 --seq-len 64K --steps 2 \
  --device cuda --out-dir /tmp/tr --save-every -1 2>&1 | grep -E "step [0-9]|rror|kernel_profile" > $out/train.log
