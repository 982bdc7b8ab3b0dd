#!/usr/bin/env bash
# The CPU teacher experiments of the session of 2026-12-04 (label 12-07), one change at a time from
# x1, on qwen3-synth-cpu (0.85M parameters, d = 16) at 128 tokens, batch 16 windows, 1 OpenBLAS
# thread, NIAH single/multikey scored every 200 steps on 32 fixed samples (hydra train --eval-niah).
# As run (two at a time on the 2-core machine, beside builds), hydra of commits 126a368..bbc7000; a
# run "stopped" was ended with SIGTERM (its last step saved; --stop-at N reproduces it).
set -u
H=${HYDRA:-build-cpu/bin/hydra}
mkdir -p /tmp/exp && cd /tmp/exp
export OPENBLAS_NUM_THREADS=1
x() {  # NAME DATA STEPS LR BATCH [train flags]; MODEL=FILE.h5 starts from a model
  local name=$1 data=$2 steps=$3 lr=$4 batch=$5; shift 5
  local src=(--preset qwen3-synth-cpu); [ -n "${MODEL:-}" ] && src=(--model "$MODEL")
  rm -rf $name
  $H train --stage pretrain "${src[@]}" --seq-len 128 --batch-seqs $batch --data $data --steps $steps --lr $lr \
    --save-every 250 --keep 1 --eval-every 200 --eval-niah single,multikey --eval-niah-samples 32 --out-dir $name "$@" \
    > $name.log 2>&1
}
# Data: NIAH-format multi-query recall (6 needles, every one queried, only the answers counted);
# the same mixed with language, single and multikey documents; Zoology-style recall mixed with mqar.
$H synth --task mqar --mqar-pairs 6 --loss answers --tokens 8M --seq-len 128 --vocab 256 --seed 1 --out mqar6_8m.h5
$H synth --task mqar:0.6,lm:0.1,single:0.15,multikey:0.15 --mqar-pairs 6 --loss answers --tokens 8M --seq-len 128 \
  --vocab 256 --seed 11 --out mix2_8m.h5
$H synth --task recall:0.5,mqar:0.5 --recall-tokens 64 --recall-pairs 16 --mqar-pairs 6 --loss answers --tokens 8M \
  --seq-len 128 --vocab 256 --seed 1 --out rm_8m.h5
x x1_mqar6_lr1e-3 mqar6_8m.h5 2000 1e-3 16                               # cosine lr (the default schedule)
x x2_mqar6_lr3e-3 mqar6_8m.h5 2000 3e-3 16                               # lr ×3 (stopped at step 664)
x x3_recall_mqar rm_8m.h5 2000 1e-3 16                                    # data: half recall (stopped at 827)
$H init --preset qwen3-synth-cpu --seed 0 --out init.h5                   # x4: q/k-norm gains ×1.6 (h5py edit of init.h5)
python3 - <<'PY'   # needs h5py
import h5py, shutil
shutil.copy("init.h5", "init_g16.h5")
with h5py.File("init_g16.h5", "r+") as f:
    for l in range(4):
        for n in ("q_norm", "k_norm"):
            d = f[f"model.layers.{l}.self_attn.{n}.weight"]
            d[...] = d[...] * 1.6
PY
MODEL=init_g16.h5 x x4_mqar6_g16 mqar6_8m.h5 2000 1e-3 16                # (stopped at ~900)
x x5_mqar6_const mqar6_8m.h5 6000 1e-3 16 --min-lr 1e-3 --warmup 50      # constant lr (stopped at ~5011)
MODEL=x5_mqar6_const/step-002750/model.h5 x x6_mix_from2750 mix2_8m.h5 1500 1e-3 16 --min-lr 1e-3 --warmup 20 --seed 1
MODEL=x6_mix_from2750/step-001500/model.h5 x x7_mix_cont mix2_8m.h5 4000 1e-3 16 --min-lr 1e-3 --warmup 20 --seed 2  # (stopped at ~570)
# Annealing: cosine from 1e-3 to 5e-5 over 1200 steps, from x7's step 500 (mix) and x5's step 5000 (mqar).
MODEL=x7_mix_cont/step-000500/model.h5 x x8_mix_anneal mix2_8m.h5 1200 1e-3 16 --min-lr 5e-5 --warmup 20 --seed 3
MODEL=x5_mqar6_const/step-005000/model.h5 x x9_mqar_anneal mqar6_8m.h5 1200 1e-3 16 --min-lr 5e-5 --warmup 20 --seed 3
# Key and value length (from x9's end): every answer needs the key; keys of one token.
$H synth --task mqar --mqar-pairs 8 --value-length 1 --loss answers --tokens 8M --seq-len 128 --vocab 256 --seed 21 --out mqar8v1_8m.h5
MODEL=x9_mqar_anneal/step-000750/model.h5 x x10_mqar8_v1 mqar8v1_8m.h5 3000 1e-3 16 --min-lr 1e-3 --warmup 20 --seed 4   # (stopped at ~667)
$H synth --task mqar --mqar-pairs 6 --key-length 1 --loss answers --tokens 8M --seq-len 128 --vocab 256 --seed 31 --out mqar6k1_8m.h5
MODEL=x9_mqar_anneal/step-001200/model.h5 x x11_mqar6_k1 mqar6k1_8m.h5 3000 1e-3 16 --min-lr 1e-3 --warmup 20 --seed 5   # (stopped at ~1325)
# Recall first (adjacent k v pairs), then NIAH's grammar; recall mixed into the copying model.
$H synth --task recall --recall-tokens 64 --recall-pairs 16 --loss answers --tokens 4M --seq-len 128 --vocab 256 --seed 41 --out recall_4m.h5
x x12_recall_phase1 recall_4m.h5 1000 1e-3 16 --min-lr 1e-3 --warmup 50
MODEL=x12_recall_phase1/step-001000/model.h5 x x12b_recall_then_mqar mqar6_8m.h5 1600 1e-3 16 --min-lr 1e-3 --warmup 50   # (stopped at ~1042)
MODEL=x9_mqar_anneal/step-001200/model.h5 x x13_mqar_plus_recall rm_8m.h5 2500 1e-3 16 --min-lr 1e-3 --warmup 20 --seed 6   # (stopped at ~2027)
# Fewer needles (2 a document), from x9's end and from scratch.
$H synth --task mqar --mqar-pairs 2 --loss answers --tokens 8M --seq-len 128 --vocab 256 --seed 51 --out mqar2_8m.h5
MODEL=x9_mqar_anneal/step-001200/model.h5 x x14_mqar2_from_x9 mqar2_8m.h5 3000 1e-3 16 --min-lr 1e-3 --warmup 20 --seed 7   # (stopped at ~1517)
x x15_mqar2_scratch mqar2_8m.h5 3000 1e-3 16 --min-lr 1e-3 --warmup 50   # (stopped at ~1506)
