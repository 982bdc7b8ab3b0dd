#!/usr/bin/env python3
"""Draws the needle-in-a-haystack heatmap (depth x length) from `hydra eval-niah` JSON lines.

Why this exists: the accuracy table hydra prints is for a terminal; papers and dashboards want the
usual NIAH picture. This script reads the per-cell lines of --out (model/eval/niah_report.h:
{"type": "cell", "task", "length", "depth", "samples", "accuracy", "mean_logprob", ...}; sample
lines are ignored) and writes one PNG with one heatmap per task: rows are depths (0 % at the top),
columns lengths, each cell annotated with its value. Several result files may be given (e.g. one
per length range run separately); a later file's cell replaces an earlier one with the same
(task, length, depth).

Usage:
    python3 cluster/niah/plot_niah.py results.jsonl --out niah.png [--metric accuracy|mean_logprob]
        [--title "Qwen3-1.7B HydraHead 7:1"]

Needs: matplotlib (the Agg backend: no display), numpy.
"""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def format_length(n):
    """4096 -> '4K', 524288 -> '512K', as hydra prints sizes."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10}K"
    return str(n)


def read_cells(paths):
    cells = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"plot_niah: {path}:{number}: not JSON ({e})")
                if row.get("type") == "cell":
                    cells[(row["task"], row["length"], row["depth"])] = row
    if not cells:
        raise SystemExit(f"plot_niah: no cell lines in {', '.join(paths)} (is this hydra eval-niah --out?)")
    return cells


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="JSON lines written by hydra eval-niah --out")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--metric", default="accuracy", choices=("accuracy", "mean_logprob"))
    p.add_argument("--title", default="", help="figure title")
    args = p.parse_args()

    cells = read_cells(args.results)
    tasks = sorted({t for t, _, _ in cells}, key=lambda t: ("single", "multikey", "multivalue", t).index(t)
                   if t in ("single", "multikey", "multivalue") else 3)
    fig, axes = plt.subplots(1, len(tasks), figsize=(1.5 + 5.2 * len(tasks), 5.0), squeeze=False, layout="constrained")
    accuracy = args.metric == "accuracy"
    image = None
    for k, (ax, task) in enumerate(zip(axes[0], tasks)):
        lengths = sorted({l for t, l, _ in cells if t == task})
        depths = sorted({d for t, _, d in cells if t == task})
        grid = np.full((len(depths), len(lengths)), np.nan)
        for i, d in enumerate(depths):
            for j, l in enumerate(lengths):
                row = cells.get((task, l, d))
                if row is not None and row.get(args.metric) is not None:
                    grid[i, j] = row[args.metric]
        if accuracy:
            image = ax.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
        else:
            image = ax.imshow(grid, cmap="viridis", aspect="auto")
        for i in range(len(depths)):
            for j in range(len(lengths)):
                if not np.isnan(grid[i, j]):
                    dark = accuracy and (grid[i, j] < 0.2 or grid[i, j] > 0.85)  # the ends of RdYlGn
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8,
                            color="white" if dark else "black")
        ax.set_xticks(range(len(lengths)), [format_length(l) for l in lengths])
        ax.set_yticks(range(len(depths)), [f"{d}%" for d in depths])
        ax.set_xlabel("context length (tokens)")
        if k == 0:
            ax.set_ylabel("needle depth")
        samples = sorted({cells[(task, l, d)]["samples"] for l in lengths for d in depths if (task, l, d) in cells})
        mean = np.nanmean(grid)
        ax.set_title(f"{task}: mean {args.metric.replace('_', ' ')} {mean:.3f}\n"
                     f"({'/'.join(map(str, samples))} samples per cell)", fontsize=10)
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.85, label=args.metric.replace("_", " "))
    if args.title:
        fig.suptitle(args.title)
    directory = os.path.dirname(os.path.abspath(args.out))
    temp = os.path.join(directory, f".{os.path.basename(args.out)}.tmp-{os.getpid()}.png")
    try:
        fig.savefig(temp, dpi=150)
        os.replace(temp, args.out)
    finally:
        if os.path.exists(temp):
            os.remove(temp)
    print(json.dumps({"command": "plot_niah", "tasks": tasks, "cells": len(cells), "out": args.out}))


if __name__ == "__main__":
    sys.exit(main())
