#!/usr/bin/env bash
# t8-t11 (second session of 2026-12-05): the lookup families from a teacher that has a key lookup, on
# the CPU. TEACHER is the GPU ablation job's qwen3-synth teacher (4.2M parameters, vocabulary 512,
# sha256 f117820d1bf98aff84c2837fc1613125fad3409835f509aafeafaf32f20d3e60; cluster/synth/ablation_job.sh
# trains it, ../h200-2026-12-05-ablation/teacher/commands.sh), H hydra built with -DHYDRA_CUDA=OFF at
# 4f30620. Run from the repository root; D is the work folder.
set -euo pipefail
H=${HYDRA:-build-cpu/bin/hydra} TEACHER=${TEACHER:?the ablation teacher .h5} D=${D:-/tmp/ruler_4m}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1

# t8 (multiquery) and t9 (vartrack): 400 steps of 16 windows of 256 each, side by side on the 2 cores.
bash cluster/synth/ruler_teacher.sh --out $D --hydra $H --init $TEACHER --families multiquery,vartrack \
  --steps 400 --lengths 256,512,1024 --vocab 512 --jobs 2

# t10: t9 continued, and t11 (vartrack only; knobs as ruler_teacher.sh's defaults).
d=$D/vartrack knobs=(--chains 2 --hops 1)
leg() {  # N SEED START STEPS BATCH_SEQS SAVE_EVERY KEEP [train flags]: a fresh 8M stream, then 2 ranks train
  local n=$1 seed=$2 start=$3 steps=$4 batch=$5 save=$6 keep=$7; shift 7
  $H synth --task vartrack "${knobs[@]}" --loss answers --tokens 8M --seq-len 256 --vocab 512 --seed $seed --out $d/train$n.h5
  mpirun -np 2 $H train --stage pretrain --model $start --seq-len 256 --batch-seqs $batch --device cpu \
    --data $d/train$n.h5 --eval-data $d/heldout.h5 --eval-windows 32 --eval-every 100 --steps $steps --lr 1e-3 --min-lr 1e-3 \
    --warmup 20 --save-every $save --keep $keep --out-dir $d/run$n "$@" > $d/train$n.log 2>&1
}
evaluate() {  # MODEL NAME: both scorings at 1x, 2x and 4x the training length
  for sc in teacher-forced generate; do
    local tag=tf; [ $sc = generate ] && tag=generate
    $H eval-niah --model $1 --task vartrack "${knobs[@]}" --lengths 256,512,1024 \
      --depths 0,25,50,75,100 --samples 20 --seed 1000 --device cpu --score $sc --out evals/$2.$tag.jsonl
  done
}
# run2: t9's step 400, 600 more steps of 16 windows over a fresh stream (seed 13). mpirun -np 2 without
# --sp made this one sequence-parallel group (the default), so 16 windows a step, not 32.
leg 2 13 $d/run/step-000400/model.h5 600 16 200 3
# run3: run2's step 600, 400 more steps on 2 data-parallel ranks (--sp 1: 32 windows a step), seed 14.
leg 3 14 $d/run2/step-000600/model.h5 400 16 200 3 --sp 1
# run4: run3's step 400 (1,400 steps in all), steps of 64 windows (the GPU run's batch), seed 15. Planned
# for 300; stopped by hand at step 102 once step 100's held-out answer loss was 0.0028 (from 1.27), and
# step 100 (1,500 in all) evaluated, the two scorings side by side.
leg 4 15 $d/run3/step-000400/model.h5 300 32 100 3 --sp 1
evaluate $d/run4/step-000100/model.h5 t10_vartrack_4m
# t11: t9 with 64 windows a step from the start (2 data-parallel ranks of 32), a stream for 400 such steps.
leg 11 16 $TEACHER 400 32 100 4 --sp 1
evaluate $d/run11/step-000400/model.h5 t11_vartrack_4m_b64
python3 cluster/synth/ruler_report.py --chance chance_4m.jsonl --json table_4m.json \
  t8_multiquery_4m=evals/t8_multiquery_4m.tf.jsonl t8_multiquery_4m=evals/t8_multiquery_4m.generate.jsonl \
  t9_vartrack_4m=evals/t9_vartrack_4m.tf.jsonl t9_vartrack_4m=evals/t9_vartrack_4m.generate.jsonl \
  t10_vartrack_4m=evals/t10_vartrack_4m.tf.jsonl t10_vartrack_4m=evals/t10_vartrack_4m.generate.jsonl \
  t11_vartrack_4m_b64=evals/t11_vartrack_4m_b64.tf.jsonl t11_vartrack_4m_b64=evals/t11_vartrack_4m_b64.generate.jsonl > table_4m.md
