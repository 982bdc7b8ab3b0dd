#!/usr/bin/env python3
"""Draws the loss curves of one or more `hydra train` runs (their train.jsonl) to a PNG: the training
loss per step (thin) with its moving average (thick), the evaluation loss as markers, and for the
align stage each layer's MSE in a second panel.

    python3 cluster/plot_train.py RUN_DIR[=LABEL] [RUN_DIR ...] --out curves.png [--smooth 20] [--log]

RUN_DIR is a --out-dir of hydra train (or a train.jsonl itself). Needs matplotlib.
"""
import argparse
import json
import os
import sys

try:
    import matplotlib
except ImportError:
    sys.exit("plot_train.py needs matplotlib: pip install matplotlib (or apt-get install python3-matplotlib)")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from figure_file import save_figure  # noqa: E402


def read_run(path):
    log = os.path.join(path, "train.jsonl") if os.path.isdir(path) else path
    steps, evals = [], []
    with open(log) as f:
        for line in f:
            if not line.strip():
                continue
            j = json.loads(line)
            (steps if j.get("type") == "step" else evals).append(j)
    return steps, evals


def moving_average(values, window):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="RUN_DIR or RUN_DIR=LABEL")
    p.add_argument("--out", required=True)
    p.add_argument("--smooth", type=int, default=20, help="moving-average window in steps")
    p.add_argument("--log", action="store_true", help="log-scale loss axis")
    a = p.parse_args()
    # An output naming an input would replace what is read: refused before any work.
    for path in [s.partition('=')[0] for s in a.runs] + [os.path.join(s.partition('=')[0], 'train.jsonl') for s in a.runs]:
        if os.path.exists(a.out) and os.path.exists(path) and os.path.samefile(a.out, path):
            raise SystemExit(f"plot_train: --out {a.out} is {path}, an input: name another output (it would be replaced)")
    runs = []
    for spec in a.runs:
        path, _, name = spec.partition("=")
        # A run is named by its folder (runs/align/train.jsonl: "align"), unless NAME= is given.
        folder = os.path.normpath(path)
        if os.path.basename(folder) == "train.jsonl":
            folder = os.path.dirname(folder) or "."
        runs.append((name or os.path.basename(os.path.abspath(folder)), *read_run(path)))
    has_layers = any(s and "layer_loss" in s[0] for _, s, _ in runs)
    fig, axes = plt.subplots(1, 2 if has_layers else 1, figsize=(12 if has_layers else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    for name, steps, evals in runs:
        if not steps:
            continue
        x = [s["step"] for s in steps]
        y = [s["loss"] for s in steps]
        line, = ax.plot(x, y, lw=0.6, alpha=0.35)
        ax.plot(x, moving_average(y, a.smooth), lw=1.8, color=line.get_color(), label=name)
        if evals:
            ax.plot([e["step"] for e in evals], [e["eval_loss"] for e in evals], "o", color=line.get_color(), ms=4)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (training: lines; evaluation: dots)")
    if a.log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    if has_layers:
        ax2 = axes[0][1]
        for name, steps, _ in runs:
            if not steps or "layer_loss" not in steps[0]:
                continue
            x = [s["step"] for s in steps]
            for layer in range(len(steps[0]["layer_loss"])):
                y = [s["layer_loss"][layer] for s in steps]
                ax2.plot(x, moving_average(y, a.smooth), lw=1, label=f"{name} L{layer}")
        ax2.set_xlabel("step")
        ax2.set_ylabel("align: per-layer MSE")
        ax2.set_yscale("log")
        ax2.grid(alpha=0.3)
        if sum(len(s[0]["layer_loss"]) for _, s, _ in runs if s and "layer_loss" in s[0]) <= 12:
            ax2.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, a.out, "plot_train", dpi=120)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
