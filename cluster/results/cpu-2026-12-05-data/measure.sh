#!/bin/bash
# usage: measure.sh HYDRA NAME DATA [extra train flags...]: 4 ranks, peak RSS per rank, seconds to the first step.
H=$1; NAME=$2; DATA=$3; shift 3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=/work/data/c/meas; mkdir -p $R; rm -rf $R/$NAME
t0=$(date +%s.%N)
mpirun --oversubscribe -np 4 /work/data/c/rank_time.sh $R/$NAME.time $H train --stage pretrain \
  --preset qwen3-tiny --data $DATA --seq-len 512 --steps ${STEPS:-6} --save-every -1 --out-dir $R/$NAME "$@" > $R/$NAME.log 2>&1
rc=$?; t1=$(date +%s.%N)
echo "$NAME rc=$rc wall=$(echo "$t1 - $t0" | bc)s"
grep -h "content identity\|step 1/" $R/$NAME.log | head -5
for f in $R/$NAME.time.*; do echo "$f $(grep 'Maximum resident' $f)"; done
