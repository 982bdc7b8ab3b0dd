#!/usr/bin/env python3
"""CTest synth_ablation_text.toy: the CPU-scale rehearsal of issue 58's ablation plan
(cluster/synth/plans/ablation_text.json). cluster/synth/plans/ablation_text_toy.json holds one
student of every arm kind that plan has — the 7:1 budget chosen globally (top-global) and per layer
(selected) against random-global draws, the fair all-FA arm (the teacher fine-tuned, no conversion),
the NoPE all-FA student, layer-wise at two positions, the three stage ablations, two fusions, a
bottom-global K, all-GDN — and cluster/synth/pipeline.sh --profile toy runs it on the CPU.

A toy run cannot learn: no accuracy is asserted. Asserted: every step exited 0; every student was
evaluated; each ran exactly its plan's stages (a stage ablation has no log of the stage it skips, the
teacher arm no conversion and only a finetune); the models are what the arms say (the teacher arm is
the Qwen3 teacher, layer-wise has one all-FA layer where asked, the fusion is the one asked, the two
random draws differ, select_budget's heads per layer); and decide.py/claims.py turn the folder into
a comparison for every claim and a verdict for each of the 7 claims.
Usage: ablation_text_toy_test.py HYDRA_BINARY REPO_ROOT
"""
import json
import os
import re
import subprocess
import sys
import tempfile
from hydra_testlib import check, failures, fa_heads


def jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(hydra, root):
    plan_file = os.path.join(root, "cluster/synth/plans/ablation_text_toy.json")
    full = os.path.join(root, "cluster/synth/plans/ablation_text.json")
    for p in (plan_file, full):
        r = subprocess.run([sys.executable, os.path.join(root, "cluster/synth/plan.py"), "check", p], capture_output=True, text=True)
        check(r.returncode == 0, f"plan.py check {p}: {r.stderr}")
    # Every arm kind of the GPU plan has its stand-in in the toy plan.
    kind = lambda s: (re.sub(r"[:@].*$", "", s["heads"]), s.get("fusion", "scale_norm") != "scale_norm", s.get("stages", ""))
    toy_students = json.load(open(plan_file))["students"]
    missing = {kind(s) for s in json.load(open(full))["students"]} - {kind(s) for s in toy_students}
    check(not missing, f"arm kinds of ablation_text.json without a toy student: {missing}")
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(["bash", os.path.join(root, "cluster/synth/pipeline.sh"), "--profile", "toy", "--hydra", hydra,
                              "--plan-file", plan_file, "--out", tmp], capture_output=True, text=True, timeout=2400)
        print(run.stdout[-4000:])
        print(run.stderr[-2000:])
        check(run.returncode == 0, f"pipeline.sh exited {run.returncode}")
        res = os.path.join(tmp, "results")
        plan = json.load(open(os.path.join(res, "plan.json")))
        names = [s["name"] for s in toy_students]
        check([s["name"] for s in plan["students"]] == names, "plan.json lists the toy plan's students")
        timings = {t["step"]: t for t in jsonl(os.path.join(res, "timings.jsonl"))}
        bad = [k for k, t in timings.items() if t["rc"] != 0]
        check(not bad, f"steps that failed: {bad}")
        stages_of = {s["name"]: s.get("stages", "finetune" if s["heads"] == "teacher" else "align,distill,finetune") for s in toy_students}
        for s in names:
            for what in ("niah.jsonl", "lm.json"):
                check(os.path.exists(os.path.join(res, "evals", f"{s}.{what}")), f"{s}: no evals/{s}.{what}")
            ran = {st for st in ("align", "distill", "finetune") if f"{st}-{s}" in timings}
            check(ran == set(stages_of[s].split(",")), f"{s}: stages run {sorted(ran)}, planned {stages_of[s]}")
            logs = {st for st in ("align", "distill", "finetune") if os.path.exists(os.path.join(res, "train", f"{s}-{st}.jsonl"))}
            check(logs == ran, f"{s}: training logs {sorted(logs)}")
            check((f"convert-{s}" in timings) == (s != "x-fair-allfa"), f"{s}: converted iff not the teacher arm")
        info = lambda s: open(os.path.join(res, "models", f"{s}.info.txt")).read()
        check(re.search(r"^\s*qwen3:", info("x-fair-allfa"), re.M) is not None, "the fair all-FA arm is the Qwen3 teacher, fine-tuned")
        heads = json.load(open(os.path.join(res, "heads.json")))
        check(all(len(layer) == plan["select_budget"] for layer in heads["fa_heads"]), f"select_budget per layer: {heads['fa_heads']}")
        lw = fa_heads(os.path.join(res, "models", "l-layer3.info.txt"))
        check(lw == [[], [], [], list(range(8))], f"layerwise:4@3 -> {lw}")
        check(fa_heads(os.path.join(res, "models", "s-random4-d1.info.txt")) != fa_heads(os.path.join(res, "models", "s-random4-d2.info.txt")),
              "two random-global draws differ")
        check(sum(len(x) for x in fa_heads(os.path.join(res, "models", "s-top4.info.txt"))) == 4, "top-global:4: 4 FA heads")
        check("fusion concat" in info("f-concat") and "fusion gate" in info("f-gate"), "fusions as asked")
        d = json.load(open(os.path.join(res, "decisions.json")))
        questions = {r["question"] for r in d["comparisons"]}
        for q in ("E2 K=4", "S per-layer top vs random (K=4)", "L head-wise vs layer-wise 3:1, every position", "X head-wise vs fair all-FA",
                  "L head-wise vs all-FA", "T full vs no align", "T full vs no distill", "T full vs no finetune", "F scale_norm vs concat",
                  "F concat worst: gate vs concat", "F scale_norm vs gate: interaction"):
            check(q in questions, f"decisions.json has no '{q}' comparison")
        claims = json.load(open(os.path.join(res, "claims.json")))
        check(len(claims) == 7 and all(c["verdict"] != "no data" and c["primary"] for c in claims),
              f"every claim read off a comparison: {[(c['claim'][:30], c['verdict']) for c in claims]}")
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: ablation_text_toy_test.py HYDRA_BINARY REPO_ROOT", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
