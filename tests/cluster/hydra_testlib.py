"""What the Python tests of tests/cluster share: recording failed checks, running the hydra binary,
reading its logits and a checkpoint's FA heads.

The tests run as scripts (`python3 tests/cluster/X_test.py ...`), so this folder is on sys.path and
`from hydra_testlib import ...` finds this file. It needs only the standard library to import;
`hydra_logits` imports numpy and h5py when called (a test that uses it checks for them first and
exits 77, skipped, without them).
"""
import re
import subprocess

failures = []  # what every failed check() said, in order


def check(ok, what):
    """Records and prints a failed check; returns ok, so a test can skip what depends on it."""
    if not ok:
        failures.append(what)
        print(f"FAILED: {what}")
    return ok


def fa_heads(info_path):
    """The FA heads per layer from `hydra info`'s output saved in info_path ("layer   0: FA heads [0, 3]")."""
    text = open(info_path).read()
    return [[int(x) for x in m.group(1).replace(" ", "").split(",") if x]
            for m in re.finditer(r"layer\s+\d+: FA heads \[([^\]]*)\]", text)]


def run(*args, env=None):
    """Runs a command (arguments made strings); its stdout, or SystemExit with its output on failure."""
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"FAILED: {' '.join(map(str, args))}\n{r.stdout}{r.stderr}")
    return r.stdout


def hydra_logits(hydra, model, ids, tmp):
    """`hydra forward --output` of one sequence of token ids: its logits [T, vocab] as written (float32).
    Writes tokens.h5 and logits.h5 in the folder tmp (a Path)."""
    import h5py
    import numpy as np

    tokens, out = tmp / "tokens.h5", tmp / "logits.h5"
    with h5py.File(tokens, "w") as f:
        f["input_ids"] = np.asarray(ids, dtype=np.int64)
    run(hydra, "forward", "--model", model, "--input", tokens, "--output", out)
    with h5py.File(out, "r") as f:
        return f["logits"][...]
