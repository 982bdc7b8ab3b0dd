#!/usr/bin/env python3
"""CTest: cluster/synth/pipeline.sh --profile toy --plan probe --plan-file cluster/synth/plans/toy.json
end to end on the CPU (a few minutes on 2 cores). --plan probe is the gpu profile's planning (second
budgets turned into steps by probe runs), so the path the one-shot GPU run takes is the one CI runs;
the toy plan has a student of every head-set kind, stage curves and a second training seed.

A toy run cannot learn, so nothing here asserts accuracy. It asserts that the pipeline ran: every
step exited 0, every model was trained for exactly its planned steps and evaluated at every
(task, length, depth) with the planned samples, the numbers parse and lie in range, the head
sets are what each student asked for (checked against heads.json's scores), the stage curves have a
point after conversion and at every quarter of every stage, and the report and the archive hold their files.
Usage: synth_pipeline_test.py HYDRA_BINARY REPO_ROOT
"""
import json
import math
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from hydra_testlib import check, failures, fa_heads


def jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(hydra, root):
    with tempfile.TemporaryDirectory() as tmp:
        archive = os.path.join(tmp, "results.tar.gz")
        run = subprocess.run(["bash", os.path.join(root, "cluster/synth/pipeline.sh"), "--profile", "toy", "--plan", "probe", "--hydra", hydra,
                              "--plan-file", os.path.join(root, "cluster/synth/plans/toy.json"),
                              "--out", tmp, "--archive", archive], capture_output=True, text=True, timeout=1500)
        print(run.stdout[-6000:])
        print(run.stderr[-3000:])
        check(run.returncode == 0, f"pipeline.sh exited {run.returncode}")
        res = os.path.join(tmp, "results")
        plan = json.load(open(os.path.join(res, "plan.json")))
        students = ["selected", "top2", "bottom2", "random2", "layerwise1", "gdn", "allfa"]
        check([s["name"] for s in plan["students"]] == students, f"plan.json students {plan['students']}")
        probed = students[:plan["jobs"]]
        probe = plan.get("probe") or {}
        for k in ("pretrain_step_s", "align_step_s", "distill_step_s", "finetune_step_s"):
            check(isinstance(probe.get(k), (int, float)) and probe[k] > 0, f"plan.json probe {k}: {probe.get(k)}")
        for stage, st in plan["stages"].items():
            check(st["steps"] >= 1 and st["tokens"] == st["steps"] * st["batch_seqs"] * st["seq_len"], f"plan {stage}: {st}")
        models = ["teacher"] + students

        # Every step ran and exited 0.
        timings = {t["step"]: t for t in jsonl(os.path.join(res, "timings.jsonl"))}
        expected = ["synth-train", "synth-heldout", "synth-heldout-lm", "synth-finetune", "synth-calib", "synth-lmtext",
                    "init-teacher", "pretrain-teacher", "select-heads", "total"]
        expected += [f"{stage}-{s}" for s in students for stage in ("convert", "align", "distill", "finetune")]
        expected += [f"eval-{kind}-{m}" for m in models for kind in ("lm", "niah")]
        expected += ["probe-pretrain"] + [f"probe-{stage}-{s}" for s in probed for stage in ("convert", "align", "distill", "finetune")]
        for s in ("selected", "allfa"):  # the students with curves: after conversion, then every checkpoint
            expected += [f"curve-lm-{s}-convert", f"curve-niah-{s}-convert"]
            for stage in ("align", "distill", "finetune"):
                n = plan["stages"][stage]["steps"]
                q = max(1, n // 4)
                expected += [f"curve-lm-{s}-{stage}-step-{k:06d}" for k in sorted(set(range(q, n + 1, q)) | {n})]
        for step in expected:
            check(step in timings and timings[step]["rc"] == 0 and timings[step]["seconds"] >= 0,
                  f"step {step}: {timings.get(step)}")

        # Training: the planned steps, finite losses, the same budget for every student.
        for name, stage in [("teacher", "pretrain")] + [(s, st) for s in students for st in ("align", "distill", "finetune")]:
            path = os.path.join(res, "train", f"{name}-{stage}.jsonl")
            check(os.path.exists(path), f"{path} missing")
            if not os.path.exists(path):
                continue
            steps = [r for r in jsonl(path) if r["type"] == "step"]
            check(len(steps) == plan["stages"][stage]["steps"], f"{name} {stage}: {len(steps)} steps, planned {plan['stages'][stage]['steps']}")
            check(all(math.isfinite(r["loss"]) for r in steps), f"{name} {stage}: non-finite loss")
            evals = [r for r in jsonl(path) if r["type"] == "eval"]
            check(len(evals) >= 1 and all(math.isfinite(r["eval_loss"]) for r in evals), f"{name} {stage}: held-out loss")
            if name in ("selected", "allfa"):  # stage curves: NIAH at every quarter
                n = plan["stages"][stage]["steps"]
                q = max(1, n // 4)
                check([r["step"] for r in evals] == sorted(set(range(q, n + 1, q)) | {n}) and  # quarters, and the end
                      all(0 <= r["niah_single"] <= 1 and 0 <= r["niah_multikey"] <= 1 for r in evals),
                      f"{name} {stage}: curve points {evals}")
        # The training seed reaches hydra train and convert (top2 has seed 2, the rest 1).
        commands = open(os.path.join(res, "commands.sh")).read()
        check("mpirun --oversubscribe -np 2 " in commands and "select-heads-1rank" not in timings,
              "select-heads on the plan's 2 ranks (select_ranks)")
        check(re.search(r"train --stage align --model \S*student-top2\.h5 .*--seed 2 ", commands) is not None, "top2: train --seed 2")
        check(re.search(r"convert --teacher \S+ --fa-heads top-global:2 --scores \S+heads\.json .*--seed 2 ", commands) is not None,
              "top2: convert --scores heads.json --seed 2")
        for s in ("selected", "allfa"):
            lm = json.load(open(os.path.join(res, "curves", f"{s}-convert.lm.json")))
            check(math.isfinite(lm["loss"]), f"{s}: LM loss after conversion")

        # Evaluations: every cell, in range; held-out LM loss finite over the planned windows.
        lengths, depths = plan["eval_lengths"], plan["depths"]
        for m in models:
            lm = json.load(open(os.path.join(res, "evals", f"{m}.lm.json")))
            check(math.isfinite(lm["loss"]) and lm["loss"] > 0, f"{m}: LM loss {lm['loss']}")
            check(lm["tokens"] == lm["windows"] * plan["seq_len"], f"{m}: LM tokens {lm['tokens']}")
            cells = [c for c in jsonl(os.path.join(res, "evals", f"{m}.niah.jsonl")) if c["type"] == "cell"]
            got = {(c["task"], c["length"], c["depth"]) for c in cells}
            want = {(t, n, d) for t in ("single", "multikey", "multivalue") for n in lengths for d in depths}
            check(got == want, f"{m}: NIAH cells {sorted(got)}")
            check(all(c["samples"] == plan["samples"] and 0 <= c["accuracy"] <= 1 for c in cells), f"{m}: cell values")

        # Head sets: what each student asked for (4 layers, 8 heads, 4 KV groups).
        heads = json.load(open(os.path.join(res, "heads.json")))
        check(len(heads["fa_heads"]) == 4 and all(len(h) == 1 for h in heads["fa_heads"]), f"heads.json {heads['fa_heads']}")
        info = {m: fa_heads(os.path.join(res, "models", f"{m}.info.txt")) for m in students}
        check(info["selected"] == heads["fa_heads"], f"selected student's heads {info['selected']} vs {heads['fa_heads']}")
        composite = heads["scores"]["composite"]
        ranked = sorted(((composite[l][h], l, h) for l in range(4) for h in range(8)), key=lambda x: (-x[0], x[1], x[2]))
        ranked_up = sorted(((composite[l][h], l, h) for l in range(4) for h in range(8)), key=lambda x: (x[0], x[1], x[2]))
        as_sets = lambda picks: [sorted(h for _, l2, h in picks if l2 == l) for l in range(4)]
        check(info["top2"] == as_sets(ranked[:2]), f"top2 heads {info['top2']} vs {as_sets(ranked[:2])}")
        check(info["bottom2"] == as_sets(ranked_up[:2]), f"bottom2 heads {info['bottom2']} vs {as_sets(ranked_up[:2])}")
        check(sum(len(h) for h in info["random2"]) == 2, f"random2 heads {info['random2']}")
        check(info["layerwise1"] == [[], list(range(8)), [], []], f"layerwise1 heads {info['layerwise1']}")
        check(info["gdn"] == [[], [], [], []], f"all-GDN heads {info['gdn']}")
        check(info["allfa"] == [list(range(8))] * 4, f"all-FA heads {info['allfa']}")

        # Report files: the table has a row per model, the plots are SVG with shapes in them.
        table = open(os.path.join(res, "table.md")).read()
        for label in ("teacher (Qwen3, all FA)", "selected heads", "top2 (top-global:2", "all-GDN", "all-FA student"):
            check(label in table, f"table.md lacks {label}")
        for svg in ("niah_heatmaps.svg", "loss_curves.svg", "stage_curves.svg"):
            tree = ET.parse(os.path.join(res, svg))
            shapes = [e for e in tree.iter() if e.tag.endswith(("rect", "polyline", "circle"))]
            check(len(shapes) > 20, f"{svg}: {len(shapes)} shapes")
        check("at depths 0–75 and, apart, at depth 100" in table, "table.md lacks the depth-100 split")
        # Stage curves: converted, then every checkpoint of the three stages, for the two students with curves.
        curve_rows = [l for l in open(os.path.join(res, "stage_curves.md")) if l.startswith("| selected |") or l.startswith("| allfa |")]
        n_points = 1 + sum(len(set(range(max(1, plan["stages"][st]["steps"] // 4), plan["stages"][st]["steps"] + 1,
                                         max(1, plan["stages"][st]["steps"] // 4))) | {plan["stages"][st]["steps"]})
                           for st in ("align", "distill", "finetune"))
        check(len(curve_rows) == 2 * n_points and all("—" not in r.split("|")[4] for r in curve_rows),
              f"stage_curves.md: {len(curve_rows)} rows, want {2 * n_points}")
        check("decisions" in open(os.path.join(res, "decisions.md")).read().lower(), "decisions.md")
        summary = json.load(open(os.path.join(res, "summary.json")))
        check(set(summary["models"]) == set(models), f"summary.json models {list(summary['models'])}")
        check("| claim | verdict |" in open(os.path.join(res, "claims.md")).read(), "claims.md has no claims table")
        with tarfile.open(archive) as tar:
            names = set(tar.getnames())
        for f in ("table.md", "claims.md", "niah_heatmaps.svg", "loss_curves.svg", "timings.jsonl", "commands.sh", "plan.json"):
            check(f"results/{f}" in names, f"archive lacks results/{f}")
    total = 1 if not failures else 0
    print(f"{total} passed, {1 - total} failed" + (f" ({len(failures)} checks failed)" if failures else ""))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
