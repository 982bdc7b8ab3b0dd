#!/usr/bin/env python3
"""The data of cluster/synth/pipeline.sh's students on a teacher of real text (`--set data_dir=DIR`),
made from a build_corpus.py folder: what `hydra synth` makes for the synthetic teachers, here from
the corpus and retrieval sets whose haystacks are its prose.

    python3 cluster/corpus/stage_data.py --corpus /work/corpus --out /tmp/stage --len 1024 --ft-len 4096 \\
        --eval-lengths 1024,4096,16384,65536 --tasks single,multikey,multivalue --depths 0,25,50,75,100 --samples 8

Writes into --out (each by cluster/niah/build_niah_set.py and cluster/niah/set_to_train.py; the
commands in OUT/commands.sh):
  train.h5        align/distill: --train-windows windows of --len, language from the training prose
                  shards mixed with retrieval samples on training haystacks (--retrieval-share of them,
                  answers counted only)
  finetune.h5     the same at --ft-len (--ft-windows windows)
  heldout_lm.h5   --lm-windows + 1 windows of held-out prose (eval-lm)
  heldout_mix.h5  held-out prose windows and held-out retrieval samples (train --eval-data)
  calib.h5, lmtext.h5   8 windows of held-out prose (convert --calib, select-heads --lm-text)
  niah/TASK-LEN.h5      the evaluation items: every task at every --eval-lengths on held-out haystacks
                        (--seed-eval), the same items for every student
  niah/calib.h5   select-heads' calibration set (single needle, --len, held-out haystack)
Needs tokenizers, h5py and numpy.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KNOBS = ["--common-words", "4", "--common-freq", "8", "--uncommon-freq", "2", "--top-words", "3", "--hops", "3", "--queries", "3"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--len", type=int, required=True, help="the teacher's training length (align, distill)")
    ap.add_argument("--ft-len", type=int, required=True, help="the finetune length")
    ap.add_argument("--eval-lengths", required=True, help="NIAH evaluation lengths, comma list")
    ap.add_argument("--tasks", default="single,multikey,multivalue", help="evaluation tasks")
    ap.add_argument("--train-tasks", default="single,multikey,multivalue,multiquery,vartrack", help="retrieval tasks in the stage data")
    ap.add_argument("--depths", default="0,25,50,75,100")
    ap.add_argument("--samples", type=int, default=8, help="evaluation samples per cell")
    ap.add_argument("--train-windows", type=int, default=4000)
    ap.add_argument("--ft-windows", type=int, default=1000)
    ap.add_argument("--lm-windows", type=int, default=64)
    ap.add_argument("--retrieval-share", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=1, help="the training samples")
    ap.add_argument("--seed-eval", type=int, default=1000, help="the evaluation items")
    ap.add_argument("--hay-mb", type=float, default=24, help="training prose for the haystacks (MB)")
    a = ap.parse_args()
    tok = os.path.join(a.corpus, "tokenizer", "tokenizer.json")
    for need in (tok, os.path.join(a.corpus, "text", "prose-train.jsonl"), os.path.join(a.corpus, "text", "prose-heldout.jsonl")):
        if not os.path.exists(need):
            sys.exit(f"stage_data: {need} is missing (a build_corpus.py folder?)")
    if not 0 <= a.retrieval_share < 1:
        sys.exit("stage_data: --retrieval-share must be in [0, 1)")
    os.makedirs(os.path.join(a.out, "niah"), exist_ok=True)
    commands = []

    def run(*cmd):
        cmd = [str(c) for c in cmd]
        commands.append(cmd)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"stage_data: {' '.join(cmd[:3])} ... failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
        return r.stdout

    def shards(split):
        d = os.path.join(a.corpus, "tokens", f"prose-{split}")
        m = json.load(open(os.path.join(d, "manifest.json")))
        return ",".join(os.path.join(d, os.path.basename(s)) for s in m["shards"])

    def text(split, path, limit):
        n = 0
        with open(os.path.join(a.corpus, "text", f"prose-{split}.jsonl")) as f, open(path, "w") as w:
            for line in f:
                t = json.loads(line)["text"]
                w.write(t + "\n")
                n += len(t)
                if limit and n >= limit:
                    break

    hay_train, hay_held = os.path.join(a.out, "hay_train.txt"), os.path.join(a.out, "hay_heldout.txt")
    text("train", hay_train, a.hay_mb * 1e6)
    text("heldout", hay_held, 0)
    build = os.path.join(ROOT, "cluster", "niah", "build_niah_set.py")
    to_train = os.path.join(ROOT, "cluster", "niah", "set_to_train.py")
    tasks, train_tasks = a.tasks.split(","), a.train_tasks.split(",")
    n_depths = len(a.depths.split(","))

    def stage(name, length, windows):
        n_ret = int(round(windows * a.retrieval_share))
        per_task = max(1, -(-n_ret // (len(train_tasks) * n_depths)))  # samples per cell, rounded up
        sets = []
        for t in train_tasks:
            out = os.path.join(a.out, f"{name}-{t}.h5")
            run(sys.executable, build, "--tokenizer", tok, "--haystack", hay_train, "--vary-haystack", "--task", t,
                "--lengths", length, "--depths", a.depths, "--samples", per_task, "--seed", a.seed * 100 + length, *KNOBS, "--out", out)
            sets.append(out)
        run(sys.executable, to_train, "--seq-len", length, "--seed", a.seed, "--lm", shards("train"),
            "--lm-windows", windows - n_ret, "--max-samples", n_ret, "--out", os.path.join(a.out, f"{name}.h5"),
            *(sets if n_ret else []))
        for s in sets:
            os.remove(s)

    stage("train", a.len, a.train_windows)
    stage("finetune", a.ft_len, a.ft_windows)
    held = shards("heldout")
    run(sys.executable, to_train, "--seq-len", a.len, "--lm", held, "--lm-windows", a.lm_windows + 1,
        "--out", os.path.join(a.out, "heldout_lm.h5"))
    for name in ("calib", "lmtext"):
        run(sys.executable, to_train, "--seq-len", a.len, "--lm", held, "--lm-windows", 8, "--out", os.path.join(a.out, f"{name}.h5"))
    calib = os.path.join(a.out, "niah", "calib.h5")
    run(sys.executable, build, "--tokenizer", tok, "--haystack", hay_held, "--vary-haystack", "--calibration", "--task", "single",
        "--lengths", a.len, "--depths", "50", "--samples", 12, "--seed", a.seed_eval + 1, "--out", calib)
    run(sys.executable, to_train, "--seq-len", a.len, "--lm", held, "--lm-windows", 8, "--out", os.path.join(a.out, "heldout_mix.h5"), calib)
    for t in tasks:
        for n in a.eval_lengths.split(","):
            run(sys.executable, build, "--tokenizer", tok, "--haystack", hay_held, "--vary-haystack", "--task", t, "--lengths", n,
                "--depths", a.depths, "--samples", a.samples, "--seed", a.seed_eval, *KNOBS,
                "--out", os.path.join(a.out, "niah", f"{t}-{n}.h5"))
    with open(os.path.join(a.out, "commands.sh"), "w") as f:
        f.write("# stage_data.py's commands, as run\n" + "".join(" ".join(c) + "\n" for c in commands))
    print(f"stage_data: {len(commands)} commands -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
