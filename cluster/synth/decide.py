"""The ablation plan's decisions (called by cluster/synth/report.py): paired comparisons on the NIAH
items every model shares, arms with several training seeds or random draws aggregated, claims per
length band and per task the teacher solves, an equivalence margin, the statistic and its 95%
interval beside each verdict. Writes decisions.md, decisions.json, budget_accuracy.svg (accuracy vs
the FA budget: selected / random / bottom) and head_score_accuracy.svg (each single-head student's
accuracy vs its head's composite score, Spearman ρ).

Arms. Students of the plan with the same head spec and fusion but another training seed are one
arm (`random-global:K@D` with any draw D counts as `random-global:K`); the students an `each-head`
entry expanded into form the single-head landscape, whose members are heads: a random head's
distribution, measured exactly rather than drawn.

F adds the interaction of scale_norm vs gate with the band: Δ outside − Δ inside (normal interval,
the two bootstrap standard errors in quadrature).

Ceiling and floor. A comparison where both arms score ≥ 0.95 on its items (or both ≤ chance + 0.05,
chance being the blind scorer's accuracy on those items: plan.json "chance" per task, 0 when absent)
is marked "at ceiling" / "at floor" whatever its interval: zero discordant items at 1.000 say nothing
about the arms, so such a row is never "equivalent" (nor a win).

Arms added for issue 58: a student's `stages` (a subset of align, distill, finetune: the stage
ablations) is part of its arm; heads `teacher` is the teacher fine-tuned with the students' finetune
tokens (the fair all-FA arm); `layerwise:E@k` students of one E are also pooled into one arm, "layer-wise
at every position" (its members are the positions).

Bands. inside = evaluation lengths up to the finetune length, outside = longer; depths 0–75
("needle in the haystack") apart from depth 100 (the needle right before the question, which a
recurrent state alone can answer); tasks = those the teacher solves at its training length
(accuracy ≥ 0.9), all tasks when it solves none (said in the output).
Standard library only.
"""
import json
import math
import os
import re
import sys

import stats

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import results_files as rf  # noqa: E402  (cluster/: a folder's files, plain, gzipped or archived)

MARGIN = 0.05  # equivalence margin on the accuracy difference (absolute)
CEILING = 0.95  # both arms at or above: at the ceiling
FLOOR = 0.05    # both arms at or below chance + this: at the floor
FULL_STAGES = "align,distill,finetune"


def bound(r, chance):
    """"at ceiling …" / "at floor …" when both arms of the comparison r sit there, else None."""
    if r is None:
        return None
    if r["acc_a"] >= CEILING and r["acc_b"] >= CEILING:
        return f"at ceiling (both ≥ {CEILING:g})"
    if r["acc_a"] <= chance + FLOOR and r["acc_b"] <= chance + FLOOR:
        return f"at floor (both ≤ chance {chance:.2f} + {FLOOR:g})"
    return None


def read_items(path):
    """{(task, length, depth, sample): 0/1} from hydra eval-niah's per-sample lines."""
    items = {}
    if not rf.exists(path):
        return items
    with rf.open_text(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                if r.get("type") == "sample":
                    items[(r["task"], int(r["length"]), int(r["depth"]), int(r["sample"]))] = 1 if r["correct"] else 0
    return items


def arm_key(student):
    heads = student["heads"]
    heads = re.sub(r"^(random-global:\d+)@\d+$", r"\1", heads)
    if heads.startswith("file:") and heads.endswith("/heads.json"):
        heads = "selected"  # select-heads' per-layer choice (plan.json records the run's absolute path)
    stages = student.get("stages", FULL_STAGES)
    # The teacher arm has one stage (finetune) by definition: not an ablation.
    return f"{heads}|{student['fusion']}" + ("" if stages == FULL_STAGES or heads == "teacher" else f"|{stages}")


def band_items(all_items, tasks, lengths, depths):
    return {k for k in all_items if k[0] in tasks and k[1] in lengths and k[2] in depths}


def fmt_cmp(r):
    if r is None:
        return "no shared items"
    s = f"{r['acc_a']:.3f} vs {r['acc_b']:.3f}, Δ {r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}], {r['items']} items"
    if "p_mcnemar" in r:
        s += f", McNemar b={r['b']} c={r['c']} p={r['p_mcnemar']:.3g}"
    else:
        s += f", paired bootstrap over items × members ({r['members_a']} vs {r['members_b']})"
    return s


def svg_open(width, height, title):
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
            '<rect width="100%" height="100%" fill="white"/>', text(width / 2, 20, title, 13, "bold")]


def text(x, y, s, size=11, weight="normal", anchor="middle"):
    s = str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" '
            f'font-family="sans-serif">{s}</text>')


def axes(parts, x0, y0, w, h, xs, xlabel, ylabel):
    parts.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#444"/>')
    for v in (0, 0.5, 1):
        parts.append(text(x0 - 6, y0 + h - v * h + 3, f"{v:.1f}", 9, anchor="end"))
    for label, x in xs:
        parts.append(text(x, y0 + h + 14, label, 9))
    parts.append(text(x0 + w / 2, y0 + h + 28, xlabel, 10))
    parts.append(text(x0 - 32, y0 - 8, ylabel, 10, anchor="start"))


def decide(res, plan, models, teacher_items, items_of, heads_json, margin=MARGIN):
    students = plan.get("students", [])
    lengths = [int(x) for x in plan.get("eval_lengths", [])]
    depths = [int(x) for x in plan.get("depths", [])]
    ft = int(plan.get("finetune_seq_len") or 0)
    train_len = int(plan.get("seq_len") or 0)
    inside = [n for n in lengths if n <= ft]
    outside = [n for n in lengths if n > ft]
    haystack = [d for d in depths if d < 100]
    all_tasks = sorted({k[0] for k in teacher_items} | {k[0] for it in items_of.values() for k in it})
    solved = []
    for t in all_tasks:
        got = [v for k, v in teacher_items.items() if k[0] == t and k[1] == train_len]
        if got and sum(got) / len(got) >= 0.9:
            solved.append(t)
    tasks = solved or all_tasks
    tasks_note = (f"tasks the teacher solves at its training length (≥ 0.9): {', '.join(solved)}" if solved else
                  f"the teacher solves no task at its training length (≥ 0.9): all tasks ({', '.join(all_tasks)}) are used")

    # Arms: students with one head spec and fusion, any seed / draw; the each-head landscape.
    arms, landscape, head_of = {}, [], {}
    for s in students:
        if s["name"] not in items_of or not items_of[s["name"]]:
            continue
        m = re.search(r"/head_sets/(\d+)\.(\d+)\.json$", s["heads"])
        if m:
            landscape.append(s["name"])
            head_of[s["name"]] = (int(m.group(1)), int(m.group(2)))
            continue
        arms.setdefault(arm_key(s), []).append(s["name"])
    members = lambda names: [items_of[n] for n in names]
    find = lambda heads, fusion="scale_norm": arms.get(f"{heads}|{fusion}")
    selected_heads = "selected"
    bands = [("inside, depths 0–75", inside, haystack), ("outside, depths 0–75", outside, haystack),
             ("inside, depth 100", inside, [100]), ("outside, depth 100", outside, [100])]
    rows, lines = [], []

    chance_of = plan.get("chance") or {}

    def chance(universe):
        return sum(float(chance_of.get(k[0], 0.0)) for k in universe) / len(universe) if universe else 0.0

    def compare_one(question, a_label, a_names, b_label, b_names, band, lens, deps, tl):
        universe = band_items(teacher_items or items_of[a_names[0]], tl, lens, deps)
        r = stats.paired_difference(members(a_names), members(b_names), items=universe)
        v = stats.verdict(r["lo"], r["hi"], margin) if r else "missing data"
        v = v.replace("A better", f"{a_label} better").replace("B better", f"{b_label} better")
        at = bound(r, chance(universe))
        if at:
            v = at
        # arm_a/arm_b name the arms (the row's a and b are McNemar's discordant counts when it has them).
        rows.append({"question": question, "a": a_label, "b": b_label, "band": band, "tasks": tl, "verdict": v,
                     "bound": at, "chance": chance(universe), **(r or {}), "arm_a": a_label, "arm_b": b_label})
        lines.append(f"| {question} | {a_label} vs {b_label} | {band} | {fmt_cmp(r)} | **{v}** |")

    def compare(question, a_label, a_names, b_label, b_names, band_list=bands, task_list=None):
        if not a_names or not b_names:
            return
        for band, lens, deps in band_list:
            compare_one(question, a_label, a_names, b_label, b_names, band, lens, deps, task_list or tasks)
            if task_list is None and len(tasks) > 1 and band == "outside, depths 0–75":
                for t in tasks:  # the claim per task the teacher solves
                    compare_one(question, a_label, a_names, b_label, b_names, f"{band}, {t}", lens, deps, [t])

    def interaction(question, a_names, b_names):
        """(Δ outside − Δ inside) at depths 0–75: does the gap between A and B change beyond the finetune
        length? The two Δ come from disjoint items, so their standard errors (bootstrap interval / 3.92)
        add in quadrature; normal 95% interval."""
        d, at = [], []
        for lens in (outside, inside):
            universe = band_items(teacher_items or items_of[a_names[0]], tasks, lens, haystack)
            d.append(stats.paired_difference(members(a_names), members(b_names), items=universe))
            at.append(bound(d[-1], chance(universe)))
        if None in d:
            return
        est = d[0]["diff"] - d[1]["diff"]
        se = math.hypot((d[0]["hi"] - d[0]["lo"]) / 3.92, (d[1]["hi"] - d[1]["lo"]) / 3.92)
        lo, hi = est - 1.96 * se, est + 1.96 * se
        v = stats.verdict(lo, hi, margin).replace("A better", "the gap grows outside").replace("B better", "the gap shrinks outside")
        # Both bands at the ceiling (or floor): the gap is 0 inside and out because neither arm can move.
        both = at[0] if at[0] and at[1] else None
        if both:
            v = both + " inside and outside"
        rows.append({"question": question, "band": "outside − inside, depths 0–75", "diff": est, "lo": lo, "hi": hi,
                     "verdict": v, "tasks": tasks, "bound": both})
        lines.append(f"| {question} | Δ outside − Δ inside | depths 0–75 | {d[0]['diff']:+.3f} − {d[1]['diff']:+.3f} = {est:+.3f} "
                     f"[{lo:+.3f}, {hi:+.3f}] (normal, bootstrap SEs in quadrature) | **{v}** |")

    # E1: the selected head vs a random one (the landscape), and the landscape's Spearman ρ.
    sel1 = find("top-global:1")
    if sel1 and landscape:
        compare("E1 selected vs random head", f"top-global:1 ({len(sel1)} seeds)", sel1,
                f"random head ({len(landscape)} heads)", landscape)
    # E2: dose-response.
    for k in sorted({int(m.group(1)) for key in arms for m in [re.match(r"^top-global:(\d+)\|", key)] if m}):
        top = find(f"top-global:{k}")
        if k == 1:
            continue
        compare(f"E2 K={k}", f"top-global:{k}", top, f"random-global:{k} ({len(find(f'random-global:{k}') or [])} draws)",
                find(f"random-global:{k}"))
        compare(f"E2 K={k}", f"top-global:{k}", top, f"bottom-global:{k}", find(f"bottom-global:{k}"))
    # F: fusion variants against scale_norm at 7:1 selected.
    base = find(selected_heads, "scale_norm")
    for fusion in ("concat", "gate", "norm", "scale"):
        other = find(selected_heads, fusion)
        if base and other:
            per_length = [(f"{n // train_len}×, depths 0–100", [n], depths) for n in lengths]
            compare(f"F scale_norm vs {fusion}", f"scale_norm ({len(base)} seeds)", base, f"{fusion} ({len(other)} seeds)", other,
                    band_list=(per_length if fusion == "concat" else bands[:2]))
            if fusion == "gate":
                interaction(f"F scale_norm vs {fusion}: interaction", base, other)
    # F: concat against every fusion other than scale_norm (the paper: concat is the worst).
    concat = find(selected_heads, "concat")
    for fusion in ("gate", "norm", "scale"):
        other = find(selected_heads, fusion)
        if concat and other:
            compare(f"F concat worst: {fusion} vs concat", f"{fusion} ({len(other)} seeds)", other,
                    f"concat ({len(concat)} seeds)", concat, band_list=bands[:2])
    # L: 7:1 head-wise vs every layer-wise placement and the all-FA student; the default plan's pairs.
    headwise = base
    n_heads = (plan.get("model_shape") or {}).get("heads")
    for key, names in sorted(arms.items()):
        heads = key.split("|")[0]
        if heads.startswith("layerwise:") or heads == "uniform:0" or heads == f"uniform:{n_heads}":
            label = "all-GDN" if heads == "uniform:0" else ("all-FA" if heads == f"uniform:{n_heads}" else heads)
            compare("L head-wise vs " + label, "7:1 head-wise", headwise, label, names)
    # Layer-wise at every position of one period E, pooled (members: the positions).
    by_period = {}
    for key, names in arms.items():
        m = re.match(r"^layerwise:(\d+)@\d+\|scale_norm$", key)
        if m:
            by_period.setdefault(int(m.group(1)), []).extend(names)
    for period, names in sorted(by_period.items()):
        if len(names) > 1:
            compare(f"L head-wise vs layer-wise {period - 1}:1, every position", "7:1 head-wise", headwise,
                    f"layerwise:{period} ({len(names)} positions)", names)
    # The fair all-FA arm: the RoPE teacher fine-tuned with the students' finetune tokens.
    fair = find("teacher")
    if headwise and fair:
        compare("X head-wise vs fair all-FA", "7:1 head-wise", headwise, "teacher fine-tuned", fair)
    rand = find("random:1")
    if headwise and rand:
        compare("selected vs random:1", "7:1 selected", headwise, "7:1 random:1", rand)
    # The central claim at the per-layer choice's own budget: select-heads' per-layer heads against
    # random-global draws of as many heads.
    n_sel = sum(len(layer) for layer in (heads_json or {}).get("fa_heads", []))
    rand_k = find(f"random-global:{n_sel}") if n_sel else None
    if headwise and rand_k:
        compare(f"S per-layer top vs random (K={n_sel})", f"selected per layer ({len(headwise)} seeds)", headwise,
                f"random-global:{n_sel} ({len(rand_k)} draws)", rand_k)
    # Stage ablations: the head-wise students without one stage against the full pipeline.
    for key, names in sorted(arms.items()):
        parts = key.split("|")
        if len(parts) == 3 and parts[0] == selected_heads and parts[1] == "scale_norm" and headwise:
            missing = [st for st in FULL_STAGES.split(",") if st not in parts[2].split(",")]
            compare(f"T full vs no {'+'.join(missing)}", "all three stages", headwise, f"without {'+'.join(missing)}", names)

    # Plots: accuracy vs FA budget; single-head accuracy vs head score.
    def accuracy(names, lens):
        if not names:
            return None
        universe = band_items(teacher_items or items_of[names[0]], tasks, lens, haystack)
        vals = [v for n in names for k, v in items_of[n].items() if k in universe]
        return sum(vals) / len(vals) if vals else None

    budget = {"selected": {}, "random": {}, "bottom": {}}
    for key, names in arms.items():
        m = re.match(r"^(top|random|bottom)-global:(\d+)\|scale_norm$", key)
        if m:
            budget[{"top": "selected", "random": "random", "bottom": "bottom"}[m.group(1)]][int(m.group(2))] = names
    if landscape:
        budget["random"].setdefault(1, landscape)
    # The landscape's ρ outside the finetune length (the paper's claim: the chosen head extrapolates)
    # and inside it (where a small model that never extrapolates still ranks its heads).
    spear, spear_inside = None, None
    points, points_inside = [], []
    if landscape and heads_json and "scores" in heads_json:
        comp = heads_json["scores"]["composite"]
        for n in landscape:
            l, h = head_of[n]
            points.append((comp[l][h], accuracy([n], outside or lengths), n))
            points_inside.append((comp[l][h], accuracy([n], inside), n))
        for pts, which in ((points, "outside"), (points_inside, "inside")):
            pairs = [(x, y) for x, y, _ in pts if y is not None]
            if len(pairs) >= 3:
                rho = stats.spearman([p[0] for p in pairs], [p[1] for p in pairs])
                if which == "outside":
                    spear = rho
                else:
                    spear_inside = rho
    with open(os.path.join(res, "budget_accuracy.svg"), "w") as f:
        f.write(budget_svg(budget, accuracy, inside, outside))
    with open(os.path.join(res, "head_score_accuracy.svg"), "w") as f:
        f.write(scatter_svg(points, spear))

    out = ["# Decisions: paired comparisons on shared NIAH items", "",
           f"Every model answered the same items (eval-niah seed {plan.get('eval_seed')}: task × length × depth × sample). "
           "Δ = accuracy of A − B over the items of the band; the 95% interval is a paired bootstrap (2000 resamples of the "
           "items, and of the training seeds / random draws / heads within an arm that has several); McNemar's exact p "
           f"is given where both arms are one model. Verdict: A or B better when the interval excludes 0; **equivalent** "
           f"when it lies within ±{margin:g} (the equivalence margin); **undecided** otherwise; and whatever the interval, "
           f"**at ceiling** when both arms score ≥ {CEILING:g} on the band's items, **at floor** when both score ≤ "
           f"chance + {FLOOR:g}: arms that cannot move are not compared.", "",
           f"Bands: inside = lengths ≤ the finetune length {ft} ({', '.join(map(str, inside))}), outside = longer "
           f"({', '.join(map(str, outside)) or 'none'}); depths 0–75 apart from depth 100. Tasks: {tasks_note}.", "",
           "| question | A vs B | band | A vs B accuracy, Δ [95%], items, test | verdict |", "|---|---|---|---|---|"]
    out += lines or ["| — | no comparison of this plan's arms had data | | | |"]
    for rho, band in ((spear, "outside"), (spear_inside, "inside")):
        if rho:
            out += ["", f"Single-head landscape ({len(points)} students): Spearman ρ of head score (composite) vs accuracy "
                    f"{band} the finetune length, depths 0–75 = {rho[0]:.3f} [{rho[1]:.3f}, {rho[2]:.3f}] (95% bootstrap over heads)."]
    out += ["", "Plots: budget_accuracy.svg (accuracy at depths 0–75 vs FA heads in the model), head_score_accuracy.svg."]
    with open(os.path.join(res, "decisions.md"), "w") as f:
        f.write("\n".join(out) + "\n")
    with open(os.path.join(res, "decisions.json"), "w") as f:
        json.dump({"margin": margin, "tasks": tasks, "inside": inside, "outside": outside, "comparisons": rows,
                   "spearman": spear, "spearman_inside": spear_inside,
                   "landscape": [{"name": n, "score": x, "accuracy": y, "accuracy_inside": yi}
                                 for (x, y, n), (_, yi, _) in zip(points, points_inside)]}, f, indent=1)
    return out


def budget_svg(budget, accuracy, inside, outside):
    w, h, pad = 300, 200, 60
    parts = svg_open(2 * (w + pad) + pad, h + 110, "NIAH accuracy (depths 0–75) vs FA heads in the model")
    colors = {"selected": "#d62728", "random": "#1f77b4", "bottom": "#7f7f7f"}
    ks = sorted({k for v in budget.values() for k in v}) or [1]
    for pi, (label, lens) in enumerate((("inside the finetune length", inside), ("outside", outside))):
        x0, y0 = pad + pi * (w + pad), 50
        sx = lambda k: x0 + (ks.index(k) + 0.5) / len(ks) * w
        axes(parts, x0, y0, w, h, [(k, sx(k)) for k in ks], f"FA heads (K) — {label}", "accuracy")
        for li, (series, by_k) in enumerate(budget.items()):
            pts = [(sx(k), accuracy(names, lens)) for k, names in sorted(by_k.items())]
            pts = [(x, y0 + h - a * h) for x, a in pts if a is not None]
            if len(pts) > 1:
                parts.append(f'<polyline points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in pts)}" fill="none" '
                             f'stroke="{colors[series]}" stroke-width="1.5"/>')
            for x, y in pts:
                parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colors[series]}"/>')
            parts.append(f'<rect x="{x0 + 8}" y="{y0 + 8 + li * 14}" width="10" height="3" fill="{colors[series]}"/>')
            parts.append(text(x0 + 22, y0 + 13 + li * 14, series, 9, anchor="start"))
    parts.append("</svg>")
    return "\n".join(parts)


def scatter_svg(points, spear):
    w, h, pad = 420, 260, 60
    title = "Single-head students: accuracy outside the finetune length (depths 0–75) vs head score"
    if spear:
        title += f" — Spearman ρ {spear[0]:.2f} [{spear[1]:.2f}, {spear[2]:.2f}]"
    parts = svg_open(w + 2 * pad, h + 100, title)
    pts = [(x, y, n) for x, y, n in points if y is not None and math.isfinite(x)]
    x0, y0 = pad, 50
    if not pts:
        axes(parts, x0, y0, w, h, [], "head score (composite)", "accuracy")
        parts.append(text(x0 + w / 2, y0 + h / 2, "no single-head students", 11))
    else:
        lo, hi = min(p[0] for p in pts), max(p[0] for p in pts)
        hi = hi if hi > lo else lo + 1
        sx = lambda v: x0 + (v - lo) / (hi - lo) * w
        axes(parts, x0, y0, w, h, [(f"{lo:.3g}", x0), (f"{hi:.3g}", x0 + w)], "head score (composite)", "accuracy")
        for x, y, n in pts:
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{y0 + h - y * h:.1f}" r="4" fill="#1f77b4" opacity="0.7"><title>{n}</title></circle>')
    parts.append("</svg>")
    return "\n".join(parts)


def main(res):
    """Decisions and claims of a results folder from its plan.json, evals/ and heads.json (what report.py
    does for these two files, without rewriting the others)."""
    import claims
    plan = json.loads(rf.read_text(os.path.join(res, "plan.json")))
    models = ["teacher"] + [st["name"] for st in plan.get("students", [])]
    items_of = {m: read_items(os.path.join(res, "evals", f"{m}.niah.jsonl")) for m in models}
    heads_path = os.path.join(res, "heads.json")
    heads_json = json.loads(rf.read_text(heads_path)) if rf.exists(heads_path) else None
    decide(res, plan, models, items_of.get("teacher", {}), items_of, heads_json)
    with open(os.path.join(res, "decisions.json")) as f:
        claims.write(res, json.load(f), plan)
    print(f"decide: wrote decisions.md, decisions.json, claims.md, claims.json, budget_accuracy.svg, "
          f"head_score_accuracy.svg in {res}")
    return 0


if __name__ == "__main__":
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if len(sys.argv) != 2:
        print("usage: decide.py RESULTS_DIR  (decisions.md/json and claims.md/json from plan.json and evals/)", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
