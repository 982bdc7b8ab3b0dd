#!/usr/bin/env python3
"""Draws the head-selection heatmaps (layers x heads) from `hydra select-heads` output.

Why this exists: the table hydra prints shows the composite score only, and a 28 x 16 grid of
numbers says little at a glance; a picture of where retrieval lives (which layers, which heads) is
what one checks before converting a teacher. This script reads the HDF5 copy of the scores
(model/selection/head_report.h, format "hydrahead-head-scores" v1: [L, H] datasets composite, total, direct,
lm and fa_mask) or the head-set JSON itself (model/fa_heads_file.h: "scores" and "fa_heads"), and
writes one PNG with one panel per score: rows are layers (layer 0 at the top), columns heads, the
heads chosen for full attention outlined. Each panel has its own colour scale, symmetric around 0
(diverging map: red = positive effect, blue = negative); cells are annotated when the grid is small
enough to read (at most 16 x 16).

Usage:
    python3 cluster/heads/plot_heads.py heads.h5 --out heads.png [--scores composite,total,direct,lm]
        [--title "Qwen3-1.7B, 8 NIAH prompts"]
    python3 cluster/heads/plot_heads.py heads.json --out heads.png

Needs: matplotlib (the Agg backend: no display), numpy; h5py for .h5 input.
"""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from figure_file import save_figure  # noqa: E402

ALL_SCORES = ("composite", "total", "direct", "lm")
LABELS = {
    "composite": "composite",
    "total": "total effect\n(activation patching)",
    "direct": "direct effect\n(logit difference)",
    "lm": "lm: NLL increase\nwhen ablated (nats/token)",
}


def read_h5(path):
    import h5py

    with h5py.File(path, "r") as f:
        fmt = f.attrs.get("format")
        if isinstance(fmt, bytes):
            fmt = fmt.decode()
        if fmt != "hydrahead-head-scores":
            raise SystemExit(f"plot_heads: {path}: format is {fmt!r}, expected 'hydrahead-head-scores' (hydra select-heads --out-h5)")
        scores = {name: np.asarray(f[name][...], dtype=np.float64) for name in ALL_SCORES if name in f}
        mask = np.asarray(f["fa_mask"][...]) if "fa_mask" in f else None
        meta = {key: (f.attrs[key].decode() if isinstance(f.attrs[key], bytes) else f.attrs[key]) for key in f.attrs}
    return scores, mask, meta


def read_json(path):
    with open(path, encoding="utf-8") as f:
        try:
            j = json.load(f)
        except json.JSONDecodeError as e:
            raise SystemExit(f"plot_heads: {path}: not JSON ({e})")
    if j.get("format") != "hydrahead-fa-heads":
        raise SystemExit(f"plot_heads: {path}: not a head-set file (format {j.get('format')!r})")
    scores = {name: np.asarray(v, dtype=np.float64) for name, v in j.get("scores", {}).items()}
    fa = j["fa_heads"]
    heads = int(j.get("num_heads", max((max(l) for l in fa if l), default=-1) + 1))
    mask = np.zeros((len(fa), heads), dtype=np.int32)
    for layer, hs in enumerate(fa):
        mask[layer, hs] = 1
    meta = dict(j.get("selection", {}))
    return scores, mask, meta


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scores", help="heads.h5 (hydra select-heads --out-h5) or heads.json (--out)")
    p.add_argument("--out", required=True, help="the figure to write, in the format its extension names (.png, .svg, .pdf)")
    p.add_argument("--scores", dest="which", default=",".join(ALL_SCORES), help="panels, a comma list of " + ", ".join(ALL_SCORES))
    p.add_argument("--title", default="", help="figure title")
    args = p.parse_args()
    # An output naming an input would replace what is read: refused before any work.
    for path in [args.scores]:
        if os.path.exists(args.out) and os.path.exists(path) and os.path.samefile(args.out, path):
            raise SystemExit(f"plot_heads: --out {args.out} is {path}, an input: name another output (it would be replaced)")

    scores, mask, meta = read_h5(args.scores) if args.scores.endswith((".h5", ".hdf5")) else read_json(args.scores)
    which = [s for s in args.which.split(",") if s]
    for name in which:
        if name not in ALL_SCORES:
            raise SystemExit(f"plot_heads: unknown score {name!r} (known: {', '.join(ALL_SCORES)})")
        if name not in scores:
            raise SystemExit(f"plot_heads: {args.scores} holds no {name!r} scores")
    layers, heads = scores[which[0]].shape
    panel_w = max(3.4, 1.2 + 0.45 * heads)
    panel_h = max(2.6, 1.4 + 0.32 * layers)
    fig, axes = plt.subplots(1, len(which), figsize=(panel_w * len(which), panel_h), squeeze=False, layout="constrained")
    annotate = layers <= 16 and heads <= 16
    for ax, name in zip(axes[0], which):
        grid = scores[name]
        limit = float(np.max(np.abs(grid))) or 1.0
        image = ax.imshow(grid, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
        if annotate:
            for l in range(layers):
                for h in range(heads):
                    dark = abs(grid[l, h]) > 0.6 * limit
                    ax.text(h, l, f"{grid[l, h]:.2g}", ha="center", va="center", fontsize=7, color="white" if dark else "black")
        if mask is not None:
            for l, h in zip(*np.nonzero(mask)):
                ax.add_patch(Rectangle((h - 0.5, l - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.6))
        ax.set_xticks(range(heads))
        ax.set_yticks(range(layers))
        ax.tick_params(labelsize=7)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(LABELS[name], fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.85)
    title = args.title
    if not title and meta:
        budget = meta.get("budget")
        mode = meta.get("mode")
        title = f"{meta.get('model', '')}  budget {budget} ({mode}); outlined: full-attention heads".strip()
    if title:
        fig.suptitle(title, fontsize=10)
    save_figure(fig, args.out, "plot_heads")
    kept = int(mask.sum()) if mask is not None else None
    print(json.dumps({"command": "plot_heads", "scores": which, "layers": layers, "heads": heads, "fa_heads": kept, "out": args.out}))


if __name__ == "__main__":
    sys.exit(main())
