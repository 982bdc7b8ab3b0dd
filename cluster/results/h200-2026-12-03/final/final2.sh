#!/usr/bin/env bash
# The merged tree (main + gdn4-next's state kernel + this session's training changes), one H200:
# test_cuda; hydrahead-1.7b finetune at 64K and 128K beside the PyTorch autograd layer x 28;
# prefill 512K beside the PyTorch layer x 28.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
mkdir -p /tmp/b && tar -C /tmp/b -xJf .device/main/bins4.tar.xz
pip install --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1; export PYTHONPATH=/tmp/site
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 )) s] $*" >> $out/run.log; }
python3 - /tmp/tok.h5 <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["input_ids"] = np.random.default_rng(0).integers(0, 151936, size=4 * 131072 + 1, dtype=np.int32)
PY
(cd /tmp && timeout -k 5 120 /tmp/b/test_cuda > $out/test_cuda.log 2>&1); st "test_cuda rc=$?"
for len in 64K 128K; do
  rm -rf /tmp/tr; echo "== $len" >> $out/train.log
  timeout -k 5 90 /tmp/b/hydra train --stage finetune --preset hydrahead-1.7b --data /tmp/tok.h5 --seq-len $len --steps 3 \
    --device cuda --out-dir /tmp/tr --save-every -1 2>&1 | grep -E "memory plan|step [0-9]|steps 1\.\.|rror" >> $out/train.log
  st "train $len"
done
for t in 65536 131072; do
  timeout -k 5 100 python3 cluster/bench/layer_reference.py --seq-len $t --backward --repeat 3 2>&1 | grep '^{' >> $out/train.log
  st "torch layer backward $t"
done
timeout -k 5 60 /tmp/b/hydra prefill --preset hydrahead-1.7b --seq-len 512K --device cuda 2>&1 | grep -E "prefill [0-9]+ tokens|rror" >> $out/prefill.log
st prefill
timeout -k 5 80 python3 cluster/bench/layer_reference.py --seq-len 524288 --repeat 3 2>&1 | grep '^{' >> $out/prefill.log
st "torch layer 512K"
