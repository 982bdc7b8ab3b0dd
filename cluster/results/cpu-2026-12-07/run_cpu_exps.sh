#!/usr/bin/env bash
# CPU retrieval experiments (one change at a time), qwen3-synth-cpu at 128 tokens.
set -u
H=${HYDRA:-build-cpu/bin/hydra}  # the binary of commit d8fa909 in the session
cd /tmp/exp
export OPENBLAS_NUM_THREADS=1
gen() { [ -f "$1" ] || $H synth --tokens 4M --seq-len 128 --vocab 256 --seed 1 --out "$@" > /dev/null; }
gen single_all.h5 --task single --loss all
gen single_ans.h5 --task single --loss answers
gen recall_ans.h5 --task recall --recall-tokens 64 --recall-pairs 16 --loss answers
gen mix_ans.h5 --task recall:0.5,single:0.25,multikey:0.25 --recall-tokens 64 --recall-pairs 16 --loss answers
run() {
  name=$1; shift
  rm -rf $name
  /usr/bin/time -f "$name wall %e s" $H train --stage pretrain --preset qwen3-synth-cpu --seq-len 128 --batch-seqs 16 \
     --save-every -1 --eval-every 100 --eval-niah single,multikey --eval-niah-samples 16 --out-dir $name "$@" > $name.log 2>&1
  grep "NIAH" $name.log | tail -3
}
run e2_single_ans --data single_ans.h5 --steps 600 --lr 1e-3
run e3_recall --data recall_ans.h5 --steps 600 --lr 1e-3
run e1_single_all --data single_all.h5 --steps 600 --lr 1e-3
run e4_mix --data mix_ans.h5 --steps 600 --lr 1e-3
