#!/usr/bin/env bash
# Final job of 2026-12-04, one H200: test_cuda; hydrahead-1.7b finetune 64K/128K with this tree
# (new) and with 370d6ed (old) in the same job; the PyTorch autograd layer x 28 at 128K and 64K;
# prefill 512K.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
mkdir -p /tmp/b /tmp/old && tar -C /tmp/b -xJf .device/s1/bins.tar.xz && tar -C /tmp/old -xJf .device/s1/old.tar.xz
pip install --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1; export PYTHONPATH=/tmp/site
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 )) s] $*" >> $out/run.log; }
python3 - /tmp/tok.h5 <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["input_ids"] = np.random.default_rng(0).integers(0, 151936, size=4 * 131072 + 1, dtype=np.int32)
PY
(cd /tmp && timeout -k 5 120 /tmp/b/test_cuda > $out/test_cuda.log 2>&1); st "test_cuda rc=$?"
for len in 64K 128K; do
  for which in new old; do
    bin=/tmp/b/hydra; [ $which = old ] && bin=/tmp/old/hydra
    rm -rf /tmp/tr; echo "== $which $len" >> $out/train.log
    timeout -k 5 100 $bin train --stage finetune --preset hydrahead-1.7b --data /tmp/tok.h5 --seq-len $len --steps 5 \
      --device cuda --out-dir /tmp/tr --save-every -1 2>&1 | grep -E "memory plan|step [0-9]|steps 1\.\.|rror" >> $out/train.log
    st "train $which $len"
  done
done
timeout -k 5 60 /tmp/b/hydra prefill --preset hydrahead-1.7b --seq-len 512K --device cuda 2>&1 | grep -E "prefill [0-9]+ tokens|rror" >> $out/prefill.log
st prefill
for t in 131072 65536; do
  timeout -k 5 200 python3 cluster/bench/layer_reference.py --seq-len $t --backward --repeat 3 2>&1 | grep -E '^\{|rror' >> $out/train.log
  st "torch layer backward $t"
done
