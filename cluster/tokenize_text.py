#!/usr/bin/env python3
"""Tokenizes text files into a hydra token file (HDF5, dataset input_ids [N] int32).

The way real text reaches `hydra train --data`, `hydra forward --input`, `hydra convert --calib`
and `hydra select-heads --lm-text`: the model's own Hugging Face tokenizer (tokenizer.json, read
with the `tokenizers` library) encodes each file; files are concatenated in the order given,
separated by the end-of-text id when the tokenizer has one (--separator overrides it, -1: none).
With --documents, each file is a document: the file also holds `document_offsets` int64 [N+1]
(0, ..., T; DESIGN.md §4), so `hydra train` and the other commands run each file as if alone
(positions restart, attention and the GDN state do not cross a boundary). The separator then
starts each document after the first (it is part of that document).

    python3 cluster/tokenize_text.py --tokenizer Qwen3-1.7B/tokenizer.json --out train.h5 a.txt b.txt
    python3 cluster/tokenize_text.py --tokenizer Qwen3-1.7B/tokenizer.json --out held.h5 --max-tokens 1M c.txt

Needs tokenizers, h5py and numpy.
"""
import argparse
import sys


def parse_size(text):
    units = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text and text[-1] in units else int(text)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="UTF-8 text files")
    p.add_argument("--tokenizer", required=True, help="the model's tokenizer.json (Hugging Face format)")
    p.add_argument("--out", required=True, help="token file to write (.h5)")
    p.add_argument("--separator", type=int, default=None,
                   help="id between files (default: the tokenizer's <|endoftext|> or </s> if it has one; -1: none)")
    p.add_argument("--max-tokens", default=None, help="stop after this many tokens (accepts 1M)")
    p.add_argument("--documents", action="store_true",
                   help="write document_offsets: each file a document (packed documents, DESIGN.md §3.6)")
    a = p.parse_args()
    try:
        import h5py
        import numpy as np
        from tokenizers import Tokenizer
    except ImportError as e:
        sys.exit(f"tokenize_text: {e} (pip install tokenizers h5py numpy)")
    tok = Tokenizer.from_file(a.tokenizer)
    sep = a.separator
    if sep is None:
        sep = next((tok.token_to_id(t) for t in ("<|endoftext|>", "</s>", "<eos>") if tok.token_to_id(t) is not None), -1)
    limit = parse_size(a.max_tokens) if a.max_tokens else None
    pieces, total = [], 0
    for i, path in enumerate(a.files):
        with open(path, encoding="utf-8") as f:
            ids = tok.encode(f.read()).ids
        if i > 0 and sep >= 0:
            ids = [sep] + ids
        pieces.append(np.asarray(ids, dtype=np.int32))
        total += len(ids)
        if limit is not None and total >= limit:
            break
    ids = np.concatenate(pieces)[:limit]
    # Document i is ids[offsets[i]:offsets[i + 1]]; a document cut by --max-tokens ends at the cut.
    # An empty file is its separator alone (a 1-token document), or nothing without a separator
    # (offsets strictly increase).
    ends = np.minimum(np.cumsum([len(x) for x in pieces]), len(ids))
    offsets = np.unique(np.concatenate([[0], ends])).astype(np.int64)
    vocab = tok.get_vocab_size()
    with h5py.File(a.out + ".tmp", "w") as f:
        f["input_ids"] = ids
        if a.documents:
            f["document_offsets"] = offsets
        f.attrs["tokenizer"] = a.tokenizer
        f.attrs["vocab_size"] = vocab
    import os
    os.replace(a.out + ".tmp", a.out)
    print(f"tokenize_text: {len(ids)} tokens from {len(pieces)} file(s)"
          f"{f', {len(offsets) - 1} documents' if a.documents else ''}, ids < {int(ids.max()) + 1 if len(ids) else 0} "
          f"(tokenizer vocabulary {vocab}) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
