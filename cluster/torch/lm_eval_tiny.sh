#!/usr/bin/env bash
# The lm-eval-harness recipe of README "Export", run end to end on the tiny presets (CPU, offline):
#
#   cluster/torch/lm_eval_tiny.sh BUILD/bin/hydra OUT_DIR
#
# Makes a character-level tokenizer of 98 ids (printable ASCII, newline, <unk>, <eos>: it fits the
# tiny presets' 256-id vocabulary) and two local tasks of 24 items (tiny_choice: multiple-choice
# log-likelihoods; tiny_gen: greedy generation until a newline), exports random hydrahead-tiny and
# qwen3-tiny with that tokenizer, and runs `lm_eval --model hf` on the teacher's folder and
# cluster/torch/lm_eval_hydra.py on the hybrid's. Random weights score at chance: this checks that
# the folders load and both request kinds run, not accuracy. Needs python3 with torch,
# transformers, accelerate and lm-eval.
set -euo pipefail
if [[ $# -ne 2 ]]; then
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 2
fi
BIN=$(realpath "$1")
OUT=$(mkdir -p "$2" && realpath "$2")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
rm -rf "$OUT/tok" "$OUT/tasks" "$OUT/hybrid-hf" "$OUT/teacher-hf"
mkdir -p "$OUT/tasks"

python3 - "$OUT" <<'EOF'
import json, random, string, sys
from tokenizers import Tokenizer, Regex, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
out = sys.argv[1]
chars = ["<unk>", "<eos>", "\n"] + list(string.printable[:95])
tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
tok.decoder = decoders.Fuse()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>",
                        pad_token="<eos>").save_pretrained(f"{out}/tok")
r = random.Random(0)
with open(f"{out}/tasks/tiny_choice.jsonl", "w") as f, open(f"{out}/tasks/tiny_gen.jsonl", "w") as g:
    for _ in range(24):
        a, b = r.randint(0, 4), r.randint(0, 4)
        choices = sorted({str(a + b), str(a + b + 1), str(abs(a + b - 1)), str(a + b + 2)})
        f.write(json.dumps({"question": f"{a}+{b}=", "choices": choices, "answer": choices.index(str(a + b))}) + "\n")
        g.write(json.dumps({"question": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
common = f"dataset_path: json\ntest_split: test\ndoc_to_text: \"{{{{question}}}}\"\n"
with open(f"{out}/tasks/tiny_choice.yaml", "w") as f:
    f.write(f"task: tiny_choice\n{common}dataset_kwargs:\n  data_files:\n    test: {out}/tasks/tiny_choice.jsonl\n"
            "output_type: multiple_choice\ndoc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{answer}}\"\n"
            "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
with open(f"{out}/tasks/tiny_gen.yaml", "w") as f:
    f.write(f"task: tiny_gen\n{common}dataset_kwargs:\n  data_files:\n    test: {out}/tasks/tiny_gen.jsonl\n"
            "output_type: generate_until\ndoc_to_target: \"{{answer}}\"\n"
            "generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 4\n  do_sample: false\n"
            "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n")
EOF

for kind in hybrid:hydrahead-tiny teacher:qwen3-tiny; do
  name=${kind%%:*} preset=${kind#*:}
  "$BIN" init --preset "$preset" --weight-seed 5 --out "$OUT/$name.h5" > "$OUT/$name-export.log" 2>&1 &&
    "$BIN" export --model "$OUT/$name.h5" --out "$OUT/$name-hf" --tokenizer "$OUT/tok" >> "$OUT/$name-export.log" 2>&1 ||
    { cat "$OUT/$name-export.log"; exit 1; }
done
args=(--model_args "pretrained=$OUT/hybrid-hf" --tasks tiny_choice,tiny_gen --include_path "$OUT/tasks" --batch_size 4
      --device cpu)
echo "== hybrid (hydrahead-tiny): cluster/torch/lm_eval_hydra.py --model hf"
python3 "$HERE/lm_eval_hydra.py" --model hf "${args[@]}" > "$OUT/hybrid.log" 2>&1 || { tail -20 "$OUT/hybrid.log"; exit 1; }
grep '^|' "$OUT/hybrid.log"
echo "== teacher (qwen3-tiny): lm_eval --model hf"
args[1]="pretrained=$OUT/teacher-hf"
python3 -m lm_eval --model hf "${args[@]}" > "$OUT/teacher.log" 2>&1 || { tail -20 "$OUT/teacher.log"; exit 1; }
grep '^|' "$OUT/teacher.log"
