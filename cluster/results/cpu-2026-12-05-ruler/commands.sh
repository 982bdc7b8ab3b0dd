#!/usr/bin/env bash
# Every command of this run (CPU, 2 cores shared; session of 2026-12-05), in the order started; runs
# t1+t2, t3+t4, t5+t6+t7 ran side by side, the evaluations beside them under nice. Run from an empty
# directory; H is hydra built with -DHYDRA_CUDA=OFF at this folder's commit, S the checkout's
# cluster/synth. The same recipe, reusable: cluster/synth/ruler_teacher.sh --init TEACHER.h5.
set -eu
H=${HYDRA:-build-cpu/bin/hydra}
S=${SYNTH:-cluster/synth}
export OPENBLAS_NUM_THREADS=1
cp "$S/../results/synth-cpu-2026-12-07/teacher.h5" teacher.h5   # the CPU NIAH teacher (copies a needle's value)

# The small-model knobs per family (synth and eval-niah take the same flags; README says why).
K_multiquery="--queries 2"
K_vartrack="--chains 2 --hops 1"
K_cwe="--key-length 1 --common-words 3 --common-freq 6 --uncommon-freq 2"
K_fwe="--key-length 1 --top-words 2"
K_mq1="--queries 2 --key-length 1 --value-length 1"   # t6 only

# Data: one family per stream, answers counted only; a held-out stream; streams at the eval lengths for
# the chance levels.
for t in multiquery vartrack cwe fwe; do
  k=K_$t
  $H synth --task $t ${!k} --loss answers --tokens 2M --seq-len 128 --vocab 256 --seed 11 --out $t.train.h5
  $H synth --task $t ${!k} --loss answers --tokens 16K --seq-len 128 --vocab 256 --seed 12 --out $t.heldout.h5
  for L in 128 256 512; do
    $H synth --task $t ${!k} --tokens $((L * 400)) --seq-len $L --vocab 256 --seed 77 --out chance_${t}_$L.h5
  done
done
python3 $S/ruler_chance.py chance_*.h5 > chance.jsonl
for t in multiquery vartrack cwe fwe; do python3 $S/show_synth.py $t.train.h5; done > decoded_samples.txt

train() {  # NAME STREAM STEPS [train flags]; MODEL=FILE.h5 starts from it (default teacher.h5), MODEL=scratch from a fresh qwen3-synth-cpu
  local name=$1 data=$2 steps=$3; shift 3
  local src=(--model "${MODEL:-teacher.h5}"); [ "${MODEL:-}" = scratch ] && src=(--preset qwen3-synth-cpu)
  $H train --stage pretrain "${src[@]}" --seq-len 128 --batch-seqs 16 --data $data.train.h5 \
    --eval-data $data.heldout.h5 --eval-windows 32 --eval-every 100 --steps $steps --lr 1e-3 --min-lr 1e-3 --warmup 20 \
    --save-every 300 --keep 4 --out-dir $name "$@" > $name.log 2>&1
}
evaluate() {  # MODEL.h5 NAME FAMILY [LENGTHS]: teacher-forced and generated
  local model=$1 name=$2 fam=$3 lengths=${4:-128,256,512} k=K_$3 cell
  case $fam in multiquery|vartrack) cell=(--depths 0,25,50,75,100 --samples 20);; *) cell=(--depths 0 --samples 100);; esac
  mkdir -p evals
  for sc in teacher-forced generate; do
    local tag=tf; [ $sc = generate ] && tag=generate
    $H eval-niah --model $model --task $fam ${!k} --lengths $lengths "${cell[@]}" --seed 1000 --device cpu --score $sc \
      --out evals/$name.$tag.jsonl > evals/$name.$tag.log 2>&1
  done
}

# The starting model on every family (before any RULER training).
for t in multiquery vartrack cwe fwe; do evaluate teacher.h5 init_$t $t 128,512; done
train t1_cwe cwe 600
train t2_fwe fwe 600
evaluate t1_cwe/step-000600/model.h5 t1_cwe cwe
evaluate t2_fwe/step-000600/model.h5 t2_fwe fwe
train t3_multiquery multiquery 600
train t4_vartrack vartrack 600
evaluate t3_multiquery/step-000600/model.h5 t3_multiquery multiquery
evaluate t4_vartrack/step-000600/model.h5 t4_vartrack vartrack
MODEL=scratch train t5_cwe_scratch cwe 600                      # one change from t1: no starting model
evaluate t5_cwe_scratch/step-000600/model.h5 t5_cwe_scratch cwe
for L in 128 256 512; do
  $H synth --task multiquery $K_mq1 --tokens $((L * 400)) --seq-len $L --vocab 256 --seed 77 --out chance6_multiquery_$L.h5
done
$H synth --task multiquery $K_mq1 --loss answers --tokens 2M --seq-len 128 --vocab 256 --seed 11 --out mq1.train.h5
$H synth --task multiquery $K_mq1 --loss answers --tokens 16K --seq-len 128 --vocab 256 --seed 12 --out mq1.heldout.h5
python3 $S/ruler_chance.py chance6_*.h5 > chance6.jsonl
train t6_multiquery_k1v1 mq1 600                                 # one change from t3: 1-token keys and values
K_multiquery=$K_mq1 evaluate t6_multiquery_k1v1/step-000600/model.h5 t6_multiquery_k1v1 multiquery
MODEL=t3_multiquery/step-000600/model.h5 train t7_multiquery_cont multiquery 800 --seed 1   # t3 continued: 1400 steps in all
evaluate t7_multiquery_cont/step-000800/model.h5 t7_multiquery_cont multiquery

# The tables (table.md): every trained model, then the starting model.
rows=()
for n in t1_cwe t2_fwe t3_multiquery t4_vartrack t5_cwe_scratch t7_multiquery_cont; do
  for s in tf generate; do rows+=("$n=evals/$n.$s.jsonl"); done
done
python3 $S/ruler_report.py --chance chance.jsonl --json table.json "${rows[@]}" > table.md
python3 $S/ruler_report.py --chance chance6.jsonl --json table_t6.json \
  t6_multiquery_k1v1=evals/t6_multiquery_k1v1.tf.jsonl t6_multiquery_k1v1=evals/t6_multiquery_k1v1.generate.jsonl > table_t6.md
rows=()
for t in multiquery vartrack cwe fwe; do for s in tf generate; do rows+=("init=evals/init_$t.$s.jsonl"); done; done
python3 $S/ruler_report.py --chance chance.jsonl --json table_init.json "${rows[@]}" > table_init.md
