#!/usr/bin/env python3
"""Cuts a build_corpus.py folder down to what cluster/corpus/teacher_recipe.sh reads, at a size that
travels to a device machine (a call carries 64 MiB with the checkout: see
cluster/results/cpu-2026-12-07-corpus/README.md).

    python3 cluster/corpus/cut_corpus.py --corpus /work/corpus --out /tmp/cut --prose-tokens 20M --code-tokens 30M
    tar -cJf .device/corpus.tar.xz -C /tmp/cut .          # xz: about 0.7 bytes a prose token, 0.4 a code token

Written into --out (the recipe's --corpus): tokenizer/ (copied), text/prose-train.jsonl (the first
--hay-mb MB of documents: the haystacks of the retrieval sets), text/prose-heldout.jsonl (whole),
tokens/{prose,code}-heldout/ (whole) and tokens/{prose,code}-train/: whole documents of the training
shards, each kept when a hash of (split, its index) falls below the share that gives the asked
tokens — a sample of every package, not the first ones in list order (the dictionaries) — in one
shard with its document_offsets, and the manifest tokenize_text.py writes. OUT/cut.json says what was
kept. Needs h5py and numpy.
"""
import argparse
import hashlib
import json
import os
import shutil
import sys


def parse_count(s):
    mult = {"K": 1e3, "M": 1e6, "G": 1e9}
    try:
        return int(float(s[:-1]) * mult[s[-1].upper()]) if s and s[-1].upper() in mult else int(s)
    except ValueError:
        sys.exit(f"cut_corpus: '{s}' is not a token count (e.g. 20M)")


def hash_unit(s):
    return int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "big") / 2.0 ** 64


def shards_of(corpus, name):
    d = os.path.join(corpus, "tokens", name)
    try:
        m = json.load(open(os.path.join(d, "manifest.json")))
    except (OSError, ValueError) as e:
        sys.exit(f"cut_corpus: {d}/manifest.json: {e} (a build_corpus.py folder?)")
    return m, [os.path.join(d, os.path.basename(s)) for s in m["shards"]]


def write_shard(out_dir, ids, offsets, manifest, tokens, documents):
    import h5py
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "shard-00000-0000.h5")
    with h5py.File(path + ".tmp", "w") as f:
        f["input_ids"] = ids
        f["document_offsets"] = offsets
    os.replace(path + ".tmp", path)
    m = dict(manifest, shards=[os.path.basename(path)], tokens=[tokens], documents=[documents])
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(m, f, indent=1)


def cut_train(corpus, out, name, want):
    """Whole documents of the split's shards, kept by hash at the share that gives about `want` tokens."""
    import h5py
    import numpy as np
    manifest, paths = shards_of(corpus, name)
    total = sum(manifest["tokens"])
    share = min(1.0, want / max(total, 1))
    pieces, offsets, kept_docs, n = [], [0], 0, 0
    index = 0
    for path in paths:
        with h5py.File(path, "r") as f:
            ids = f["input_ids"][...]
            off = f["document_offsets"][...] if "document_offsets" in f else np.array([0, len(ids)])
        for k in range(len(off) - 1):
            if hash_unit(f"{name}/{index}") < share:
                doc = ids[off[k]:off[k + 1]]
                pieces.append(doc)
                n += len(doc)
                offsets.append(n)
                kept_docs += 1
            index += 1
    if not pieces:
        sys.exit(f"cut_corpus: {name}: no document kept (ask for more tokens)")
    write_shard(os.path.join(out, "tokens", name), np.concatenate(pieces), np.array(offsets, dtype=np.int64),
                manifest, n, kept_docs)
    return {"tokens": n, "documents": kept_docs, "of_tokens": total, "of_documents": index, "share": share}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--corpus", required=True, help="a build_corpus.py folder")
    ap.add_argument("--out", required=True, help="the cut folder (must not exist or be empty)")
    ap.add_argument("--prose-tokens", required=True, help="training prose tokens to keep (20M)")
    ap.add_argument("--code-tokens", required=True, help="training code tokens to keep (0: none)")
    ap.add_argument("--hay-mb", type=float, default=24, help="training prose text for the haystacks (MB)")
    a = ap.parse_args()
    try:
        import h5py  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        sys.exit(f"cut_corpus: {e} (pip install h5py numpy)")
    want = {"prose-train": parse_count(a.prose_tokens), "code-train": parse_count(a.code_tokens)}
    if want["prose-train"] <= 0 or want["code-train"] < 0:
        sys.exit("cut_corpus: --prose-tokens must be positive and --code-tokens not negative")
    need = ["tokenizer/tokenizer.json", "text/prose-train.jsonl", "text/prose-heldout.jsonl", "tokens/prose-train/manifest.json",
            "tokens/prose-heldout/manifest.json"]
    for rel in need:
        if not os.path.exists(os.path.join(a.corpus, rel)):
            sys.exit(f"cut_corpus: {a.corpus}/{rel} is missing (a build_corpus.py folder?)")
    if os.path.abspath(a.out) == os.path.abspath(a.corpus) or (os.path.isdir(a.out) and os.listdir(a.out)):
        sys.exit(f"cut_corpus: --out {a.out} exists and is not empty")
    os.makedirs(os.path.join(a.out, "text"), exist_ok=True)
    shutil.copytree(os.path.join(a.corpus, "tokenizer"), os.path.join(a.out, "tokenizer"),
                    ignore=shutil.ignore_patterns("sample.jsonl", "*.tmp"))
    shutil.copy(os.path.join(a.corpus, "text", "prose-heldout.jsonl"), os.path.join(a.out, "text"))
    hay = 0
    with open(os.path.join(a.corpus, "text", "prose-train.jsonl")) as f, \
            open(os.path.join(a.out, "text", "prose-train.jsonl"), "w") as w:
        for line in f:
            if hay >= a.hay_mb * 1e6:
                break
            w.write(line)
            hay += len(line)
    report = {"corpus": os.path.abspath(a.corpus), "hay_bytes": hay}
    for name in ("prose-heldout", "code-heldout"):
        src = os.path.join(a.corpus, "tokens", name)
        if os.path.exists(os.path.join(src, "manifest.json")):
            m, paths = shards_of(a.corpus, name)
            os.makedirs(os.path.join(a.out, "tokens", name))
            for p in paths:
                shutil.copy(p, os.path.join(a.out, "tokens", name))
            with open(os.path.join(a.out, "tokens", name, "manifest.json"), "w") as f:
                json.dump(dict(m, shards=[os.path.basename(p) for p in paths]), f, indent=1)
            report[name] = {"tokens": sum(m["tokens"]), "documents": sum(m["documents"])}
    for name, n in want.items():
        if n and os.path.exists(os.path.join(a.corpus, "tokens", name, "manifest.json")):
            report[name] = cut_train(a.corpus, a.out, name, n)
    with open(os.path.join(a.out, "cut.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("cut_corpus: " + ", ".join(f"{k} {v['tokens']} tokens ({v['documents']} documents)"
                                     for k, v in report.items() if isinstance(v, dict)) + f", haystack text {hay} bytes -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
