#!/usr/bin/env python3
"""Plots a scaling sweep (cluster/sweep.py JSON lines): prefill time (or, for a train sweep, the
fine-tuning step time) and parallel efficiency against the number of GPUs, one line per sequence
length, plus weak scaling (fixed tokens per GPU).

    python3 cluster/plot_sweep.py cluster/results/sweep.jsonl --out cluster/results/sweep.png

Efficiency of a run on G GPUs = time(1 GPU, same length) / (G · time(G GPUs)); where the one-GPU
run of a length is missing it is left out.
"""
import argparse
import collections
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from figure_file import save_figure  # noqa: E402


def label(n):
    return f"{n // 1048576}M" if n % 1048576 == 0 else f"{n // 1024}K"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("jsonl")
    p.add_argument("--out", required=True)
    p.add_argument("--command", choices=["prefill", "train"], default=None,
                   help="which runs to plot (default: prefill if the file has any, else train)")
    a = p.parse_args()
    # An output naming an input would replace what is read: refused before any work.
    for path in [a.jsonl]:
        if os.path.exists(a.out) and os.path.exists(path) and os.path.samefile(a.out, path):
            raise SystemExit(f"plot_sweep: --out {a.out} is {path}, an input: name another output (it would be replaced)")
    runs = [json.loads(line) for line in open(a.jsonl) if line.strip()]
    command = a.command or ("prefill" if any(r.get("command") == "prefill" for r in runs) else "train")
    runs = [r for r in runs if r.get("command") == command and "error" not in r]
    seconds = "seconds" if command == "prefill" else "step_s"
    what = "prefill time (s)" if command == "prefill" else "fine-tuning step (s)"
    best = {}
    for r in runs:  # best time per (GPUs, length)
        k = (r["ranks"], r["seq_len"])
        best[k] = min(best.get(k, float("inf")), r[seconds])
    by_len = collections.defaultdict(dict)
    for (g, n), t in best.items():
        by_len[n][g] = t
    fig, (ax_t, ax_e, ax_w) = plt.subplots(1, 3, figsize=(16, 4.8))
    for n in sorted(by_len):
        gs = sorted(by_len[n])
        ax_t.plot(gs, [by_len[n][g] for g in gs], marker="o", label=label(n))
        if 1 in by_len[n]:
            ax_e.plot(gs, [by_len[n][1] / (g * by_len[n][g]) for g in gs], marker="o", label=label(n))
    per_gpu = collections.defaultdict(dict)
    for (g, n), t in best.items():
        per_gpu[n // g][g] = t
    for m in sorted(per_gpu):
        gs = sorted(per_gpu[m])
        if len(gs) > 1:
            ax_w.plot(gs, [per_gpu[m][g] for g in gs], marker="o", label=f"{label(m)} tokens/GPU")
    ax_t.set(xlabel="GPUs", ylabel=what, title="strong scaling", yscale="log")
    ax_e.set(xlabel="GPUs", ylabel="efficiency  t1 / (G·tG)", title="parallel efficiency", ylim=(0, 1.1))
    ax_w.set(xlabel="GPUs", ylabel=what, title="weak scaling")
    for ax in (ax_t, ax_e, ax_w):
        ax.set_xticks(sorted({g for g, _ in best}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"hydra {command}, {runs[0].get('model', 'hydrahead-1.7b') if runs else ''}, bf16")
    fig.tight_layout()
    save_figure(fig, a.out, "plot_sweep", dpi=120)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
