#!/usr/bin/env python3
"""CTest teacher_recipe.toy: cluster/corpus/teacher_recipe.sh --profile toy end to end on the CPU, on a
corpus that build_corpus.py makes here from this repository's own English documentation (the
READMEs and design notes: prose) and Python sources (code), with a 2000-id byte-level BPE.

A toy run cannot learn, so no accuracy or loss level is asserted. Asserted: every step ran; the
retrieval sets vary their haystacks (two samples do not share the text before their needles) and the
training file counts exactly the answers (loss_mask = the sets' answer tokens); both phases ran their
steps on the blends (the retrieval file at its share); the teacher is a qwen3-text-cpu model (4 layers,
8 heads in 4 KV groups, vocabulary 16384); teacher.json holds a finite held-out loss with its perplexity e^loss,
every task's retrieval over its samples, and select-heads' concentration over the 4 layers with the
issue's spread test. Then the ablation pipeline on that teacher with real-text stage data and NIAH sets
(stage_data.py, pipeline.sh --set data_dir): three students (selected with curves, a stage ablation, the
fair all-FA arm) evaluated on the text items and compared. Skipped (77) without tokenizers, h5py or numpy.
Usage: teacher_recipe_test.py HYDRA_BINARY REPO_ROOT
"""
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from hydra_testlib import check, failures

hydra, root = sys.argv[1], sys.argv[2]
try:
    import h5py
    import numpy as np
    import tokenizers  # noqa: F401
except ImportError as e:
    print(f"SKIPPED: {e} (teacher_recipe.toy needs tokenizers, h5py and numpy)")
    sys.exit(77)

with tempfile.TemporaryDirectory() as tmp:
    src = os.path.join(tmp, "text")
    docs = [os.path.join(root, "README.md"), os.path.join(root, "docs", "DESIGN.md")]
    docs += sorted(glob.glob(os.path.join(root, "cluster", "results", "*", "README.md")))
    docs += sorted(glob.glob(os.path.join(root, "cluster", "synth", "*.py")))
    for i, d in enumerate(docs):
        os.makedirs(src, exist_ok=True)
        shutil.copy(d, os.path.join(src, f"{i:03d}-{os.path.basename(d)}"))
    with open(os.path.join(tmp, "packages.txt"), "w") as f:
        f.write(f"file:{src}\n")
    corpus = os.path.join(tmp, "corpus")
    r = subprocess.run([sys.executable, os.path.join(root, "cluster/corpus/build_corpus.py"), "--packages",
                        os.path.join(tmp, "packages.txt"), "--out", corpus, "--vocab", "2000", "--heldout", "0.3",
                        "--tokenizer-bytes", "2e6"], capture_output=True, text=True)
    check(r.returncode == 0, f"build_corpus: {r.stderr[-2000:]}")
    out = os.path.join(tmp, "teacher")
    cmd = ["bash", os.path.join(root, "cluster/corpus/teacher_recipe.sh"), "--corpus", corpus, "--out", out, "--profile", "toy",
           "--hydra", hydra, "--seed", "3"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    print(r.stdout[-4000:], r.stderr[-2000:])
    check(r.returncode == 0, f"teacher_recipe.sh exited {r.returncode}")
    log = open(os.path.join(out, "logs", "recipe.log")).read()
    check("rc 0" in log and " rc 1" not in log and "rc 2" not in log, f"every step exited 0:\n{log}")
    tasks = ["single", "multikey", "multivalue", "multiquery", "vartrack"]
    # The training sets: varied haystacks, answers counted only.
    with h5py.File(os.path.join(out, "data", "train-single.h5"), "r") as f:
        ids, off, start = f["input_ids"][...], f["sample_offset"][...], f["answer_start"][...]
        # Past the instruction (the same words in every sample) each sample's haystack is its own text.
        hay = {tuple(ids[off[k] + 60:off[k] + 72]) for k in range(len(off) - 1)}
        check(len(hay) > 1, "the single-needle training samples have different haystack text")
    answers = 0
    for t in tasks:
        with h5py.File(os.path.join(out, "data", f"train-{t}.h5"), "r") as f:
            answers += int(f["answer_length"][...].sum())
            n_samples = len(f["answer_length"])
    with h5py.File(os.path.join(out, "data", "retrieval.h5"), "r") as f:
        check(int(f["loss_mask"][...].sum()) == answers, f"retrieval.h5 counts the answers: {int(f['loss_mask'][...].sum())} vs {answers}")
        check((len(f["input_ids"]) - 1) % 256 == 0 and f.attrs["tasks"] == ",".join(tasks), "retrieval.h5: whole samples of 256")
    for phase in ("lm", "mix"):
        steps = [json.loads(l) for l in open(os.path.join(out, "runs", phase, "train.jsonl")) if json.loads(l).get("type") == "step"]
        check(len(steps) == 3 and all(math.isfinite(s["loss"]) for s in steps), f"phase {phase}: 3 finite steps")
    mix = open(os.path.join(out, "commands.sh")).read()
    check("retrieval.h5:0.3" in mix and "--vary-haystack" in mix and "set_to_train.py" in mix, "commands.sh: the blend and the sets")
    info = subprocess.run([hydra, "info", os.path.join(out, "teacher.h5")], capture_output=True, text=True).stdout
    check("qwen3: 4 layers" in info and "H=8, G=4" in info and "vocab 16384" in info, f"the teacher's shape: {info[:300]}")
    t = json.load(open(os.path.join(out, "teacher.json")))
    lm = t["lm"]["prose"]
    check(lm and math.isfinite(lm["loss"]) and abs(lm["perplexity"] - math.exp(lm["loss"])) < 1e-9 * lm["perplexity"],
          f"held-out prose loss and perplexity: {lm}")
    for task in tasks:
        v = t["retrieval"].get(task)
        check(v and v["all"]["samples"] == 2 and 0 <= v["all"]["accuracy"] <= 1, f"{task}: 2 samples (depths 0 and 100): {v}")
    h = t["heads"]
    check(h and len(h["layer_share"]) == 4 and h["effective_heads"] >= 1 and len(h["top8_heads"]) == 8
          and isinstance(h["spread"], bool), f"concentration: {h}")
    check(all(len(layer) == 1 for layer in h["fa_heads"]), "select-heads: the toy's select_budget, 1 head a layer (7:1 of 8)")
    check(os.path.exists(os.path.join(out, "teacher.md")), "teacher.md")
    # The ablation pipeline on this teacher: stage data and NIAH sets from the corpus (stage_data.py),
    # then pipeline.sh with data_dir: a selected student with curves, a stage ablation, the teacher arm.
    stage = os.path.join(tmp, "stage")
    r = subprocess.run([sys.executable, os.path.join(root, "cluster/corpus/stage_data.py"), "--corpus", corpus, "--out", stage,
                        "--len", "256", "--ft-len", "512", "--eval-lengths", "256,512", "--tasks", "single,multikey",
                        "--train-tasks", "single,multikey", "--depths", "0,100", "--samples", "1", "--train-windows", "8",
                        "--ft-windows", "4", "--lm-windows", "2", "--hay-mb", "0.5"], capture_output=True, text=True)
    check(r.returncode == 0, f"stage_data.py: {r.stderr[-1500:]}")
    with h5py.File(os.path.join(stage, "train.h5"), "r") as f:
        task = f["document_task"][...]
        check(len(task) == 8 and (task == -1).sum() == 6 and (len(f["input_ids"]) - 1) == 8 * 256,
              f"train.h5: 6 language windows and 2 retrieval samples of 256: {task}")
    plan = os.path.join(tmp, "plan.json")
    json.dump({"students": [{"name": "selected", "heads": "selected", "curves": True},
                            {"name": "no-distill", "heads": "selected", "stages": "align,finetune", "curves": False},
                            {"name": "fair", "heads": "teacher", "curves": False}]}, open(plan, "w"))
    pipe = os.path.join(tmp, "pipe")
    r = subprocess.run(["bash", os.path.join(root, "cluster/synth/pipeline.sh"), "--profile", "toy", "--hydra", hydra,
                        "--teacher", os.path.join(out, "teacher.h5"), "--plan-file", plan, "--out", pipe,
                        "--set", f"data_dir={stage}", "--set", "len=256", "--set", "ft_len=512", "--set", "eval_mults=1 2",
                        "--set", "eval_tasks=single,multikey", "--set", "select_budget=1"], capture_output=True, text=True, timeout=1500)
    print(r.stdout[-3000:], r.stderr[-1500:])
    check(r.returncode == 0, f"pipeline.sh with data_dir exited {r.returncode}")
    res = os.path.join(pipe, "results")
    for m in ("teacher", "selected", "no-distill", "fair"):
        lines = [json.loads(l) for l in open(os.path.join(res, "evals", f"{m}.niah.jsonl"))] if os.path.exists(
            os.path.join(res, "evals", f"{m}.niah.jsonl")) else []
        cells = {(c["task"], c["length"]) for c in lines if c.get("type") == "cell"}
        check(cells == {(t, n) for t in ("single", "multikey") for n in (256, 512)}, f"{m}: NIAH cells from the text sets {cells}")
    check(json.load(open(os.path.join(res, "heads.json")))["selection"]["calibration"] is not None, "select-heads on the text set")
    d = json.load(open(os.path.join(res, "decisions.json")))
    check(any(c["question"] == "X head-wise vs fair all-FA" for c in d["comparisons"]) and
          any(c["question"] == "T full vs no distill" for c in d["comparisons"]), "decisions on the text items")
    # Bad input: one line, exit 2, before any work.
    r = subprocess.run(cmd[:3] + [os.path.join(tmp, "nowhere"), "--out", os.path.join(tmp, "t2"), "--profile", "toy", "--hydra", hydra],
                       capture_output=True, text=True)
    check(r.returncode == 2 and "is missing" in r.stderr and r.stderr.count("\n") == 1, f"no corpus: {r.stderr!r}")
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 2 and "not empty" in r.stderr, f"a used --out: {r.stderr!r}")

print(f"teacher_recipe_test: {len(failures)} failure(s)")
print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
sys.exit(1 if failures else 0)
