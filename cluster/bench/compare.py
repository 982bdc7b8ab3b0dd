#!/usr/bin/env python3
"""Joins `hydra bench` JSON lines and anchors.py JSON lines (same GPU, same job) into one table:
each hydra measurement next to the anchors of the same shape (the `what` field: forward ops and
the forward + backward ops `attention fwd+bwd …`, `gdn fwd+bwd …` match by name), with the ratio.

    python3 cluster/bench/compare.py bench.jsonl anchors.jsonl > table.md
"""
import json
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().startswith("{")]


def key(rec):
    return rec["what"].replace(" bf16", "").split(" [")[0]


def main():
    ours = load(sys.argv[1])
    anchors = load(sys.argv[2])
    by_what = {}
    for a in anchors:
        by_what.setdefault(key(a), []).append(a)
    print("| measurement | hydra | anchor | anchor figure | hydra / anchor |")
    print("| --- | --- | --- | --- | --- |")
    for r in ours:
        mine = f"{r['ms']:.3f} ms, {r['tflops']:.1f} TFLOP/s ({r['fraction_of_ceiling']:.2f} of GEMM ceiling {r['ceiling_tflops']:.0f})"
        if "backward_ms" in r:  # forward + backward ops also report the backward alone
            mine += f"; backward alone {r['backward_ms']:.3f} ms"
        matches = by_what.get(key(r), [])
        if not matches:
            print(f"| {r['what']} | {mine} | - | - | - |")
        for a in matches:
            if "error" in a:
                print(f"| {r['what']} | {mine} | {a['anchor']} | {a['error']} | - |")
                continue
            ratio = a["ms"] / r["ms"]  # > 1: hydra faster
            print(f"| {r['what']} | {mine} | {a['anchor']} | {a['ms']:.3f} ms, {a['tflops']:.1f} TFLOP/s | "
                  f"{ratio:.2f}x speed ({r['tflops'] / a['tflops']:.2f}x TFLOP/s) |")


if __name__ == "__main__":
    main()
