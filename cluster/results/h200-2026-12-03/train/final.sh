#!/usr/bin/env bash
# The final job of 2026-12-03 (one H200): test_cuda; hydrahead-1.7b finetune at 64K and 128K, this
# build ("new") and main at b7acfd1 ("old", .device/main/bins.tar.xz) in the same job, the PyTorch
# autograd layer x 28 beside them; the 128K step with HYDRA_SERIAL_BRANCHES=1 (exclusive phases);
# prefill 512K new/old beside the PyTorch layer x 28.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
mkdir -p /tmp/b /tmp/old && tar -C /tmp/b -xJf .device/main/bins3.tar.xz && tar -C /tmp/old -xJf .device/main/bins.tar.xz
export LD_LIBRARY_PATH=/tmp/b:${LD_LIBRARY_PATH:-}
pip install --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1; export PYTHONPATH=/tmp/site
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 )) s] $*" >> $out/run.log; }
{ uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; env | grep -iE "inject|cupti|preload" ; } >> $out/run.log 2>&1
python3 - /tmp/tok.h5 <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["input_ids"] = np.random.default_rng(0).integers(0, 151936, size=4 * 131072 + 1, dtype=np.int32)
PY
(cd /tmp && timeout -k 5 150 /tmp/b/test_cuda > $out/test_cuda.log 2>&1); st "test_cuda rc=$?"
train() {  # label bin len [env]
  local label=$1 bin=$2 len=$3; shift 3
  rm -rf /tmp/tr
  echo "== $label $len" >> $out/train.log
  env "$@" timeout -k 5 90 $bin train --stage finetune --preset hydrahead-1.7b --data /tmp/tok.h5 --seq-len $len --steps 3 \
    --device cuda --out-dir /tmp/tr --save-every -1 2>&1 | grep -E "memory plan|step [0-9]|steps 1\.\.|rror|kernel_profile" >> $out/train.log
  st "train $label $len"
}
train new /tmp/b/hydra 64K
train new-none /tmp/b/hydra "64K --kept-activations none"
train old /tmp/old/hydra 64K
train new /tmp/b/hydra 128K CUDA_INJECTION64_PATH=/tmp/b/libhydra_kernel_profile.so HYDRA_KERNEL_PROFILE=$out/prof_train128k.tsv
train new-none /tmp/b/hydra "128K --kept-activations none"
train old /tmp/old/hydra 128K
train new-serial /tmp/b/hydra 128K HYDRA_SERIAL_BRANCHES=1
for t in 65536 131072; do
  timeout -k 5 80 python3 cluster/bench/layer_reference.py --seq-len $t --backward --repeat 3 2>&1 | grep '^{' >> $out/train.log
  st "torch layer backward $t"
done
for b in new old; do
  bin=/tmp/b/hydra; [ $b = old ] && bin=/tmp/old/hydra
  echo "== prefill $b" >> $out/prefill.log
  timeout -k 5 60 $bin prefill --preset hydrahead-1.7b --seq-len 512K --device cuda 2>&1 | grep -E "prefill [0-9]+ tokens|rror" >> $out/prefill.log
  st "prefill $b"
done
timeout -k 5 80 python3 cluster/bench/layer_reference.py --seq-len 524288 --repeat 3 2>&1 | grep '^{' >> $out/prefill.log
st "torch layer 512K"
