#!/usr/bin/env python3
"""The RULER families' accuracy table of a teacher, with intervals, against each scorer's chance.

Reads eval-niah result files (JSON lines; their `sample` records) and the chance levels written by
ruler_chance.py, and prints a Markdown table: one row per (model, task, length, scoring) with

  exact   the greedy verdict (the whole answer right): k/n and its 95% Wilson interval
  recall  RULER's order-free fraction of answer items present: the mean and a 95% percentile
          bootstrap interval over samples (2000 resamples, fixed seed)
  chance  the blind answerer's exact and recall (ruler_chance.py), and the verdict for each score:
          "above" when the interval's lower end exceeds the chance level, "at/below" otherwise

    ruler_report.py --chance CHANCE.jsonl NAME=EVAL.jsonl [NAME=EVAL.jsonl ...] [--json OUT.json]

The scoring is read from the file name: X.generate.jsonl (--score generate), X.tf.jsonl (teacher-forced).

Standard library only (wilson from report.py beside this file).
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import rf, wilson  # noqa: E402  (rf: a results folder's files, plain, gzipped or archived)


def bootstrap_mean(xs, resamples=2000, seed=12345):
    """95% percentile bootstrap interval of the mean of xs."""
    rng = random.Random(seed)
    n = len(xs)
    means = sorted(sum(xs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def read_samples(path):
    # The results file does not name its scoring; the file name does (NAME.generate.jsonl, NAME.tf.jsonl).
    score = "generate" if ".generate." in path else "teacher-forced" if ".tf." in path else "?"
    out = {}
    with rf.open_text(path) as f:
        for line in f:
            j = json.loads(line)
            if j.get("type") != "sample":
                continue
            out.setdefault((j["task"], j["length"]), []).append(j)
    return score, out


def rows(chance, evals):
    table = []
    for name, path in evals:
        score, cells = read_samples(path)
        for (task, length), samples in sorted(cells.items()):
            c = chance.get((task, length))
            if c is None:
                sys.exit(f"ruler_report.py: no chance level for {task} at {length} (run ruler_chance.py on a stream "
                         f"of that family and length)")
            n = len(samples)
            k = sum(1 for s in samples if s["correct"])
            lo, hi = wilson(k, n)
            rec = [s["recall"] for s in samples]
            rlo, rhi = bootstrap_mean(rec)
            table.append({"model": name, "task": task, "length": length, "score": score, "samples": n,
                          "correct": k, "exact": k / n, "exact_lo": lo, "exact_hi": hi,
                          "recall": sum(rec) / n, "recall_lo": rlo, "recall_hi": rhi,
                          "chance_exact": c["blind_exact"], "chance_recall": c["blind_recall"],
                          "exact_above": lo > c["blind_exact"], "recall_above": rlo > c["blind_recall"],
                          "file": path})
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chance", required=True, help="ruler_chance.py output (JSON lines)")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("evals", nargs="+", help="NAME=EVAL.jsonl")
    args = ap.parse_args()
    chance = {}
    with rf.open_text(args.chance) as f:
        for line in f:
            j = json.loads(line)
            chance[(j["task"], j["length"])] = j
    evals = []
    for e in args.evals:
        if "=" not in e:
            sys.exit(f"ruler_report.py: '{e}' is not NAME=EVAL.jsonl")
        evals.append(tuple(e.split("=", 1)))
    table = rows(chance, evals)
    print("| model | task | length | scoring | n | exact [95% Wilson] | chance | recall [95% bootstrap] | chance |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in table:
        ex = f"{r['correct']}/{r['samples']} = {r['exact']:.2f} [{r['exact_lo']:.2f}, {r['exact_hi']:.2f}]"
        rc = f"{r['recall']:.2f} [{r['recall_lo']:.2f}, {r['recall_hi']:.2f}]"
        ce = f"{r['chance_exact']:.3g} ({'above' if r['exact_above'] else 'at/below'})"
        cr = f"{r['chance_recall']:.3g} ({'above' if r['recall_above'] else 'at/below'})"
        print(f"| {r['model']} | {r['task']} | {r['length']} | {r['score']} | {r['samples']} | {ex} | {ce} | {rc} | {cr} |")
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(table, f, indent=1)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
