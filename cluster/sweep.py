#!/usr/bin/env python3
"""Scaling sweep over GPU counts × sequence lengths, one JSON line per run: hydra prefill, or
hydra train --stage finetune (one sequence over all the GPUs of a run, --sp G).

    python3 cluster/sweep.py --hydra build/bin/hydra --gpus 1,2,4,8 --lengths 128K,256K,512K,1M \
        --out cluster/results/sweep.jsonl
    python3 cluster/sweep.py --command train --gpus 1,2,4,8 --lengths 128K,256K,512K --steps 4 \
        --out cluster/results/train_sweep.jsonl
    python3 cluster/plot_sweep.py cluster/results/sweep.jsonl --out cluster/results/sweep.png

Each prefill run is `cluster/launch.sh -g G -- hydra prefill --preset MODEL --seq-len N --json-out OUT`;
each train run is `cluster/launch.sh -g G -- hydra train --stage finetune --preset MODEL --seq-len N
--sp G --steps S --save-every -1 --data TOKENS.h5` on random tokens (written once with h5py next to
--out), and its line holds the mean step time, tokens/s and MFU of the steps after the first.
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
    p.add_argument("--command", choices=["prefill", "train"], default="prefill")
    p.add_argument("--steps", type=int, default=4, help="train: optimizer steps per run (the first is not averaged)")
    a = p.parse_args()
    tokens = None
    if a.command == "train":
        tokens = os.path.splitext(a.out)[0] + "_tokens.h5"
        longest = max(size(t) for t in a.lengths.split(","))
        if not os.path.exists(tokens):
            import h5py
            import numpy as np
            vocab = 151936  # the 1.7B shapes' vocabulary; ids below every preset's vocabulary would also do
            with h5py.File(tokens, "w") as f:
                f["input_ids"] = np.random.default_rng(0).integers(0, vocab, size=(a.steps + 1) * longest + 1, dtype=np.int32)
    launcher = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.sh")
    limit = size(a.max_tokens_per_gpu)
    failures = 0
    for g in [int(x) for x in a.gpus.split(",")]:
        for text in a.lengths.split(","):
            n = size(text)
            if n // g > limit:
                print(f"skip {g} GPU(s) × {text}: {n // g} tokens per GPU > {limit}", flush=True)
                continue
            if a.command == "prefill":
                cmd = [launcher, "-g", str(g), "--", a.hydra, "prefill", "--preset", a.model, "--seq-len", str(n),
                       "--device", "cuda", "--progress", "off", "--json-out", a.out]
            else:
                run_dir = os.path.splitext(a.out)[0] + f"_runs/g{g}_t{n}"
                subprocess.run(["rm", "-rf", run_dir], check=False)
                cmd = [launcher, "-g", str(g), "--", a.hydra, "train", "--stage", "finetune", "--preset", a.model,
                       "--data", tokens, "--seq-len", str(n), "--sp", str(g), "--steps", str(a.steps),
                       "--save-every", "-1", "--device", "cuda", "--out-dir", run_dir]
            start = time.time()
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            if r.returncode != 0:
                failures += 1
                err = (r.stderr.strip().splitlines() or ["?"])[-1]
                with open(a.out, "a") as f:
                    f.write(json.dumps({"command": a.command, "ranks": g, "seq_len": n, "error": err}) + "\n")
                print(f"{g} GPU(s) × {text}: FAILED ({err})", flush=True)
                continue
            if a.command == "prefill":
                summary = json.loads(r.stdout.strip().splitlines()[-1])
                print(f"{g} GPU(s) × {text}: {summary['seconds']:.3f} s, {summary['tflops_per_rank']:.0f} TFLOP/s per GPU "
                      f"(wall {time.time() - start:.0f} s)", flush=True)
                continue
            steps = [json.loads(l) for l in open(os.path.join(run_dir, "train.jsonl")) if '"type": "step"' in l
                     or '"type":"step"' in l]
            timed = steps[1:] or steps  # the first step includes warm-up (allocator, cuBLAS plans)
            mean = lambda k: sum(x[k] for x in timed) / len(timed)
            phases = {k: sum(x["phases"][k] for x in timed) / len(timed) for k in timed[0].get("phases", {})}
            line = {"command": "train", "stage": "finetune", "model": a.model, "ranks": g, "sp": g, "seq_len": n,
                    "steps": len(steps), "step_s": mean("step_s"), "tokens_per_s": mean("tokens_per_s"),
                    "mfu": mean("mfu"), "phases_rank0": phases, "loss_last": steps[-1]["loss"]}
            with open(a.out, "a") as f:
                f.write(json.dumps(line) + "\n")
            print(f"{g} GPU(s) × {text}: {line['step_s']:.3f} s/step, {line['tokens_per_s']:.0f} tokens/s, "
                  f"MFU {100 * line['mfu']:.1f}% (wall {time.time() - start:.0f} s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
