#!/usr/bin/env python3
"""Chance levels of the RULER families' scorers (eval-niah --task multiquery|vartrack|cwe|fwe).

A score means something only against what a model gets without the skill the task tests. For each
family this computes, from the documents of a `hydra synth` stream of that family (synth documents
are eval-niah samples at a random depth: the same generator, model/eval/ruler.h), the expected exact
accuracy and recall of a *blind* answerer that knows the format and the context's candidates but not
the one thing the task asks for:

  multiquery  the context's needle values, all of them, in a uniformly random order (ignores which key
              is asked first): exact 1/Q!, recall 1 — order-free recall cannot show a lookup here.
  vartrack    one chain of the context picked uniformly, its variables in context order (ignores the
              queried value): exact 1/chains, recall 1/chains (chains are disjoint).
  cwe, fwe    k distinct words drawn uniformly from the D distinct words of the list, in random order
              (ignores the counts): recall k/D, exact (D−k)!/D!.

and the random-token floor (uniform content ids: ~0 for both scores). Every figure is the mean over
the stream's documents (D varies per document for fwe).

    ruler_chance.py STREAM.h5 [STREAM.h5 ...]   → one JSON line per file

Needs h5py and numpy.
"""
import json
import math
import sys

import h5py
import numpy as np


def statements(ctx, m):
    """(key, rhs) of every NEEDLE key IS rhs END in the context, in order."""
    out, i = [], 0
    while i < len(ctx):
        if ctx[i] == m["needle"]:
            j = ctx.index(m["is"], i)
            k = ctx.index(m["end"], j)
            out.append((tuple(ctx[i + 1:j]), tuple(ctx[j + 1:k])))
            i = k + 1
        else:
            i += 1
    return out


def words(ctx, m):
    """The word list of cwe/fwe: items between SEPs after the END padding."""
    items, cur = [], []
    for t in ctx:
        if t == m["end"] and not cur and not items:
            continue
        if t == m["sep"]:
            items.append(tuple(cur))
            cur = []
        else:
            cur.append(t)
    return items


def blind(kind, ids, a, n, m, retrieval):
    ctx, answer = list(ids[:a]), list(ids[a:a + n])
    q = ctx.index(m["query"])
    ctx = ctx[:q]
    if kind == "multiquery":
        values = [v for _, v in statements(ctx, m)]
        return 1.0 / math.factorial(len(values)), 1.0
    if kind == "vartrack":
        st = statements(ctx, m)
        keys = {k for k, _ in st}
        chains = sum(1 for _, rhs in st if rhs not in keys)  # a chain starts where a value is assigned
        return 1.0 / chains, 1.0 / chains
    if kind in ("cwe", "fwe"):
        d = len(set(words(ctx, m)))
        k = retrieval["common_words"] if kind == "cwe" else retrieval["top_words"]
        return math.factorial(d - k) / math.factorial(d), k / d
    raise SystemExit(f"ruler_chance.py: {kind} is not a RULER family (multiquery, vartrack, cwe, fwe)")


def main(paths):
    for path in paths:
        with h5py.File(path, "r") as f:
            ids = f["input_ids"][...].tolist()
            config = json.loads(f.attrs["config"])
            kinds = json.loads(f.attrs["kinds"])
            doc_kind = f["document_kind"][...]
            starts, lengths, docs = f["answer_start"][...], f["answer_length"][...], f["answer_document"][...]
            seq_len = int(f.attrs["seq_len"])
        v = int(config["vocab_size"])
        m = {"needle": v - 1, "is": v - 2, "end": v - 3, "query": v - 4, "sep": v - 5}
        per_kind = {}
        for s, n, d in zip(starts, lengths, docs):
            kind = kinds[doc_kind[d]]
            base = int(d) * seq_len
            e, r = blind(kind, ids[base:base + seq_len], int(s) - base, int(n), m, config["retrieval"])
            per_kind.setdefault(kind, []).append((e, r))
        for kind, xs in per_kind.items():
            arr = np.array(xs)
            print(json.dumps({"file": path, "task": kind, "length": seq_len, "documents": len(xs),
                              "blind_exact": float(arr[:, 0].mean()), "blind_recall": float(arr[:, 1].mean()),
                              "random_exact": 0.0, "random_recall": 0.0,
                              "knobs": config["retrieval"]}))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
