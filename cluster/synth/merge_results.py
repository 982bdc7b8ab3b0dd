#!/usr/bin/env python3
"""Merges the results folders of one teacher's pipeline runs (the ablation job's call1/ and call2/)
into one folder that cluster/synth/report.py reads as a single plan, so the comparisons that span
the calls (the budget plot's K = 1 from call 1 beside K = 2, 4 from call 2) are made on the same items.

    python3 cluster/synth/merge_results.py OUT RESULTS1 RESULTS2 [...] && python3 cluster/synth/report.py OUT

Refused (one line, exit 2) unless every folder evaluated the same teacher (heads.json equal), on the
same items (eval seed, lengths, depths, samples, tasks) with the same stage steps, and no student
name appears twice. OUT/plan.json is the first folder's with every folder's students; the evals,
curves, train logs, model descriptions and head sets are copied; timings.jsonl holds every step with
the folder it came from; OUT/merged_from.json lists the folders. Standard library only.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import results_files as rf  # noqa: E402  (cluster/: a folder's files, plain, gzipped or archived)

SAME = ("eval_seed", "eval_lengths", "depths", "samples", "eval_tasks", "seq_len", "finetune_seq_len", "preset", "vocab")


def fail(msg):
    print(f"merge_results.py: {msg}", file=sys.stderr)
    sys.exit(2)


def main(out, folders):
    plans = []
    for f in folders:
        try:
            plans.append(json.load(rf.open_text(os.path.join(f, "plan.json"))))
        except (OSError, ValueError) as e:
            fail(f"{f}: no readable plan.json ({e})")
    heads = [rf.read_text(os.path.join(f, "heads.json")) if rf.exists(os.path.join(f, "heads.json")) else None
             for f in folders]
    scored = [(json.loads(h).get("fa_heads"), json.loads(h).get("scores")) if h else None for h in heads]
    if any(h is None or h != scored[0] for h in scored):
        fail("the folders' heads.json differ in head sets or scores (or one is missing): not the same teacher's head scores")
    for f, p in zip(folders[1:], plans[1:]):
        for k in SAME:
            if p.get(k) != plans[0].get(k):
                fail(f"{f}: {k} is {p.get(k)!r}, {folders[0]} has {plans[0].get(k)!r}: not the same items")
        steps = lambda q: {s: (q.get("stages", {}).get(s) or {}).get("steps") for s in ("align", "distill", "finetune")}
        if steps(p) != steps(plans[0]):
            fail(f"{f}: stage steps {steps(p)}, {folders[0]} has {steps(plans[0])}: not the same budgets")
    names = [s["name"] for p in plans for s in p.get("students", [])]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        fail(f"students {dup} appear in more than one folder")
    if os.path.exists(out) and os.listdir(out):
        fail(f"{out} exists and is not empty")
    os.makedirs(out, exist_ok=True)
    merged = dict(plans[0])
    merged["students"] = [s for p in plans for s in p.get("students", [])]
    merged["merged_from"] = folders
    with open(os.path.join(out, "plan.json"), "w") as f:
        json.dump(merged, f, indent=1)
    with open(os.path.join(out, "heads.json"), "w") as f:
        f.write(heads[0])
    for sub in ("evals", "curves", "train", "models", "head_sets", "logs"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
        for k, folder in enumerate(folders):
            src = os.path.join(folder, sub)
            for name in rf.listdir(src):  # plain, gzipped or in the folder's archive
                data = rf.read_bytes(os.path.join(src, name))
                if data is None or (name.endswith(".gz") and name[:-3] in rf.listdir(src)):
                    continue  # a folder, or a .gz whose content is copied under its plain name
                dst = os.path.join(out, sub, name)
                if os.path.exists(dst):
                    if name.startswith("teacher") or sub in ("head_sets", "logs"):
                        continue  # the same teacher evaluated again / the same head set: keep the first
                    fail(f"{folder}/{sub}/{name} is also in an earlier folder")
                with open(dst, "wb") as f:
                    f.write(data)
    with open(os.path.join(out, "timings.jsonl"), "w") as f:
        for folder in folders:
            path = os.path.join(folder, "timings.jsonl")
            if rf.exists(path):
                for line in rf.open_text(path):
                    if line.strip():
                        row = json.loads(line)
                        row["from"] = folder
                        f.write(json.dumps(row) + "\n")
    with open(os.path.join(out, "merged_from.json"), "w") as f:
        json.dump({"folders": folders, "students": {folder: [s["name"] for s in p.get("students", [])]
                                                    for folder, p in zip(folders, plans)}}, f, indent=1)
    print(f"merge_results: {len(merged['students'])} students from {len(folders)} folders into {out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2:]))
