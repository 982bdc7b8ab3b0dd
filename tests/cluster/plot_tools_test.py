#!/usr/bin/env python3
"""The plot scripts write what their --out names and title what they show.

cluster/niah/plot_niah.py (heatmaps and --ruler), cluster/heads/plot_heads.py, cluster/plot_train.py and
cluster/plot_sweep.py, each to .svg and .png: the file holds that format (at 6777ccb every script saved a
temporary .png and renamed it, so x.svg held PNG bytes); an extension matplotlib cannot write is one
line and no file. The heatmap of mean_recall is titled "mean recall", not "mean mean recall" (6777ccb),
and the NIAH figures name the scoring mode of the cells. Skipped (exit 77) without matplotlib and numpy.

    plot_tools_test.py HYDRA_BINARY REPO_ROOT   (the binary is not used)
"""
import json
import os
import subprocess
import sys
import tempfile

from hydra_testlib import check, failures

root = sys.argv[2]
try:
    import matplotlib  # noqa: F401
    import numpy  # noqa: F401
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)


def magic(path):
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith(b"\x89PNG"):
        return "png"
    if b"<svg" in head or head.lstrip().startswith(b"<?xml"):
        return "svg"
    return repr(head[:16])


with tempfile.TemporaryDirectory() as d:
    # SVG text as text (not glyph paths), so the titles can be read back.
    with open(os.path.join(d, "matplotlibrc"), "w") as f:
        f.write("svg.fonttype: none\nbackend: Agg\n")
    env = dict(os.environ, MATPLOTLIBRC=os.path.join(d, "matplotlibrc"))

    results = os.path.join(d, "ruler.jsonl")
    with open(results, "w") as f:
        for task in ("single", "cwe"):
            for length in (256, 512):
                for depth in ((0, 50) if task == "single" else (0,)):
                    f.write(json.dumps({"type": "cell", "task": task, "length": length, "depth": depth, "samples": 2,
                                        "correct": 1, "accuracy": 0.5, "mean_recall": 0.75, "mean_logprob": -3.0,
                                        "score": "generate", "seconds": 0.1}) + "\n")
    heads = os.path.join(d, "heads.json")
    with open(heads, "w") as f:
        json.dump({"format": "hydrahead-fa-heads", "version": 1, "fa_heads": [[0], [1, 2]],
                   "scores": {name: [[0.1, 0.5, 0.2, 0.0], [0.3, 0.9, 0.8, 0.1]] for name in ("composite", "total", "direct", "lm")},
                   "selection": {"budget": 3, "mode": "global"}}, f)
    run = os.path.join(d, "run")
    os.makedirs(run)
    with open(os.path.join(run, "train.jsonl"), "w") as f:
        for step in range(1, 11):
            f.write(json.dumps({"step": step, "loss": 5.0 - 0.1 * step}) + "\n")
    sweep = os.path.join(d, "sweep.jsonl")
    with open(sweep, "w") as f:
        for gpus in (1, 2):
            f.write(json.dumps({"command": "prefill", "seq_len": 131072, "ranks": gpus, "seconds": 2.0 / gpus,
                                "tokens_per_s": 65536.0 * gpus}) + "\n")

    scripts = {
        "heatmap": [os.path.join(root, "cluster", "niah", "plot_niah.py"), results, "--metric", "mean_recall"],
        "ruler": [os.path.join(root, "cluster", "niah", "plot_niah.py"), results, "--ruler"],
        "heads": [os.path.join(root, "cluster", "heads", "plot_heads.py"), heads],
        "train": [os.path.join(root, "cluster", "plot_train.py"), run],
        "sweep": [os.path.join(root, "cluster", "plot_sweep.py"), sweep],
    }
    for name, cmd in scripts.items():
        for ext in ("svg", "png"):
            out = os.path.join(d, f"{name}.{ext}")
            r = subprocess.run([sys.executable] + cmd + ["--out", out], capture_output=True, text=True, env=env)
            if not check(r.returncode == 0, f"{name} -> .{ext}: exit {r.returncode}: {r.stderr[-400:]}"):
                continue
            check(magic(out) == ext, f"{name}: {out} holds {magic(out)}, not {ext}")
            check(not [n for n in os.listdir(d) if ".tmp-" in n], f"{name}: a temporary file was left: {os.listdir(d)}")
        svg = open(os.path.join(d, f"{name}.svg"), encoding="utf-8").read() if os.path.exists(os.path.join(d, f"{name}.svg")) else ""
        if name == "heatmap":
            check("mean mean" not in svg and "single: mean recall 0.750" in svg,
                  "heatmap title: 'single: mean recall 0.750' (not 'mean mean recall')")
        if name in ("heatmap", "ruler"):
            check("generate" in svg, f"{name}: the scoring mode (generate) is in the figure")
        print(f"{name}: .svg and .png written as named")
    out = os.path.join(d, "heads.xyz")
    r = subprocess.run([sys.executable] + scripts["heads"] + ["--out", out], capture_output=True, text=True, env=env)
    check(r.returncode != 0 and "cannot write .xyz" in r.stderr and len(r.stderr.strip().splitlines()) == 1
          and not os.path.exists(out), f"an unknown extension is one line and no file: {r.stderr.strip()!r}")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all passed")
