#!/usr/bin/env python3
"""CTest ruler_teacher.toy: cluster/synth/ruler_teacher.sh end to end at toy size (2 steps a family,
5 samples a cell, lengths 128 and 256): every family's data, training run, both scorings at both
lengths and the table exist, with one row per (family, length, scoring) and the sample counts asked;
a bad argument is refused with exit 2 before anything runs. No accuracy is asserted (two steps learn
nothing). Skipped (exit 77) without h5py/numpy. Usage: ruler_teacher_test.py HYDRA REPO_ROOT
"""
import json
import os
import subprocess
import sys
import tempfile
from hydra_testlib import check, failures

try:
    import h5py  # noqa: F401
    import numpy  # noqa: F401
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

hydra, root = sys.argv[1], sys.argv[2]
script = os.path.join(root, "cluster", "synth", "ruler_teacher.sh")

with tempfile.TemporaryDirectory() as d:
    out = os.path.join(d, "r")
    bad = subprocess.run(["bash", script, "--out", out, "--hydra", hydra, "--families", "cwe,bogus"],
                         capture_output=True, text=True)
    check(bad.returncode == 2 and "unknown family 'bogus'" in bad.stderr, f"bad family: {bad.returncode} {bad.stderr}")
    check(not os.path.exists(out), "nothing written for a bad argument")
    r = subprocess.run(["bash", script, "--out", out, "--hydra", hydra, "--steps", "2", "--samples", "5",
                        "--lengths", "128,256", "--train-tokens", "8K", "--jobs", "2"], capture_output=True, text=True)
    print(r.stdout[-3000:], r.stderr[-3000:])
    check(r.returncode == 0, f"exit {r.returncode}")
    if r.returncode == 0:
        rows = json.load(open(os.path.join(out, "table.json")))
        got = sorted((x["task"], x["length"], x["score"]) for x in rows)
        want = sorted((t, n, s) for t in ("multiquery", "vartrack", "cwe", "fwe") for n in (128, 256)
                      for s in ("teacher-forced", "generate"))
        check(got == want, f"rows {got}")
        check(all(x["samples"] == 5 for x in rows), "5 samples a cell")
        for t in ("multiquery", "vartrack", "cwe", "fwe"):
            check(os.path.exists(os.path.join(out, t, "run", "step-000002", "model.h5")), f"{t}: the trained model")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("ruler_teacher.sh toy run passed")
