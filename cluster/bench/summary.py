#!/usr/bin/env python3
"""The compact table of issue 18's targets from one job's JSON lines (same GPU, same job):

  FA forward, causal d=128:   hydra TFLOP/s / SDPA-cuDNN TFLOP/s        target ≥ 1.0 on every shape
  GDN forward, 14 heads:      hydra ms / flash-linear-attention ms       target ≤ 0.6
  hydrahead-1.7b 512K prefill: hydra s / (PyTorch layer ms × 28)          target ≤ 0.6

    python3 cluster/bench/summary.py bench.jsonl anchors.jsonl [layer.jsonl prefill.jsonl]

Rows come from every kernel variant in bench.jsonl (the label's [kernel] part); the target column
is judged on the default kernel's row. Missing files or records are reported as "-".
"""
import json
import os
import sys


def load(path):
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().startswith("{")]


def shape(rec):
    return rec["what"].replace(" bf16", "").split(" [")[0]


def variant(rec):
    what = rec["what"]
    return what[what.index("[") + 1:what.rindex("]")] if "[" in what else "-"


def main():
    args = sys.argv[1:] + [None] * 4
    ours, anchors, layer, prefill = load(args[0]), load(args[1]), load(args[2]), load(args[3])
    cudnn = {shape(a): a for a in anchors if a.get("anchor") == "sdpa-cudnn" and "error" not in a}
    fla = {shape(a): a for a in anchors if a.get("anchor") == "fla" and "error" not in a}
    print("| measurement | variant | hydra | anchor | ratio | target | met |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in ours:
        s, v = shape(r), variant(r)
        if s.startswith("attention"):
            a = cudnn.get(s)
            ratio = r["tflops"] / a["tflops"] if a else None
            anchor = f"cuDNN {a['tflops']:.0f} TFLOP/s" if a else "-"
            mine, target, ok = f"{r['tflops']:.0f} TFLOP/s ({r['ms']:.2f} ms)", ">= 1.0", ratio is not None and ratio >= 1.0
        elif s.startswith("gdn"):
            a = fla.get(s)
            ratio = r["ms"] / a["ms"] if a else None
            anchor = f"fla {a['ms']:.3f} ms" if a else "-"
            mine, target, ok = f"{r['ms']:.3f} ms", "<= 0.6", ratio is not None and ratio <= 0.6
        else:
            continue
        print(f"| {s} | {v} | {mine} | {anchor} | {f'{ratio:.2f}' if ratio is not None else '-'} | {target} | "
              f"{'yes' if ok else 'no'} |")
    ref = next((x for x in layer if "prefill_s" in x), None)
    for p in prefill:
        if "seconds" not in p:
            continue
        ratio = p["seconds"] / ref["prefill_s"] if ref else None
        breakdown = " ".join(f"{k} {v:.2f}" for k, v in p.get("phases_rank0", {}).items())
        anchor = f"PyTorch layer x28 {ref['prefill_s']:.2f} s" if ref else "-"
        ratio_text = f"{ratio:.2f}" if ratio is not None else "-"
        ok = "yes" if ratio is not None and ratio <= 0.6 else "no"
        print(f"| prefill hydrahead-1.7b T={p.get('seq_len')} ({breakdown}) | {p.get('ranks', 1)} GPU | "
              f"{p['seconds']:.2f} s | {anchor} | {ratio_text} | <= 0.6 | {ok} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
