#!/usr/bin/env python3
"""The steady speed of a hydra train run from its train.jsonl: the median tokens/s and step time of
the steps after the first SKIP (module loading, the allocator's pool, a CUDA graph's warm-up and
capture at steps 1-2). Prints one line for the log and one JSON line for tables:

    python3 cluster/bench/train_steady.py OUT_DIR LABEL [--skip 10]
"""
import argparse
import json
import statistics
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("label")
    p.add_argument("--skip", type=int, default=10)
    a = p.parse_args()
    steps = []
    with open(f"{a.out_dir}/train.jsonl") as f:
        for line in f:
            j = json.loads(line)
            if j.get("type") == "step" and j.get("loss") is not None and j["step"] > a.skip:
                steps.append(j)
    if not steps:
        print(f"steady {a.label}: no step after {a.skip}", file=sys.stderr)
        return 1
    tps = statistics.median(s["tokens_per_s"] for s in steps)
    ms = 1e3 * statistics.median(s["step_s"] for s in steps)
    graph = sum(1 for s in steps if s.get("cuda_graph"))
    print(f"steady {a.label}: {len(steps)} steps, median {tps / 1e6:.3f}M tokens/s, median step {ms:.3f} ms, "
          f"{graph} replayed from a CUDA graph")
    print(json.dumps({"label": a.label, "steps": len(steps), "tokens_per_s": tps, "step_ms": ms, "graph_steps": graph}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
