#!/usr/bin/env bash
# GPU job 3 (session of 2026-12-05, label 12-07): after the small-model fixes (one launch each for the
# optimizer's update, zeroing and norm; uploads through a pinned ring without a stream sync; the
# embedding backward's run bisection), the small-model step beside PyTorch eager/compiled in the same
# job, its scaling with the batch (fixed per-step cost) and kernel profile; the GPU tests; the packed
# 128K step (the count fix) against an unpacked one; the memory plan from the allocations against the
# measured peaks (64K and 128K training, 512K prefill); the export check in PyTorch. Output: $OUT/r3.tgz.
# Carry: .device (dev.tar.xz built as in run1.sh's header). As run for job 3 the results went
# straight under $OUT/r3 and 8 of 18 files came back; the tarring below was added after it.
set -u
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
H=build/bin/hydra
# The device returns at most 8 files a call (job 3 lost its speed logs and test_cuda.log that way):
# the folder is tarred into $OUT/r3.tgz after every section, so a call cut short still returns it.
R=/tmp/r3; mkdir -p $R
save() { tar -czf $OUT/r3.tgz.tmp -C /tmp r3 && mv $OUT/r3.tgz.tmp $OUT/r3.tgz; }
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $R/timeline.txt; }
DEADLINE=${DEADLINE:-585}  # seconds this job may take (lower when less device time is left)
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
# 1. Small-model speed on a quiet GPU. Steady state = median tokens/s of steps 11.. (the first steps
#    load modules and fill the allocator's pool).
$H synth --task lm:0.5,recall:0.5 --recall-tokens 128 --recall-pairs 32 --loss answers --tokens 4M --seq-len 256 --vocab 512 --seed 1 --out /tmp/speed.h5 > $R/speed_synth.log 2>&1
steady() { python3 -c "
import json,statistics,sys
r=[json.loads(l) for l in open('$1/train.jsonl') if '\"step\"' in l]
r=[x for x in r if x.get('type')=='step' and x['step']>10]
print('steady', len(r), 'steps: median', round(statistics.median(x['tokens_per_s'] for x in r)), 'tokens/s, median step', round(1e3*statistics.median(x['step_s'] for x in r),3), 'ms')"; }
for b in 64 32 128; do
  rm -rf /tmp/speed$b
  timeout 60 $H train --stage pretrain --preset qwen3-synth --data /tmp/speed.h5 --seq-len 256 --batch-seqs $b --steps 60 --save-every -1 --device cuda --out-dir /tmp/speed$b > $R/speed_hydra_b$b.log 2>&1
  el "hydra batch $b rc $? $(steady /tmp/speed$b)"
done
timeout 120 python3 cluster/bench/small_model_torch.py --batch 64 --seq-len 256 --steps 30 > $R/speed_torch.jsonl 2> $R/speed_torch.err
el "torch rc $?"; cat $R/speed_torch.jsonl; tail -3 $R/speed_torch.err
rm -rf /tmp/prof
CUDA_INJECTION64_PATH=build/lib/libhydra_kernel_profile.so HYDRA_KERNEL_PROFILE=$R/prof_small.tsv \
  timeout 60 $H train --stage pretrain --preset qwen3-synth --data /tmp/speed.h5 --seq-len 256 --batch-seqs 64 --steps 30 --save-every -1 --device cuda --out-dir /tmp/prof > $R/speed_prof.log 2>&1
el "profile rc $?"; head -3 $R/prof_small.tsv; save
# 2. The GPU tests (the list-form optimizer test, the embedding backward, the upload ring under everything).
timeout 200 build/tests/test_cuda > $R/test_cuda.log 2>&1; echo "test_cuda exit $?" >> $R/test_cuda.log
el "test_cuda"; grep -E "^\[  (PASSED|FAILED)|FAILED|tests? ran|exit" $R/test_cuda.log | tail -20; save
# 3. Packed documents (issue 34): a 128K hydrahead-1.7b finetune step, one stream vs 16 documents of 8K.
$H synth --task lm --tokens 400K --seq-len 131072 --vocab 151936 --seed 1 --out /tmp/tok.h5 > $R/packed_synth.log 2>&1
$H synth --task lm --tokens 400K --seq-len 131072 --vocab 151936 --doc-length 8192..8192 --seed 1 --out /tmp/packed8k.h5 >> $R/packed_synth.log 2>&1
for data in tok packed8k; do
  l=$(left); (( l > 30 )) || break
  rm -rf /tmp/tr
  timeout -k 5 $l $H train --stage finetune --preset hydrahead-1.7b --data /tmp/$data.h5 --seq-len 128K --steps 3 \
    --device cuda --out-dir /tmp/tr --save-every -1 > $R/packed_$data.log 2>&1
  el "packed $data rc $?"; grep -E "step [0-9]|memory plan|peak memory" $R/packed_$data.log | tail -4
done
# 3b. The memory plan from the allocations (issue 30 item 3): plan vs peak at 64K training (128K is
#     packed_tok above) and a 512K prefill.
l=$(left)
if (( l > 120 )); then
  rm -rf /tmp/tr
  timeout -k 5 60 $H train --stage finetune --preset hydrahead-1.7b --data /tmp/tok.h5 --seq-len 64K --steps 3 \
    --device cuda --out-dir /tmp/tr --save-every -1 > $R/memplan_train64k.log 2>&1
  el "memplan 64K rc $?"; grep -E "memory plan|peak memory" $R/memplan_train64k.log | tail -2
  timeout -k 5 60 $H prefill --preset hydrahead-1.7b --seq-len 512K --device cuda > $R/memplan_prefill512k.log 2>&1
  el "memplan prefill 512K rc $?"; grep -E "peak memory|estimate" $R/memplan_prefill512k.log | tail -2
fi
save
# 4. Export (issue 36): exported models in PyTorch against hydra's GPU logits, with the time left.
l=$(left)
if (( l > 90 )); then
  timeout -k 5 $l cluster/torch/check_export_gpu.sh $H /tmp/export 4096 > $R/export.log 2>&1
  el "export rc $?"; tail -15 $R/export.log
  cp /tmp/export/result.json $R/export_result.json 2>/dev/null
fi
save; ls -la $OUT
