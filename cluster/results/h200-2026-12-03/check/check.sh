#!/usr/bin/env bash
# The tree after the replaced state kernel's deletion: test_cuda, the GDN forward bench, prefill 512K.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p /tmp/b && tar -C /tmp/b -xJf .device/main/bins5.tar.xz
(cd /tmp && timeout -k 5 60 /tmp/b/test_cuda > $out/test_cuda.log 2>&1; echo "test_cuda rc=$?" >> $out/check.log)
for t in 32768 131072 524288; do
  timeout -k 5 30 /tmp/b/hydra bench --op gdn --seq-len $t --heads 14 --repeat 5 --json-out $out/gdn_fwd.jsonl >> $out/check.log 2>&1
done
timeout -k 5 40 /tmp/b/hydra prefill --preset hydrahead-1.7b --seq-len 512K --device cuda 2>&1 | grep -E "prefill [0-9]+ tokens|rror" >> $out/check.log
