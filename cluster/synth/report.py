#!/usr/bin/env python3
"""Tables, plots and a claims check from a results folder of cluster/synth/pipeline.sh.

Reads (all written by the pipeline): plan.json, timings.jsonl, models/NAME.info.txt (hydra info),
evals/NAME.niah.jsonl (hydra eval-niah), evals/NAME.lm.json (hydra eval-lm), train/NAME-STAGE.jsonl
(hydra train logs), heads.json (select-heads). Writes into the same folder:

  table.md          models (FA heads, KV cache per token, GDN state, LM loss, NIAH accuracy by task and
                    length), planned budgets, and the wall time of every step
  summary.json      the same numbers for scripts
  niah_heatmaps.svg accuracy by depth x length, one panel per model and task
  loss_curves.svg   training (lines) and held-out (dots) loss of every stage
  claims.md         (claims.py) the paper's claims, each reproduced / not reproduced / undecided off
                    its paired comparison in decisions.json, "undecided (at ceiling/floor)" where both
                    arms sit at 0.95+ or at chance; claims.json

  decisions.md      (decide.py) the plan's arms compared item by item on the NIAH items all models
                    share: Δ accuracy with a 95% paired-bootstrap interval (McNemar's exact p for
                    single models), seeds and random draws aggregated, per length band (inside /
                    outside the finetune length), depths 0–75 apart from depth 100, per task the
                    teacher solves, verdicts against an equivalence margin; decisions.json
  budget_accuracy.svg, head_score_accuracy.svg   accuracy vs FA budget (selected / random / bottom)
                    and single-head accuracy vs head score (Spearman ρ)
  stage_curves.md, stage_curves.svg   (curves.py) NIAH and LM loss of the students with curves after
                    conversion and at every checkpoint of every stage

Standard library only (json, statistics, re), so it runs on CI machines and the GPU image alike.
Missing pieces (a step that failed or was cut by the deadline) are reported as missing, never
invented. Exit status 0 when every model has its evaluations, 1 otherwise.
"""
import json
import math
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import claims  # noqa: E402  (beside this file)
import curves as stage_curves  # noqa: E402
import decide  # noqa: E402
import results_files as rf  # noqa: E402  (cluster/: a folder's files, plain, gzipped or archived)

# The default plan's students have names the claims below know; a plan's other students are listed
# under their own names and head specs (plan.json "students").
MODELS = ["teacher", "selected", "random", "layerwise", "gdn", "allfa"]
LABELS = {"teacher": "teacher (Qwen3, all FA)", "selected": "7:1 head-wise, selected heads",
          "random": "7:1 head-wise, random heads", "layerwise": "3:1 layer-wise", "gdn": "all-GDN",
          "allfa": "all-FA student"}
SHORT = {"teacher": "teacher", "selected": "7:1 selected", "random": "7:1 random", "layerwise": "3:1 layer-wise",
         "gdn": "all-GDN"}
TASKS = ["single", "multikey", "multivalue"]
STAGES = ["pretrain", "align", "distill", "finetune"]
COLORS = {"teacher": "#222222", "selected": "#d62728", "random": "#1f77b4", "layerwise": "#2ca02c", "gdn": "#9467bd"}


def read_jsonl(path):
    if not rf.exists(path):
        return []
    out = []
    with rf.open_text(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def read_json(path):
    if not rf.exists(path):
        return None
    with rf.open_text(path) as f:
        return json.load(f)


def parse_info(path):
    """hydra info's text: H, G, d, layers and every layer's FA heads."""
    if not rf.exists(path):
        return None
    text = rf.read_text(path)
    m = re.search(r"(\d+) layers, D=(\d+), H=(\d+), G=(\d+), d=(\d+)", text)
    if not m:
        return None
    layers, hidden, heads, groups, d = (int(x) for x in m.groups())
    fa = []
    for lm in re.finditer(r"layer\s+(\d+): FA heads \[([^\]]*)\]", text):
        fa.append([int(x) for x in lm.group(2).replace(" ", "").split(",") if x != ""])
    if re.search(r"^\s*qwen3:", text, re.M):  # a teacher: every head is softmax attention
        fa = [list(range(heads)) for _ in range(layers)]
    group = heads // groups
    kv_heads = sum(len({h // group for h in layer}) for layer in fa)
    fa_heads = sum(len(layer) for layer in fa)
    gdn_heads = layers * heads - fa_heads
    return {"layers": layers, "hidden": hidden, "heads": heads, "kv_groups": groups, "head_dim": d, "fa_heads": fa,
            "fa_head_count": fa_heads, "gdn_head_count": gdn_heads,
            "kv_cache_per_token": 2 * d * kv_heads,      # K and V elements each token adds (FA KV heads)
            "gdn_state": gdn_heads * d * d}              # fixed recurrent state elements (any length)


def niah_cells(path):
    """{(task, length): {"accuracy", "samples", "correct", "by_depth": {depth: accuracy}}}"""
    cells = {}
    for c in read_jsonl(path):
        if c.get("type") != "cell":
            continue
        key = (c["task"], int(c["length"]))
        e = cells.setdefault(key, {"samples": 0, "correct": 0, "by_depth": {}, "depth_counts": {}})
        e["samples"] += int(c["samples"])
        e["correct"] += int(c["correct"])
        e["by_depth"][int(c["depth"])] = float(c["accuracy"])
        e["depth_counts"][int(c["depth"])] = (int(c["correct"]), int(c["samples"]))
    for e in cells.values():
        e["accuracy"] = e["correct"] / e["samples"] if e["samples"] else float("nan")
    return cells


def fmt(x, digits=3):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}f}"


def pooled(cells, lengths, tasks=TASKS):
    """(correct, samples) over the cells of these tasks and lengths; None when there are none."""
    got = [cells[(t, n)] for t in tasks for n in lengths if (t, n) in cells]
    if not got:
        return None
    return sum(e["correct"] for e in got), sum(e["samples"] for e in got)


def wilson(correct, samples, z=1.959964):
    """The 95% Wilson score interval of a binomial proportion (correct of samples)."""
    if samples <= 0:
        return None
    p = correct / samples
    denom = 1 + z * z / samples
    centre = (p + z * z / (2 * samples)) / denom
    half = z * math.sqrt(p * (1 - p) / samples + z * z / (4 * samples * samples)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def fmt_ci_depths(cells, lengths, depths, tasks=TASKS):
    """fmt_ci over the given depths only."""
    got = [cells[(t, n)]["depth_counts"][d] for t in tasks for n in lengths if (t, n) in cells
           for d in depths if d in cells[(t, n)]["depth_counts"]]
    correct, samples = sum(g[0] for g in got), sum(g[1] for g in got)
    if samples == 0:
        return "—"
    lo, hi = wilson(correct, samples)
    return f"{correct / samples:.2f} [{lo:.2f}, {hi:.2f}]"


def fmt_ci(cells, lengths, tasks=TASKS):
    """'0.83 [0.71, 0.91]' — the pooled accuracy and its 95% Wilson interval."""
    p = pooled(cells, lengths, tasks)
    if p is None or p[1] == 0:
        return "—"
    lo, hi = wilson(*p)
    return f"{p[0] / p[1]:.2f} [{lo:.2f}, {hi:.2f}]"


# ---------------------------------------------------------------------------------- SVG helpers
def svg_text(x, y, s, size=11, anchor="middle", weight="normal", rotate=None):
    t = f' transform="rotate({rotate} {x} {y})"' if rotate is not None else ""
    s = str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" '
            f'font-family="sans-serif"{t}>{s}</text>')


def accuracy_color(a):
    if a is None or math.isnan(a):
        return "#dddddd"
    # white (0) -> dark green (1)
    r, g, b = (int(255 + (c - 255) * a) for c in (0, 109, 44))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmaps_svg(models, cells_of, lengths, depths, plan):
    cw, ch = 46, 22
    pw, ph = 60 + cw * len(lengths), 50 + ch * len(depths)
    width = 110 + pw * len(models)
    height = 40 + ph * len(TASKS) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
             '<rect width="100%" height="100%" fill="white"/>',
             svg_text(width / 2, 20, f"NIAH accuracy by needle depth (rows, %) and length (columns, tokens); "
                      f"training length {plan.get('seq_len')}, {plan.get('samples')} samples per cell", 13,
                      weight="bold")]
    for ti, task in enumerate(TASKS):
        y0 = 40 + ti * ph
        parts.append(svg_text(20, y0 + ph / 2, task, 12, weight="bold", rotate=-90))
        for mi, model in enumerate(models):
            x0 = 110 + mi * pw
            if ti == 0:
                parts.append(svg_text(x0 + 40 + cw * len(lengths) / 2, y0 + 12, SHORT.get(model, model), 10,
                                      weight="bold"))
            cells = cells_of.get(model, {})
            for di, depth in enumerate(depths):
                y = y0 + 24 + di * ch
                if mi == 0:
                    parts.append(svg_text(x0 + 36, y + 15, depth, 10, anchor="end"))
                for li, n in enumerate(lengths):
                    x = x0 + 40 + li * cw
                    e = cells.get((task, n))
                    a = e["by_depth"].get(depth) if e else None
                    parts.append(f'<rect x="{x}" y="{y}" width="{cw - 2}" height="{ch - 2}" fill="{accuracy_color(a)}" '
                                 f'stroke="#999" stroke-width="0.5"/>')
                    label = "—" if a is None else f"{a:.2f}"
                    parts.append(svg_text(x + cw / 2 - 1, y + 15, label, 9))
            for li, n in enumerate(lengths):
                x = x0 + 40 + li * cw + cw / 2 - 1
                parts.append(svg_text(x, y0 + 24 + len(depths) * ch + 12, n, 9))
    parts.append("</svg>")
    return "\n".join(parts)


def loss_svg(curves, plan):
    """curves: {stage: {model: {"train": [(step, loss)], "eval": [(step, loss)]}}}"""
    pw, ph, pad = 360, 240, 50
    width, height = 2 * (pw + pad) + pad, 2 * (ph + pad) + 60
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
             '<rect width="100%" height="100%" fill="white"/>',
             svg_text(width / 2, 20, "Training loss (lines; running mean over 1/60 of the steps) and held-out loss "
                      "(dots) per stage", 13, weight="bold")]
    ylabel = {"pretrain": "next-token loss (nats)", "align": "alignment loss (Σ_l mean ‖Δy‖²/D)",
              "distill": "KL(teacher ‖ student) (nats)", "finetune": "next-token loss (nats), long sequences"}
    for si, stage in enumerate(STAGES):
        x0 = pad + (si % 2) * (pw + pad)
        y0 = 40 + (si // 2) * (ph + pad)
        data = curves.get(stage, {})
        pts = [p for m in data.values() for k in ("train", "eval") for p in m[k] if math.isfinite(p[1])]
        st = plan.get("stages", {}).get(stage) or {}  # a stage the plan skipped (pretrain with --teacher) is null
        title = f"{stage}: {st.get('steps', '?')} steps × {st.get('batch_seqs', '?')} × {st.get('seq_len', '?')} tokens"
        parts.append(svg_text(x0 + pw / 2, y0 - 6, title, 11, weight="bold"))
        parts.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
        parts.append(svg_text(x0 - 34, y0 + ph / 2, ylabel[stage], 9, rotate=-90))
        if not pts:
            parts.append(svg_text(x0 + pw / 2, y0 + ph / 2, "no data", 11))
            continue
        xmax = max(p[0] for p in pts)
        ymin, ymax = min(p[1] for p in pts), max(p[1] for p in pts)
        if ymax - ymin < 1e-9:
            ymax = ymin + 1
        sx = lambda s: x0 + (s - 1) / max(xmax - 1, 1) * pw if xmax > 1 else x0 + pw / 2
        sy = lambda v: y0 + ph - (v - ymin) / (ymax - ymin) * ph
        for frac in (0, 0.5, 1):
            v = ymin + frac * (ymax - ymin)
            parts.append(svg_text(x0 - 4, sy(v) + 3, f"{v:.3g}", 9, anchor="end"))
        parts.append(svg_text(x0, y0 + ph + 14, "1", 9))
        parts.append(svg_text(x0 + pw, y0 + ph + 14, xmax, 9))
        parts.append(svg_text(x0 + pw / 2, y0 + ph + 26, "step", 9))
        for li, (model, m) in enumerate(data.items()):
            color = COLORS.get(model, "#555")
            train = [p for p in m["train"] if math.isfinite(p[1])]
            w = max(1, len(train) // 60)  # running mean over w steps: one window's noise hides the trend
            if w > 1:
                train = [(train[i][0], sum(v for _, v in train[max(0, i - w + 1):i + 1]) / len(train[max(0, i - w + 1):i + 1]))
                         for i in range(len(train))]
            if train:
                path = " ".join(f"{sx(s):.1f},{sy(v):.1f}" for s, v in train)
                parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.2" opacity="0.8"/>')
            for s, v in m["eval"]:
                if math.isfinite(v):
                    parts.append(f'<circle cx="{sx(s):.1f}" cy="{sy(v):.1f}" r="3" fill="{color}"/>')
            parts.append(f'<rect x="{x0 + pw - 150}" y="{y0 + 8 + li * 14}" width="10" height="3" fill="{color}"/>')
            parts.append(svg_text(x0 + pw - 136, y0 + 13 + li * 14, LABELS.get(model, model), 9, anchor="start"))
    parts.append("</svg>")
    return "\n".join(parts)


# ------------------------------------------------------------------------------------- report
def main(res):
    plan = read_json(os.path.join(res, "plan.json")) or {}
    timings = read_jsonl(os.path.join(res, "timings.jsonl"))
    lengths = [int(x) for x in plan.get("eval_lengths", [])]
    depths = [int(x) for x in plan.get("depths", [])]
    train_len = plan.get("seq_len")
    models = ["teacher"] + [s["name"] for s in plan.get("students", [])] if plan.get("students") else MODELS
    for s in plan.get("students", []):
        LABELS.setdefault(s["name"], f"{s['name']} ({os.path.basename(s['heads'])}, {s['fusion']}, seed {s['seed']})")
    info, cells_of, lm = {}, {}, {}
    for m in models:
        info[m] = parse_info(os.path.join(res, "models", f"{m}.info.txt"))
        if rf.exists(os.path.join(res, "evals", f"{m}.niah.jsonl")):
            cells_of[m] = niah_cells(os.path.join(res, "evals", f"{m}.niah.jsonl"))
        j = read_json(os.path.join(res, "evals", f"{m}.lm.json"))
        lm[m] = j["loss"] if j else None
    present = [m for m in models if info[m] or m in cells_of]
    floor = None  # the language's own expected loss on the held-out windows (hydra synth's summary line)
    log = os.path.join(res, "logs", "synth-heldout-lm.log")
    if rf.exists(log):
        for line in rf.open_text(log):
            if line.startswith("{"):
                floor = json.loads(line).get("lm_loss_floor")
    curves = {}
    for m in models:
        for stage in STAGES:
            rows = read_jsonl(os.path.join(res, "train", f"{m}-{stage}.jsonl"))
            if rows:
                curves.setdefault(stage, {})[m] = {
                    "train": [(r["step"], float(r["loss"])) for r in rows if r.get("type") == "step"],
                    "eval": [(r["step"], float(r["eval_loss"])) for r in rows if r.get("type") == "eval"]}

    # ---- table.md
    mult = lambda n: f"{n // train_len}×" if train_len and n % train_len == 0 else str(n)
    out = [f"# Synthetic-teacher pipeline: results ({plan.get('profile', '?')} profile, {plan.get('device', '?')})", ""]
    out.append(f"Teacher preset `{plan.get('preset')}`, vocabulary {plan.get('vocab')}, training length {train_len}, "
               f"finetune length {plan.get('finetune_seq_len')}; data mixture `{plan.get('mixture')}`. NIAH: "
               f"{plan.get('samples')} samples per (task, length, depth), depths {depths}, eval seed {plan.get('eval_seed')}. "
               "Accuracy = exact greedy answer (teacher-forced verdict, `hydra eval-niah`).")
    out.append("")
    head = ["model", "FA / GDN heads", "KV per token", "GDN state", "LM loss"] + [f"NIAH {mult(n)}" for n in lengths]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in present:
        i = info[m] or {}
        cells = cells_of.get(m, {})
        row = [LABELS[m], f"{i.get('fa_head_count', '?')} / {i.get('gdn_head_count', '?')}",
               str(i.get("kv_cache_per_token", "—")), str(i.get("gdn_state", "—")), fmt(lm[m])]
        row += [fmt_ci(cells, [n]) for n in lengths]
        out.append("| " + " | ".join(row) + " |")
    out += ["", "KV per token: K and V elements each token adds to the cache (2·d per KV head used by an FA head); "
            "GDN state: elements of the fixed recurrent state (d² per GDN head). LM loss: mean next-token loss "
            f"(nats) on held-out language text at length {train_len} (`hydra eval-lm`); the source's own expected "
            f"loss on those windows (the floor no model beats in expectation) is {fmt(floor)}, a uniform guess "
            f"{fmt(math.log(plan['vocab'] - 8) if plan.get('vocab') else None)}. NIAH columns: accuracy over the three "
            "tasks and all depths, with the 95% Wilson interval of the pooled samples in brackets.", ""]
    out.append("## NIAH at depths 0–75 and, apart, at depth 100 (the needle right before the question)")
    out.append("")
    low = [d for d in depths if d < 100]
    head = ["model"] + [f"{mult(n)} {band}" for n in lengths for band in ("0–75", "100")]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in present:
        cells = cells_of.get(m, {})
        out.append("| " + " | ".join([LABELS[m]] + [fmt_ci_depths(cells, [n], ds) for n in lengths for ds in (low, [100])]) + " |")
    out += ["", "A recurrent state alone answers at depth 100; retrieval over the context shows at depths 0–75.", ""]
    out.append("## NIAH accuracy by task")
    out.append("")
    head = ["model"] + [f"{t} {mult(n)}" for t in TASKS for n in lengths]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in present:
        cells = cells_of.get(m, {})
        out.append("| " + " | ".join([LABELS[m]] + [fmt_ci(cells, [n], [t]) for t in TASKS for n in lengths]) + " |")
    out += ["", "## FA heads per layer", ""]
    for m in present:
        if info[m] and m != "teacher":
            out.append(f"* {LABELS[m]}: {info[m]['fa_heads']}")
    heads = read_json(os.path.join(res, "heads.json"))
    if heads and "selection" in heads:
        sel = heads["selection"]
        out.append(f"* select-heads: log p(answer) clean {fmt(sel.get('logprob_clean'))}, corrupted "
                   f"{fmt(sel.get('logprob_corrupt'))}; total effect normalised: {sel.get('total_normalized')}")
        conc = sel.get("concentration")
        if conc:
            out.append(f"* the teacher's concentration (positive direct effect): effective heads {fmt(conc['effective_heads'], 2)}; "
                       f"per-layer share {[round(x, 3) for x in conc['layer_share']]}; top-k share "
                       + ", ".join(f"{k}: {v:.3f}" for k, v in sorted(conc["top_share"].items(), key=lambda kv: int(kv[0]))))
        groups = sel.get("groups")
        if groups:
            out.append(f"* group patching (total effect): whole layer {[round(x, 3) for x in groups['layer_total']]}; "
                       f"every head of a layer but one, per layer (min, max): "
                       f"{[(round(min(r), 3), round(max(r), 3)) for r in groups['all_but_one']]}")
    out += ["", "## Budgets (equal for every student)", "", "| stage | steps | windows per step | tokens per window | tokens | peak lr |",
            "|---|---|---|---|---|---|"]
    for stage in STAGES:
        st = plan.get("stages", {}).get(stage)
        if st:
            out.append(f"| {stage} | {st['steps']} | {st['batch_seqs']} | {st['seq_len']} | {st['tokens']} | {st['lr']} |")
    if plan.get("probe"):
        p = plan["probe"]
        out += ["", "Budgets were set in seconds ({}) and turned into steps by probe runs (median seconds per step: "
                "pretrain {}, align {}, distill {}, finetune {}; students probed side by side, slowest taken)."
                .format(", ".join(f"{k} {v} s" for k, v in p["budget_s"].items()), fmt(p.get("pretrain_step_s")),
                        fmt(p.get("align_step_s")), fmt(p.get("distill_step_s")), fmt(p.get("finetune_step_s")))]
    out += ["", "## Wall time per step (device time on the GPU run)", "", "| step | seconds | exit |", "|---|---|---|"]
    for t in timings:
        out.append(f"| {t['step']} | {t['seconds']} | {t['rc']}{' (skipped)' if t.get('skipped') else ''} |")
    with open(os.path.join(res, "table.md"), "w") as f:
        f.write("\n".join(out) + "\n")

    # ---- decisions.md: paired comparisons of the plan's arms (decide.py)
    items_of = {m: decide.read_items(os.path.join(res, "evals", f"{m}.niah.jsonl")) for m in models}
    decisions = decide.decide(res, plan, models, items_of.get("teacher", {}), items_of,
                              read_json(os.path.join(res, "heads.json")))
    # ---- claims.md: the paper's claims, each off its paired comparison (claims.py)
    c = claims.write(res, read_json(os.path.join(res, "decisions.json")), plan)

    # ---- stage curves (curves.py)
    stage_curves.write(res, plan)

    # ---- plots and summary
    with open(os.path.join(res, "niah_heatmaps.svg"), "w") as f:
        f.write(heatmaps_svg(present, cells_of, lengths, depths, plan))
    with open(os.path.join(res, "loss_curves.svg"), "w") as f:
        f.write(loss_svg(curves, plan))
    summary = {"plan": plan, "lm_loss_floor": floor, "models": {m: {"info": info[m], "lm_loss": lm[m],
                                            "niah": {f"{t}@{n}": e["accuracy"] for (t, n), e in cells_of.get(m, {}).items()}}
                                        for m in present},
               "timings": timings}
    with open(os.path.join(res, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=lambda x: None)
    complete = all(m in cells_of and lm[m] is not None for m in models)
    print("\n".join(out[:len(present) + 7]))
    print("\n".join(c[4:]))
    print("\n".join(decisions[6:]))
    print(f"report: wrote table.md, claims.md, decisions.md, decisions.json, niah_heatmaps.svg, loss_curves.svg, "
          f"budget_accuracy.svg, head_score_accuracy.svg, stage_curves.md, stage_curves.svg, summary.json in {res}"
          f"{'' if complete else ' (some models lack evaluations)'}")
    return 0 if complete else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: report.py RESULTS_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
