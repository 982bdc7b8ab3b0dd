#!/usr/bin/env bash
# Final job (one call): the GDN input pass with a half-warp (16 lanes, 8 bf16 each) per head,
# branch-free rows, the rows' positions loaded with the inputs and float4 conv weights, in two tile
# sizes — a: conv tiles of 8 rows, q/k backward tiles of 8; b: 4 and 4 — both with run 1's
# 2-channel conv backward; basek: HEAD's kernels (01b96d0) with this session's bench op and MFU count.
#   test_cuda (a, b); hydra bench --op gdn-input at 64K and 128K x 14 heads (basek, a, b);
#   prefill 512K (a); hydrahead-1.7b finetune 64K and 128K, 4 steps (basek, a, b);
#   per-kernel profiles of a; the PyTorch autograd layer x 28 anchors (cluster/bench/layer_reference.py).
set -u
out=$1
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
for v in basek a b; do mkdir -p /tmp/$v && tar -C /tmp/$v -xJf .device/s3/$v.tar.xz; done
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 )) s] $*" >> $out/run.log; }
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.sm --format=csv >> $out/run.log 2>&1
python3 - /tmp/tok.h5 <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["input_ids"] = np.random.default_rng(0).integers(0, 151936, size=4 * 131072 + 1, dtype=np.int32)
PY
for v in a b; do
  echo "== test_cuda $v" >> $out/test_cuda.log
  (cd /tmp && timeout -k 5 150 /tmp/$v/test_cuda >> $out/test_cuda.log 2>&1); st "test_cuda $v rc=$?"
done
for len in 64K 128K; do
  for v in basek a b; do
    echo "== $v $len" >> $out/bench.log
    timeout -k 5 60 /tmp/$v/hydra bench --op gdn-input --seq-len $len --heads 14 --repeat 20 2>&1 \
      | grep -E "gdn-input|ceiling|rror|^\{" >> $out/bench.log
    st "bench $v $len"
  done
done
echo "== a" >> $out/prefill.log
timeout -k 5 60 /tmp/a/hydra prefill --preset hydrahead-1.7b --seq-len 512K --device cuda 2>&1 | grep -E "prefill [0-9]+ tokens|rror" >> $out/prefill.log
st "prefill a"
train() {  # variant len [label]
  rm -rf /tmp/tr; echo "== ${3:-$1} $2" >> $out/train.log
  timeout -k 5 100 /tmp/$1/hydra train --stage finetune --preset hydrahead-1.7b --data /tmp/tok.h5 --seq-len $2 --steps ${STEPS:-4} \
    --device cuda --out-dir /tmp/tr --save-every -1 2>&1 | grep -E "MFU counts|memory plan|step [0-9]|steps 1\.\.|rror" >> $out/train.log
  st "train ${3:-$1} $2"
}
for len in 64K 128K; do for v in basek a b; do train $v $len; done; done
for len in 64K 128K; do
  (export CUDA_INJECTION64_PATH=/tmp/a/libhydra_kernel_profile.so HYDRA_KERNEL_PROFILE=$out/prof$len.tsv STEPS=2; train a $len "prof a")
done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >> $out/run.log 2>&1; export PYTHONPATH=/tmp/site
for n in 131072 65536; do
  timeout -k 5 200 python3 cluster/bench/layer_reference.py --seq-len $n --backward --repeat 3 >> $out/ref.log 2>&1
  st "reference $n rc=$?"
done
