#!/usr/bin/env bash
# Run 3 (final): test_cuda; finetune 64K and 128K (5 steps) with this session's changes; the PyTorch
# autograd layer x 28 anchors in the same job; a profile of each length.
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
  rm -rf /tmp/tr; echo "== $label $len $*" >> $out/train.log
  timeout -k 5 100 /tmp/b/hydra train --stage finetune --preset hydrahead-1.7b --data /tmp/tok.h5 --seq-len $len --steps ${STEPS:-5} \
    --device cuda --out-dir /tmp/tr --save-every -1 "$@" 2>&1 | grep -E "memory plan|step [0-9]|steps 1\.\.|rror" >> $out/train.log
  st "train $label $len"
}
timeout -k 5 60 /tmp/b/hydra prefill --preset hydrahead-1.7b --seq-len 512K --device cuda 2>&1 | grep -E "prefill [0-9]+ tokens|rror" >> $out/prefill.log
st prefill
train new 64K
train new 128K
for len in 64K 128K; do
  (export CUDA_INJECTION64_PATH=/tmp/b/libhydra_kernel_profile.so HYDRA_KERNEL_PROFILE=$out/prof$len.tsv STEPS=2; train prof $len)
done
python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $out/pip.log 2>&1; export PYTHONPATH=/tmp/site
for n in 131072 65536; do
  timeout -k 5 200 python3 cluster/bench/layer_reference.py --seq-len $n --backward --repeat 3 > $out/ref_$n.log 2>&1
  st "reference $n rc=$?"
done
