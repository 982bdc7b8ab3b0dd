#!/usr/bin/env bash
# A synthetic teacher per RULER family (eval-niah --task multiquery|vartrack|cwe|fwe), trained and
# scored on the CPU: for each family, a training stream of that family only (answers counted,
# hydra synth --loss answers), a short run of hydra train from a starting model, then eval-niah at
# the training length and the longer lengths, teacher-forced and by generation, and the table of
# cluster/synth/ruler_report.py against each scorer's chance level (ruler_chance.py).
#
# The knobs are the small ones a 0.85M model learns in a few hundred steps at 128 tokens (RULER's
# defaults do not fit 128 tokens for cwe/fwe, and ask 4 queries / 4 hops of a model that has no key
# lookup); cluster/results/cpu-2026-12-05-ruler/README.md says why each was chosen. Override one
# family's knobs with K_<family>="..." in the environment (the same flags go to synth and eval-niah).
#
#   ruler_teacher.sh --out DIR [--hydra BIN] [--init MODEL.h5|scratch] [--families LIST] [--steps N]
#                    [--lengths 128,256,512] [--samples N] [--train-tokens 2M] [--jobs J]
#                    [--vocab 256] [--batch-seqs 16] [--device cpu|cuda]
#
# --init: the model training starts from; default the CPU NIAH teacher of
# cluster/results/synth-cpu-2026-12-07 (it copies a needle's value). From scratch (`scratch`) nothing
# is learned in 600 steps (cwe recall below chance); cluster/results/cpu-2026-12-05-ruler has the runs.
# --vocab must be the starting model's vocabulary (512 for the GPU teachers of cluster/synth/ablation_job.sh);
# the first of --lengths is the training length.
# The defaults are that folder's runs t1-t4 (its commands.sh is the record of what ran).
#
# DIR/<family>/: train.h5, heldout.h5 (data), run/ (hydra train: train.jsonl, checkpoints),
# evals/<family>.{tf,generate}.jsonl (eval-niah), chance.jsonl; DIR/table.md and DIR/table.json.
# Needs python3 with h5py and numpy (ruler_chance.py). OPENBLAS_NUM_THREADS=1 per run; --jobs
# families run side by side.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
H=build-cpu/bin/hydra OUT= INIT=$here/../results/synth-cpu-2026-12-07/teacher.h5 FAMILIES=multiquery,vartrack,cwe,fwe
STEPS=600 LENGTHS=128,256,512 SAMPLES=100 JOBS=2 TRAIN_TOKENS=2M VOCAB=256 BATCH=16 DEVICE=cpu
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2;;
    --hydra) H=$2; shift 2;;
    --init) INIT=$2; shift 2;;
    --families) FAMILIES=$2; shift 2;;
    --steps) STEPS=$2; shift 2;;
    --lengths) LENGTHS=$2; shift 2;;
    --samples) SAMPLES=$2; shift 2;;
    --train-tokens) TRAIN_TOKENS=$2; shift 2;;
    --jobs) JOBS=$2; shift 2;;
    --vocab) VOCAB=$2; shift 2;;
    --batch-seqs) BATCH=$2; shift 2;;
    --device) DEVICE=$2; shift 2;;
    -h|--help) sed -n '2,27p' "$0"; exit 0;;
    *) echo "ruler_teacher.sh: unknown argument '$1' (see --help)" >&2; exit 2;;
  esac
done
[ -n "$OUT" ] || { echo "ruler_teacher.sh: --out DIR is required" >&2; exit 2; }
[ -x "$H" ] || { echo "ruler_teacher.sh: no hydra binary at $H (--hydra)" >&2; exit 2; }
[[ "$STEPS" =~ ^[1-9][0-9]*$ && "$SAMPLES" =~ ^[1-9][0-9]*$ && "$JOBS" =~ ^[1-9][0-9]*$ &&
   "$VOCAB" =~ ^[1-9][0-9]*$ && "$BATCH" =~ ^[1-9][0-9]*$ ]] ||
  { echo "ruler_teacher.sh: --steps, --samples, --jobs, --vocab and --batch-seqs must be positive integers" >&2; exit 2; }
case $DEVICE in cpu|cuda) ;; *) echo "ruler_teacher.sh: --device is cpu or cuda (got '$DEVICE')" >&2; exit 2;; esac
: "${K_multiquery:=--queries 2}"
: "${K_vartrack:=--chains 2 --hops 1}"
: "${K_cwe:=--key-length 1 --common-words 3 --common-freq 6 --uncommon-freq 2}"
: "${K_fwe:=--key-length 1 --top-words 2}"
IFS=, read -ra fams <<< "$FAMILIES"
IFS=, read -ra lens <<< "$LENGTHS"
train_len=${lens[0]}
for f in "${fams[@]}"; do
  case $f in multiquery|vartrack|cwe|fwe) ;; *) echo "ruler_teacher.sh: unknown family '$f'" >&2; exit 2;; esac
done
# The default teacher is kept in its results folder's archive (cluster/results_files.py): taken out
# once, after every other check, so a bad argument writes nothing (a folder made for a failed
# extraction is removed again).
if [ "$INIT" != scratch ] && [ ! -f "$INIT" ]; then
  made_out=0; [ -d "$OUT" ] || made_out=1
  mkdir -p "$OUT"
  if python3 "$here/../results_files.py" extract "$INIT" "$OUT/init_teacher.h5" 2> /dev/null; then
    INIT=$OUT/init_teacher.h5
  elif [ $made_out = 1 ]; then
    rmdir "$OUT"
  fi
fi
[ "$INIT" = scratch ] || [ -f "$INIT" ] || { echo "ruler_teacher.sh: --init $INIT: no such file" >&2; exit 2; }
mkdir -p "$OUT"
export OPENBLAS_NUM_THREADS=1

family() {  # the whole recipe for one family
  local f=$1 d="$OUT/$1" k="K_$1"
  local knobs=(${!k})
  local src=(--preset qwen3-synth-cpu); [ "$INIT" = scratch ] || src=(--model "$INIT")
  local cell=(--depths 0 --samples "$SAMPLES")  # cwe and fwe have no depth
  case $f in multiquery|vartrack) cell=(--depths 0,25,50,75,100 --samples $(( (SAMPLES + 4) / 5 )));; esac
  mkdir -p "$d/evals"
  "$H" synth --task "$f" "${knobs[@]}" --loss answers --tokens "$TRAIN_TOKENS" \
    --seq-len "$train_len" --vocab "$VOCAB" --seed 11 --out "$d/train.h5" > "$d/synth.log" 2>&1
  "$H" synth --task "$f" "${knobs[@]}" --loss answers --tokens 16K --seq-len "$train_len" \
    --vocab "$VOCAB" --seed 12 --out "$d/heldout.h5" >> "$d/synth.log" 2>&1
  for L in "${lens[@]}"; do  # streams of the eval lengths, for the chance levels only
    "$H" synth --task "$f" "${knobs[@]}" --tokens $((400 * L)) --seq-len "$L" --vocab "$VOCAB" --seed 77 \
      --out "$d/chance_$L.h5" >> "$d/synth.log" 2>&1
  done
  python3 "$here/ruler_chance.py" "$d"/chance_*.h5 > "$d/chance.jsonl"
  rm -rf "$d/run"
  "$H" train --stage pretrain "${src[@]}" --seq-len "$train_len" --batch-seqs "$BATCH" --device "$DEVICE" --data "$d/train.h5" \
    --eval-data "$d/heldout.h5" --eval-windows 32 --eval-every 100 --steps "$STEPS" --lr 1e-3 --min-lr 1e-3 \
    --warmup $((STEPS < 20 ? STEPS : 20)) --save-every 300 --keep 4 --out-dir "$d/run" > "$d/train.log" 2>&1
  local model
  model=$(ls -d "$d"/run/step-*/ | tail -1)model.h5
  for sc in teacher-forced generate; do
    local tag=tf; [ $sc = generate ] && tag=generate
    "$H" eval-niah --model "$model" --task "$f" "${knobs[@]}" --lengths "$LENGTHS" "${cell[@]}" --seed 1000 \
      --device "$DEVICE" --score $sc --out "$d/evals/$f.$tag.jsonl" > "$d/evals/$f.$tag.log" 2>&1
  done
  echo "ruler_teacher.sh: $f done ($model)"
}

pids=()
for f in "${fams[@]}"; do
  family "$f" &
  pids+=($!)
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
[ $status -eq 0 ] || { echo "ruler_teacher.sh: a family failed (see $OUT/*/train.log and evals/*.log)" >&2; exit 1; }

cat "$OUT"/*/chance.jsonl > "$OUT/chance.jsonl"
evals=()
for f in "${fams[@]}"; do
  for tag in tf generate; do evals+=("$f=$OUT/$f/evals/$f.$tag.jsonl"); done
done
python3 "$here/ruler_report.py" --chance "$OUT/chance.jsonl" --json "$OUT/table.json" "${evals[@]}" > "$OUT/table.md"
cat "$OUT/table.md"
