"""Stage curves (called by cluster/synth/report.py): for every student the plan gave curves, NIAH at
the stage's training length and the held-out LM loss after conversion and at every checkpoint of
align, distill and finetune. Reads curves/NAME-convert.{lm.json,niah.jsonl} (eval-lm, eval-niah of
the converted student), train/NAME-STAGE.jsonl (hydra train --eval-niah: niah_TASK at every
evaluation) and curves/NAME-STAGE-step-NNNNNN.lm.json (eval-lm of each kept checkpoint). Writes
stage_curves.md (every point, with the file it came from) and stage_curves.svg (x: the stages one
after another, stage k spanning (k − 1, k]). Standard library only.
"""
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import results_files as rf  # noqa: E402  (cluster/: a folder's files, plain, gzipped or archived)

STAGES = ["align", "distill", "finetune"]
COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


def _read_json(path):
    try:
        with rf.open_text(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _jsonl(path):
    if not rf.exists(path):
        return []
    with rf.open_text(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def student_curve(res, name, tasks, steps_of):
    """[(x, niah or None, lm or None, source)], x = (stage index − 1) + step / stage steps (converted = 0)."""
    points = []
    lm = _read_json(os.path.join(res, "curves", f"{name}-convert.lm.json"))
    cells = [c for c in _jsonl(os.path.join(res, "curves", f"{name}-convert.niah.jsonl")) if c.get("type") == "cell"]
    niah = (sum(c["correct"] for c in cells) / sum(c["samples"] for c in cells)) if cells and sum(c["samples"] for c in cells) else None
    if lm or cells:
        points.append((0.0, niah, lm["loss"] if lm else None, f"curves/{name}-convert.*"))
    for si, stage in enumerate(STAGES):
        total = steps_of.get(stage) or 1
        evals = {r["step"]: r for r in _jsonl(os.path.join(res, "train", f"{name}-{stage}.jsonl")) if r.get("type") == "eval"}
        lms = {}
        for path in rf.glob(os.path.join(res, "curves", f"{name}-{stage}-step-*.lm.json")):
            m = re.search(r"step-(\d+)\.lm\.json$", path)
            j = _read_json(path)
            if m and j:
                lms[int(m.group(1))] = j["loss"]
        for step in sorted(set(evals) | set(lms)):
            r = evals.get(step, {})
            vals = [r[f"niah_{t}"] for t in tasks if f"niah_{t}" in r]
            points.append((si + 1 + step / total - 1, sum(vals) / len(vals) if vals else None, lms.get(step),
                           f"train/{name}-{stage}.jsonl step {step}; curves/{name}-{stage}-step-{step:06d}.lm.json"))
    return points


def write(res, plan):
    names = [s["name"] for s in plan.get("students", []) if s.get("curves")]
    tasks = [t for t in str(plan.get("curve_tasks", "single,multikey")).split(",") if t]
    steps_of = {k: (v or {}).get("steps") for k, v in (plan.get("stages") or {}).items()}
    curves = {n: student_curve(res, n, tasks, steps_of) for n in names}
    curves = {n: c for n, c in curves.items() if c}
    md = ["# Stage curves", "",
          f"NIAH accuracy at the stage's training length (mean over {', '.join(tasks)}; {plan.get('curve_samples')} samples "
          "per task at each point, from hydra train --eval-niah; after conversion from eval-niah) and the held-out LM "
          "loss (eval-lm of each checkpoint). x: 0 = converted; (k − 1) + f = stage k (1 align, 2 distill, 3 finetune) "
          "after the fraction f of its steps.", "", "| student | x | NIAH | LM loss | from |", "|---|---|---|---|---|"]
    for n, pts in curves.items():
        for x, a, l, src in pts:
            md.append(f"| {n} | {x:.2f} | {'—' if a is None else f'{a:.3f}'} | {'—' if l is None else f'{l:.4f}'} | {src} |")
    if not curves:
        md.append("| — | no student of this plan has curves | | | |")
    with open(os.path.join(res, "stage_curves.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(res, "stage_curves.svg"), "w") as f:
        f.write(svg(curves))
    return curves


def _text(x, y, s, size=10, anchor="middle", weight="normal"):
    s = str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" font-family="sans-serif">{s}</text>'


def svg(curves):
    w, h, pad = 420, 220, 60
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * (w + pad) + pad}" height="{h + 120}">',
             '<rect width="100%" height="100%" fill="white"/>',
             _text(w + pad, 20, "Stage curves: converted (0), then align (1), distill (2), finetune (3)", 13, weight="bold")]
    for pi, (label, idx) in enumerate((("NIAH accuracy at the stage's length", 1), ("held-out LM loss (nats)", 2))):
        x0, y0 = pad + pi * (w + pad), 50
        vals = [p[idx] for c in curves.values() for p in c if p[idx] is not None and math.isfinite(p[idx])]
        lo, hi = (0.0, 1.0) if idx == 1 else ((min(vals), max(vals)) if vals else (0.0, 1.0))
        hi = hi if hi > lo else lo + 1
        sx = lambda x: x0 + x / 3 * w
        sy = lambda v: y0 + h - (v - lo) / (hi - lo) * h
        parts.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#444"/>')
        for k in range(4):
            parts.append(f'<line x1="{sx(k):.1f}" y1="{y0}" x2="{sx(k):.1f}" y2="{y0 + h}" stroke="#ccc"/>')
            parts.append(_text(sx(k), y0 + h + 14, ["converted", "align done", "distill done", "finetune done"][k], 9))
        for v in (lo, (lo + hi) / 2, hi):
            parts.append(_text(x0 - 6, sy(v) + 3, f"{v:.3g}", 9, anchor="end"))
        parts.append(_text(x0 + w / 2, y0 - 8, label, 10))
        for ci, (name, pts) in enumerate(curves.items()):
            color = COLORS[ci % len(COLORS)]
            xy = [(sx(p[0]), sy(p[idx])) for p in pts if p[idx] is not None and math.isfinite(p[idx])]
            if len(xy) > 1:
                parts.append(f'<polyline points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in xy)}" fill="none" stroke="{color}" stroke-width="1.5"/>')
            for x, y in xy:
                parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>')
            if pi == 0:
                parts.append(f'<rect x="{x0 + 8 + (ci % 3) * 130}" y="{y0 + h + 28 + (ci // 3) * 14}" width="10" height="3" fill="{color}"/>')
                parts.append(_text(x0 + 22 + (ci % 3) * 130, y0 + h + 33 + (ci // 3) * 14, name, 9, anchor="start"))
    parts.append("</svg>")
    return "\n".join(parts)
