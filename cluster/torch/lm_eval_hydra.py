#!/usr/bin/env python3
"""lm-eval-harness on `hydra export` folders: lm_eval's own command line, with
cluster/torch/hydrahead.py imported first so that its `hf` model (AutoConfig /
AutoModelForCausalLM) knows model_type "hydrahead". A teacher's folder (model_type "qwen3") loads
with plain `lm_eval` too, through transformers' Qwen3ForCausalLM.

    python3 cluster/torch/lm_eval_hydra.py --model hf \
        --model_args pretrained=EXPORT_DIR,dtype=bfloat16 --tasks lambada_openai --batch_size 4

The folder needs a tokenizer: export it with `hydra export --tokenizer HF_DIR`, or name one with
`tokenizer=HF_DIR` in --model_args. Batches are left-padded by lm-eval, which the hybrid handles
exactly (hydrahead.py's docstring).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hydrahead  # noqa: E402,F401  (registers the hydrahead classes with transformers)

if not hydrahead.HAVE_TRANSFORMERS:
    sys.exit("lm_eval_hydra.py: transformers is not installed (lm-eval-harness's hf model needs it)")

from lm_eval.__main__ import cli_evaluate  # noqa: E402

if __name__ == "__main__":
    cli_evaluate()
