#!/bin/bash
# usage: baseline.sh HYDRA OUTROOT

H=$1; R=$2; D=/work/data/c
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p $R
run() { name=$1; np=$2; shift 2; rm -rf $R/$name
  if [ $np = 1 ]; then $H train --stage pretrain --preset qwen3-tiny --steps 20 --save-every -1 --out-dir $R/$name "$@" > $R/$name.log 2>&1
  else mpirun --oversubscribe -np $np $H train --stage pretrain --preset qwen3-tiny --steps 20 --save-every -1 --out-dir $R/$name "$@" > $R/$name.log 2>&1; fi
  echo "$name rc=$?"; }
run plain1 1 --data $D/plain.h5 --seq-len 64
run plain4 4 --data $D/plain.h5 --seq-len 64
run masked1 1 --data $D/masked.h5 --seq-len 64 --batch-seqs 2
run masked4 4 --data $D/masked.h5 --seq-len 64 --batch-seqs 2
run docs1 1 --data $D/docs.h5 --seq-len 64 --batch-seqs 3
run docs4 4 --data $D/docs.h5 --seq-len 64 --batch-seqs 2
run docs4sp2 4 --data $D/docs.h5,$D/i64docs.h5 --seq-len 64 --batch-seqs 2 --sp 2 --grad-accum 2
run chunked4 4 --data $D/chunked.h5 --seq-len 32 --batch-seqs 2 --sp 2
run synth4 4 --data $D/synth.h5 --seq-len 64 --batch-seqs 2 --eval-data $D/docs.h5 --eval-every 10
