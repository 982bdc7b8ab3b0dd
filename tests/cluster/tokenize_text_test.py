#!/usr/bin/env python3
"""cluster/tokenize_text.py --documents: three text files (the second empty) under a word-level
tokenizer built here give exactly the expected ids, separators and document_offsets; hydra eval-lm
accepts the packed file; without --documents no offsets are written. Skipped (exit 77) without
tokenizers, numpy and h5py in this interpreter (HYDRA_TORCH_PYTHON names one that has them)."""
import os
import subprocess
import sys
import tempfile

hydra, root = sys.argv[1], sys.argv[2]
try:
    import h5py
    import numpy as np
    from tokenizers import Tokenizer, models, pre_tokenizers
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

words = ["<|endoftext|>", "<unk>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
failures = []
with tempfile.TemporaryDirectory() as d:
    tj = os.path.join(d, "tokenizer.json")
    tok.save(tj)
    texts = {"a.txt": "the cat sat on the mat", "b.txt": "", "c.txt": "a dog ran"}
    for n, t in texts.items():
        open(os.path.join(d, n), "w").write(t)
    out = os.path.join(d, "docs.h5")
    r = subprocess.run([sys.executable, os.path.join(root, "cluster", "tokenize_text.py"), "--tokenizer", tj, "--out", out,
                        "--documents"] + [os.path.join(d, n) for n in texts], capture_output=True, text=True)
    print(r.stdout, r.stderr)
    if r.returncode != 0:
        failures.append(f"tokenize_text exited {r.returncode}")
    else:
        with h5py.File(out) as f:
            ids = f["input_ids"][...].tolist()
            offsets = f["document_offsets"][...].tolist() if "document_offsets" in f else None
        # a.txt: 6 ids; b.txt: the separator alone (1 id); c.txt: separator + 3 ids.
        want_ids = [2, 3, 4, 5, 2, 6, 0, 0, 7, 8, 9]
        if ids != want_ids:
            failures.append(f"input_ids {ids}, expected {want_ids}")
        if offsets != [0, 6, 7, 11]:
            failures.append(f"document_offsets {offsets}, expected [0, 6, 7, 11]")
        # hydra accepts the file as packed documents (a forward over one window of all 11 tokens).
        model = os.path.join(d, "m.h5")
        subprocess.run([hydra, "init", "--preset", "qwen3-tiny", "--weight-seed", "1", "--out", model], check=True,
                       capture_output=True)
        r = subprocess.run([hydra, "eval-lm", "--model", model, "--data", out, "--seq-len", "10", "--windows", "1",
                            "--out", os.path.join(d, "lm.json")], capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"hydra eval-lm on the packed file exited {r.returncode}: {r.stderr.strip()[-300:]}")
    # Without --documents: no offsets.
    plain = os.path.join(d, "plain.h5")
    subprocess.run([sys.executable, os.path.join(root, "cluster", "tokenize_text.py"), "--tokenizer", tj, "--out", plain]
                   + [os.path.join(d, n) for n in texts], check=True, capture_output=True)
    with h5py.File(plain) as f:
        if "document_offsets" in f:
            failures.append("document_offsets written without --documents")
for f in failures:
    print("FAIL:", f)
print(f"tokenize_text_test: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
