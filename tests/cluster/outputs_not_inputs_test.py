#!/usr/bin/env python3
"""Every cluster/ script that writes an --out refuses one that names one of its inputs (issue 54: at
6777ccb tokenize_text replaced its input; the others would have too): exit != 0, one line on
stderr starting with the script's name, no traceback, the input unchanged. tokenize_text.py has its
own cases in tokenize_hostile_test.py.

    python3 tests/cluster/outputs_not_inputs_test.py ROOT

Each script is run with its output naming an input, directly and through a symbolic link; scripts
whose libraries are missing here (matplotlib, tokenizers, torch) are reported as skipped, and the
whole test exits 77 when every one was.
"""
import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile

root = sys.argv[1]
failures, ran, skipped = [], 0, []


def have(*modules):
    return all(importlib.util.find_spec(m) is not None for m in modules)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def expect_refused(name, script, args, victim, tool, cwd):
    global ran
    before = digest(victim)
    r = subprocess.run([sys.executable, os.path.join(root, script)] + args, capture_output=True, text=True, cwd=cwd,
                       timeout=300)
    err = r.stderr.strip()
    problems = []
    if r.returncode == 0:
        problems.append("exit 0")
    if "Traceback" in err or len(err.splitlines()) != 1 or not err.startswith(f"{tool}: "):
        problems.append(f"not one '{tool}: ' line")
    if "an input" not in err:
        problems.append("the message does not say the output is an input")
    if digest(victim) != before:
        problems.append(f"{victim} was changed")
    ran += 1
    if problems:
        failures.append(f"{name}: {'; '.join(problems)} (exit {r.returncode}): {err[-300:]!r}")
    else:
        print(f"ok   {name}: {err}")


with tempfile.TemporaryDirectory() as d:
    def write(name, text):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    results = write("results.jsonl", '{"task": "single", "length": 1024, "depth": 50, "accuracy": 1.0}\n')
    heads = write("heads.json", '{"format": "hydrahead-head-selection"}\n')
    sweep = write("sweep.jsonl", '{"command": "prefill", "ranks": 1, "seq_len": 1024, "seconds": 1.0}\n')
    os.makedirs(os.path.join(d, "run"))
    log = write("run/train.jsonl", '{"step": 1, "loss": 2.0}\n')
    model = write("model.h5", "not really a model")
    tok = write("tokenizer.json", "{}")
    prompts = write("prompts.txt", "hello\n")
    haystack = write("haystack.txt", "Some text. " * 50)
    os.symlink("results.jsonl", os.path.join(d, "link.png"))
    cases = []
    if have("matplotlib", "numpy"):
        cases += [
            ("plot_niah --out the results", "cluster/niah/plot_niah.py", [results, "--out", results], results, "plot_niah"),
            ("plot_niah --out a link to the results", "cluster/niah/plot_niah.py", [results, "--out", "link.png"], results,
             "plot_niah"),
            ("plot_heads --out the scores", "cluster/heads/plot_heads.py", [heads, "--out", heads], heads, "plot_heads"),
            ("plot_sweep --out the sweep", "cluster/plot_sweep.py", [sweep, "--out", sweep], sweep, "plot_sweep"),
            ("plot_train --out the run's log", "cluster/plot_train.py", ["run", "--out", log], log, "plot_train"),
        ]
    else:
        skipped.append("plot_* (no matplotlib)")
    if have("tokenizers", "h5py", "numpy"):
        cases += [
            ("generate_text --out the prompts", "cluster/generate_text.py",
             ["--model", model, "--tokenizer", tok, "--prompts", prompts, "--max-new-tokens", "4", "--out", prompts], prompts, "generate_text"),
            ("generate_text --keep-prompt-file the model", "cluster/generate_text.py",
             ["--model", model, "--tokenizer", tok, "--prompts", prompts, "--max-new-tokens", "4", "--out", "o.jsonl",
              "--keep-prompt-file", model],
             model, "generate_text"),
            ("build_niah_set --out the haystack", "cluster/niah/build_niah_set.py",
             ["--tokenizer", tok, "--haystack", haystack, "--lengths", "1K", "--out", haystack], haystack, "build_niah_set"),
        ]
    else:
        skipped.append("generate_text, build_niah_set (no tokenizers, h5py or numpy)")
    if have("torch", "h5py", "numpy"):
        cases.append(("check_export_gpu --out the tokens", "cluster/torch/check_export_gpu.py",
                      ["--tokens", model, "--out", model, "--device", "cpu"], model, "check_export_gpu"))
    else:
        skipped.append("check_export_gpu (no torch)")
    for name, script, args, victim, tool in cases:
        expect_refused(name, script, args, victim, tool, d)

for s in skipped:
    print(f"skipped: {s}")
for f in failures:
    print("FAIL:", f)
print(f"outputs_not_inputs_test: {ran} case(s), {len(failures)} failure(s)")
sys.exit(1 if failures else 77 if ran == 0 else 0)
