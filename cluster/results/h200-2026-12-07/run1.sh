#!/usr/bin/env bash
# GPU job 1 (session of 2026-12-04, results label 12-07): the small-model step beside its PyTorch
# anchor and its per-kernel profile with the GPU's idle gaps; the teacher-recipe probe
# (cluster/synth/teacher_probe.py, probe_variants.json) with the GPU tests beside it; a packed
# 128K hydrahead-1.7b step against an unpacked one. Output: $OUT/r1.tgz (and $OUT/teacher.h5.xz.aa, .ab, ...).
#
# Carry (the three binaries are 126 MB unstripped, over the 64 MiB carry limit; stripped and xz'd
# they were 11.7 MiB), built here first with
#   HYDRA_BUILD_DIR=build cluster/build.sh hydra test_cuda test_parallel_gpu hydra_kernel_profile
#   rm -rf .device && mkdir -p .device/s/bin .device/s/tests .device/s/lib
#   strip -o .device/s/bin/hydra build/bin/hydra; cp build/lib/libhydra_kernel_profile.so .device/s/lib/
#   for t in test_cuda test_parallel_gpu; do strip -o .device/s/tests/$t build/tests/$t; done
#   tar -C .device/s -cf - bin tests lib | xz -T2 -6 > .device/dev.tar.xz && rm -rf .device/s
# then: run(carry [".device"], command "mkdir -p build && tar -xJf .device/dev.tar.xz -C build &&
#   bash cluster/results/h200-2026-12-07/run1.sh").
set -u
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
H=build/bin/hydra
R=/tmp/r1; mkdir -p $R
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $R/timeline.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
# 1. Small-model step speed on a quiet GPU: hydra (packed micro-batches) vs PyTorch eager/compiled.
$H synth --task lm:0.5,recall:0.5 --recall-tokens 128 --recall-pairs 32 --loss answers --tokens 4M --seq-len 256 --vocab 512 --seed 1 --out /tmp/speed.h5 > $R/speed_synth.log 2>&1
el synth
timeout 60 $H train --stage pretrain --preset qwen3-synth --data /tmp/speed.h5 --seq-len 256 --batch-seqs 64 --steps 40 --save-every -1 --device cuda --out-dir /tmp/speed > $R/speed_hydra.log 2>&1
el "hydra speed rc $?"; tail -2 $R/speed_hydra.log
rm -rf /tmp/speed
HYDRA_KERNEL_PROFILE_HOST=1 CUDA_INJECTION64_PATH=build/lib/libhydra_kernel_profile.so HYDRA_KERNEL_PROFILE=$R/prof_small.tsv \
  timeout 60 $H train --stage pretrain --preset qwen3-synth --data /tmp/speed.h5 --seq-len 256 --batch-seqs 64 --steps 15 --save-every -1 --device cuda --out-dir /tmp/speed > $R/speed_prof.log 2>&1
el "profile rc $?"
timeout 100 python3 cluster/bench/small_model_torch.py --batch 64 --seq-len 256 --steps 30 > $R/speed_torch.jsonl 2> $R/speed_torch.err
el "torch rc $?"; cat $R/speed_torch.jsonl
# 2. The probe, with the GPU tests beside it (the probe measures learning, not speed).
(timeout 400 build/tests/test_cuda > $R/test_cuda.log 2>&1; echo "test_cuda exit $?" >> $R/test_cuda.log) &
timeout 290 python3 cluster/synth/teacher_probe.py --hydra $H --out /tmp/probe --variants cluster/synth/probe_variants.json \
  --deadline-s 250 --tokens 24M --eval-every 100 > $R/probe_table.txt 2>&1
el "probe rc $?"; cat $R/probe_table.txt
wait
el "tests done"
grep -E "^\[  (PASSED|FAILED)|FAILED|tests? ran|exit" $R/test_cuda.log | tail -20
cp /tmp/probe/probe.jsonl /tmp/probe/commands.sh $R/ 2>/dev/null
for d in /tmp/probe/*/; do
  n=$(basename $d); mkdir -p $R/probe_$n
  for r in $d/run*; do [ -f $r/train.jsonl ] && cp $r/train.jsonl $R/probe_$n/$(basename $r).jsonl; done
  for l in $d/*.log; do [ -f $l ] && tail -4 $l > $R/probe_$n/$(basename $l .log).tail; done
done
tar -czf $OUT/r1.tgz -C /tmp r1
# The best variant's final model (highest single + multikey accuracy at its last evaluation) comes
# back as the teacher of the pipeline job (run2.sh carries the parts as .device/teacher.h5.xz.*).
python3 - <<'PY' > $R/best.txt
import json
rows = [json.loads(l) for l in open("/tmp/probe/probe.jsonl")]
def score(r):
    last = [p for p in r["phases"] if "niah_single" in p]
    if not last or not last[-1]["niah_single"]: return -1
    p = last[-1]
    return (p["niah_single"][-1][1] or 0) + (p["niah_multikey"][-1][1] or 0)
best = max(rows, key=score)
print(best["name"], score(best), best.get("final_model"))
PY
cat $R/best.txt
# (qwen3-synth's model.h5 is near the 16 MiB a returned file may have: xz, in 15 MiB parts.)
xz -T8 -9 -c "$(awk '{print $3}' $R/best.txt)" | split -b 15M - $OUT/teacher.h5.xz. 2>/dev/null
# 3. Packed documents (issue 34): a 128K hydrahead-1.7b finetune step, one stream vs 16 documents of 8K.
left=$(( 585 - ($(date +%s) - T0) ))
if (( left > 60 )); then
  $H synth --task lm --tokens 400K --seq-len 131072 --vocab 151936 --seed 1 --out /tmp/tok.h5 > $R/packed_synth.log 2>&1
  $H synth --task lm --tokens 400K --seq-len 131072 --vocab 151936 --doc-length 8192..8192 --seed 1 --out /tmp/packed8k.h5 >> $R/packed_synth.log 2>&1
  for data in tok packed8k; do
    left=$(( 585 - ($(date +%s) - T0) )); (( left > 20 )) || break
    rm -rf /tmp/tr
    timeout -k 5 $left $H train --stage finetune --preset hydrahead-1.7b --data /tmp/$data.h5 --seq-len 128K --steps 3 \
      --device cuda --out-dir /tmp/tr --save-every -1 > $R/packed_$data.log 2>&1
    el "packed $data rc $?"; grep -E "step [0-9]" $R/packed_$data.log | tail -2
  done
fi
tar -czf $OUT/r1.tgz -C /tmp r1 && ls -la $OUT
