#!/bin/bash
# eval-niah of the 8 layer-1 students with the first landscape's settings (single, 6 samples)
H=/work/main/build-cpu/bin/hydra
cd /work/data/landscape1
one() {
  s=$1; t0=$(date +%s.%N)
  $H eval-niah --model out/work/runs/e1-head-$s-finetune/step-000030/model.h5 --task single --lengths 128,512,2048,8192 --depths 0,50,100 --samples 6 --seed 1000 --device cpu --out res6/evals/e1-head-$s.niah.jsonl > res6/logs/eval6-$s.log 2>&1
  echo "{\"step\":\"eval-niah6-e1-head-$s\",\"seconds\":$(echo "$(date +%s.%N) - $t0" | bc),\"rc\":$?}" >> res6/timings_eval6.jsonl
}
for a in 0 2 4 6; do one 1.$a & one 1.$((a+1)); wait; done
