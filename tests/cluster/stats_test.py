#!/usr/bin/env python3
"""CTest synth_stats: the statistics behind the ablation report (cluster/synth/stats.py), its
decisions (decide.py) and the plan format (plan.py), on cases whose answers are known:
exact McNemar p-values computed by hand, paired differences whose sign and width are fixed by
construction, Spearman's ρ with ties against its hand value, the power function against a seeded
Monte Carlo of the same test, a synthetic results folder where the selected head is right on every
item and the landscape is not, and plans with every kind of mistake.
Usage: stats_test.py REPO_ROOT
"""
import json
import math
import os
import random
import subprocess
import sys
import tempfile

root = sys.argv[1]
sys.path.insert(0, os.path.join(root, "cluster", "synth"))
import decide  # noqa: E402
import plan as planmod  # noqa: E402
import stats  # noqa: E402
from hydra_testlib import check, failures  # noqa: E402


def close(a, b, tol):
    return abs(a - b) <= tol


# ---- McNemar, exact: 2 * P(Binomial(b + c, 1/2) <= min(b, c)).
check(stats.mcnemar_exact(0, 0) == 1.0, "no discordant pair: p = 1")
check(close(stats.mcnemar_exact(10, 0), 2 * 0.5 ** 10, 1e-12), f"(10, 0): {stats.mcnemar_exact(10, 0)}")
check(close(stats.mcnemar_exact(3, 12), 2 * (1 + 15 + 105 + 455) / 2 ** 15, 1e-12), f"(3, 12): {stats.mcnemar_exact(3, 12)}")
check(stats.mcnemar_exact(3, 12) == stats.mcnemar_exact(12, 3), "symmetric")
check(stats.mcnemar_exact(5, 5) == 1.0, "(5, 5): p capped at 1")

# ---- Paired differences.
items = list(range(200))
right = {i: 1 for i in items}
wrong = {i: 0 for i in items}
half = {i: i % 2 for i in items}
r = stats.paired_difference([right], [wrong])
check(r["diff"] == 1.0 and r["b"] == 200 and r["c"] == 0 and r["p_mcnemar"] < 1e-50, f"right vs wrong {r}")
check(stats.verdict(r["lo"], r["hi"], 0.05) == "A better", "right vs wrong: A better")
r = stats.paired_difference([half], [dict(half)])
check(r["diff"] == 0 and close(r["lo"], -3 / 200, 1e-12) and close(r["hi"], 3 / 200, 1e-12), f"equal arms: ±3/n {r}")
check(stats.verdict(r["lo"], r["hi"], 0.05).startswith("equivalent"), "equal arms on 200 items: equivalent within 0.05")
check(stats.verdict(-0.01, 0.08, 0.05) == "undecided" and stats.verdict(-0.2, -0.01, 0.05) == "B better", "verdicts")
# The same two arms on fewer items: the same point estimate, a wider interval.
r20 = stats.paired_difference([half], [dict(half)], items=range(20))
check(r20["items"] == 20 and r20["hi"] - r20["lo"] > 0.25, f"20 items: wide interval {r20}")
# Items answered differently on half of them, in both directions equally often: Δ = 0, McNemar p = 1.
flip = {i: 1 - v if i % 4 < 2 else v for i, v in half.items()}
r = stats.paired_difference([half], [flip])
check(r["diff"] == 0 and r["b"] == r["c"] == 50 and r["p_mcnemar"] == 1.0 and r["lo"] < -0.05 < 0.05 < r["hi"],
      f"50/50 discordant: undecided {r}")
# Seeds: arm A's two seeds are all right and all wrong (mean 0.5), B is 0.5 on every item: Δ = 0, but the
# seed-to-seed spread must make the interval wide (resampling members), not the ±3/n of one model.
r = stats.paired_difference([right, wrong], [{i: 0.5 for i in items}])
check(r["diff"] == 0 and r["hi"] - r["lo"] > 0.9, f"seed spread widens the interval {r}")
check("p_mcnemar" not in r, "no McNemar p for arms of several members")
# Only shared items count.
r = stats.paired_difference([{1: 1, 2: 1}], [{2: 0, 3: 0}])
check(r["items"] == 1 and r["diff"] == 1, f"shared items only {r}")
check(stats.paired_difference([{1: 1}], [{2: 0}]) is None, "no shared item: None")
r = stats.paired_difference([{1: 1}], [{1: 1}])
check(r["lo"] == -1.0 and r["hi"] == 1.0, f"one item: the interval is the whole [-1, 1] {r}")

# ---- Spearman with ties: ranks x = [1, 2.5, 2.5, 4] against [1, 2, 3, 4] -> 4.5 / sqrt(4.5 * 5).
rho, lo, hi = stats.spearman([1, 2, 2, 3], [1, 2, 3, 4])
check(close(rho, 4.5 / math.sqrt(22.5), 1e-12), f"Spearman with ties {rho}")
check(close(stats.spearman([1, 2, 3, 4, 5], [2, 4, 8, 16, 32])[0], 1.0, 1e-12), "monotone: 1")
check(close(stats.spearman([1, 2, 3, 4, 5], [5, 3, 2, 1, 0])[0], -1.0, 1e-12), "reversed: -1")
check(stats.ranks([3, 1, 3, 2]) == [3.5, 1, 3.5, 2], f"ranks {stats.ranks([3, 1, 3, 2])}")

# ---- Power against a seeded Monte Carlo of the same test (independent errors).
rng = random.Random(7)
n, pa, pb, runs = 80, 0.95, 0.80, 3000
hits = 0
for _ in range(runs):
    b = c = 0
    for _ in range(n):
        a_ok, b_ok = rng.random() < pa, rng.random() < pb
        b += a_ok and not b_ok
        c += b_ok and not a_ok
    hits += stats.mcnemar_exact(b, c) < 0.05
power = stats.mcnemar_power(n, pa, pb)
check(abs(power - hits / runs) < 0.03, f"power {power:.3f} vs Monte Carlo {hits / runs:.3f}")
check(stats.mcnemar_power(80, 0.7, 0.7) < 0.05, "no difference: power below alpha")

# ---- decide(): the selected head right everywhere, the landscape's heads right with their score.
with tempfile.TemporaryDirectory() as res:
    lengths, depths = [64, 256], [0, 50, 100]
    keys = [(t, n, d, s) for t in ("single", "multikey") for n in lengths for d in depths for s in range(10)]
    composite = [[0.1 * (l * 4 + h) for h in range(4)] for l in range(2)]
    students, items_of = [], {"teacher": {k: 1 for k in keys}}
    for seed in (1, 2, 3):
        students.append({"name": f"sel-s{seed}", "heads": "top-global:1", "fusion": "scale_norm", "seed": seed, "curves": False})
        items_of[f"sel-s{seed}"] = {k: 1 for k in keys}
    rng = random.Random(3)
    for l in range(2):
        for h in range(4):
            name = f"head-{l}.{h}"
            students.append({"name": name, "heads": f"file:/x/head_sets/{l}.{h}.json", "fusion": "scale_norm", "seed": 1, "curves": False})
            p = (l * 4 + h) / 10  # accuracy rises with the score
            items_of[name] = {k: int(rng.random() < p) for k in keys}
    plan = {"students": students, "eval_lengths": lengths, "depths": depths, "finetune_seq_len": 128, "seq_len": 64,
            "eval_seed": 1, "model_shape": {"layers": 2, "heads": 4}}
    decide.decide(res, plan, ["teacher"] + [s["name"] for s in students], items_of["teacher"], items_of,
                  {"fa_heads": [[], []], "scores": {"composite": composite}})
    d = json.load(open(os.path.join(res, "decisions.json")))
    e1 = [c for c in d["comparisons"] if c["question"].startswith("E1")]
    check(len(e1) == 4 + 2 and all(c["verdict"] == "top-global:1 (3 seeds) better" for c in e1 if "depths 0–75" in c["band"]),
          f"E1 verdicts {[(c['band'], c['verdict']) for c in e1]}")
    check(d["inside"] == [64] and d["outside"] == [256] and d["tasks"] == ["multikey", "single"], f"bands {d['inside']} {d['outside']} {d['tasks']}")
    check(d["spearman"] is not None and d["spearman"][0] > 0.8, f"Spearman of score vs accuracy {d['spearman']}")
    check(len(d["landscape"]) == 8, "8 single-head students")
    for svg in ("budget_accuracy.svg", "head_score_accuracy.svg"):
        body = open(os.path.join(res, svg)).read()
        check(body.count("<circle") >= 2, f"{svg}: points drawn")

# ---- decide(): F's interaction — gate equal to scale_norm inside, worse outside: the gap grows outside.
with tempfile.TemporaryDirectory() as res:
    lengths, depths = [64, 256], [0, 50, 100]
    keys = [(t, n, d, s) for t in ("single",) for n in lengths for d in depths for s in range(40)]
    items_of = {"teacher": {k: 1 for k in keys}}
    students = []
    for seed in (1, 2):
        students.append({"name": f"sn{seed}", "heads": "file:/r/heads.json", "fusion": "scale_norm", "seed": seed, "curves": False})
        items_of[f"sn{seed}"] = {k: 1 for k in keys}
        students.append({"name": f"g{seed}", "heads": "file:/r/heads.json", "fusion": "gate", "seed": seed, "curves": False})
        items_of[f"g{seed}"] = {k: (1 if k[1] == 64 or k[3] % 2 else 0) for k in keys}
    plan = {"students": students, "eval_lengths": lengths, "depths": depths, "finetune_seq_len": 128, "seq_len": 64,
            "eval_seed": 1, "model_shape": {"layers": 1, "heads": 2}}
    decide.decide(res, plan, ["teacher"] + [s["name"] for s in students], items_of["teacher"], items_of, None)
    rows = {(c["question"], c["band"]): c for c in json.load(open(os.path.join(res, "decisions.json")))["comparisons"]}
    inter = rows.get(("F scale_norm vs gate: interaction", "outside − inside, depths 0–75"))
    check(inter is not None and close(inter["diff"], 0.5, 1e-12) and inter["verdict"] == "the gap grows outside",
          f"interaction {inter}")
    inside_row = rows.get(("F scale_norm vs gate", "inside, depths 0–75"))
    # Both arms answer every inside item: at the ceiling, never "equivalent".
    check(inside_row is not None and inside_row["diff"] == 0 and inside_row["verdict"].startswith("at ceiling"), f"inside {inside_row}")

# ---- plan.py: every mistake named on one line; expansions exact.
bad = {"students": [{"name": "a", "heads": "selected"}, {"name": "a", "heads": "uniform:1"},
                    {"name": "b c", "heads": "x"}, {"name": "d", "heads": "uniform:1", "fusion": "mean"},
                    {"name": "e", "heads": "uniform:1", "seed": -1}, {"name": "teacher", "heads": "uniform:1"},
                    {"name": "f", "heads": "each-head@x"}, {"name": "g", "heads": "uniform:1", "extra": 1}]}
bad["students"] += [{"name": "s1", "heads": "selected", "stages": "finetune,align"}, {"name": "s2", "heads": "selected", "stages": "pretrain"},
                    {"name": "s3", "heads": "teacher", "stages": "align,finetune"}, {"name": "s4", "heads": "selected", "stages": ""}]
msgs = planmod.problems(bad)
check(sum("stages" in m for m in msgs) == 3 and any("the teacher arm goes through finetune only" in m for m in msgs),
      f"stage mistakes: {[m for m in msgs if 'stages' in m]}")
check(not planmod.problems({"students": [{"name": "t", "heads": "teacher"}, {"name": "n", "heads": "selected", "stages": "align,finetune"}]}),
      "teacher arm and a stage ablation are sound")
for want in ("name 'a' is used twice", "name 'b c' must be", "heads 'x' is not", "fusion 'mean' is not one of",
             "seed -1 must be", "name 'teacher' must be", "heads 'each-head@x' is not", "unknown keys ['extra']"):
    check(any(want in m for m in msgs), f"plan problem '{want}' not reported: {msgs}")
check(all("\n" not in m for m in msgs), "one line per problem")
check(planmod.problems({"students": []}) == ["'students' must be a non-empty list"], "empty plan")
with tempfile.TemporaryDirectory() as res:
    rows = planmod.expand({"students": [{"name": "h", "heads": "each-head@1/0,5"}, {"name": "s", "heads": "selected", "seed": 3},
                                        {"name": "t", "heads": "top-global:2", "fusion": "gate", "curves": False},
                                        {"name": "a", "heads": "all-fa"}]}, 4, 8, res)
    check([r[0] for r in rows] == ["h-1.0", "h-1.5", "s", "t", "a"], f"expanded names {[r[0] for r in rows]}")
    check(json.load(open(os.path.join(res, "head_sets", "1.5.json")))["fa_heads"] == [[], [5], [], []], "each-head file")
    check(rows[2][1] == f"file:{res}/heads.json" and rows[2][4] == 3, f"selected row {rows[2]}")
    check(rows[3][1:] == ("top-global:2", f"{res}/heads.json", "gate", 1, False, "align,distill,finetune"), f"top-global row {rows[3]}")
    st = planmod.expand({"students": [{"name": "na", "heads": "selected", "stages": "distill,finetune"},
                                      {"name": "ft", "heads": "teacher"}]}, 4, 8, res)
    check(st[0][6] == "distill,finetune" and st[1][1] == "teacher" and st[1][6] == "finetune", f"stages rows {st}")
    check(rows[4][1] == "uniform:8", f"all-fa row {rows[4]}")
    comp = [[0.0] * 8 for _ in range(4)]
    comp[2][3], comp[2][6], comp[0][1], comp[1][7] = 9.0, 8.0, 5.0, 7.0
    json.dump({"format": "hydrahead-fa-heads", "version": 1, "fa_heads": [[]] * 4, "scores": {"composite": comp}},
              open(os.path.join(res, "heads.json"), "w"))
    same = planmod.resolve("same-layer:2", res)
    other = planmod.resolve("other-layer:1", res)
    check(json.load(open(same[5:]))["fa_heads"] == [[], [], [6], []], f"same-layer:2 -> {open(same[5:]).read()}")
    check(json.load(open(other[5:]))["fa_heads"] == [[], [7], [], []], f"other-layer:1 -> {open(other[5:]).read()}")
    check(planmod.resolve("uniform:1", res) == "uniform:1", "other specs unchanged")
    check(planmod.probe_spec("top-global:4", 8) == "random-global:4" and planmod.probe_spec("all-fa", 8) == "uniform:8",
          "probe specs")
r = subprocess.run([sys.executable, os.path.join(root, "cluster/synth/plan.py"), "check", "/nonexistent.json"], capture_output=True, text=True)
check(r.returncode != 0 and r.stderr.count("\n") == 1, f"missing plan file: {r.returncode} {r.stderr!r}")
for name in ("default", "toy", "ablation_call1", "ablation_call2", "ablation_toy_call1", "ablation_toy_call2"):
    check(planmod.problems(json.load(open(os.path.join(root, "cluster/synth/plans", f"{name}.json")))) == [], f"plans/{name}.json")

print(f"stats_test: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
