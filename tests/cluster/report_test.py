#!/usr/bin/env python3
"""cluster/synth/report.py's statistics: the Wilson interval against published values, and the
claim verdicts (held / did not hold / undecided) on synthetic eval-niah cells, including a case
where the point estimates differ but the samples cannot decide."""
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
check(report.compare((0.6, 0.9), (0.1, 0.5)) is True, "disjoint above is not True")
check(report.compare((0.1, 0.5), (0.6, 0.9)) is False, "disjoint below is not False")
check(report.compare((0.3, 0.7), (0.5, 0.9)) == "undecided", "overlap is not undecided")
check(report.close_to((0.0, 0.24), (0.0, 0.24), 0.1) == "undecided", "two wide intervals are not undecided for closeness")
check(report.close_to((0.98, 1.0), (0.86, 0.93), 0.1) is True, "0.98.. vs ..0.93 is not close within 0.1")
check(report.close_to((0.1, 0.3), (0.8, 0.9), 0.1) is False, "..0.3 vs 0.8.. is close within 0.1")


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
    claims = open(os.path.join(res, "claims.md")).read()
    table = open(os.path.join(res, "table.md")).read()
    lines = [l for l in claims.splitlines() if l.startswith("* ")]
    verdict = lambda key: next((l for l in lines if key in l), "")
    check("**undecided** — selected heads beat random" in verdict("selected heads beat random"),
          "240/240 vs 234/240 should be undecided: " + verdict("selected heads beat random"))
    check("**held** — FA heads matter" in verdict("FA heads matter"), "hybrids vs all-GDN should hold: " + verdict("FA heads"))
    check("**held** — the teacher solves" in verdict("the teacher solves"), "teacher 120/120 at 1x should hold")
    check("**held** — 7:1 head-wise, selected heads extrapolates" in verdict("selected heads extrapolates"),
          "selected 120/120 vs teacher 0/120 at 16x should hold: " + verdict("selected heads extrapolates"))
    check(os.path.getsize(os.path.join(res, "loss_curves.svg")) > 0, "loss_curves.svg is empty")
    check("| align | 3 | 2 | 256 | 1536 | 0.002 |" in table, "table lacks the align budget row")
    check("1.00 [0.97, 1.00]" in table, "table lacks the interval of 120/120 (expected '1.00 [0.97, 1.00]')")

for f in failures:
    print("FAIL:", f)
print(f"report_test: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
