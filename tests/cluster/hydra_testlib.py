"""What the Python tests of tests/cluster share: running the hydra binary and reading its logits.

The tests run as scripts (`python3 tests/cluster/X_test.py ...`), so this folder is on sys.path and
`from hydra_testlib import ...` finds this file. A test imports it after its own check for numpy and
h5py (it exits 77, skipped, without them): this module imports both.
"""
import subprocess

import h5py
import numpy as np


def run(*args, env=None):
    """Runs a command (arguments made strings); its stdout, or SystemExit with its output on failure."""
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"FAILED: {' '.join(map(str, args))}\n{r.stdout}{r.stderr}")
    return r.stdout


def hydra_logits(hydra, model, ids, tmp):
    """`hydra forward --output` of one sequence of token ids: its logits [T, vocab] as written (float32).
    Writes tokens.h5 and logits.h5 in the folder tmp (a Path)."""
    tokens, out = tmp / "tokens.h5", tmp / "logits.h5"
    with h5py.File(tokens, "w") as f:
        f["input_ids"] = np.asarray(ids, dtype=np.int64)
    run(hydra, "forward", "--model", model, "--input", tokens, "--output", out)
    with h5py.File(out, "r") as f:
        return f["logits"][...]
