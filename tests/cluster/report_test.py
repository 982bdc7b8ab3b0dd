#!/usr/bin/env python3
"""cluster/synth/report.py's statistics: the Wilson interval against published values, the table's
intervals and budgets on synthetic eval-niah cells, and claims.md without per-sample lines (no
comparison: every claim "no data"; claims_test.py checks the verdicts)."""
import importlib.util
import json
import os
import sys
import tempfile

root = sys.argv[1]
spec = importlib.util.spec_from_file_location("report", os.path.join(root, "cluster", "synth", "report.py"))
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


# Wilson 95% intervals: 8 of 10 -> [0.490, 0.943]; 0 of 20 -> [0, 0.161]; 50 of 100 -> [0.404, 0.596].
for (k, n), (lo, hi) in {(8, 10): (0.490, 0.943), (0, 20): (0.0, 0.161), (50, 100): (0.404, 0.596)}.items():
    got = report.wilson(k, n)
    check(abs(got[0] - lo) < 1e-3 and abs(got[1] - hi) < 1e-3, f"wilson({k}, {n}) = {got}, expected ({lo}, {hi})")
check(report.wilson(0, 0) is None, "wilson of no samples is not None")


def cells(path, correct_of, samples):
    with open(path, "w") as f:
        for task in report.TASKS:
            for length in (256, 4096):
                f.write(json.dumps({"type": "cell", "task": task, "length": length, "depth": 50, "samples": samples,
                                    "correct": correct_of(task, length), "accuracy": correct_of(task, length) / samples}) + "\n")


with tempfile.TemporaryDirectory() as res:
    os.makedirs(os.path.join(res, "evals"))
    # With --teacher the plan has no pretraining stage (null): the loss plot must still be drawn.
    json.dump({"profile": "test", "seq_len": 256, "eval_lengths": [256, 4096], "depths": [50], "vocab": 512,
               "stages": {"pretrain": None, "align": {"steps": 3, "batch_seqs": 2, "seq_len": 256, "tokens": 1536,
                                                       "lr": 0.002}}},
              open(os.path.join(res, "plan.json"), "w"))
    # Teacher perfect at 1x; selected 40/40 per length, random 39/40 (overlapping), gdn 0.
    cells(os.path.join(res, "evals", "teacher.niah.jsonl"), lambda t, n: 40 if n == 256 else 0, 40)
    cells(os.path.join(res, "evals", "selected.niah.jsonl"), lambda t, n: 40, 40)
    cells(os.path.join(res, "evals", "random.niah.jsonl"), lambda t, n: 39, 40)
    cells(os.path.join(res, "evals", "layerwise.niah.jsonl"), lambda t, n: 36, 40)
    cells(os.path.join(res, "evals", "gdn.niah.jsonl"), lambda t, n: 0, 40)
    report.main(res)
    table = open(os.path.join(res, "table.md")).read()
    # No per-sample lines here, so no paired comparison: every claim is "no data", none invented.
    claims = [l for l in open(os.path.join(res, "claims.md")).read().splitlines() if l.startswith("| ") and "**" in l]
    check(len(claims) == 7 and all("**no data**" in l for l in claims), f"claims.md without items: {claims}")
    check(os.path.getsize(os.path.join(res, "loss_curves.svg")) > 0, "loss_curves.svg is empty")
    check("| align | 3 | 2 | 256 | 1536 | 0.002 |" in table, "table lacks the align budget row")
    check("1.00 [0.97, 1.00]" in table, "table lacks the interval of 120/120 (expected '1.00 [0.97, 1.00]')")

for f in failures:
    print("FAIL:", f)
print(f"report_test: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
