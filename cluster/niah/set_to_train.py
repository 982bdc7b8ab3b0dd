#!/usr/bin/env python3
"""Turns eval sets (hydrahead-niah-set, cluster/niah/build_niah_set.py) into one training token file,
so a model learns the retrieval tasks on real-text haystacks beside its language data
(`hydra train --data corpus.h5:0.8,retrieval.h5:0.2`).

    python3 cluster/niah/set_to_train.py --seq-len 1024 --out retrieval.h5 single.h5 multikey.h5 vartrack.h5
    python3 cluster/niah/set_to_train.py --seq-len 1024 --lm corpus/shard-00000-0000.h5 --lm-windows 4000 \
        --out stage.h5 single.h5 multikey.h5      # the samples among 4000 windows of language, every target counted

With --lm (token files: tokenize_text.py shards) the file also holds --lm-windows windows of --seq-len
tokens cut from them in order (the first ones; the files in turn), every target counted: one file
that mixes language and retrieval at window granularity (what cluster/synth/pipeline.sh's stages read
as one --data file).

Every sample must be exactly --seq-len tokens (build_niah_set.py --lengths SEQ_LEN). The samples of all
sets are shuffled together (--seed) and written back to back with one trailing token, so that
hydra train's windows (seq_len + 1 tokens at stride seq_len) are exactly the samples: each window's
targets are its sample's tokens after the first and the next sample's first token. Written:
  input_ids         the samples, then the first sample's first token (the last window's last target)
  loss_mask         uint8: 1 on the answer tokens only (--loss answers, the default: the haystack is
                    language the corpus already teaches, and counted whole it would drown the answer's
                    gradient), or on every target (--loss all)
  document_offsets  int64 [N+1]: sample k is input_ids[o_k, o_{k+1}) (the last one with the trailing token)
  document_task     the task of each sample (its index in the `tasks` attribute; -1: a language window)
The file is written atomically. Needs h5py and numpy.
"""
import argparse
import os
import random
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("sets", nargs="*", help="eval sets (.h5) of build_niah_set.py")
    ap.add_argument("--seq-len", type=int, required=True, help="the training length: every sample must have it")
    ap.add_argument("--out", required=True, help="the training token file (.h5)")
    ap.add_argument("--loss", choices=("answers", "all"), default="answers", help="targets counted (default answers)")
    ap.add_argument("--seed", type=int, default=0, help="the shuffle of the samples")
    ap.add_argument("--max-samples", type=int, default=0, help="keep this many of the sets' samples (after the shuffle; 0: all)")
    ap.add_argument("--lm", help="token files (comma list) to cut language windows from")
    ap.add_argument("--lm-windows", type=int, default=0, help="with --lm: how many windows of language")
    a = ap.parse_args()
    try:
        import h5py
        import numpy as np
    except ImportError as e:
        sys.exit(f"set_to_train: {e} (pip install h5py numpy)")
    if a.seq_len < 2:
        sys.exit("set_to_train: --seq-len must be at least 2")
    if os.path.abspath(a.out) in {os.path.abspath(s) for s in a.sets}:
        sys.exit(f"set_to_train: --out {a.out} is one of the inputs")
    samples, tasks = [], []
    for path in a.sets:
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            sys.exit(f"set_to_train: {path}: not an HDF5 file ({e})")
        with f:
            if f.attrs.get("format") != "hydrahead-niah-set":
                sys.exit(f"set_to_train: {path}: not a hydrahead-niah-set (format {f.attrs.get('format')!r})")
            task = str(f.attrs.get("task", os.path.basename(path)))
            if task not in tasks:
                tasks.append(task)
            ids, off = f["input_ids"][...], f["sample_offset"][...]
            start, length = f["answer_start"][...], f["answer_length"][...]
            for k in range(len(off) - 1):
                n = int(off[k + 1] - off[k])
                if n != a.seq_len:
                    sys.exit(f"set_to_train: {path}: sample {k} has {n} tokens, not --seq-len {a.seq_len} "
                             f"(build it with --lengths {a.seq_len})")
                samples.append((ids[off[k]:off[k + 1]], int(start[k]), int(length[k]), tasks.index(task)))
    if a.max_samples:
        random.Random(a.seed).shuffle(samples)
        samples = samples[:a.max_samples]
    if bool(a.lm) != (a.lm_windows > 0):
        sys.exit("set_to_train: --lm and --lm-windows N > 0 go together")
    lm_left = a.lm_windows
    for path in (a.lm.split(",") if a.lm else []):
        if lm_left == 0:
            break
        try:
            with h5py.File(path, "r") as f:
                ids = f["input_ids"]
                take = min(lm_left, (len(ids) - 1) // a.seq_len)
                block = ids[:take * a.seq_len][...].astype(np.int64)
        except (OSError, KeyError) as e:
            sys.exit(f"set_to_train: --lm {path}: not a token file with input_ids ({e})")
        for k in range(take):
            samples.append((block[k * a.seq_len:(k + 1) * a.seq_len], None, None, -1))
        lm_left -= take
    if lm_left:
        sys.exit(f"set_to_train: --lm holds {a.lm_windows - lm_left} windows of {a.seq_len} tokens, not --lm-windows {a.lm_windows}")
    if not samples:
        sys.exit("set_to_train: the sets hold no samples")
    random.Random(a.seed).shuffle(samples)
    n = len(samples) * a.seq_len
    vocab_max = max(int(s[0].max()) for s in samples)
    ids = np.empty(n + 1, dtype=np.int32 if vocab_max > 65535 else np.uint16)
    mask = np.zeros(n + 1, dtype=np.uint8)
    for k, (s, start, length, _) in enumerate(samples):
        ids[k * a.seq_len:(k + 1) * a.seq_len] = s
        if start is None or a.loss == "all":  # a language window, or every target asked for
            mask[k * a.seq_len + 1:(k + 1) * a.seq_len] = 1
        elif a.loss == "answers":
            mask[k * a.seq_len + start:k * a.seq_len + start + length] = 1
    ids[n] = samples[0][0][0]
    tmp = a.out + ".tmp"
    with h5py.File(tmp, "w") as f:
        f["input_ids"] = ids
        f["loss_mask"] = mask
        # Documents partition the ids (hydra's rule): the trailing token closes the last one.
        f["document_offsets"] = np.append(np.arange(0, n, a.seq_len, dtype=np.int64), n + 1)
        f["document_task"] = np.array([s[3] for s in samples], dtype=np.int32)
        f.attrs["tasks"] = ",".join(tasks)
        f.attrs["seq_len"] = a.seq_len
        f.attrs["loss"] = a.loss
    os.replace(tmp, a.out)
    print(f"set_to_train: {len(samples) - a.lm_windows} samples ({', '.join(tasks)}), {a.lm_windows} language windows, "
          f"{n + 1} tokens, {int(mask.sum())} counted -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
