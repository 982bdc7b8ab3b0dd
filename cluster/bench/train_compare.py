#!/usr/bin/env python3
"""Two hydra train runs of the same steps side by side (e.g. --cuda-graph on against off): the largest
relative difference of the logged loss and gradient norm over their common steps, and whether every
step logged the same learning rate and clip scale. One line for the log and one JSON line:

    python3 cluster/bench/train_compare.py OUT_DIR_A OUT_DIR_B LABEL
"""
import argparse
import json
import sys


def steps(out_dir):
    with open(f"{out_dir}/train.jsonl") as f:
        return {j["step"]: j for j in map(json.loads, f) if j.get("type") == "step" and j.get("loss") is not None}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("label")
    args = p.parse_args()
    a, b = steps(args.a), steps(args.b)
    common = sorted(set(a) & set(b))
    if not common:
        print(f"compare {args.label}: no common step", file=sys.stderr)
        return 1

    def rel(key):
        return max(abs(a[s][key] - b[s][key]) / max(abs(b[s][key]), 1e-300) for s in common)

    r = {"label": args.label, "steps": len(common), "loss_rel": rel("loss"), "grad_norm_rel": rel("grad_norm"),
         "same_lr": all(a[s]["lr"] == b[s]["lr"] for s in common),
         "same_clip_scale": all(a[s]["clip_scale"] == b[s]["clip_scale"] for s in common)}
    print(f"compare {args.label}: {r['steps']} steps, max relative difference loss {r['loss_rel']:.3g}, "
          f"grad-norm {r['grad_norm_rel']:.3g}; same lr every step: {r['same_lr']}, "
          f"same clip scale: {r['same_clip_scale']}")
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
