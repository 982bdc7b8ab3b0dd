#!/usr/bin/env bash
# The HydraHead pipeline end to end on a teacher trained here (or given), every step a `hydra`
# command: synthetic data (hydra synth) -> pretrain a Qwen3-shaped teacher (hydra train --stage
# pretrain) -> select-heads -> convert -> align -> distill -> long-context finetune -> eval-niah and
# eval-lm, for the students of an experiment plan (--plan-file, cluster/synth/plan.py says the
# format), all with equal token budgets per stage. The default plan (cluster/synth/plans/default.json):
#   selected   7:1 head-wise, the heads select-heads chose (--budget 1 --per-layer; select_budget)
#   random     7:1 head-wise, one random head per layer (--fa-heads random:1)
#   layerwise  3:1 layer-wise (--fa-heads layerwise:4)
#   gdn        all-GDN (--fa-heads uniform:0)
#   allfa      every head full attention, converted and trained through the same stages
# The teacher and every student are evaluated on NIAH (eval_tasks, default single/multikey/multivalue)
# at eval_mults times the training length and depths, and on the held-out language-model loss. A
# student with curves (the plan's default) is also scored after conversion and at every quarter of
# every stage: NIAH at the stage's training length (hydra train --eval-niah, curve_tasks,
# curve_samples, in train/NAME-STAGE.jsonl) and the LM loss of each quarter's checkpoint
# (curves/NAME-STAGE-STEP.lm.json). cluster/synth/report.py turns the results folder into tables,
# plots and claims with paired statistics.
#
#   cluster/synth/pipeline.sh --profile gpu --out /tmp/synth --archive $OUT/synth-results.tar.gz
#   cluster/synth/pipeline.sh --profile cpu --out /tmp/synth-cpu        # the 2-core CPU, ~45 min
#   cluster/synth/pipeline.sh --profile toy --out /tmp/synth-toy        # CTest: minutes, no accuracy
#   cluster/synth/pipeline.sh --profile gpu --teacher T.h5 --plan-file cluster/synth/plans/ablation_call1.json ...
#
# Profiles fix the model, lengths, data and budgets (printed into results/plan.json):
#   gpu  qwen3-synth (4.2M parameters, d = 64), training length 256, finetune 1024, on one GPU.
#        Stage budgets are in SECONDS of wall time and become step counts from probes: before the
#        real run, each kind of step (teacher pretrain; the four students' align, distill and
#        finetune, --jobs at a time as in the real run) runs a few steps and the median step time
#        turns the budget into --steps. Every student gets the same steps per stage (the slowest
#        probe's), so token budgets are equal. A deadline (--deadline-s) bounds every command.
#   cpu  qwen3-synth-cpu (0.9M parameters, d = 16), length 128, fixed steps, one student at a time.
#   toy  qwen3-synth-cpu at length 64 and a few steps: the pipeline itself, for CI.
# The gpu and cpu profiles write answer masks (hydra synth --loss answers): a retrieval document's
# loss is its answers, a language document's every target (without them the teacher never learned
# to retrieve: cluster/results/cpu-2026-12-07). --set synth_extra= turns that off.
#
# Output: OUT/work (data, checkpoints; not archived) and OUT/results: plan.json, commands.sh (every
# command as run), timings.jsonl (wall seconds and exit code per step: the device time each took),
# logs/, train/ (train.jsonl of every stage), evals/, curves/, models/ (hydra info of every model),
# heads.*, head_sets/, plan_file.json and students.tsv (the plan as given and as expanded), and what
# report.py writes. A failed or timed-out step is recorded and the rest goes on (a later
# step that needs its output fails in turn); the report and the archive are always written.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
profile=gpu
out=""
archive=""
hydra="${HYDRA:-$root/build/bin/hydra}"
device=""
jobs=""
deadline_s=""
teacher_in=""
heads_in=""
plan_override=""
plan_file="$root/cluster/synth/plans/default.json"
overrides=()
usage() {
  sed -n '2,43p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  echo "flags: --profile gpu|cpu|toy --out DIR [--archive FILE.tar.gz] [--hydra BIN] [--device cuda|cpu]"
  echo "       [--jobs N (students side by side)] [--deadline-s S (0: none)] [--teacher FILE.h5 (skip pretraining)]"
  echo "       [--plan probe|fixed (override the profile's: probe turns its second budgets into steps)]"
  echo "       [--heads HEADS.json (select-heads' output for this --teacher: skip head selection)]"
  echo "       [--plan-file PLAN.json (the students; default cluster/synth/plans/default.json; see cluster/synth/plan.py)]"
  echo "       [--set NAME=VALUE ... (override a profile setting, e.g. --set budget_pretrain=300 --set mix=lm:0.5,mqar:0.5)]"
}
while (($#)); do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --archive) archive="$2"; shift 2 ;;
    --hydra) hydra="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --deadline-s) deadline_s="$2"; shift 2 ;;
    --teacher) teacher_in="$2"; shift 2 ;;
    --heads) heads_in="$2"; shift 2 ;;
    --plan) plan_override="$2"; shift 2 ;;
    --plan-file) plan_file="$2"; shift 2 ;;
    --set) overrides+=("$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "pipeline.sh: unknown flag $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ -n "$out" ]] || { echo "pipeline.sh: --out DIR is required" >&2; exit 2; }
[[ -x "$hydra" ]] || { echo "pipeline.sh: $hydra is not an executable (build first, or pass --hydra)" >&2; exit 2; }
[[ -z "$teacher_in" || -r "$teacher_in" ]] || { echo "pipeline.sh: --teacher $teacher_in is not readable" >&2; exit 2; }
[[ -z "$heads_in" || ( -r "$heads_in" && -n "$teacher_in" ) ]] || { echo "pipeline.sh: --heads $heads_in must be a readable file, with --teacher (the model it scored)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "pipeline.sh: python3 is needed (standard library only)" >&2; exit 2; }
plan_py="$root/cluster/synth/plan.py"
[[ -r "$plan_file" ]] || { echo "pipeline.sh: --plan-file $plan_file is not readable" >&2; exit 2; }
python3 "$plan_py" check "$plan_file" || exit 2

# ---- profiles --------------------------------------------------------------------------------
mix="lm:0.3,mqar:0.4,single:0.1,multikey:0.1,multivalue:0.1"  # gpu: more retrieval, below
eval_seed=1000          # eval-niah's samples; training NIAH documents use a seed derived from synth's
synth_extra=""          # more hydra synth flags for every stream, e.g. "--recall-tokens 128 --loss answers"
eval_tasks=single,multikey,multivalue   # eval-niah's tasks for the final evaluation
curve_tasks=single,multikey             # NIAH tasks of the stage curves (hydra train --eval-niah)
curve_samples=16                        # their samples per task and evaluation
select_ranks=1                          # select-heads' CPU ranks (mpirun -np N when > 1: its head jobs are dealt over the ranks)
select_budget=1                         # select-heads --budget (FA heads per layer of `selected`; 2 of 16 heads is 7:1)
data_dir=""                             # a teacher of real text: the stage data and NIAH sets of cluster/corpus/stage_data.py
case "$profile" in
  gpu)
    preset=qwen3-synth; vocab=512; len=256; ft_len=1024; pairs=10
    mix="lm:0.2,mqar:0.5,single:0.1,multikey:0.1,multivalue:0.1"
    synth_extra="--loss answers"   # retrieval documents count their answers only (cluster/results/cpu-2026-12-07)
    train_tokens=32M; ft_tokens=8M; batch=16; ft_batch=4
    plan_mode=probe; budget_pretrain=240; budget_align=15; budget_distill=30; budget_finetune=20
    lr_pretrain=2e-3; lr_align=2e-3; lr_distill=5e-4; lr_finetune=2e-4
    eval_mults="1 4 16 64"; depths=0,25,50,75,100; samples=4; lm_windows=64
    calib_samples=8; lm_samples=2; select_ranks=8   # the GPU machine has 16 CPU cores
    : "${device:=cuda}"; : "${jobs:=4}"; : "${deadline_s:=540}" ;;
  cpu)
    preset=qwen3-synth-cpu; vocab=256; len=128; ft_len=512; pairs=6
    synth_extra="--loss answers"
    train_tokens=4M; ft_tokens=2M; batch=8; ft_batch=2
    plan_mode=fixed; steps_pretrain=1500; steps_align=60; steps_distill=60; steps_finetune=30
    budget_pretrain=900; budget_align=60; budget_distill=120; budget_finetune=60           # --plan probe
    lr_pretrain=2e-3; lr_align=2e-3; lr_distill=5e-4; lr_finetune=2e-4
    eval_mults="1 4 16 64"; depths=0,50,100; samples=2; lm_windows=32
    calib_samples=4; lm_samples=2
    : "${device:=cpu}"; : "${jobs:=1}"; : "${deadline_s:=0}" ;;
  toy)
    preset=qwen3-synth-cpu; vocab=256; len=64; ft_len=128; pairs=3
    train_tokens=64K; ft_tokens=32K; batch=2; ft_batch=1
    plan_mode=fixed; steps_pretrain=4; steps_align=2; steps_distill=2; steps_finetune=2
    budget_pretrain=3; budget_align=2; budget_distill=2; budget_finetune=2   # --plan probe (CTest)
    lr_pretrain=2e-3; lr_align=2e-3; lr_distill=5e-4; lr_finetune=2e-4
    eval_mults="1 4"; depths=0,100; samples=1; lm_windows=2
    calib_samples=2; lm_samples=1; curve_samples=2
    : "${device:=cpu}"; : "${jobs:=1}"; : "${deadline_s:=0}" ;;
  *) echo "pipeline.sh: --profile must be gpu, cpu or toy (got $profile)" >&2; exit 2 ;;
esac
settings="synth_extra preset vocab len ft_len pairs train_tokens ft_tokens batch ft_batch mix eval_seed eval_mults depths samples
  lm_windows calib_samples lm_samples budget_pretrain budget_align budget_distill budget_finetune steps_pretrain steps_align
  steps_distill steps_finetune lr_pretrain lr_align lr_distill lr_finetune eval_tasks curve_tasks curve_samples select_ranks
  select_budget data_dir"
# The plan's settings first, then --set: the command line wins.
mapfile -t plan_settings < <(python3 "$plan_py" settings "$plan_file")
overrides=("${plan_settings[@]}" "${overrides[@]}")
for o in "${overrides[@]}"; do
  name="${o%%=*}"
  [[ "$o" == *=* && " $(echo $settings) " == *" $name "* ]] || { echo "pipeline.sh: --set $o: not NAME=VALUE with NAME one of: $(echo $settings)" >&2; exit 2; }
  printf -v "$name" '%s' "${o#*=}"
done
if [[ -n "$plan_override" ]]; then
  [[ "$plan_override" == probe || "$plan_override" == fixed ]] || { echo "pipeline.sh: --plan must be probe or fixed" >&2; exit 2; }
  [[ "$plan_override" == fixed && "$profile" == gpu && ( -z "${steps_align:-}" || -z "${steps_distill:-}" || -z "${steps_finetune:-}" ) ]] &&
    { echo "pipeline.sh: the gpu profile has no fixed steps: give them (--set steps_align=N --set steps_distill=N --set steps_finetune=N)" >&2; exit 2; }
  [[ "$plan_override" == fixed && -z "$teacher_in" && -z "${steps_pretrain:-}" ]] &&
    { echo "pipeline.sh: --plan fixed without --teacher needs --set steps_pretrain=N" >&2; exit 2; }
  plan_mode="$plan_override"
fi
lengths=""
n_depths=$(echo "$depths" | tr ',' '\n' | grep -c .)
for m in $eval_mults; do lengths="${lengths:+$lengths,}$((len * m))"; done

work="$out/work"
res="$out/results"
mkdir -p "$work/data" "$work/runs" "$work/models" "$work/evals" "$res/logs" "$res/train" "$res/evals" "$res/models" "$res/curves" || exit 2
: > "$res/timings.jsonl"
printf '#!/usr/bin/env bash\n# Every command of this run, in the order started (concurrent steps interleave).\n' > "$res/commands.sh"
start_epoch=$(date +%s.%N)
deadline_at=0
if [[ "$deadline_s" != 0 ]]; then deadline_at=$(python3 -c "print($start_epoch + $deadline_s)"); fi

# run_step NAME CMD...: runs CMD with its output in logs/NAME.log, bounded by the deadline; appends
# {"step", "seconds", "rc", "start_s"} to timings.jsonl (one short line per write: O_APPEND keeps
# concurrent writers' lines whole). Returns CMD's exit status (124: timed out or skipped).
run_step() {
  local name="$1"; shift
  local t0 left rc
  t0=$(date +%s.%N)
  printf '%q ' "$@" >> "$res/commands.sh"; printf '\n' >> "$res/commands.sh"
  if [[ "$deadline_at" != 0 ]]; then
    left=$(python3 -c "print(int($deadline_at - $t0))")
    if ((left < 5)); then
      echo "{\"step\":\"$name\",\"seconds\":0,\"rc\":124,\"skipped\":true}" >> "$res/timings.jsonl"
      echo "[pipeline] $name: skipped (deadline)" | tee -a "$res/logs/pipeline.log"
      return 124
    fi
    timeout "$left" "$@" > "$res/logs/$name.log" 2>&1; rc=$?
  else
    "$@" > "$res/logs/$name.log" 2>&1; rc=$?
  fi
  local t1 sec
  t1=$(date +%s.%N)
  sec=$(python3 -c "print(round($t1 - $t0, 3))")
  echo "{\"step\":\"$name\",\"seconds\":$sec,\"rc\":$rc,\"start_s\":$(python3 -c "print(round($t0 - $start_epoch, 3))")}" >> "$res/timings.jsonl"
  echo "[pipeline] $name: rc $rc, $sec s" | tee -a "$res/logs/pipeline.log"
  return $rc
}

# The model a training run ended with (its latest checkpoint).
final_model() { local d="$1"; [[ -r "$d/latest" ]] && echo "$d/$(cat "$d/latest")/model.h5"; }

# Median step time (s) of a probe run's steps after the first two (warm-up); nan if it failed.
probe_step_s() {
  python3 - "$1/train.jsonl" <<'EOF'
import json, os, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()] if os.path.exists(sys.argv[1]) else []
t = [s["step_s"] for s in steps if s.get("type") == "step" and s["step"] > 2]
print(statistics.median(t) if t else "nan")
EOF
}
# The largest of its arguments that is a number (nan if none).
max_finite() { python3 -c "import math,sys; v=[float(x) for x in sys.argv[1:] if math.isfinite(float(x))]; print(max(v) if v else 'nan')" "$@"; }

echo "[pipeline] profile $profile on $device: $preset, training length $len, finetune $ft_len, NIAH at $lengths" \
  | tee "$res/logs/pipeline.log"

# ---- data ------------------------------------------------------------------------------------
d="$work/data"
if [[ -n "$data_dir" ]]; then
  # A teacher of real text: its stage data and NIAH sets were made by cluster/corpus/stage_data.py
  # (corpus shards with real-text retrieval samples), at this run's lengths.
  d="$data_dir"
  for f in train.h5 heldout_mix.h5 heldout_lm.h5 finetune.h5 calib.h5 lmtext.h5 niah/calib.h5 \
           $(for t in ${eval_tasks//,/ }; do for n in ${lengths//,/ }; do echo "niah/$t-$n.h5"; done; done); do
    [[ -r "$d/$f" ]] || { echo "pipeline.sh: data_dir $d has no $f (cluster/corpus/stage_data.py makes it)" >&2; exit 2; }
  done
  [[ -n "$teacher_in" ]] || { echo "pipeline.sh: data_dir needs --teacher (the text teacher)" >&2; exit 2; }
  curve_tasks=""  # hydra train --eval-niah knows token-space tasks only
else
synth_common=(--vocab "$vocab" --mqar-pairs "$pairs")
# shellcheck disable=SC2206  # synth_extra is a list of flags, split on spaces
synth_common+=($synth_extra)
run_step synth-train "$hydra" synth --task "$mix" --tokens "$train_tokens" --seq-len "$len" --seed 1 --out "$d/train.h5" "${synth_common[@]}"
run_step synth-heldout "$hydra" synth --task "$mix" --tokens $((len * 64)) --seq-len "$len" --seed 2 --out "$d/heldout_mix.h5" "${synth_common[@]}"
run_step synth-heldout-lm "$hydra" synth --task lm --tokens $((len * (lm_windows + 1))) --seq-len "$len" --seed 3 --out "$d/heldout_lm.h5" "${synth_common[@]}"
run_step synth-finetune "$hydra" synth --task "$mix" --tokens "$ft_tokens" --seq-len "$ft_len" --seed 4 --out "$d/finetune.h5" "${synth_common[@]}"
run_step synth-calib "$hydra" synth --task "$mix" --tokens $((len * 8)) --seq-len "$len" --seed 5 --out "$d/calib.h5" "${synth_common[@]}"
run_step synth-lmtext "$hydra" synth --task lm --tokens $((len * 8)) --seq-len "$len" --seed 6 --out "$d/lmtext.h5" "${synth_common[@]}"
fi
if [[ -z "$teacher_in" ]]; then
  run_step init-teacher "$hydra" init --preset "$preset" --weight-seed 0 --out "$work/models/teacher_init.h5"
fi

# ---- the plan's students, expanded for the teacher's shape (layers, heads) ------------------------
shape_of="${teacher_in:-$work/models/teacher_init.h5}"
read -r n_layers n_heads < <("$hydra" info "$shape_of" 2>/dev/null | sed -n 's/^ *qwen3: \([0-9]*\) layers, .*H=\([0-9]*\),.*/\1 \2/p')
[[ -n "${n_layers:-}" && -n "${n_heads:-}" ]] || { echo "pipeline.sh: cannot read the layer and head counts of $shape_of (hydra info)" >&2; exit 1; }
cp "$plan_file" "$res/plan_file.json"
python3 "$plan_py" students "$plan_file" --layers "$n_layers" --heads "$n_heads" --results "$res" > "$res/students.tsv" || exit 2
students=""
declare -A spec scores_of fusion_of seed_of curves_of stages_of
while IFS=$'\t' read -r s_name s_spec s_scores s_fusion s_seed s_curves s_stages; do
  students="$students $s_name"
  spec[$s_name]="$s_spec"; scores_of[$s_name]="$s_scores"; fusion_of[$s_name]="$s_fusion"
  seed_of[$s_name]="$s_seed"; curves_of[$s_name]="$s_curves"; stages_of[$s_name]="$s_stages"
done < "$res/students.tsv"
echo "[pipeline] plan $(basename "$plan_file"): $(wc -l < "$res/students.tsv") students" | tee -a "$res/logs/pipeline.log"
# hydra convert's flags for a student: the head set, its score file, a fusion other than the default.
convert_flags() {
  local s="$1" f=(--fa-heads "${spec[$s]}")
  [[ "${scores_of[$s]}" != - ]] && f+=(--scores "${scores_of[$s]}")
  [[ "${fusion_of[$s]}" != scale_norm ]] && f+=(--fusion "${fusion_of[$s]}")
  printf '%s\n' "${f[@]}"
}

# ---- plan: stage budgets in seconds -> steps (gpu), or fixed steps --------------------------------
if [[ "$plan_mode" == probe ]]; then
  pinit="$work/models/teacher_init.h5"
  [[ -n "$teacher_in" ]] && pinit="$teacher_in"
  if [[ -z "$teacher_in" ]]; then
    run_step probe-pretrain "$hydra" train --stage pretrain --model "$pinit" --data "$d/train.h5" --seq-len "$len" \
      --steps 6 --batch-seqs "$batch" --save-every -1 --out-dir "$work/runs/probe-pretrain" --device "$device"
    t_pretrain=$(probe_step_s "$work/runs/probe-pretrain")
  fi
  # Probes: the plan's first `jobs` students (head sets of the same size that need no select-heads
  # output), run `jobs` at a time, as the students will.
  probe_students=$(echo $students | tr ' ' '\n' | head -n "$jobs" | tr '\n' ' ')
  throttle() { while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done; }
  for s in $probe_students; do
    throttle
    pspec=$(python3 "$plan_py" probe-spec "${spec[$s]}" --heads "$n_heads")
    pflags=(--fa-heads "$pspec")
    [[ "${fusion_of[$s]}" != scale_norm ]] && pflags+=(--fusion "${fusion_of[$s]}")
    run_step "probe-convert-$s" "$hydra" convert --teacher "$pinit" "${pflags[@]}" --seed 1 \
      --out "$work/models/probe-$s.h5" &
  done
  wait
  declare -A t_stage
  for stage in align distill finetune; do
    for s in $probe_students; do
      throttle
      if [[ $stage == finetune ]]; then dd=("$d/finetune.h5" "$ft_len" "$ft_batch"); teach=(); else dd=("$d/train.h5" "$len" "$batch"); teach=(--teacher "$pinit"); fi
      run_step "probe-$stage-$s" "$hydra" train --stage "$stage" --model "$work/models/probe-$s.h5" "${teach[@]}" \
        --data "${dd[0]}" --seq-len "${dd[1]}" --steps 5 --batch-seqs "${dd[2]}" --save-every -1 \
        --out-dir "$work/runs/probe-$stage-$s" --device "$device" &
    done
    wait
    t_stage[$stage]=$(max_finite $(for s in $probe_students; do probe_step_s "$work/runs/probe-$stage-$s"; done))
  done
  # A budget over the probe's step time; 1 step where the probe failed (its log says why).
  steps_of() { python3 -c "import math,sys; t=float('$2'); print(max(1, int($1 / t)) if math.isfinite(t) and t > 0 else 1)"; }
  steps_pretrain=$(steps_of "$budget_pretrain" "${t_pretrain:-nan}")
  steps_align=$(steps_of "$budget_align" "${t_stage[align]}")
  steps_distill=$(steps_of "$budget_distill" "${t_stage[distill]}")
  steps_finetune=$(steps_of "$budget_finetune" "${t_stage[finetune]}")
  probe_json="{\"pretrain_step_s\":${t_pretrain:-null},\"align_step_s\":${t_stage[align]},\"distill_step_s\":${t_stage[distill]},\"finetune_step_s\":${t_stage[finetune]},\"budget_s\":{\"pretrain\":$budget_pretrain,\"align\":$budget_align,\"distill\":$budget_distill,\"finetune\":$budget_finetune}}"
  probe_json="${probe_json//nan/null}"
else
  probe_json=null
fi
# A given teacher is not pretrained here: no pretraining stage in the plan.
pretrain_json="{\"steps\": ${steps_pretrain:-0}, \"batch_seqs\": $batch, \"seq_len\": $len, \"lr\": $lr_pretrain, \"tokens\": $((${steps_pretrain:-0} * batch * len))}"
[[ -n "$teacher_in" ]] && pretrain_json=null
cat > "$res/plan.json" <<EOF
{"profile": "$profile", "device": "$device", "preset": "$preset", "vocab": $vocab, "mixture": "$mix", "synth_extra": "$synth_extra",
 "seq_len": $len, "finetune_seq_len": $ft_len, "mqar_pairs": $pairs, "eval_lengths": [$lengths],
 "depths": [$depths], "samples": $samples, "eval_seed": $eval_seed, "jobs": $jobs, "deadline_s": $deadline_s,
 "eval_tasks": "$eval_tasks", "curve_tasks": "$curve_tasks", "curve_samples": $curve_samples,
 "plan_file": "$(basename "$plan_file")", "students": [$(for s in $students; do printf '{"name":"%s","heads":"%s","fusion":"%s","seed":%s,"curves":%s,"stages":"%s"},' "$s" "${spec[$s]}" "${fusion_of[$s]}" "${seed_of[$s]}" "${curves_of[$s]}" "${stages_of[$s]}"; done | sed 's/,$//')],
 "select_budget": $select_budget, "data_dir": "$data_dir",
 "model_shape": {"layers": $n_layers, "heads": $n_heads},
 "teacher": "${teacher_in:-pretrained here}",
 "stages": {"pretrain": $pretrain_json,
            "align": {"steps": $steps_align, "batch_seqs": $batch, "seq_len": $len, "lr": $lr_align, "tokens": $((steps_align * batch * len))},
            "distill": {"steps": $steps_distill, "batch_seqs": $batch, "seq_len": $len, "lr": $lr_distill, "tokens": $((steps_distill * batch * len))},
            "finetune": {"steps": $steps_finetune, "batch_seqs": $ft_batch, "seq_len": $ft_len, "lr": $lr_finetune, "tokens": $((steps_finetune * ft_batch * ft_len))}},
 "probe": $probe_json}
EOF
echo "[pipeline] plan: pretrain $([[ -n "$teacher_in" ]] && echo "none (teacher given)" || echo "$steps_pretrain"), align $steps_align, distill $steps_distill, finetune $steps_finetune steps" \
  | tee -a "$res/logs/pipeline.log"

# ---- evaluation of one model: NIAH at every length, held-out LM loss, its config ----------------
evaluate() {
  local name="$1" model="$2"
  [[ -r "$model" ]] || { echo "[pipeline] $name: no model to evaluate" | tee -a "$res/logs/pipeline.log"; return 1; }
  "$hydra" info "$model" > "$res/models/$name.info.txt" 2>&1
  run_step "eval-lm-$name" "$hydra" eval-lm --model "$model" --data "$d/heldout_lm.h5" --seq-len "$len" \
    --windows "$lm_windows" --device "$device" --out "$res/evals/$name.lm.json"
  if [[ -n "$data_dir" ]]; then
    # Every task × length set in turn; their sample and cell lines joined into one file.
    local t n parts=()
    for t in ${eval_tasks//,/ }; do
      for n in ${lengths//,/ }; do
        run_step "eval-niah-$name-$t-$n" "$hydra" eval-niah --model "$model" --dataset "$d/niah/$t-$n.h5" --device "$device" \
          --out "$work/evals/$name-$t-$n.niah.jsonl" && parts+=("$work/evals/$name-$t-$n.niah.jsonl")
      done
    done
    ((${#parts[@]})) && cat "${parts[@]}" > "$res/evals/$name.niah.jsonl"
  else
    run_step "eval-niah-$name" "$hydra" eval-niah --model "$model" --task "$eval_tasks" --lengths "$lengths" \
      --depths "$depths" --samples "$samples" --seed "$eval_seed" --device "$device" --out "$res/evals/$name.niah.jsonl"
  fi
}

# A training stage; copies its train.jsonl into the results. SEED is the data order; CURVES true
# scores NIAH at the stage's length at every quarter (in train.jsonl) and keeps each quarter's
# checkpoint for its LM loss (curves/NAME-STAGE-STEP.lm.json).
train_stage() {
  local name="$1" stage="$2" model="$3" teacher="$4" data="$5" seq="$6" steps="$7" bs="$8" lr="$9" seed="${10:-0}" curves="${11:-false}"
  local dir="$work/runs/$name-$stage" teach=() save=() quarter=$(( steps / 4 > 0 ? steps / 4 : 1 )) keep=1 niah=()
  [[ "$teacher" != - ]] && teach=(--teacher "$teacher")
  # Pretraining saves along the way: if the deadline cuts it, the pipeline goes on from the last save.
  [[ "$stage" == pretrain ]] && save=(--save-every "$quarter")
  if [[ "$curves" == true ]]; then
    save=(--save-every "$quarter"); keep=8
    [[ -n "$curve_tasks" ]] && niah=(--eval-niah "$curve_tasks" --eval-niah-samples "$curve_samples")
  fi
  run_step "$stage-$name" "$hydra" train --stage "$stage" --model "$model" "${teach[@]}" --data "$data" \
    --eval-data "$d/heldout_mix.h5" --eval-windows 8 --eval-every "$quarter" "${niah[@]}" --seed "$seed" \
    --seq-len "$seq" --steps "$steps" --batch-seqs "$bs" --lr "$lr" "${save[@]}" --keep "$keep" --out-dir "$dir" --device "$device"
  local rc=$?
  [[ -r "$dir/train.jsonl" ]] && cp "$dir/train.jsonl" "$res/train/$name-$stage.jsonl"
  if [[ "$curves" == true ]]; then
    local c
    for c in "$dir"/step-*/model.h5; do
      [[ -r "$c" ]] || continue
      local step_name; step_name=$(basename "$(dirname "$c")")
      run_step "curve-lm-$name-$stage-$step_name" "$hydra" eval-lm --model "$c" --data "$d/heldout_lm.h5" --seq-len "$len" \
        --windows "$lm_windows" --device "$device" --out "$res/curves/$name-$stage-$step_name.lm.json"
    done
  fi
  return $rc
}

# ---- teacher ---------------------------------------------------------------------------------
if [[ -n "$teacher_in" ]]; then
  teacher="$teacher_in"
else
  train_stage teacher pretrain "$work/models/teacher_init.h5" - "$d/train.h5" "$len" "$steps_pretrain" "$batch" "$lr_pretrain"
  teacher="$(final_model "$work/runs/teacher-pretrain")"
fi
# With several jobs the teacher's evaluation runs beside head selection and the students (it
# counts as one of the jobs); with one, before them.
running=0
if ((jobs > 1)); then
  evaluate teacher "$teacher" &
  running=1
else
  evaluate teacher "$teacher"
fi

# ---- head selection ----------------------------------------------------------------------------
# Group patching (a whole layer; all heads of a layer but one) shows whether the retrieval heads are
# redundant; the concentration of the direct effect goes into heads.json either way.
if [[ -n "$heads_in" ]]; then
  cp "$heads_in" "$res/heads.json" && echo "[pipeline] select-heads: given ($heads_in)" | tee -a "$res/logs/pipeline.log"
else
  calib=(--calib-task single --calib-length "$len" --calib-samples "$calib_samples")
  [[ -n "$data_dir" ]] && calib=(--calib "$d/niah/calib.h5")
  select_args=(select-heads --model "$teacher" --budget "$select_budget" --per-layer "${calib[@]}"
    --lm-text "$d/lmtext.h5" --lm-length "$len" --lm-samples "$lm_samples" --seed 7 --group-patching --device cpu
    --out "$res/heads.json")
  # On several CPU ranks when asked (the scores do not depend on the rank count); one rank if that fails.
  if ((select_ranks > 1)) && command -v mpirun > /dev/null; then
    run_step select-heads mpirun --oversubscribe -np "$select_ranks" "$hydra" "${select_args[@]}" ||
      run_step select-heads-1rank "$hydra" "${select_args[@]}"
  else
    run_step select-heads "$hydra" "${select_args[@]}"
  fi
fi

# ---- students ----------------------------------------------------------------------------------
student_chain() {
  local s="$1" m="$work/models/student-$s.h5" seed="${seed_of[$1]}" curves="${curves_of[$1]}" flags
  local stages=",${stages_of[$1]},"
  if [[ "${spec[$s]}" == teacher ]]; then
    # The fair all-FA arm: the teacher, unconverted, through the finetune stage only.
    m="$teacher"
  else
    # Head sets named by rank (same-layer:N, other-layer:N) become files now that heads.json exists.
    spec[$s]=$(python3 "$plan_py" resolve "${spec[$s]}" --results "$res") || return
    mapfile -t flags < <(convert_flags "$s")
    run_step "convert-$s" "$hydra" convert --teacher "$teacher" "${flags[@]}" --calib "$d/calib.h5" --seed "$seed" --out "$m" || return
  fi
  if [[ "$curves" == true ]]; then
    # The curves' first point: the converted student before any training.
    run_step "curve-lm-$s-convert" "$hydra" eval-lm --model "$m" --data "$d/heldout_lm.h5" --seq-len "$len" \
      --windows "$lm_windows" --device "$device" --out "$res/curves/$s-convert.lm.json"
    [[ -n "$curve_tasks" ]] && run_step "curve-niah-$s-convert" "$hydra" eval-niah --model "$m" --task "$curve_tasks" --lengths "$len" \
      --depths "$depths" --samples "$(( (curve_samples + n_depths - 1) / n_depths ))" --seed "$eval_seed" --device "$device" --out "$res/curves/$s-convert.niah.jsonl"
  fi
  # The stages the plan gives this student, each from the model the one before ended with (a stage
  # ablation skips one; the teacher arm runs finetune alone).
  if [[ "$stages" == *,align,* ]]; then
    train_stage "$s" align "$m" "$teacher" "$d/train.h5" "$len" "$steps_align" "$batch" "$lr_align" "$seed" "$curves" || return
    m="$(final_model "$work/runs/$s-align")"
  fi
  if [[ "$stages" == *,distill,* ]]; then
    train_stage "$s" distill "$m" "$teacher" "$d/train.h5" "$len" "$steps_distill" "$batch" "$lr_distill" "$seed" "$curves" || return
    m="$(final_model "$work/runs/$s-distill")"
  fi
  if [[ "$stages" == *,finetune,* ]]; then
    train_stage "$s" finetune "$m" - "$d/finetune.h5" "$ft_len" "$steps_finetune" "$ft_batch" "$lr_finetune" "$seed" "$curves" || return
    m="$(final_model "$work/runs/$s-finetune")"
  fi
  evaluate "$s" "$m"
}
for s in $students; do
  student_chain "$s" &
  running=$((running + 1))
  if ((running >= jobs)); then wait -n; running=$((running - 1)); fi
done
wait

# ---- report and archive ------------------------------------------------------------------------
total=$(python3 -c "import time; print(round(time.time() - $start_epoch, 1))")
echo "{\"step\":\"total\",\"seconds\":$total,\"rc\":0}" >> "$res/timings.jsonl"
echo "[pipeline] total $total s" | tee -a "$res/logs/pipeline.log"
python3 "$root/cluster/synth/report.py" "$res" 2>&1 | tee "$res/logs/report.log"
report_rc=${PIPESTATUS[0]}
if [[ -n "$archive" ]]; then
  tar -czf "$archive" -C "$out" results && echo "[pipeline] archive $archive ($(du -h "$archive" | cut -f1))"
fi
exit "$report_rc"
