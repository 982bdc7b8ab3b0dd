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
#   OUT=DIR bash cluster/bench/decode_bench.sh      # from the repository root, on the device machine
#
# A job of the GPU harness (cluster/gpu_job_lib.sh: the carried binaries or a build of hydra, each
# step under its time limit and the call's deadline, logs and $OUT/decode.tgz after every step).
# PYTHON (default python3) runs the anchors; without torch the anchor step says so and the table shows
# our figures alone. CONTEXTS / BATCHES override the cells (e.g. CONTEXTS=32K,512K for a quick run).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../gpu_job_lib.sh"
gpu_job_start decode "${DEADLINE:-585}" hydra || exit 1
py=${PYTHON:-python3}
contexts=${CONTEXTS:-32K,128K,512K,1M}
batches=${BATCHES:-1,8,32}

for model in hydrahead-1.7b qwen3-1.7b; do
  run_job "bench_$model" 120 "$H bench --op decode --preset $model --contexts $contexts --batches $batches \
    --warmup 3 --repeat 10 --json-out $R/decode.jsonl"
  grep -E "check|ceiling|decode .* (skipped|ms per step)" "$R/bench_$model.log" | sed 's/^/  /'
done

run_job anchors 90 "$py cluster/bench/decode_anchor.py --contexts $contexts --batches $batches"
grep '^{' "$R/anchors.log" > "$R/anchors.jsonl" || true
grep -v '^{' "$R/anchors.log" | tail -3 | sed 's/^/  /'

if run_job synth_prompt 60 "$H synth --task lm --tokens 32768 --seq-len 32768 --vocab 151936 --seed 1 --out $R/prompt32k.h5"; then
  run_job generate_32k 60 "$H generate --preset hydrahead-1.7b --prompt $R/prompt32k.h5 --max-new-tokens 64 \
    --device cuda --out $R/generate.jsonl" && sed 's/^/  /' "$R/generate.jsonl"
fi

run_job table 30 "$py cluster/bench/decode_table.py $R/decode.jsonl $R/anchors.jsonl > $R/table.md" && cat "$R/table.md"
gpu_job_end
