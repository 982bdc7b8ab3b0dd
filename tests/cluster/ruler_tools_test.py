#!/usr/bin/env python3
"""CTest ruler_tools: the chance levels (cluster/synth/ruler_chance.py), the table with intervals
(ruler_report.py) and the stream decoder (show_synth.py) on inputs whose answers are known.

* Chance: streams written by `hydra synth` for each RULER family, where the blind answerer's scores
  are fixed by the knobs: multiquery exact 1/Q! and recall 1; vartrack 1/chains for both; cwe
  recall k/D with D = k + the uncommon words the generator fits (model/eval/ruler.cpp); fwe k/D with
  D the distinct words each document really holds (counted here independently of the script).
* Report: hand-written eval-niah files: 8 of 10 right gives report.py's Wilson interval; a recall
  of 1 on every sample gives the interval [1, 1]; the verdict is "above" only when the lower end
  clears the chance level; a missing chance level is an error naming the task and length.
* show_synth.py: exits 0 on a masked stream (counted targets = answer spans) and prints the markers.
Skipped (exit 77) without h5py/numpy. Usage: ruler_tools_test.py HYDRA REPO_ROOT
"""
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import h5py  # noqa: F401
    import numpy as np
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

hydra, root = sys.argv[1], sys.argv[2]
tools = os.path.join(root, "cluster", "synth")
sys.path.insert(0, tools)
import report  # noqa: E402
from hydra_testlib import check, failures  # noqa: E402


def run(args, expect=0):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != expect:
        print(r.stdout, r.stderr)
    check(r.returncode == expect, f"{' '.join(args[:3])}... exit {r.returncode}, expected {expect}")
    return r


with tempfile.TemporaryDirectory() as d:
    knobs = {
        "multiquery": ["--queries", "3"],
        "vartrack": ["--chains", "3", "--hops", "1"],
        "cwe": ["--key-length", "1", "--common-words", "3", "--common-freq", "6", "--uncommon-freq", "2"],
        "fwe": ["--key-length", "1", "--top-words", "2"],
    }
    paths = {}
    for task, k in knobs.items():
        paths[task] = os.path.join(d, f"{task}.h5")
        run([hydra, "synth", "--task", task, *k, "--loss", "answers", "--tokens", str(40 * 128), "--seq-len", "128",
             "--vocab", "256", "--seed", "5", "--out", paths[task]])
    out = run([sys.executable, os.path.join(tools, "ruler_chance.py"), *paths.values()]).stdout
    chance = {json.loads(line)["task"]: json.loads(line) for line in out.splitlines()}
    check(set(chance) == set(knobs), f"one line per family: {sorted(chance)}")
    mq, vt, cwe, fwe = chance["multiquery"], chance["vartrack"], chance["cwe"], chance["fwe"]
    check(mq["documents"] == 40 and abs(mq["blind_exact"] - 1 / 6) < 1e-12 and mq["blind_recall"] == 1.0,
          f"multiquery Q=3: exact 1/6, recall 1: {mq}")
    check(abs(vt["blind_exact"] - 1 / 3) < 1e-12 and abs(vt["blind_recall"] - 1 / 3) < 1e-12,
          f"vartrack 3 chains: 1/3: {vt}")
    # cwe at 128: answer 3·2−1 = 5, region 128 − 2 − 5 = 121, common 3·6·2 = 36, uncommon (121−36)/(2·2) = 21.
    check(abs(cwe["blind_recall"] - 3 / 24) < 1e-12, f"cwe recall 3/24: {cwe}")
    check(abs(cwe["blind_exact"] - 1 / (24 * 23 * 22)) < 1e-15, f"cwe exact 1/(24·23·22): {cwe}")
    # fwe: count each document's distinct words here (every second id of the list is SEP).
    with h5py.File(paths["fwe"]) as f:
        ids = f["input_ids"][...]
        starts = f["answer_start"][...]
    sep, end, recalls = 256 - 5, 256 - 3, []
    for i, a in enumerate(starts):
        ctx = ids[i * 128:a - 2]  # up to QUERY IS
        words = {int(t) for t in ctx if t not in (sep, end)}
        recalls.append(2 / len(words))
    check(abs(fwe["blind_recall"] - float(np.mean(recalls))) < 1e-12,
          f"fwe recall = mean 2/D: {fwe['blind_recall']} vs {np.mean(recalls)}")

    # The report on hand-written results.
    ev = os.path.join(d, "m.tf.jsonl")
    with open(ev, "w") as f:
        for i in range(10):
            f.write(json.dumps({"type": "sample", "task": "cwe", "length": 128, "correct": i < 8, "recall": 1.0}) + "\n")
        f.write(json.dumps({"type": "cell", "task": "cwe", "length": 128}) + "\n")
    ch = os.path.join(d, "chance.jsonl")
    with open(ch, "w") as f:
        f.write(json.dumps({"task": "cwe", "length": 128, "blind_exact": 0.5, "blind_recall": 0.999}) + "\n")
    table = os.path.join(d, "t.json")
    md = run([sys.executable, os.path.join(tools, "ruler_report.py"), "--chance", ch, "--json", table, f"m={ev}"]).stdout
    rows = json.load(open(table))
    check(len(rows) == 1, f"one row: {rows}")
    r = rows[0]
    lo, hi = report.wilson(8, 10)
    check(r["correct"] == 8 and r["samples"] == 10 and (r["exact_lo"], r["exact_hi"]) == (lo, hi),
          f"8/10 with Wilson {lo, hi}: {r}")
    check(not r["exact_above"], f"exact 8/10 [{lo:.2f}, ..] is not above 0.5: {r}")
    check((r["recall_lo"], r["recall_hi"]) == (1.0, 1.0) and r["recall_above"], f"recall 1 everywhere: {r}")
    check(r["score"] == "teacher-forced" and "| m | cwe | 128 | teacher-forced | 10 |" in md, f"the row: {md}")
    with open(ch, "w") as f:
        f.write(json.dumps({"task": "fwe", "length": 128, "blind_exact": 0.5, "blind_recall": 0.5}) + "\n")
    bad = run([sys.executable, os.path.join(tools, "ruler_report.py"), "--chance", ch, f"m={ev}"], expect=1)
    check("no chance level for cwe at 128" in bad.stderr, f"missing chance level named: {bad.stderr}")

    shown = run([sys.executable, os.path.join(tools, "show_synth.py"), paths["multiquery"]]).stdout
    check("differ from their answer spans: 0" in shown and "NEEDLE" in shown and "[SEP]" in shown,
          f"show_synth.py output: {shown[:400]}")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all ruler tool checks passed")
