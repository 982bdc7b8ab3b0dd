#!/usr/bin/env bash
# GPU job 2: the synthetic-teacher pipeline (issue 31 item 4) with the teacher job 1's probe chose
# (.device/teacher.h5.xz.*, carried), the students evaluated at 1x-64x with 95% Wilson intervals, and
# claims.md; then, with the time left, the decode benchmark (issue 33). Output: $OUT/synth.tgz,
# $OUT/decode.tgz.
set -u
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
T0=$(date +%s)
cat .device/teacher.h5.xz.* | xz -d > /tmp/teacher.h5 || { echo "no teacher from job 1"; exit 1; }
build/bin/hydra info /tmp/teacher.h5 | head -3
# Students' streams: the teacher's final mixture, answers counted (language documents count every target).
cluster/synth/pipeline.sh --profile gpu --out /tmp/synth --teacher /tmp/teacher.h5 --deadline-s 450 \
  --set mix=mqar:0.6,lm:0.1,single:0.15,multikey:0.15 --set pairs=8 --set samples=16 \
  --archive $OUT/synth.tgz 2>&1 | tail -30
left=$(( 590 - ($(date +%s) - T0) ))
if (( left > 60 )); then
  CONTEXTS=32K,128K,512K BATCHES=1,8 timeout $left cluster/bench/decode_bench.sh build/bin /tmp/decode 2>&1 | tail -20
  tar -czf $OUT/decode.tgz -C /tmp decode
fi
