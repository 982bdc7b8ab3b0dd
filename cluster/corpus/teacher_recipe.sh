#!/usr/bin/env bash
# The language teacher of issue 58: a qwen3-text model (8 layers, 16 query heads in 4 KV groups, RoPE,
# 78.7M parameters, the corpus tokenizer's 16384 ids) trained on one GPU on the real-text corpus of
# cluster/corpus/build_corpus.py mixed with retrieval tasks whose haystacks are that text, then
# measured: held-out LM loss and perplexity, retrieval at its training length, and where its
# retrieval lives (select-heads' concentration: layer shares, effective heads, the top heads' layers).
#
#   bash cluster/corpus/teacher_recipe.sh --corpus /work/corpus --out /tmp/teacher1 --seed 1     # one H100/H200
#   bash cluster/corpus/teacher_recipe.sh --corpus DIR --out DIR --profile toy --device cpu      # CTest, minutes
#
# The corpus folder (build_corpus.py's --out): tokenizer/tokenizer.json, tokens/{prose,code}-{train,heldout}/
# (shards, manifest.json) and text/prose-{train,heldout}.jsonl (the haystacks). Steps, every one a command
# in OUT/commands.sh, its output in OUT/logs/:
#   1. haystacks: --hay-mb of prose training text and the held-out prose as plain text
#   2. phase 1 (LM): hydra train --stage pretrain on the corpus shards alone (prose and code by
#      --prose-share), for --lm-share of the training seconds; meanwhile the CPU builds the retrieval
#      sets (build_niah_set.py --vary-haystack: NIAH single/multikey/multivalue and RULER's
#      multiquery/vartrack/cwe/fwe at the training length, --train-samples per task) and turns them
#      into one training file (cluster/niah/set_to_train.py: answers counted only)
#   3. phase 2 (LM + retrieval): the same model on the corpus blended with the retrieval file
#      (--retrieval-share of the windows) for the rest of the seconds; steps from a probe of each phase
#      (the median step time of a few steps), so the budget is seconds of GPU time, not a guess
#   4. evaluation: hydra eval-lm on held-out prose and code (loss, perplexity = e^loss), eval-niah
#      --dataset on every task built from held-out text at the training length, select-heads
#      (select_budget heads a layer: 2 of 16 is 7:1; mpirun over select_ranks CPU ranks; calibrated
#      on a held-out single-needle set) for the concentration
#   5. OUT/teacher.json and teacher.md: every number above, and whether the retrieval is spread as
#      the issue asks (no layer above half of the positive direct effect; the top 8 heads in >= 3 layers)
# Profiles: gpu (qwen3-text, length 1024, 32 windows a step, lr 1e-3 cosine to 1e-4, 420 s of training)
# and toy (qwen3-text-cpu, length 256, a few steps: the recipe's plumbing). --set NAME=VALUE overrides a
# profile setting (e.g. --set train_s=300 --set retrieval_share=0.3). The teacher is OUT/teacher.h5.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
corpus="" out="" profile=gpu hydra="${HYDRA:-$root/build/bin/hydra}" device="" seed=1 overrides=()
usage() { sed -n '2,31p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --corpus) corpus="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --profile) profile="$2"; shift 2 ;;
    --hydra) hydra="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --set) overrides+=("$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "teacher_recipe.sh: unknown flag $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ -n "$corpus" && -n "$out" ]] || { echo "teacher_recipe.sh: --corpus DIR and --out DIR are required" >&2; exit 2; }
[[ -x "$hydra" ]] || { echo "teacher_recipe.sh: $hydra is not an executable (build first, or pass --hydra)" >&2; exit 2; }
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "teacher_recipe.sh: --seed takes a number (got '$seed')" >&2; exit 2; }
for f in tokenizer/tokenizer.json text/prose-train.jsonl text/prose-heldout.jsonl tokens/prose-train/manifest.json \
         tokens/prose-heldout/manifest.json; do
  [[ -r "$corpus/$f" ]] || { echo "teacher_recipe.sh: $corpus/$f is missing (a build_corpus.py folder?)" >&2; exit 2; }
done
if [[ -e "$out" && -n "$(ls -A "$out" 2>/dev/null)" ]]; then
  echo "teacher_recipe.sh: --out $out exists and is not empty" >&2; exit 2
fi
case "$profile" in
  gpu) preset=qwen3-text; len=1024; batch=32; lr=1e-3; min_lr=1e-4; train_s=420; lm_share=0.35
       retrieval_share=0.2; prose_share=0.6; hay_mb=24; train_samples=400; eval_samples=8; depths=0,25,50,75,100
       tasks=single,multikey,multivalue,multiquery,vartrack,cwe,fwe; lm_windows=64; probe_steps=8
       select_ranks=16; select_budget=2; calib_len=512; calib_samples=12; : "${device:=cuda}" ;;
  toy) preset=qwen3-text-cpu; len=256; batch=2; lr=2e-3; min_lr=2e-4; train_s=0; lm_share=0.5
       retrieval_share=0.3; prose_share=0.6; hay_mb=1; train_samples=6; eval_samples=1; depths=0,100
       tasks=single,multikey,multivalue,multiquery,vartrack; lm_windows=2; probe_steps=0; steps_lm=3; steps_mix=3
       select_ranks=1; select_budget=1; calib_len=256; calib_samples=8; : "${device:=cpu}" ;;
  *) echo "teacher_recipe.sh: --profile must be gpu or toy (got $profile)" >&2; exit 2 ;;
esac
# RULER's word tasks sized to the length (their defaults need ~940 tokens at least).
knobs=(--common-words 4 --common-freq 8 --uncommon-freq 2 --top-words 3 --hops 3 --queries 3)
settings="preset len batch lr min_lr train_s lm_share retrieval_share prose_share hay_mb train_samples eval_samples depths
  tasks lm_windows probe_steps steps_lm steps_mix select_ranks select_budget calib_len calib_samples"
for o in "${overrides[@]}"; do
  name="${o%%=*}"
  [[ "$o" == *=* && " $(echo $settings) " == *" $name "* ]] || { echo "teacher_recipe.sh: --set $o: not NAME=VALUE with NAME one of: $(echo $settings)" >&2; exit 2; }
  printf -v "$name" '%s' "${o#*=}"
done
mkdir -p "$out/logs" "$out/data" "$out/evals" || exit 2
printf '#!/usr/bin/env bash\n# The commands of this run, in order.\n' > "$out/commands.sh"
T0=$(date +%s)
log() { echo "[teacher $(( $(date +%s) - T0 )) s] $*" | tee -a "$out/logs/recipe.log"; }
step() {  # step NAME CMD...: CMD's output in logs/NAME.log; its exit status returned
  local name="$1"; shift
  printf '%s\n' "$(printf '%q ' "$@")" >> "$out/commands.sh"  # one write: concurrent steps keep whole lines
  "$@" > "$out/logs/$name.log" 2>&1
  local rc=$?
  log "$name: rc $rc"
  return $rc
}
final_model() { [[ -r "$1/latest" ]] && echo "$1/$(cat "$1/latest")/model.h5"; }
tok="$corpus/tokenizer/tokenizer.json"

# ---- 1. haystacks -------------------------------------------------------------------------------------
python3 - "$corpus/text/prose-train.jsonl" "$out/data/hay_train.txt" "$hay_mb" "$corpus/text/prose-heldout.jsonl" \
  "$out/data/hay_heldout.txt" <<'EOF' || { log "no haystack text"; exit 1; }
import json, sys
def dump(src, dst, limit):
    n = 0
    with open(src) as f, open(dst, "w") as w:
        for line in f:
            t = json.loads(line)["text"]
            w.write(t + "\n")
            n += len(t)
            if limit and n >= limit:
                break
    return n
n1 = dump(sys.argv[1], sys.argv[2], float(sys.argv[3]) * 1e6)
n2 = dump(sys.argv[4], sys.argv[5], 0)
print(f"haystacks: {n1} characters of training prose, {n2} held out")
EOF
log "haystacks written"

# The corpus shards as a --data blend: prose and code by prose_share, each corpus's shards by their tokens.
blend() {  # blend SPLIT [EXTRA_FILE:WEIGHT]: the --data list
  python3 - "$corpus" "$1" "$prose_share" "${2:-}" <<'EOF'
import json, os, sys
corpus, split, prose, extra = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
rest = 1.0
if extra:
    rest -= float(extra.rsplit(":", 1)[1])
parts = []
for cat, share in (("prose", prose), ("code", 1 - prose)):
    d = os.path.join(corpus, "tokens", f"{cat}-{split}")
    if not os.path.exists(os.path.join(d, "manifest.json")):
        continue
    m = json.load(open(os.path.join(d, "manifest.json")))
    total = sum(m["tokens"])
    for shard, n in zip(m["shards"], m["tokens"]):
        path = shard if os.path.isabs(shard) else os.path.join(d, os.path.basename(shard))
        parts.append(f"{path}:{rest * share * n / total:.6f}")
print(",".join(parts + ([extra] if extra else [])))
EOF
}
lm_data=$(blend train) || exit 1
heldout_prose=$(python3 -c "import json,os,sys; d=sys.argv[1]; m=json.load(open(d+'/manifest.json')); print(os.path.join(d, os.path.basename(m['shards'][0])))" "$corpus/tokens/prose-heldout")
heldout_code=$(python3 -c "import json,os,sys; d=sys.argv[1]; m=json.load(open(d+'/manifest.json')); print(os.path.join(d, os.path.basename(m['shards'][0])))" "$corpus/tokens/code-heldout" 2>/dev/null)

# ---- the retrieval sets (CPU, in the background while phase 1 trains) ------------------------------
build_sets() {
  local pids=() t
  for t in ${tasks//,/ }; do
    step "set-train-$t" python3 "$root/cluster/niah/build_niah_set.py" --tokenizer "$tok" --haystack "$out/data/hay_train.txt" \
      --vary-haystack --task "$t" --lengths "$len" --depths "$depths" --samples "$train_samples" --seed "$((seed * 100 + 1))" \
      "${knobs[@]}" --out "$out/data/train-$t.h5" &
    pids+=($!)
    step "set-eval-$t" python3 "$root/cluster/niah/build_niah_set.py" --tokenizer "$tok" --haystack "$out/data/hay_heldout.txt" \
      --vary-haystack --task "$t" --lengths "$len" --depths "$depths" --samples "$eval_samples" --seed 1000 \
      "${knobs[@]}" --out "$out/data/eval-$t.h5" &
    pids+=($!)
  done
  step set-calib python3 "$root/cluster/niah/build_niah_set.py" --tokenizer "$tok" --haystack "$out/data/hay_heldout.txt" \
    --vary-haystack --calibration --task single --lengths "$calib_len" --depths 50 --samples "$calib_samples" --seed 2000 \
    --out "$out/data/calib.h5" &
  pids+=($!)
  local rc=0 p
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  ((rc == 0)) || return 1
  step set-to-train python3 "$root/cluster/niah/set_to_train.py" --seq-len "$len" --seed "$seed" --out "$out/data/retrieval.h5" \
    $(for t in ${tasks//,/ }; do echo "$out/data/train-$t.h5"; done)
}

# ---- steps from a probe: a few steps of the run, median step time, budget / step time -------------
probe_steps() {  # probe_steps NAME DATA MODEL SECONDS -> steps
  local name="$1" data="$2" model="$3" seconds="$4"
  step "probe-$name" "$hydra" train --stage pretrain --model "$model" --data "$data" --seq-len "$len" --steps "$probe_steps" \
    --batch-seqs "$batch" --lr "$lr" --save-every -1 --out-dir "$out/runs/probe-$name" --device "$device" >/dev/null 2>&1
  python3 - "$out/runs/probe-$name/train.jsonl" "$seconds" <<'EOF'
import json, statistics, sys
t = [json.loads(l)["step_s"] for l in open(sys.argv[1]) if l.strip() and json.loads(l).get("type") == "step" and json.loads(l)["step"] > 2]
print(max(1, int(float(sys.argv[2]) / statistics.median(t))) if t else 1)
EOF
}

# ---- 2. phase 1: language alone --------------------------------------------------------------------
step init "$hydra" init --preset "$preset" --weight-seed "$seed" --out "$out/data/init.h5" || exit 1
build_sets > /dev/null &
sets_pid=$!
if ((probe_steps > 0)); then
  steps_lm=$(probe_steps lm "$lm_data" "$out/data/init.h5" "$(python3 -c "print($train_s * $lm_share)")") || exit 1
fi
log "phase 1: $steps_lm steps of language (${preset}, ${len} tokens x ${batch})"
step train-lm "$hydra" train --stage pretrain --model "$out/data/init.h5" --data "$lm_data" --seq-len "$len" --steps "$steps_lm" \
  --batch-seqs "$batch" --lr "$lr" --min-lr "$lr" --warmup "$(( steps_lm / 20 ))" --seed "$seed" --save-every 0 \
  --out-dir "$out/runs/lm" --device "$device" || exit 1
wait "$sets_pid" || { log "the retrieval sets failed (logs/set-*.log)"; exit 1; }

# ---- 3. phase 2: language + retrieval --------------------------------------------------------------
mix_data=$(blend train "$out/data/retrieval.h5:$retrieval_share") || exit 1
phase1=$(final_model "$out/runs/lm")
if ((probe_steps > 0)); then
  steps_mix=$(probe_steps mix "$mix_data" "$phase1" "$(python3 -c "print($train_s * (1 - $lm_share))")") || exit 1
fi
log "phase 2: $steps_mix steps of language + retrieval ($retrieval_share of the windows)"
step train-mix "$hydra" train --stage pretrain --model "$phase1" --data "$mix_data" --seq-len "$len" --steps "$steps_mix" \
  --batch-seqs "$batch" --lr "$lr" --min-lr "$min_lr" --warmup 0 --seed "$((seed + 1000))" --save-every 0 \
  --out-dir "$out/runs/mix" --device "$device" || exit 1
cp "$(final_model "$out/runs/mix")" "$out/teacher.h5" || exit 1

# ---- 4. evaluation ----------------------------------------------------------------------------------
step eval-lm-prose "$hydra" eval-lm --model "$out/teacher.h5" --data "$heldout_prose" --seq-len "$len" --windows "$lm_windows" \
  --device "$device" --out "$out/evals/lm-prose.json"
[[ -n "$heldout_code" ]] && step eval-lm-code "$hydra" eval-lm --model "$out/teacher.h5" --data "$heldout_code" --seq-len "$len" \
  --windows "$lm_windows" --device "$device" --out "$out/evals/lm-code.json"
for t in ${tasks//,/ }; do
  step "eval-niah-$t" "$hydra" eval-niah --model "$out/teacher.h5" --dataset "$out/data/eval-$t.h5" --score generate \
    --device "$device" --out "$out/evals/niah-$t.jsonl"
done
select=(select-heads --model "$out/teacher.h5" --budget "$select_budget" --per-layer --calib "$out/data/calib.h5" --lm-text "$heldout_prose"
        --lm-length "$calib_len" --lm-samples 1 --device cpu --out "$out/heads.json")
if ((select_ranks > 1)); then
  step select-heads mpirun --oversubscribe -np "$select_ranks" "$hydra" "${select[@]}"
else
  step select-heads "$hydra" "${select[@]}"
fi

# ---- 5. the report ----------------------------------------------------------------------------------
python3 "$root/cluster/corpus/teacher_report.py" "$out" --tasks "$tasks" --train-len "$len" --seconds "$(( $(date +%s) - T0 ))"
