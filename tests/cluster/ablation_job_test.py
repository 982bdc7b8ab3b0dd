#!/usr/bin/env python3
"""CTest synth_ablation_job.toy: the ablation GPU job (cluster/synth/ablation_job.sh) at toy size on
the CPU, both calls through the job harness (cluster/gpu_job.sh) exactly as the jobs files run them
but with --profile toy and the CI plans (plans/ablation_toy_call*.json): call 1 trains a teacher and
leaves it in $OUT in parts with the step counts; call 2 starts from what call 1 left (the lead
carries it as .device/). Asserts: both calls exit 0; the carried files are within the device's
limits (at most 8 files, each under 16 MiB); call 2's teacher is call 1's (same SHA-256) and its
stages have call 1's step counts; every student of both plans was trained and evaluated; the head
sets named by rank are what heads.json says (same-layer:2 in the best head's layer, other-layer:1
outside it). A toy run cannot learn, so no accuracy is asserted.
Usage: ablation_job_test.py HYDRA_BINARY REPO_ROOT
"""
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from hydra_testlib import check, failures, fa_heads


def run_call(root, hydra, tmp, call, carry_in):
    out = os.path.join(tmp, f"out{call}")
    os.makedirs(out)
    name = f"ablationtest{os.getpid()}c{call}"
    plans = [os.path.join(root, "cluster/synth/plans", f"ablation_toy_call{k}.json") for k in (1, 2)]
    jobs = os.path.join(tmp, f"call{call}.jobs")
    with open(jobs, "w") as f:
        f.write(f"ablation{call} 500 bash {root}/cluster/synth/ablation_job.sh --call {call} --profile toy --hydra {hydra} "
                f"--results $R --carry-in {carry_in} --plan1 {plans[0]} --plan2 {plans[1]} --deadline-s 480\n")
    r = subprocess.run(["bash", os.path.join(root, "cluster/gpu_job.sh"), "--name", name, "--deadline", "520", jobs],
                       cwd=tmp, env=dict(os.environ, OUT=out), capture_output=True, text=True, timeout=600)
    print(r.stdout[-4000:], r.stderr[-2000:])
    check(r.returncode == 0, f"call {call}: gpu_job.sh exited {r.returncode}")
    files = os.listdir(out)
    check(len(files) <= 8 and all(os.path.getsize(os.path.join(out, f)) < 16 << 20 for f in files),
          f"call {call}: $OUT holds {[(f, os.path.getsize(os.path.join(out, f))) for f in files]}")
    res = os.path.join(tmp, f"res{call}")
    with tarfile.open(os.path.join(out, f"{name}.tgz")) as tar:
        tar.extractall(res)
    shutil.rmtree(f"/tmp/{name}", ignore_errors=True)
    return out, os.path.join(res, name)


def main(hydra, root):
    with tempfile.TemporaryDirectory() as tmp:
        out1, r1 = run_call(root, hydra, tmp, 1, os.path.join(tmp, "none"))
        parts = sorted(f for f in os.listdir(out1) if f.startswith("teacher.h5.xz."))
        check(len(parts) >= 1, f"call 1 left no teacher parts: {os.listdir(out1)}")
        check(os.path.exists(os.path.join(out1, "ablation_steps.env")), "call 1 left no ablation_steps.env")
        check(os.path.exists(os.path.join(out1, "heads.json")), "call 1 left no heads.json")
        probe = [json.loads(l) for l in open(os.path.join(r1, "teacher", "probe.jsonl"))]
        check(len(probe) == 1 and all(p.get("steps_done") == p.get("steps_planned") for p in probe[0]["phases"]),
              f"teacher phases {probe}")
        check(all(len(p["niah_multivalue"]) >= 1 for p in probe[0]["phases"]), "the teacher's multivalue curve")
        out2, r2 = run_call(root, hydra, tmp, 2, out1)
        sha = [open(os.path.join(r, "teacher", "teacher.sha256")).read().strip() for r in (r1, r2)]
        check(len(sha[0]) == 64 and sha[0] == sha[1], f"teacher SHA-256 of the calls {sha}")
        steps = dict(l.strip().split("=") for l in open(os.path.join(out1, "ablation_steps.env")) if l.strip())
        plans = [json.load(open(os.path.join(r, f"call{k}", "plan.json"))) for k, r in ((1, r1), (2, r2))]
        for stage in ("align", "distill", "finetune"):
            check(plans[0]["stages"][stage]["steps"] == plans[1]["stages"][stage]["steps"] == int(steps[f"steps_{stage}"]),
                  f"{stage}: steps {plans[0]['stages'][stage]['steps']} vs {plans[1]['stages'][stage]['steps']} vs {steps}")
        check(plans[0]["probe"] is not None and plans[1]["probe"] is None, "call 1 probes, call 2 reuses its steps")
        want = {1: ["e1-selected", "e3-same", "e3-other", "e1-head-1.0", "e1-head-1.5"],
                2: ["f-scale_norm", "l-allfa", "l-layer2", "e2-bottom2", "e2-random2-d1"]}
        for k, r in ((1, r1), (2, r2)):
            res = os.path.join(r, f"call{k}")
            check([s["name"] for s in plans[k - 1]["students"]] == want[k], f"call {k} students {plans[k - 1]['students']}")
            timings = {t["step"]: t for t in map(json.loads, open(os.path.join(res, "timings.jsonl")))}
            for s in want[k] + ["teacher"]:
                for step in [f"eval-lm-{s}", f"eval-niah-{s}"] + ([f"convert-{s}", f"finetune-{s}"] if s != "teacher" else []):
                    check(timings.get(step, {}).get("rc") == 0, f"call {k} step {step}: {timings.get(step)}")
            cells = [json.loads(l) for l in open(os.path.join(res, "evals", f"{want[k][0]}.niah.jsonl"))]
            check(any(c.get("type") == "cell" for c in cells), f"call {k}: NIAH cells")
        res1 = os.path.join(r1, "call1")
        # Call 2 used call 1's head scores (no second select-heads); they carry the concentration and group effects.
        h1, h2 = (json.load(open(os.path.join(r, f"call{k}", "heads.json"))) for k, r in ((1, r1), (2, r2)))
        check(h1 == h2, "call 2's heads.json is call 1's")
        check("select-heads" not in {t["step"] for t in map(json.loads, open(os.path.join(r2, "call2", "timings.jsonl")))},
              "call 2 ran select-heads again")
        check(len(h1["selection"]["groups"]["layer_total"]) == 4 and len(h1["selection"]["concentration"]["layer_share"]) == 4,
              f"heads.json groups / concentration {h1['selection'].get('groups')}")
        composite = json.load(open(os.path.join(res1, "heads.json")))["scores"]["composite"]
        ranked = sorted(((composite[l][h], l, h) for l in range(4) for h in range(8)), key=lambda x: (-x[0], x[1], x[2]))
        info = {s: fa_heads(os.path.join(res1, "models", f"{s}.info.txt")) for s in want[1]}
        top_l, top_h = ranked[0][1], ranked[0][2]
        check(info["e1-selected"][top_l] == [top_h] and sum(map(len, info["e1-selected"])) == 1, f"e1-selected {info['e1-selected']}")
        same = [(l, h) for _, l, h in ranked if l == top_l][1]
        other = [(l, h) for _, l, h in ranked if l != top_l][0]
        check(info["e3-same"][same[0]] == [same[1]] and sum(map(len, info["e3-same"])) == 1, f"e3-same {info['e3-same']} vs {same}")
        check(info["e3-other"][other[0]] == [other[1]] and sum(map(len, info["e3-other"])) == 1, f"e3-other {info['e3-other']} vs {other}")
        check(info["e1-head-1.5"] == [[], [5], [], []], f"e1-head-1.5 {info['e1-head-1.5']}")
        check(os.path.exists(os.path.join(r1, "test_cuda.log")) is False, "no test_cuda without --test-cuda")
        # The two calls merged into one report: comparisons across the calls (E1 from call 1, L from call 2).
        merged = os.path.join(tmp, "merged")
        m = subprocess.run([sys.executable, os.path.join(root, "cluster/synth/merge_results.py"), merged, res1, os.path.join(r2, "call2")],
                           capture_output=True, text=True)
        check(m.returncode == 0, f"merge_results: {m.stdout}{m.stderr}")
        subprocess.run([sys.executable, os.path.join(root, "cluster/synth/report.py"), merged], capture_output=True, text=True)
        d = json.load(open(os.path.join(merged, "decisions.json")))
        questions = {c["question"] for c in d["comparisons"]}
        check(any(q.startswith("E1") for q in questions) and any(q.startswith("L head-wise vs all-FA") for q in questions),
              f"merged decisions {sorted(questions)}")
        again = subprocess.run([sys.executable, os.path.join(root, "cluster/synth/merge_results.py"), os.path.join(tmp, "m2"), res1, res1],
                               capture_output=True, text=True)
        check(again.returncode == 2 and "appear in more than one folder" in again.stderr, f"a folder merged twice: {again.stderr}")
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
