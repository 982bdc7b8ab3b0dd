#!/usr/bin/env bash
# Run 2: the GDN input-pass kernels alone (hydra bench --op gdn-input, 14 heads, 64K and 128K) in
# three builds — basek: HEAD's kernels; new: tile kernels (conv 16 rows x 7 heads a block, q/k
# backward 8 rows x 14 heads) and the 2-channel conv backward; alt: new with 8-row conv tiles and
# 4-row x 8-head q/k backward tiles — then hydrahead-1.7b finetune 64K and 128K with each (4 steps).
set -u
out=$1
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
for v in new basek alt; do mkdir -p /tmp/$v && tar -C /tmp/$v -xJf .device/s2/$v.tar.xz; done
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 )) s] $*" >> $out/run.log; }
python3 - /tmp/tok.h5 <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["input_ids"] = np.random.default_rng(0).integers(0, 151936, size=4 * 131072 + 1, dtype=np.int32)
PY
for len in 64K 128K; do
  for v in basek new alt; do
    echo "== $v $len" >> $out/bench.log
    timeout -k 5 60 /tmp/$v/hydra bench --op gdn-input --seq-len $len --heads 14 --repeat 20 --json-out $out/bench_$v.jsonl 2>&1 \
      | grep -E "gdn-input|ceiling|rror" >> $out/bench.log
    st "bench $v $len"
  done
done
train() {  # variant len
  rm -rf /tmp/tr; echo "== $1 $2" >> $out/train.log
  timeout -k 5 100 /tmp/$1/hydra train --stage finetune --preset hydrahead-1.7b --data /tmp/tok.h5 --seq-len $2 --steps 4 \
    --device cuda --out-dir /tmp/tr --save-every -1 2>&1 | grep -E "step [0-9]|steps 1\.\.|rror" >> $out/train.log
  st "train $1 $2"
}
for len in 64K 128K; do for v in basek new alt; do train $v $len; done; done
# Per-kernel profile of the new build with the branches serialised: every kernel's time alone.
rm -rf /tmp/tr; echo "== new 64K serial profile" >> $out/train.log
HYDRA_SERIAL_BRANCHES=1 CUDA_INJECTION64_PATH=/tmp/new/libhydra_kernel_profile.so HYDRA_KERNEL_PROFILE=$out/prof64K_serial.tsv \
  timeout -k 5 100 /tmp/new/hydra train --stage finetune --preset hydrahead-1.7b --data /tmp/tok.h5 --seq-len 64K --steps 2 \
  --device cuda --out-dir /tmp/tr --save-every -1 2>&1 | grep -E "step [0-9]|steps 1\.\.|rror" >> $out/train.log
st "serial profile"
