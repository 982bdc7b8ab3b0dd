#!/usr/bin/env bash
# Which pretraining settings make the synthetic teacher retrieve? Trains several qwen3-synth
# teachers side by side on one GPU, each on its own mixture / learning rate / batch, for at most
# --seconds each, then scores every teacher's latest checkpoint with eval-niah (single needle at the
# training length) and its held-out loss; prints one table and writes probe.jsonl.
#
#   cluster/synth/teacher_probe.sh --hydra build/bin/hydra --out /tmp/probe --seconds 240 \
#       "base|lm:0.2,mqar:0.5,single:0.1,multikey:0.1,multivalue:0.1|2e-3|16|4000" \
#       "mqar|mqar:1|1e-3|16|4000" ...
#
# Each variant is NAME|MIXTURE|LR|BATCH_SEQS|STEPS (the cosine schedule's length; a run cut by
# --seconds keeps its last checkpoint, saved every min(STEPS/8, 100) steps). Everything else is the gpu profile
# of pipeline.sh: vocab 512, 256-token windows, 10 MQAR pairs, 16M training tokens per variant.
set -uo pipefail
hydra=build/bin/hydra; out=/tmp/teacher-probe; seconds=240; device=cuda
variants=()
while (($#)); do
  case "$1" in
    --hydra) hydra="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) variants+=("$1"); shift ;;
  esac
done
((${#variants[@]})) || { echo "teacher_probe.sh: give at least one NAME|MIXTURE|LR|BATCH|STEPS variant" >&2; exit 2; }
len=256; vocab=512; pairs=10
mkdir -p "$out" || exit 2
"$hydra" synth --task lm --tokens $((len * 33)) --seq-len $len --seed 3 --vocab $vocab --mqar-pairs $pairs \
  --out "$out/heldout_lm.h5" > "$out/synth_heldout_lm.log" 2>&1 || { cat "$out/synth_heldout_lm.log"; exit 1; }
"$hydra" init --preset qwen3-synth --seed 0 --out "$out/init.h5" > /dev/null || exit 1

run_variant() {
  local name="$1" mix="$2" lr="$3" batch="$4" steps="$5" dir="$out/$1"
  mkdir -p "$dir"
  "$hydra" synth --task "$mix" --tokens 16M --seq-len $len --seed 1 --vocab $vocab --mqar-pairs $pairs \
    --out "$dir/train.h5" > "$dir/synth.log" 2>&1 || return 1
  "$hydra" synth --task "$mix" --tokens $((len * 64)) --seq-len $len --seed 2 --vocab $vocab --mqar-pairs $pairs \
    --out "$dir/heldout.h5" >> "$dir/synth.log" 2>&1 || return 1
  # A checkpoint at least every 100 steps, so that a run cut by --seconds early still has one.
  local save=$((steps / 8 < 100 ? (steps / 8 > 0 ? steps / 8 : 1) : 100)) t0=$SECONDS
  timeout "$seconds" "$hydra" train --stage pretrain --model "$out/init.h5" --data "$dir/train.h5" --seq-len $len \
    --steps "$steps" --batch-seqs "$batch" --lr "$lr" --save-every "$save" --keep 1 \
    --eval-data "$dir/heldout.h5" --eval-every "$save" --eval-windows 8 \
    --out-dir "$dir/run" --device "$device" > "$dir/train.log" 2>&1
  echo "$((SECONDS - t0))" > "$dir/train_seconds"
}

for v in "${variants[@]}"; do
  IFS='|' read -r name mix lr batch steps <<< "$v"
  run_variant "$name" "$mix" "$lr" "$batch" "$steps" &
done
wait

: > "$out/probe.jsonl"
for v in "${variants[@]}"; do
  IFS='|' read -r name mix lr batch steps <<< "$v"
  dir="$out/$name"
  model=""
  [[ -r "$dir/run/latest" ]] && model="$dir/run/$(cat "$dir/run/latest")/model.h5"
  if [[ -z "$model" || ! -r "$model" ]]; then
    echo "{\"name\":\"$name\",\"error\":\"no checkpoint\"}" >> "$out/probe.jsonl"
    tail -5 "$dir/train.log" 2>/dev/null
    continue
  fi
  "$hydra" eval-niah --model "$model" --task single --lengths $len --depths 0,50,100 --samples 8 --seed 1000 \
    --device "$device" --out "$dir/niah.jsonl" > "$dir/niah.log" 2>&1
  "$hydra" eval-lm --model "$model" --data "$out/heldout_lm.h5" --seq-len $len --windows 32 --device "$device" \
    --out "$dir/lm.json" > "$dir/lm.log" 2>&1
  python3 - "$name" "$mix" "$lr" "$batch" "$steps" "$dir" "$(cat "$dir/train_seconds" 2>/dev/null || echo 0)" \
    >> "$out/probe.jsonl" <<'EOF'
import json, os, sys
name, mix, lr, batch, steps, d, secs = sys.argv[1:]
rows = [json.loads(l) for l in open(os.path.join(d, "run", "train.jsonl")) if l.strip()]
train = [r for r in rows if r.get("type") == "step"]
evals = [r for r in rows if r.get("type") == "eval"]
cells = [json.loads(l) for l in open(os.path.join(d, "niah.jsonl")) if l.strip()] if os.path.exists(os.path.join(d, "niah.jsonl")) else []
cells = [c for c in cells if c.get("type") == "cell"]
lm = json.load(open(os.path.join(d, "lm.json"))) if os.path.exists(os.path.join(d, "lm.json")) else {}
acc = sum(c["correct"] for c in cells) / max(1, sum(c["samples"] for c in cells)) if cells else None
print(json.dumps({"name": name, "mixture": mix, "lr": float(lr), "batch_seqs": int(batch), "steps_planned": int(steps),
                  "steps_done": train[-1]["step"] if train else 0, "train_seconds": int(secs),
                  "loss_curve": [[r["step"], round(r["loss"], 4)] for r in train[:: max(1, len(train) // 16)]],
                  "eval_loss": [[r["step"], round(r["eval_loss"], 4)] for r in evals],
                  "niah_single_accuracy": acc, "heldout_lm_loss": lm.get("loss")}))
EOF
done
python3 - "$out/probe.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{'variant':<12} {'mixture':<52} {'lr':>7} {'batch':>5} {'steps':>11} {'last loss':>9} {'eval':>7} {'NIAH':>5} {'LM':>6}")
for r in rows:
    if "error" in r:
        print(f"{r['name']:<12} {r['error']}")
        continue
    last = r["loss_curve"][-1][1] if r["loss_curve"] else float("nan")
    ev = r["eval_loss"][-1][1] if r["eval_loss"] else float("nan")
    acc = r["niah_single_accuracy"]
    print(f"{r['name']:<12} {r['mixture']:<52} {r['lr']:>7g} {r['batch_seqs']:>5} {r['steps_done']:>5}/{r['steps_planned']:<5} "
          f"{last:>9.3f} {ev:>7.3f} {acc if acc is not None else float('nan'):>5.2f} {r['heldout_lm_loss'] or float('nan'):>6.3f}")
EOF
