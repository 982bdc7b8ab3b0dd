#!/usr/bin/env python3
"""Which pretraining recipe makes the synthetic teacher retrieve? Trains several qwen3-synth teachers
side by side on one GPU (or the CPU), each a curriculum of phases — every phase a `hydra synth`
stream and a `hydra train --stage pretrain` that starts from the previous phase's model — and
reads each one's NIAH accuracy at the training length (hydra train --eval-niah, every --eval-every
steps; --niah-tasks, default single,multikey) and answer loss from its train.jsonl. Every command is a hydra command, written to
OUT/commands.sh as run.

    python3 cluster/synth/teacher_probe.py --hydra build/bin/hydra --out /tmp/probe --deadline-s 300 \\
        --variants cluster/synth/probe_variants.json

A variants file is a JSON list of
    {"name": "recall", "lr": 1e-3, "batch": 64, "train": "--min-lr 1e-3 --warmup 50", "phases": [
        {"steps": 800, "synth": "--task recall --recall-tokens 128 --recall-pairs 32 --loss answers"},
        {"steps": 800, "synth": "--task recall:0.4,single:0.2,multikey:0.2,lm:0.2 --recall-tokens 128 --loss answers"}]}
"train" (optional) adds hydra train flags to every phase of the variant (e.g. a constant learning
rate). Shared settings (--vocab, --seq-len, --preset, --eval-every, --tokens) come from the flags. Variants
run concurrently; a phase that passes the deadline is stopped by `timeout` (its last checkpoint,
saved every --eval-every steps, stands). Output: OUT/probe.jsonl (one line per variant: per-phase
NIAH curves, answer-loss curves, steps done, seconds) and a table on stdout.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time


def run(cmd, log, timeout=None, commands=None, lock=None):
    if commands is not None:
        with lock:
            commands.write(" ".join(shlex.quote(c) for c in cmd) + f"  > {log} 2>&1\n")
            commands.flush()
    with open(log, "w") as f:
        try:
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return 124


def latest_model(run_dir):
    try:
        with open(os.path.join(run_dir, "latest")) as f:
            return os.path.join(run_dir, f.read().strip(), "model.h5")
    except OSError:
        return None


def variant(v, a, init, deadline, commands, lock):
    name, out = v["name"], os.path.join(a.out, v["name"])
    os.makedirs(out, exist_ok=True)
    model, result = init, {"name": name, "lr": v["lr"], "batch": v["batch"], "phases": []}
    for k, ph in enumerate(v["phases"]):
        data = os.path.join(out, f"phase{k}.h5")
        synth = [a.hydra, "synth", *shlex.split(ph["synth"]), "--tokens", a.tokens, "--seq-len", str(a.seq_len),
                 "--vocab", str(a.vocab), "--seed", str(10 + k), "--out", data]
        if run(synth, os.path.join(out, f"synth{k}.log"), commands=commands, lock=lock) != 0:
            result["phases"].append({"error": "synth failed", "log": os.path.join(out, f"synth{k}.log")})
            break
        run_dir = os.path.join(out, f"run{k}")
        left = deadline - time.time()
        if left < 10:
            result["phases"].append({"error": "deadline"})
            break
        train = [a.hydra, "train", "--stage", "pretrain", "--model", model, "--data", data, "--seq-len", str(a.seq_len),
                 "--steps", str(ph["steps"]), "--batch-seqs", str(v["batch"]), "--lr", str(v["lr"]),
                 "--save-every", str(a.eval_every), "--keep", "1", "--eval-every", str(a.eval_every),
                 "--eval-niah", a.niah_tasks, "--eval-niah-samples", str(a.niah_samples),
                 "--device", a.device, "--out-dir", run_dir, *shlex.split(v.get("train", ""))]
        t0 = time.time()
        rc = run(train, os.path.join(out, f"train{k}.log"), timeout=left, commands=commands, lock=lock)
        rows = []
        if os.path.exists(os.path.join(run_dir, "train.jsonl")):
            rows = [json.loads(l) for l in open(os.path.join(run_dir, "train.jsonl")) if l.strip()]
        steps = [r for r in rows if r.get("type") == "step" and r.get("loss") is not None]
        evals = [r for r in rows if r.get("type") == "eval"]
        result["phases"].append({
            "synth": ph["synth"], "steps_planned": ph["steps"], "steps_done": steps[-1]["step"] if steps else 0,
            "seconds": round(time.time() - t0, 1), "exit": rc,
            "tokens_per_s": round(sum(r["tokens_per_s"] for r in steps[-20:]) / max(1, len(steps[-20:]))),
            "answer_loss": [[r["step"], round(r["answer_loss"], 4)] for r in steps[:: max(1, len(steps) // 12)]
                            if r.get("answer_loss") is not None],
            **{f"niah_{task}": [[r["step"], r.get(f"niah_{task}")] for r in evals] for task in a.tasks}})
        nxt = latest_model(run_dir)
        if not nxt or not os.path.exists(nxt):
            break
        model = nxt
    result["final_model"] = model
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hydra", default="build/bin/hydra")
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", required=True, help="JSON file: a list of variants (see above)")
    ap.add_argument("--preset", default="qwen3-synth")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--tokens", default="32M", help="tokens per phase's stream")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--niah-samples", type=int, default=32)
    ap.add_argument("--niah-tasks", default="single,multikey",
                    help="NIAH tasks scored while training (hydra train --eval-niah): single, multikey, multivalue")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deadline-s", type=float, default=300)
    a = ap.parse_args()
    a.tasks = a.niah_tasks.split(",")
    variants = json.load(open(a.variants))
    os.makedirs(a.out, exist_ok=True)
    deadline = time.time() + a.deadline_s
    lock = threading.Lock()
    commands = open(os.path.join(a.out, "commands.sh"), "w")
    init = os.path.join(a.out, "init.h5")
    if run([a.hydra, "init", "--preset", a.preset, "--weight-seed", "0", "--out", init], os.path.join(a.out, "init.log"),
           commands=commands, lock=lock) != 0:
        sys.exit("teacher_probe: hydra init failed (see init.log)")
    results = [None] * len(variants)

    def work(i):
        results[i] = variant(variants[i], a, init, deadline, commands, lock)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(variants))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(os.path.join(a.out, "probe.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    print(f"{'variant':<14} {'phase':>5} {'steps':>10} {'tok/s':>9} {'answer loss':>12} "
          + " ".join(f"{'NIAH ' + t:>14}" for t in a.tasks))
    for r in results:
        for k, ph in enumerate(r["phases"]):
            if "error" in ph:
                print(f"{r['name']:<14} {k:>5} {ph['error']}")
                continue
            al = ph["answer_loss"][-1][1] if ph["answer_loss"] else float("nan")
            last = [ph[f"niah_{t}"][-1][1] if ph[f"niah_{t}"] else None for t in a.tasks]
            print(f"{r['name']:<14} {k:>5} {ph['steps_done']:>5}/{ph['steps_planned']:<4} {ph['tokens_per_s']:>9} "
                  f"{al:>12.3f} " + " ".join(f"{v if v is not None else float('nan'):>14.3f}" for v in last))


if __name__ == "__main__":
    main()
