#!/usr/bin/env python3
"""Holds a run on P ranks to the same run on one rank (or on CPU ranks), for the multi-rank GPU
checks of cluster/shared_gpu/ (ranks sharing one GPU, HYDRA_SHARE_GPUS=1) and their CTest form.

  compare.py tokens  A.jsonl B.jsonl [--logprob-tol X] [--tie X]   hydra generate --logprobs K (K >= 2)
  compare.py losses  A_DIR B_DIR [--rel X] [--steps a:b]            train.jsonl step losses
  compare.py summary A.json B.json KEY --rel X                      one number of two summary lines
  compare.py niah    A.jsonl B.jsonl [--logprob-tol X]              eval-niah sample lines
  compare.py gradients A.h5 B.h5 [--rms X] [--scalar-rms X]          hydra gradients files

tokens: every prompt's tokens equal up to the first step where they differ; the log-probabilities
of the equal steps within --logprob-tol; at the first difference both tokens must be among B's two
most likely at that step, less than --tie apart in B's log-probability (a near tie that bf16
rounding may decide either way: the contexts differ from there on, so nothing after it is
compared). Anything else is a defect. Each comparison prints one line and the script exits 1 on
the first failure (2 on bad arguments or unreadable files).
"""
import argparse
import json
import math
import os
import sys


def fail(msg):
    print(f"compare: FAILED: {msg}")
    sys.exit(1)


def read_lines(path, logs=False):
    """The JSON lines of a file; with logs=True, of a command's output (other lines skipped)."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip() and (not logs or line.startswith("{"))]
    except (OSError, ValueError) as e:
        print(f"compare: cannot read {path}: {e}", file=sys.stderr)
        sys.exit(2)


def tokens(args):
    """Generated tokens of a P-rank run (a) against one rank (b), both written with --logprobs K.

    Up to the first token where the two differ the contexts are equal, so at every step until then
    (that one included) the K most likely tokens that both list must have log p within
    --logprob-tol. A difference is then allowed only where the two runs may honestly part: greedy,
    a near tie (both tokens among b's K most likely, < --tie apart); --sampled (top-k sampling with
    k <= K, so b's list is the whole candidate set), both tokens among b's candidates — the same
    draw picks another token once the cumulative probabilities move across it, which they do by
    bf16 rounding when the distribution is flat. The rest of the sequence is not compared.
    """
    a = [j for j in read_lines(args.a) if "tokens" in j]
    b = [j for j in read_lines(args.b) if "tokens" in j]
    if len(a) != len(b) or not a:
        fail(f"{len(a)} and {len(b)} generated sequences")
    for ja, jb in zip(a, b):
        p = ja["prompt_index"]
        ta, tb = ja["tokens"], jb["tokens"]
        if "top_logprobs" not in jb or "top_logprobs" not in ja:
            fail("run hydra generate with --logprobs K (K >= 2; >= --top-k when sampling) for both")
        equal, worst = 0, 0.0
        for i, (x, y) in enumerate(zip(ta, tb)):
            top_a = {tid: lp for tid, lp in ja["top_logprobs"][i]}
            top_b = {tid: lp for tid, lp in jb["top_logprobs"][i]}
            common = set(top_a) & set(top_b)
            if not common:
                fail(f"prompt {p} token {i}: no token among both runs' most likely {sorted(top_a)} and {sorted(top_b)}")
            for tid in common:
                d = abs(top_a[tid] - top_b[tid])
                worst = max(worst, d)
                if d > args.logprob_tol:
                    fail(f"prompt {p} token {i}: log p of {tid} {top_a[tid]:.5f} vs {top_b[tid]:.5f} "
                         f"(> {args.logprob_tol} apart)")
            if x == y:
                equal += 1
                continue
            if x not in top_b or y not in top_b:
                fail(f"prompt {p} token {i}: {x} vs {y}, not both among the reference's most likely {sorted(top_b)}")
            gap = abs(top_b[y] - top_b[x])
            if not args.sampled and gap >= args.tie:
                fail(f"prompt {p} token {i}: {x} vs {y}, {gap:.4f} apart in log p (not a near tie < {args.tie})")
            break
        if equal == len(tb) and len(ta) != len(tb):
            fail(f"prompt {p}: {len(ta)} vs {len(tb)} tokens")
        tail = "" if equal == len(tb) else f", then they part at token {equal} ({'two candidates' if args.sampled else 'a near tie'})"
        print(f"compare: prompt {p}: {equal} of {len(tb)} tokens equal, the most likely tokens' log p within {worst:.2e}{tail}")


def losses(args):
    def read(d):
        return [j["loss"] for j in read_lines(os.path.join(d, "train.jsonl")) if j.get("type") == "step"]
    la, lb = read(args.a), read(args.b)
    if len(la) != len(lb) or not la:
        fail(f"{len(la)} and {len(lb)} step losses")
    lo, hi = 1, len(la)
    if args.steps:
        lo, hi = (int(x) for x in args.steps.split(":"))
    worst = 0.0
    for step in range(lo, hi + 1):
        x, y = la[step - 1], lb[step - 1]
        if not (math.isfinite(x) and math.isfinite(y)):
            fail(f"step {step}: loss {x} vs {y}")
        rel = abs(x - y) / abs(y)
        worst = max(worst, rel)
        if rel > args.rel:
            fail(f"step {step}: loss {x:.6f} vs {y:.6f} ({rel:.2e} relative > {args.rel})")
    print(f"compare: steps {lo}..{hi}: losses within {worst:.2e} relative (bound {args.rel}); "
          f"{' '.join(f'{x:.5f}' for x in la[lo - 1:hi])} vs {' '.join(f'{y:.5f}' for y in lb[lo - 1:hi])}")


def summary(args):
    def last(path):
        lines = [j for j in read_lines(path, logs=True) if args.key in j]
        if not lines:
            fail(f"{path} has no '{args.key}'")
        return lines[-1][args.key]
    x, y = last(args.a), last(args.b)
    if isinstance(y, (int, str)) and not isinstance(y, bool) and not isinstance(y, float):
        if x != y:
            fail(f"{args.key}: {x} vs {y}")
        print(f"compare: {args.key}: {x} equal")
        return
    rel = abs(x - y) / max(abs(y), 1e-30)
    if not math.isfinite(x) or rel > args.rel:
        fail(f"{args.key}: {x} vs {y} ({rel:.2e} relative > {args.rel})")
    print(f"compare: {args.key}: {x:.6g} vs {y:.6g}, {rel:.2e} relative (bound {args.rel})")


def niah(args):
    a = [j for j in read_lines(args.a) if j.get("type") == "sample"]
    b = [j for j in read_lines(args.b) if j.get("type") == "sample"]
    if len(a) != len(b) or not a:
        fail(f"{len(a)} and {len(b)} samples")
    worst, same_pred = 0.0, 0
    for i, (x, y) in enumerate(zip(a, b)):
        for key in ("task", "length", "depth", "answer"):
            if x.get(key) != y.get(key):
                fail(f"sample {i}: {key} {x.get(key)} vs {y.get(key)}")
        d = abs(x["logprob"] - y["logprob"])
        worst = max(worst, d)
        if d > args.logprob_tol:
            fail(f"sample {i}: answer log p {x['logprob']:.5f} vs {y['logprob']:.5f} (> {args.logprob_tol} apart)")
        same_pred += x["predicted"] == y["predicted"]
        # A verdict may only differ where rounding can move it: the answer's log p within the bound of
        # the level where it becomes the arg-max is not known here, so a differing verdict must come
        # with differing predictions (the arg-max moved), never alone.
        if x["correct"] != y["correct"] and x["predicted"] == y["predicted"]:
            fail(f"sample {i}: verdict {x['correct']} vs {y['correct']} with the same prediction")
    print(f"compare: {len(a)} samples: answer log p within {worst:.2e} (bound {args.logprob_tol}), "
          f"{same_pred} predictions equal")


def gradients(args):
    """Every parameter's gradient: ‖a − b‖ / ‖b‖ <= --rms, and --scalar-rms for the per-head gate
    scalars (A_log, dt_bias, the fusion gate's bias: sums over every token of terms of both signs)."""
    try:
        import h5py
        import numpy as np
    except ImportError:
        print("compare: gradients needs h5py and numpy", file=sys.stderr)
        sys.exit(2)
    try:
        fa, fb = h5py.File(args.a, "r"), h5py.File(args.b, "r")
    except OSError as e:
        print(f"compare: cannot read {args.a} or {args.b}: {e}", file=sys.stderr)
        sys.exit(2)
    with fa, fb:
        names = []
        fb.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        if not names:
            fail(f"{args.b} holds no datasets")
        worst, worst_name = 0.0, ""
        for n in names:
            if n not in fa:
                fail(f"{args.a} has no {n}")
            x, y = np.asarray(fa[n], dtype=np.float64), np.asarray(fb[n], dtype=np.float64)
            if x.shape != y.shape or not np.all(np.isfinite(x)):
                fail(f"{n}: shape {x.shape} vs {y.shape} or non-finite values")
            denom = np.linalg.norm(y)
            rel = np.linalg.norm(x - y) / denom if denom > 0 else np.linalg.norm(x)
            scalar = any(k in n for k in ("A_log", "dt_bias", "fuse_gate.bias"))
            bound = args.scalar_rms if scalar else args.rms
            if rel > bound:
                fail(f"gradient of {n}: RMS ratio {rel:.3e} > {bound}")
            if not scalar and rel > worst:
                worst, worst_name = rel, n
    print(f"compare: {len(names)} gradients within bound, worst RMS ratio {worst:.2e} ({worst_name}; bound {args.rms})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("tokens")
    t.add_argument("a"), t.add_argument("b")
    t.add_argument("--logprob-tol", type=float, default=0.05)
    t.add_argument("--tie", type=float, default=0.1)
    t.add_argument("--sampled", action="store_true", help="top-k sampled runs (k <= the --logprobs K)")
    lo = sub.add_parser("losses")
    lo.add_argument("a"), lo.add_argument("b")
    lo.add_argument("--rel", type=float, default=1e-3)
    lo.add_argument("--steps", default="")
    s = sub.add_parser("summary")
    s.add_argument("a"), s.add_argument("b"), s.add_argument("key")
    s.add_argument("--rel", type=float, default=1e-3)
    n = sub.add_parser("niah")
    n.add_argument("a"), n.add_argument("b")
    n.add_argument("--logprob-tol", type=float, default=0.05)
    g = sub.add_parser("gradients")
    g.add_argument("a"), g.add_argument("b")
    g.add_argument("--rms", type=float, default=5e-2)
    g.add_argument("--scalar-rms", type=float, default=0.15)
    args = ap.parse_args()
    {"tokens": tokens, "losses": losses, "summary": summary, "niah": niah, "gradients": gradients}[args.what](args)


if __name__ == "__main__":
    main()
