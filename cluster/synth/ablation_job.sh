#!/usr/bin/env bash
# The ablation GPU job (the paper's ablations on a teacher that knows language and retrieves): two
# device calls of at most ~9.5 minutes, run through cluster/gpu_job.sh with
# cluster/synth/jobs/ablation_call1.jobs and ablation_call2.jobs.
#
#   call 1  trains the teacher (cluster/synth/plans/teacher.json: recall, then mqar, then mqar with
#           language and single/multikey/multivalue NIAH documents; its NIAH curve at the training
#           length every 100 steps), packs it into CARRY_OUT/teacher.h5.xz.* (parts under 15 MiB),
#           then runs plans/ablation_call1.json (E1, E3) through cluster/synth/pipeline.sh with
#           stage budgets in seconds turned into steps by probes, and writes those step counts to
#           CARRY_OUT/ablation_steps.env and select-heads' output (with group patching) to CARRY_OUT/heads.json.
#   call 2  unpacks the teacher and the step counts from CARRY_IN (what call 1 left in $OUT, carried
#           back as .device/), and runs plans/ablation_call2.json (F, L, E2) with the same steps and
#           head scores (no second select-heads), so every student of both calls has the same token budget.
# Both: the pipeline's results (tables, evaluations with every sample, curves, logs, commands) go to
# RESULTS/callN/, which gpu_job.sh tars into $OUT. A command past the deadline is skipped and
# recorded; the results are written either way.
#
#   bash cluster/synth/ablation_job.sh --call 1 --results DIR [--profile gpu|toy] [--hydra BIN] [--device cuda|cpu]
#        [--carry-in DIR (default .device)] [--carry-out DIR (default $OUT)] [--deadline-s S (default 540)]
#        [--plan1 FILE] [--plan2 FILE] [--jobs N] [--test-cuda BIN (run beside the teacher)]
# After both calls: cluster/synth/merge_results.py OUT r1/call1 r2/call2 && cluster/synth/report.py OUT.
# The toy profile (qwen3-synth-cpu, a few steps) is the same job on the CPU: CTest synth_ablation_job.toy.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
call="" results="" profile=gpu hydra="${H:-$root/build/bin/hydra}" device="" carry_in=.device carry_out="${OUT:-}"
deadline_s=540 plan1="$root/cluster/synth/plans/ablation_call1.json" plan2="$root/cluster/synth/plans/ablation_call2.json"
jobs="" test_cuda="" toy_sets=()
usage() { sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --call) call="$2"; shift 2 ;;
    --results) results="$2"; shift 2 ;;
    --profile) profile="$2"; shift 2 ;;
    --hydra) hydra="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --carry-in) carry_in="$2"; shift 2 ;;
    --carry-out) carry_out="$2"; shift 2 ;;
    --deadline-s) deadline_s="$2"; shift 2 ;;
    --plan1) plan1="$2"; shift 2 ;;
    --plan2) plan2="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --test-cuda) test_cuda="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "ablation_job.sh: unknown flag $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$call" == 1 || "$call" == 2 ]] || { echo "ablation_job.sh: --call must be 1 or 2" >&2; exit 2; }
[[ -n "$results" ]] || { echo "ablation_job.sh: --results DIR is required" >&2; exit 2; }
[[ -n "$carry_out" ]] || { echo "ablation_job.sh: --carry-out DIR (or OUT) is required" >&2; exit 2; }
[[ "$deadline_s" =~ ^[0-9]+$ ]] || { echo "ablation_job.sh: --deadline-s takes seconds (got '$deadline_s')" >&2; exit 2; }
[[ -x "$hydra" ]] || { echo "ablation_job.sh: $hydra is not an executable (build first, or pass --hydra)" >&2; exit 2; }
case "$profile" in
  gpu) : "${device:=cuda}"; : "${jobs:=8}"
       teacher_flags=(--variants "$root/cluster/synth/plans/teacher.json" --preset qwen3-synth --vocab 512 --seq-len 256
                      --tokens 24M --eval-every 100 --niah-samples 32)
       teacher_s=200 ;;
  toy) : "${device:=cpu}"; : "${jobs:=2}"
       teacher_flags=(--variants "$root/cluster/synth/plans/teacher_toy.json" --preset qwen3-synth-cpu --vocab 256 --seq-len 64
                      --tokens 64K --eval-every 3 --niah-samples 2)
       teacher_s=120
       # The plans' settings are GPU-sized: the toy keeps its own lengths, samples and second budgets.
       toy_sets=(--set "eval_mults=1 4" --set depths=0,100 --set samples=1 --set curve_samples=2 --set pairs=3
                 --set budget_align=1 --set budget_distill=1 --set budget_finetune=1) ;;
  *) echo "ablation_job.sh: --profile must be gpu or toy (got $profile)" >&2; exit 2 ;;
esac
for p in "$plan1" "$plan2"; do python3 "$root/cluster/synth/plan.py" check "$p" || exit 2; done
mkdir -p "$results" "$carry_out" || exit 2
T0=$(date +%s)
left() { echo $(( deadline_s - ($(date +%s) - T0) )); }
el() { echo "[ablation $(( $(date +%s) - T0 )) s] $*" | tee -a "$results/ablation.log"; }
work=$(mktemp -d "${TMPDIR:-/tmp}/ablation.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [[ "$call" == 1 ]]; then
  # ---- the teacher, with the GPU tests beside it (they measure correctness, not speed) ----------
  if [[ -n "$test_cuda" ]]; then
    (timeout 240 "$test_cuda" > "$results/test_cuda.log" 2>&1; echo "test_cuda exit $?" >> "$results/test_cuda.log") &
  fi
  timeout "$teacher_s" python3 "$root/cluster/synth/teacher_probe.py" --hydra "$hydra" --out "$work/teacher" \
    "${teacher_flags[@]}" --niah-tasks single,multikey,multivalue --device "$device" --deadline-s $((teacher_s - 10)) \
    > "$results/teacher_table.txt" 2>&1
  el "teacher rc $?"; cat "$results/teacher_table.txt"
  mkdir -p "$results/teacher"
  cp "$work/teacher/probe.jsonl" "$work/teacher/commands.sh" "$results/teacher/" 2>/dev/null
  for r in "$work"/teacher/*/run*/train.jsonl; do
    [[ -f "$r" ]] && cp "$r" "$results/teacher/$(basename "$(dirname "$r")").jsonl"
  done
  teacher=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline()).get('final_model') or '')" \
            "$work/teacher/probe.jsonl" 2>/dev/null)
  [[ -n "$teacher" && -r "$teacher" && "$teacher" != "$work/teacher/init.h5" ]] || { el "no trained teacher"; wait; exit 1; }
  # The teacher for call 2: xz'd, in parts under 15 MiB (a file that comes back is at most 16 MiB).
  rm -f "$carry_out"/teacher.h5.xz.*
  xz -T0 -3 -c "$teacher" | split -b 15M - "$carry_out/teacher.h5.xz." || { el "packing the teacher failed"; exit 1; }
  sha256sum "$teacher" | cut -c1-64 > "$results/teacher/teacher.sha256"
  el "teacher $(basename "$(dirname "$(dirname "$teacher")")")/$(basename "$(dirname "$teacher")"): $(ls "$carry_out"/teacher.h5.xz.* | wc -l) part(s), sha256 $(cut -c1-16 "$results/teacher/teacher.sha256")"
  plan_file="$plan1" plan_flags=(--plan probe)
else
  # ---- call 2: call 1's teacher and step counts --------------------------------------------------
  ls "$carry_in"/teacher.h5.xz.* > /dev/null 2>&1 || { el "no teacher in $carry_in (teacher.h5.xz.* from call 1)"; exit 1; }
  [[ -r "$carry_in/ablation_steps.env" ]] || { el "no $carry_in/ablation_steps.env from call 1"; exit 1; }
  [[ -r "$carry_in/heads.json" ]] || { el "no $carry_in/heads.json from call 1"; exit 1; }
  teacher="$work/teacher.h5"
  cat "$carry_in"/teacher.h5.xz.* | xz -d > "$teacher" || { el "unpacking the teacher failed"; exit 1; }
  mkdir -p "$results/teacher"
  sha256sum "$teacher" | cut -c1-64 > "$results/teacher/teacher.sha256"
  el "teacher unpacked, sha256 $(cut -c1-16 "$results/teacher/teacher.sha256")"
  plan_file="$plan2" plan_flags=(--plan fixed --heads "$carry_in/heads.json")
  while IFS= read -r line; do
    [[ "$line" =~ ^steps_(align|distill|finetune)=[0-9]+$ ]] || { el "bad line in ablation_steps.env: $line"; exit 1; }
    plan_flags+=(--set "$line")
  done < "$carry_in/ablation_steps.env"
fi

# ---- the plan ---------------------------------------------------------------------------------------
# The pipeline's own deadline leaves 40 s for its report and this script's copies.
budget=$(( $(left) - 40 ))
((budget > 30)) || { el "only $(left) s left for the plan"; wait; exit 1; }
bash "$root/cluster/synth/pipeline.sh" --profile "$profile" --hydra "$hydra" --device "$device" --jobs "$jobs" \
  --teacher "$teacher" --plan-file "$plan_file" "${plan_flags[@]}" "${toy_sets[@]}" --deadline-s "$budget" --out "$work/pipeline" \
  > "$results/pipeline.log" 2>&1
rc=$?
el "pipeline rc $rc"; tail -5 "$results/pipeline.log"
rm -rf "$results/call$call"
cp -r "$work/pipeline/results" "$results/call$call"
# What comes back is one tarball of at most 16 MiB (gpu_job.sh tars $results): the eval-niah HDF5
# copies go (every sample is in the .niah.jsonl beside them), every command's log keeps its last 60
# lines (the full ones stay on the device), and if the tarball would still pass 14 MiB, the training
# logs keep every 10th step line (all evaluation lines stay). Each cut is written to ablation.log.
c="$results/call$call"
rm -f "$c"/evals/*.niah.h5 "$c"/curves/*.niah.h5
for f in "$c"/logs/*.log; do [[ -f "$f" ]] && tail -n 60 "$f" > "$f.tail" && mv "$f.tail" "$f"; done
size=$(tar -czf - -C "$results" . | wc -c)
if ((size > 14 * 1024 * 1024)); then
  for f in "$c"/train/*.jsonl; do
    python3 - "$f" <<'EOF2'
import json, sys
rows = [l for l in open(sys.argv[1]) if l.strip()]
keep = [l for l in rows if json.loads(l).get("type") != "step" or json.loads(l).get("step", 0) % 10 == 0]
open(sys.argv[1], "w").writelines(keep)
EOF2
  done
  el "results were $size bytes compressed: training logs thinned to every 10th step ($(tar -czf - -C "$results" . | wc -c) bytes now)"
fi
el "results: $(tar -czf - -C "$results" . | wc -c) bytes compressed"
if [[ "$call" == 1 ]]; then
  python3 - "$work/pipeline/results/plan.json" > "$carry_out/ablation_steps.env" <<'EOF' || { el "no step counts for call 2"; rc=1; }
import json, sys
stages = json.load(open(sys.argv[1]))["stages"]
for s in ("align", "distill", "finetune"):
    print(f"steps_{s}={stages[s]['steps']}")
EOF
  cp "$carry_out/ablation_steps.env" "$results/"
  cp "$work/pipeline/results/heads.json" "$carry_out/heads.json" || { el "no heads.json for call 2"; rc=1; }
fi
wait
el "done, rc $rc"
exit "$rc"
