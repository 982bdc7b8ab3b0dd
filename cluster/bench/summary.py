#!/usr/bin/env python3
"""The compact table of the forward kernels' targets from one job's JSON lines (same GPU, same job):

  FA forward, causal d=128:   hydra TFLOP/s / SDPA-cuDNN TFLOP/s        target ≥ 1.0 on every shape
  GDN forward, 14 heads:      hydra ms / flash-linear-attention ms       target ≤ 0.6
  hydrahead-1.7b 512K prefill: hydra s / (PyTorch layer ms × 28)          target ≤ 0.6
  FA forward + backward:      hydra TFLOP/s / SDPA-cuDNN TFLOP/s         target ≥ 0.85 (backward kernels)
  GDN forward + backward:     hydra ms / flash-linear-attention ms       target ≤ 1.0

    python3 cluster/bench/summary.py bench.jsonl anchors.jsonl [layer.jsonl prefill.jsonl]

bench.jsonl and anchors.jsonl may each be a comma-separated list of files (forward and backward
benches of one job).

Rows come from every kernel variant in bench.jsonl (the label's [kernel] part); the target column
is judged on the default kernel's row. Missing files or records are reported as "-".
"""
import json
import os
import sys


def load(paths):
    records = []
    for path in (paths or "").split(","):
        if path and os.path.exists(path):
            with open(path) as f:
                records += [json.loads(line) for line in f if line.strip().startswith("{")]
    return records


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
            goal = 0.85 if "fwd+bwd" in s else 1.0
            mine = f"{r['tflops']:.0f} TFLOP/s ({r['ms']:.2f} ms)"
            if "backward_ms" in r:
                mine += f", bwd {r['backward_ms']:.2f} ms"
            target, ok = f">= {goal}", ratio is not None and ratio >= goal
        elif s.startswith("gdn"):
            a = fla.get(s)
            ratio = r["ms"] / a["ms"] if a else None
            anchor = f"fla {a['ms']:.3f} ms" if a else "-"
            goal = 1.0 if "fwd+bwd" in s else 0.6
            mine = f"{r['ms']:.3f} ms" + (f", bwd {r['backward_ms']:.3f} ms" if "backward_ms" in r else "")
            target, ok = f"<= {goal}", ratio is not None and ratio <= goal
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
