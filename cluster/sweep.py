#!/usr/bin/env python3
"""Scaling sweep: hydra prefill over GPU counts × sequence lengths, one JSON line per run.

    python3 cluster/sweep.py --hydra build/bin/hydra --gpus 1,2,4 --lengths 128K,256K,512K,1M \
        --out cluster/results/sweep.jsonl
    python3 cluster/plot_sweep.py cluster/results/sweep.jsonl --out cluster/results/sweep.png

Each run is `cluster/launch.sh -g G -- hydra prefill --preset MODEL --seq-len N --json-out OUT`.
A run that fails (out of memory, length not admissible) is recorded as {"error": ...} and the
sweep goes on. --max-tokens-per-gpu skips runs that would not fit.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def size(text):
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1], 1)
    return int(text[:-1] if scale > 1 else text) * scale


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hydra", default="build/bin/hydra")
    p.add_argument("--model", default="hydrahead-1.7b", help="preset name")
    p.add_argument("--gpus", default="1,2")
    p.add_argument("--lengths", default="128K,256K,512K,1M")
    p.add_argument("--max-tokens-per-gpu", default="1M", help="skip runs with more tokens per GPU")
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=int, default=1800)
    a = p.parse_args()
    launcher = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.sh")
    limit = size(a.max_tokens_per_gpu)
    failures = 0
    for g in [int(x) for x in a.gpus.split(",")]:
        for text in a.lengths.split(","):
            n = size(text)
            if n // g > limit:
                print(f"skip {g} GPU(s) × {text}: {n // g} tokens per GPU > {limit}", flush=True)
                continue
            cmd = [launcher, "-g", str(g), "--", a.hydra, "prefill", "--preset", a.model, "--seq-len", str(n),
                   "--device", "cuda", "--progress", "off", "--json-out", a.out]
            start = time.time()
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            if r.returncode != 0:
                failures += 1
                err = (r.stderr.strip().splitlines() or ["?"])[-1]
                with open(a.out, "a") as f:
                    f.write(json.dumps({"command": "prefill", "ranks": g, "seq_len": n, "error": err}) + "\n")
                print(f"{g} GPU(s) × {text}: FAILED ({err})", flush=True)
                continue
            summary = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"{g} GPU(s) × {text}: {summary['seconds']:.3f} s, {summary['tflops_per_rank']:.0f} TFLOP/s per GPU "
                  f"(wall {time.time() - start:.0f} s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
