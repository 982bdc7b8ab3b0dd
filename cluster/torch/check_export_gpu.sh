#!/usr/bin/env bash
# The H200 check of `hydra export`: exported models run in PyTorch give hydra's GPU logits.
#
#   cluster/torch/check_export_gpu.sh BUILD/bin/hydra OUT_DIR [TOKENS]
#
# 1. hydra init: a random hydrahead-1.7b (bf16, seed 1) and a random qwen3-1.7b teacher (bf16,
#    seed 2), side by side; hydra export of both (bf16, one 5 GiB shard or fewer each);
# 2. TOKENS (default 4096) random ids, and `hydra forward --device cuda --output` of each model
#    (logits [T, 151936] float32: 2.5 GB per model at 4K);
# 3. cluster/torch/check_export_gpu.py: cluster/torch/hydrahead.py (float32 loop and bfloat16 with
#    flash-linear-attention when importable) on the hybrid, transformers' Qwen3ForCausalLM and
#    hydrahead.py on the teacher, each against hydra's logits: max |Δ| ≤ 5e-2 of max |logit|,
#    mean errors and arg-max agreement printed.
# Needs python3 with torch (CUDA), transformers, h5py, numpy. Prints the measured errors and a JSON
# summary (also OUT_DIR/result.json); exits non-zero if any comparison fails. The models and logits
# (about 14 GB) are written under OUT_DIR/work and removed at the end unless KEEP=1.
# A dry run on a machine without a GPU (the plumbing, with tiny models on the CPU):
#   DEVICE=cpu HYBRID_PRESET=hydrahead-tiny TEACHER_PRESET=qwen3-tiny cluster/torch/check_export_gpu.sh BIN OUT 256
set -euo pipefail
if [[ $# -lt 2 || "$1" == "-h" || "$1" == "--help" ]]; then
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 2
fi
BIN=$(realpath "$1")
OUT=$2
TOKENS=${3:-4096}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEVICE=${DEVICE:-cuda}
HYBRID_PRESET=${HYBRID_PRESET:-hydrahead-1.7b}
TEACHER_PRESET=${TEACHER_PRESET:-qwen3-1.7b}
W=$OUT/work
mkdir -p "$W"
rm -rf "$W"/hybrid-hf "$W"/teacher-hf
start=$SECONDS
stamp() { echo "[check_export_gpu $((SECONDS - start)) s] $*"; }

stamp "init $HYBRID_PRESET and $TEACHER_PRESET (bf16, random weights)"
"$BIN" init --preset "$HYBRID_PRESET" --dtype bf16 --weight-seed 1 --out "$W/hybrid.h5" > "$OUT/init_hybrid.log" 2>&1 &
p1=$!
"$BIN" init --preset "$TEACHER_PRESET" --dtype bf16 --weight-seed 2 --out "$W/teacher.h5" > "$OUT/init_teacher.log" 2>&1 &
p2=$!
wait $p1 || { cat "$OUT/init_hybrid.log"; exit 1; }
wait $p2 || { cat "$OUT/init_teacher.log"; exit 1; }

stamp "export both"
"$BIN" export --model "$W/hybrid.h5" --out "$W/hybrid-hf" > "$OUT/export_hybrid.log" 2>&1 &
p1=$!
"$BIN" export --model "$W/teacher.h5" --out "$W/teacher-hf" > "$OUT/export_teacher.log" 2>&1 &
p2=$!
wait $p1 || { cat "$OUT/export_hybrid.log"; exit 1; }
wait $p2 || { cat "$OUT/export_teacher.log"; exit 1; }
tail -n 1 "$OUT/export_hybrid.log" "$OUT/export_teacher.log"

python3 - "$W/tokens.h5" "$TOKENS" "$W/hybrid-hf/config.json" <<'EOF'
import json, sys, h5py, numpy as np
vocab = json.load(open(sys.argv[3]))["vocab_size"]
ids = np.random.default_rng(36).integers(0, vocab, size=int(sys.argv[2]), dtype=np.int64)
with h5py.File(sys.argv[1], "w") as f:
    f["input_ids"] = ids
EOF

for m in hybrid teacher; do
  stamp "hydra forward --device $DEVICE: $m, $TOKENS tokens"
  "$BIN" forward --model "$W/$m.h5" --input "$W/tokens.h5" --device "$DEVICE" --output "$W/$m-logits.h5" \
    > "$OUT/forward_$m.log" 2>&1 || { cat "$OUT/forward_$m.log"; exit 1; }
  tail -n 1 "$OUT/forward_$m.log"
done

stamp "PyTorch comparisons"
status=0
python3 "$HERE/check_export_gpu.py" --tokens "$W/tokens.h5" --hybrid "$W/hybrid-hf" "$W/hybrid-logits.h5" \
  --teacher "$W/teacher-hf" "$W/teacher-logits.h5" --device "$DEVICE" --out "$OUT/result.json" 2>&1 | tee "$OUT/compare.log" || status=1
[[ "${KEEP:-0}" == 1 ]] || rm -rf "$W"
stamp "done (exit $status)"
exit $status
