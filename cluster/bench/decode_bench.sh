#!/usr/bin/env bash
# The decode benchmark as one device job on one H200 (about 3 minutes):
#   1. hydra bench --op decode for hydrahead-1.7b and qwen3-1.7b (random weights, random caches: no
#      prefill) at 32K, 128K, 512K and 1M cached tokens, batches 1, 8 and 32, the step replayed as a
#      CUDA graph (bench's default; cluster/bench/decode_job.jobs compares it with eager and PDL):
#      ms per step (= per generated token at batch 1), tokens/s, cache bytes per token and in all,
#      peak memory, GB/s beside a device copy and the card's datasheet; one layer's decode attention
#      and GDN step alone. Cells whose cache does
#      not fit the GPU are skipped with a line saying so (the teacher's 1M cache alone is 120 GB: it
#      fits at batch 1 only);
#   2. the PyTorch anchors of one layer (cluster/bench/decode_anchor.py): SDPA over the same caches,
#      flash-linear-attention's fused_recurrent_gated_delta_rule step (if importable) and an eager step;
#   3. hydra generate end to end on the GPU (hydrahead-1.7b, a 32K-token prompt from hydra synth, 64
#      new tokens): the sequence-parallel prefill path filling the bf16 cache, then decode; its JSON lines;
#   4. the table (cluster/bench/decode_table.py): our figures beside the anchors, and the decode
#      targets of issue 57 (≥ 0.70 of the card's bandwidth at 32K and 512K batch 1, the hybrid ≥ 5×
#      the teacher at 512K).
#
#   cluster/bench/decode_bench.sh BIN_DIR OUT_DIR
#
# BIN_DIR holds hydra (a CUDA build). PYTHON (default python3) runs the anchors; without torch the
# anchor step says so and the table shows our figures alone. Every step has a time limit and its
# own log in OUT_DIR. CONTEXTS / BATCHES override the cells (e.g. CONTEXTS=32K,512K for a quick run).
set -uo pipefail
bin=$(cd "$1" && pwd); out=$2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$out"
py=${PYTHON:-python3}
contexts=${CONTEXTS:-32K,128K,512K,1M}
batches=${BATCHES:-1,8,32}
export PYTHONUNBUFFERED=1
status="$out/status.txt"; : > "$status"
echo "== $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"

step() {  # NAME LIMIT_S LOG command...
  local name=$1 limit=$2 log=$3; shift 3
  local t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$status"
  return $rc
}

: > "$out/decode.jsonl"
for model in hydrahead-1.7b qwen3-1.7b; do
  step "hydra bench decode $model" 120 "$out/bench_$model.log" \
    "$bin/hydra" bench --op decode --preset "$model" --contexts "$contexts" --batches "$batches" \
    --warmup 3 --repeat 10 --json-out "$out/decode.jsonl"
  grep -E "check|ceiling|decode .* (skipped|ms per step)" "$out/bench_$model.log" | sed 's/^/  /'
done

step "anchors" 90 "$out/anchors.log" "$py" "$root/cluster/bench/decode_anchor.py" --contexts "$contexts" --batches "$batches"
grep '^{' "$out/anchors.log" > "$out/anchors.jsonl" || true
grep -v '^{' "$out/anchors.log" | tail -3 | sed 's/^/  /'

if step "synth prompt" 60 "$out/synth.log" "$bin/hydra" synth --task lm --tokens 32768 --seq-len 32768 \
     --vocab 151936 --seed 1 --out "$out/prompt32k.h5"; then
  step "hydra generate hydrahead-1.7b 32K" 60 "$out/generate.log" "$bin/hydra" generate --preset hydrahead-1.7b \
    --prompt "$out/prompt32k.h5" --max-new-tokens 64 --device cuda --out "$out/generate.jsonl" \
    && sed 's/^/  /' "$out/generate.jsonl"
fi

"$py" "$root/cluster/bench/decode_table.py" "$out/decode.jsonl" "$out/anchors.jsonl" | tee "$out/table.md"
