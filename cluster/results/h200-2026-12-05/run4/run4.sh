#!/usr/bin/env bash
# Run 4: after reverting the GDN input-pass lookahead: test_cuda, finetune 64K and 128K, 5 steps.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p /tmp/b && tar -C /tmp/b -xJf .device/s2/bins.tar.xz
python3 - /tmp/tok.h5 <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["input_ids"] = np.random.default_rng(0).integers(0, 151936, size=4 * 131072 + 1, dtype=np.int32)
PY
(cd /tmp && timeout -k 5 60 /tmp/b/test_cuda > $out/test_cuda.log 2>&1); echo "test_cuda rc=$?" >> $out/run.log
for len in 64K 128K; do
  rm -rf /tmp/tr; echo "== $len" >> $out/train.log
  timeout -k 5 60 /tmp/b/hydra train --stage finetune --preset hydrahead-1.7b --data /tmp/tok.h5 --seq-len $len --steps 5 \
    --device cuda --out-dir /tmp/tr --save-every -1 2>&1 | grep -E "memory plan|step [0-9]|steps 1\.\.|rror" >> $out/train.log
done
