#!/usr/bin/env python3
"""Print documents of a `hydra synth` stream decoded: what a model trained on it sees.

Markers are named as model/eval/niah.h defines them from the vocabulary (the top 8 ids: NEEDLE,
IS, END, QUERY, SEP), content ids are printed as numbers, and every target the loss counts
(loss_mask = 1: the next-token term whose target is that id) is printed in [brackets], so a reader
checks at a glance that a retrieval document holds the task in the evaluator's format and that
the loss falls on its answer and nowhere else. Also checks, for every document, that the counted
targets of a retrieval document are exactly its answer span (answer_start/answer_length).

    show_synth.py DATA.h5 [--kind multiquery] [--documents 1] [--vocab 256]

Needs h5py and numpy.
"""
import argparse
import json
import sys

import h5py
import numpy as np


def marker_names(vocab):
    return {vocab - 1: "NEEDLE", vocab - 2: "IS", vocab - 3: "END", vocab - 4: "QUERY", vocab - 5: "SEP"}


def decode(ids, mask, names, start=0):
    out = []
    for i, t in enumerate(ids):
        word = names.get(int(t), str(int(t)))
        counted = mask is not None and mask[start + i]
        out.append(f"[{word}]" if counted else word)
    return " ".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--kind", help="only documents of this kind (default: the first of each kind)")
    ap.add_argument("--documents", type=int, default=1, help="documents to print per kind")
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the stream's config)")
    args = ap.parse_args()

    with h5py.File(args.data, "r") as f:
        ids = f["input_ids"][...]
        mask = f["loss_mask"][...] if "loss_mask" in f else None
        kinds = json.loads(f.attrs["kinds"])
        doc_kind = f["document_kind"][...]
        seq_len = int(f.attrs["seq_len"])
        config = json.loads(f.attrs["config"])
        a_start, a_len, a_doc = f["answer_start"][...], f["answer_length"][...], f["answer_document"][...]
        if "document_offsets" in f:
            sys.exit("show_synth.py: packed streams (document_offsets) are not supported; write one with --seq-len")
    vocab = args.vocab or int(config["vocab_size"])
    names = marker_names(vocab)

    # The loss must fall on the answers of retrieval documents and nowhere else in them.
    bad = 0
    if mask is not None:
        for d, k in enumerate(doc_kind):
            if kinds[k] == "lm":
                continue
            base = d * seq_len
            expect = np.zeros(seq_len, dtype=bool)
            for s, n in zip(a_start[a_doc == d], a_len[a_doc == d]):
                expect[s - base:s - base + n] = True
            if not np.array_equal(mask[base:base + seq_len].astype(bool), expect):
                bad += 1
    print(f"{args.data}: {len(doc_kind)} documents of {seq_len}, vocab {vocab}, "
          f"loss mask {'present' if mask is not None else 'absent (every target counts)'}; "
          f"retrieval documents whose counted targets differ from their answer spans: {bad}")

    shown = {}
    for d, k in enumerate(doc_kind):
        kind = kinds[k]
        if (args.kind and kind != args.kind) or shown.get(kind, 0) >= args.documents:
            continue
        shown[kind] = shown.get(kind, 0) + 1
        base = d * seq_len
        spans = [(int(s - base), int(n)) for s, n in zip(a_start[a_doc == d], a_len[a_doc == d])]
        print(f"\n# document {d}: {kind}, answers at {spans}")
        print(decode(ids[base:base + seq_len], mask, names, base))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
