#!/usr/bin/env python3
"""Runs the README's CPU training recipe exactly as written: the shell lines between
`<!-- readme-recipe: cpu-training -->` and `<!-- /readme-recipe -->`, in a fresh directory, with the
built hydra first on PATH, under `bash -euo pipefail`. Fails if the block is missing, a line fails,
a run leaves no checkpoint, or the NIAH and generation outputs do not hold what the README says.

    readme_recipe_test.py HYDRA_BINARY REPO_ROOT
"""
import json
import os
import re
import subprocess
import sys
import tempfile


def main():
    hydra, root = sys.argv[1], sys.argv[2]
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    m = re.search(r"<!-- readme-recipe: cpu-training -->\s*```sh\n(.*?)```\s*<!-- /readme-recipe -->", readme, re.S)
    if not m:
        print("README.md: no cpu-training recipe block")
        return 1
    script = m.group(1)
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ, PATH=os.path.dirname(os.path.abspath(hydra)) + os.pathsep + os.environ["PATH"])
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env)
        if r.returncode != 0:
            print(f"the README recipe failed (exit {r.returncode})")
            return 1
        for run in ("teacher", "align", "distill", "finetune"):
            latest = os.path.join(work, "runs", run, "latest")
            if not os.path.exists(latest):
                print(f"runs/{run}: no checkpoint")
                return 1
        niah = [json.loads(l) for l in open(os.path.join(work, "niah.jsonl")) if l.strip()]
        if not niah:
            print("niah.jsonl: empty")
            return 1
        lines = [json.loads(l) for l in open(os.path.join(work, "generated.jsonl")) if l.strip()]
        prompts = [l for l in lines if not l.get("summary")]
        if len(prompts) != 1 or len(prompts[0]["tokens"]) != 16 and not prompts[0]["stopped"]:
            print(f"generated.jsonl: expected one prompt with 16 new tokens, got {prompts}")
            return 1
    print("the README recipe ran as written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
