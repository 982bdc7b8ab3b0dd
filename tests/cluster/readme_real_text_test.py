#!/usr/bin/env python3
"""Runs the README's real-text recipe exactly as written: the shell lines between
`<!-- readme-recipe: real-text -->` and `<!-- /readme-recipe -->`, under `bash -euo pipefail`, in a
fresh directory laid out as the repository's root (`cluster/` linked in) with the built hydra first
on PATH, the repository's own Markdown as the raw text (README.md in text/, docs/DESIGN.md as
held.txt). From raw text to a tokenizer trained here, a corpus folder, a model of its vocabulary
trained and evaluated, a RULER table, a calibrated conversion, an export that transformers loads and
generates from, and text generated with a stop string. Checked: every line ran; the held-out loss
fell below the uniform guess ln 512; the RULER table of generated answers covers the seven families;
the export names the tokenizer's eos in generation_config.json; the generated text stopped at ".".
Skipped (exit 77) without tokenizers, h5py, numpy, jinja2, torch or transformers
(cluster/install_deps.sh installs them).

    readme_real_text_test.py HYDRA_BINARY REPO_ROOT
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

from hydra_testlib import check, failures

hydra, root = sys.argv[1], sys.argv[2]
missing = []
for module in ("tokenizers", "h5py", "numpy", "jinja2", "torch", "transformers"):
    try:
        __import__(module)
    except ImportError:
        missing.append(module)
if missing:
    print(f"skipped: no {', '.join(missing)} (cluster/install_deps.sh installs them)")
    sys.exit(77)

readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
m = re.search(r"<!-- readme-recipe: real-text -->\s*```sh\n(.*?)```\s*<!-- /readme-recipe -->", readme, re.S)
if not m:
    print("README.md: no real-text recipe block")
    sys.exit(1)
script = m.group(1)

with tempfile.TemporaryDirectory() as work:
    os.symlink(os.path.join(root, "cluster"), os.path.join(work, "cluster"))
    os.makedirs(os.path.join(work, "text"))
    shutil.copy(os.path.join(root, "README.md"), os.path.join(work, "text", "readme.txt"))
    shutil.copy(os.path.join(root, "docs", "DESIGN.md"), os.path.join(work, "held.txt"))
    env = dict(os.environ, PATH=os.path.dirname(os.path.abspath(hydra)) + os.pathsep + os.environ["PATH"],
               HYDRA_CACHE_DIR=os.path.join(work, "cache"), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env, capture_output=True, text=True)
    out = r.stdout + r.stderr
    if not check(r.returncode == 0, f"the README recipe runs as written (exit {r.returncode}):\n{out[-3000:]}"):
        sys.exit(1)

    steps = [json.loads(line) for line in open(os.path.join(work, "runs", "lm", "train.jsonl")) if '"eval_loss"' in line]
    check(steps and steps[-1]["eval_loss"] < math.log(512) - 0.5,
          f"the held-out loss fell below ln 512 = {math.log(512):.2f} - 0.5 (got {steps[-1]['eval_loss'] if steps else None})")
    print(f"held-out loss after training: {steps[-1]['eval_loss']:.3f} (uniform: {math.log(512):.3f})")

    cells = [json.loads(line) for line in open(os.path.join(work, "ruler.jsonl")) if '"cell"' in line]
    check({c["task"] for c in cells} == {"single", "multikey", "multivalue", "multiquery", "vartrack", "cwe", "fwe"},
          f"ruler.jsonl: the seven families ({sorted({c['task'] for c in cells})})")
    check(all(c["score"] == "generate" for c in cells), "ruler.jsonl: every cell scored by generation")
    table = out[out.find("RULER score (generate:"):]
    if check("RULER score (generate: mean recall of the generated answers" in out, "the RULER table is printed"):
        print("\n".join(table.splitlines()[:10]))

    generation = json.load(open(os.path.join(work, "hybrid-hf", "generation_config.json")))
    check(generation.get("eos_token_id") == 0, f"generation_config.json names <|endoftext|> (0) as eos: {generation}")
    for name in ("tokenizer.json", "tokenizer_config.json", "hydrahead.py", "model.safetensors"):
        check(os.path.exists(os.path.join(work, "hybrid-hf", name)), f"hybrid-hf/{name}")

    answers = [json.loads(line) for line in open(os.path.join(work, "answer.jsonl")) if line.strip()]
    first = answers[0]
    check(first["prompt"] == "The runtime" and (first["stopped"] and first.get("stop_string") == "." and "." not in first["text"]
                                                or not first["stopped"] and len(first["ids"]) == 24),
          f"answer.jsonl: stopped at '.' with the text before it, or 24 tokens: {first}")
    print(f"generated: {first['prompt']!r} + {first['text']!r} (stopped: {first['stopped']})")
    last = r.stdout.strip().splitlines()[-1]
    check(last.startswith("The runtime"), f"transformers generated from the export: {last!r}")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("the real-text recipe ran as written")
