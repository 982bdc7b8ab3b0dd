#!/usr/bin/env python3
"""cluster/bench/decode_job.jobs, issue 57's decode GPU job (or another decode jobs file, e.g.
decode_gemv.jobs), on the CPU (no GPU is made visible):

  decode_job_test.py HYDRA TEST_CUDA PROJECT_ROOT [JOBS_FILE under cluster/bench/]

- the jobs file follows cluster/gpu_job.sh's format (every line a LABEL SECONDS COMMAND the harness
  accepts, labels distinct);
- run through the real harness in a folder laid out as on the device (build/bin/hydra,
  build/tests/test_cuda, cluster/), every job runs: each `hydra bench` and `hydra generate` line gets
  as far as asking for the GPU (so its flags parse: an unknown flag or a bad value would be refused
  first), hydra synth writes the prompt, the GPU tests report SKIPPED, the table runs;
  (the prompt checked where the file has a synth line);
- same_tokens.py passes equal outputs and fails different ones, naming the first differing token.
"""
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile

hydra, test_cuda, root = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])
jobs_name = sys.argv[4] if len(sys.argv) > 4 else "decode_job.jobs"
jobs_file = os.path.join(root, "cluster", "bench", jobs_name)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


# 1. The format, as gpu_job.sh reads it.
commands = {}  # label -> command
with open(jobs_file) as f:
    text = f.read()
for line in text.splitlines():
    if not line.strip() or line.startswith("#"):
        continue
    parts = line.split(None, 2)
    ok = len(parts) == 3 and re.fullmatch(r"[A-Za-z0-9_.-]+", parts[0]) is not None and parts[1].isdigit()
    check(ok, f"a line the harness would reject: {line!r}")
    if ok:
        check(parts[0] not in commands, f"label {parts[0]} repeats")
        commands[parts[0]] = parts[2]

# 2. Through the harness, laid out as on the device.
with tempfile.TemporaryDirectory() as tmp:
    for d in ("build/bin", "build/tests"):
        os.makedirs(os.path.join(tmp, d))
    os.symlink(os.path.abspath(hydra), os.path.join(tmp, "build/bin/hydra"))
    os.symlink(os.path.abspath(test_cuda), os.path.join(tmp, "build/tests/test_cuda"))
    os.symlink(os.path.join(root, "cluster"), os.path.join(tmp, "cluster"))
    out = os.path.join(tmp, "out")
    os.makedirs(out)
    name = f"decodejobtest{os.getpid()}"
    env = dict(os.environ, OUT=out, CUDA_VISIBLE_DEVICES="")  # never a real GPU run from the test suite
    r = subprocess.run(["bash", "cluster/gpu_job.sh", "--name", name, "--deadline", "600", f"cluster/bench/{jobs_name}"],
                       cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    check(r.returncode == 1, f"exit {r.returncode} (the GPU jobs fail without a GPU: expected 1)\n{r.stdout}{r.stderr}")
    tgz = os.path.join(out, f"{name}.tgz")
    check(os.path.exists(tgz), "the result tarball")
    logs = {}
    if os.path.exists(tgz):
        with tarfile.open(tgz) as t:
            for m in t.getmembers():
                if m.isfile() and m.name.endswith(".log"):
                    logs[os.path.basename(m.name)[:-4]] = t.extractfile(m).read().decode(errors="replace")
            timeline = t.extractfile(f"{name}/timeline.txt").read().decode()
        for label in commands:
            check(f"{label}: rc" in timeline, f"job {label} did not run: {timeline}")
            check(label in logs, f"no log for {label}")
    # Each hydra line gets as far as asking for the GPU: its flags and values were accepted.
    no_gpu = ("needs a CUDA device", "no CUDA device is visible", "HYDRA_CUDA=OFF")
    for label, command in commands.items():
        if "$H bench" in command or "$H generate" in command:
            log = logs.get(label, "")
            check(any(s in log for s in no_gpu), f"{label}: not refused for the missing GPU alone: {log[-400:]!r}")
    if any("$H synth" in c for c in commands.values()):
        # In the job's own result folder ($R): the three ctest entries of this script run at once, so
        # no path outside it may be shared (a fixed /tmp name was removed by one run under another).
        check(os.path.exists(f"/tmp/{name}/prompt.h5"), "hydra synth wrote the 32K prompt")
    for label, command in commands.items():
        if "test_cuda" in command:
            log = logs.get(label, "")
            check("SKIPPED" in log and "FAILED" not in log, f"{label}: the GPU tests did not skip: {log[-300:]!r}")
    check("## Decode" in logs.get("table", ""), f"the table ran: {logs.get('table', '')!r}")
    subprocess.run(["rm", "-rf", f"/tmp/{name}"])

# 3. same_tokens.py.
same = os.path.join(root, "cluster", "bench", "same_tokens.py")
with tempfile.TemporaryDirectory() as tmp:
    def write(path, tokens, graph):
        with open(path, "w") as f:
            f.write(json.dumps({"prompt_index": 0, "tokens": tokens}) + "\n")
            f.write(json.dumps({"summary": True, "cuda_graph": graph, "decode_tokens_per_s": 100.0}) + "\n")
    a, b, c = (os.path.join(tmp, n) for n in ("a.jsonl", "b.jsonl", "c.jsonl"))
    write(a, [5, 6, 7, 8], True)
    write(b, [5, 6, 7, 8], False)
    write(c, [5, 6, 9, 8], False)
    ok = subprocess.run([sys.executable, same, a, b], capture_output=True, text=True)
    check(ok.returncode == 0 and "tokens equal (graph vs eager): yes" in ok.stdout, f"equal outputs: {ok.stdout}{ok.stderr}")
    bad = subprocess.run([sys.executable, same, a, c], capture_output=True, text=True)
    check(bad.returncode == 1 and "prompt 0 differs from token 2 of 4" in bad.stdout, f"different outputs: {bad.stdout}")
    swapped = subprocess.run([sys.executable, same, b, a], capture_output=True, text=True)
    check(swapped.returncode == 1 and "want true, false" in swapped.stdout, f"modes swapped: {swapped.stdout}")
    # --same-mode: two kernel choices in one mode (decode_fused.jobs).
    d = os.path.join(tmp, "d.jsonl")
    write(d, [5, 6, 7, 8], True)
    same_ok = subprocess.run([sys.executable, same, "--same-mode", a, d], capture_output=True, text=True)
    check(same_ok.returncode == 0 and "tokens equal (same mode, other kernels): yes" in same_ok.stdout,
          f"--same-mode, equal: {same_ok.stdout}{same_ok.stderr}")
    mixed = subprocess.run([sys.executable, same, "--same-mode", a, b], capture_output=True, text=True)
    check(mixed.returncode == 1 and "want the same" in mixed.stdout, f"--same-mode, graph against eager: {mixed.stdout}")
    same_bad = subprocess.run([sys.executable, same, "--same-mode", b, c], capture_output=True, text=True)
    check(same_bad.returncode == 1 and "prompt 0 differs from token 2 of 4" in same_bad.stdout,
          f"--same-mode, different tokens: {same_bad.stdout}")

for f in failures:
    print("FAILED:", f)
print("decode_job_test:", "FAILED" if failures else "PASSED")
sys.exit(1 if failures else 0)
