#!/usr/bin/env python3
"""Draws the needle-in-a-haystack heatmap (depth x length) from `hydra eval-niah` JSON lines.

Why this exists: the accuracy table hydra prints is for a terminal; papers and dashboards want the
usual NIAH picture. This script reads the per-cell lines of --out (model/eval/niah_report.h:
{"type": "cell", "task", "length", "depth", "samples", "accuracy", "mean_logprob", ...}; sample
lines are ignored) and writes one PNG with one heatmap per task: rows are depths (0 % at the top),
columns lengths, each cell annotated with its value. Several result files may be given (e.g. one
per length range run separately); a later file's cell replaces an earlier one with the same
(task, length, depth).

`--ruler` draws RULER's picture instead: the score hydra prints in its RULER table (mean recall in
percent over every sample of a task at a length, all depths together) against the context length,
one line per task and a thick line for the average over the tasks, as RULER's length curves.

Usage:
    python3 cluster/niah/plot_niah.py results.jsonl --out niah.png
        [--metric accuracy|mean_recall|mean_logprob] [--title "Qwen3-1.7B HydraHead 7:1"]
    python3 cluster/niah/plot_niah.py ruler.jsonl --ruler --out ruler.png

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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from figure_file import save_figure  # noqa: E402


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


def ruler_scores(cells):
    """{task: {length: mean recall}} weighted by samples, as model/eval/niah_report.cpp's RULER table."""
    sums = {}
    for (task, length, _), row in cells.items():
        total, samples = sums.setdefault(task, {}).get(length, (0.0, 0))
        recall = row.get("mean_recall")
        if recall is None:
            raise SystemExit(f"plot_niah: the cell ({task}, {length}) has no mean_recall (written by an older hydra?)")
        sums[task][length] = (total + recall * row["samples"], samples + row["samples"])
    return {t: {l: total / samples for l, (total, samples) in by.items() if samples > 0} for t, by in sums.items()}


TASK_ORDER = ("single", "multikey", "multivalue", "multiquery", "vartrack", "cwe", "fwe")


def task_key(task):
    return (TASK_ORDER.index(task) if task in TASK_ORDER else len(TASK_ORDER), task)


def scoring(cells):
    """The scoring mode of the cells ("generate", "teacher-forced"; both named if mixed)."""
    return " + ".join(sorted({row.get("score", "teacher-forced") for row in cells.values()}))


def plot_ruler(cells, title):
    scores = ruler_scores(cells)
    tasks = sorted(scores, key=task_key)
    lengths = sorted({l for by in scores.values() for l in by})
    fig, ax = plt.subplots(figsize=(7.5, 4.8), layout="constrained")
    for task in tasks:
        xs = [l for l in lengths if l in scores[task]]
        ax.plot(xs, [100 * scores[task][l] for l in xs], marker="o", linewidth=1.2, label=task)
    average = [(l, np.mean([scores[t][l] for t in tasks if l in scores[t]])) for l in lengths]
    ax.plot([l for l, _ in average], [100 * v for _, v in average], color="black", linewidth=2.6, marker="s",
            label="average")
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [format_length(l) for l in lengths])
    ax.minorticks_off()
    ax.set_ylim(-3, 103)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("score (mean recall, %)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title(title or f"RULER score by length ({scoring(cells)})")
    return fig, tasks


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="JSON lines written by hydra eval-niah --out")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--metric", default="accuracy", choices=("accuracy", "mean_recall", "mean_logprob"))
    p.add_argument("--ruler", action="store_true", help="RULER's curves: mean recall by length, one line per task")
    p.add_argument("--title", default="", help="figure title")
    args = p.parse_args()
    # An output naming an input would replace what is read: refused before any work.
    for path in args.results:
        if os.path.exists(args.out) and os.path.exists(path) and os.path.samefile(args.out, path):
            raise SystemExit(f"plot_niah: --out {args.out} is {path}, an input: name another output (it would be replaced)")

    cells = read_cells(args.results)
    if args.ruler:
        fig, tasks = plot_ruler(cells, args.title)
        save_figure(fig, args.out, "plot_niah")
        print(json.dumps({"command": "plot_niah", "kind": "ruler", "tasks": tasks, "cells": len(cells), "out": args.out}))
        return 0
    tasks = sorted({t for t, _, _ in cells}, key=task_key)
    fig, axes = plt.subplots(1, len(tasks), figsize=(1.5 + 5.2 * len(tasks), 5.0), squeeze=False, layout="constrained")
    accuracy = args.metric in ("accuracy", "mean_recall")  # both in [0, 1]
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
        label = args.metric.replace("_", " ")  # mean_recall is a mean already: no "mean mean recall"
        ax.set_title(f"{task}: {label if label.startswith('mean ') else 'mean ' + label} {mean:.3f}\n"
                     f"({'/'.join(map(str, samples))} samples per cell, {scoring(cells)})", fontsize=10)
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.85, label=args.metric.replace("_", " "))
    if args.title:
        fig.suptitle(args.title)
    save_figure(fig, args.out, "plot_niah")
    print(json.dumps({"command": "plot_niah", "tasks": tasks, "cells": len(cells), "out": args.out}))


if __name__ == "__main__":
    sys.exit(main())
