#!/usr/bin/env python3
"""cluster/gpu_job.sh, the GPU job harness, on the CPU: jobs run in order under their own limit and
the deadline, each job's log and the timeline land in the result folder, which is tarred into $OUT
after every job; a job that fails or times out makes the exit status 1; a bad job line is reported
and skipped; bad arguments are one error line and exit 2. (nvidia-smi may be absent here.)"""
import os
import subprocess
import sys
import tarfile
import tempfile

root = sys.argv[1]
harness = os.path.join(root, "cluster", "gpu_job.sh")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "out")
    os.makedirs(out)
    jobs = os.path.join(tmp, "jobs.txt")
    with open(jobs, "w") as f:
        f.write("# comment\n"
                "hello 5 echo hello from $R; echo '{\"summary\": true, \"x\": 1}'\n"
                "slow 1 sleep 5\n"
                "bad x echo never\n"
                "fails 5 exit 3\n")
    name = f"gpujobtest{os.getpid()}"
    env = dict(os.environ, OUT=out)
    r = subprocess.run(["bash", harness, "--name", name, "--deadline", "60", jobs], cwd=tmp, env=env,
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 1, f"exit {r.returncode} (a job failed: expected 1)\n{r.stdout}{r.stderr}")
    check("hello: rc 0" in r.stdout, "the timeline line of the first job")
    check('{"summary": true, "x": 1}' in r.stdout, "the kept JSON summary line")
    check("slow: rc 124 (timed out after 1 s)" in r.stdout, "the timed-out job")
    check("bad job line: bad x echo never" in r.stdout, "the bad line reported")
    check("fails: rc 3" in r.stdout, "the failing job")
    tgz = os.path.join(out, f"{name}.tgz")
    check(os.path.exists(tgz), "the result tarball")
    if os.path.exists(tgz):
        with tarfile.open(tgz) as t:
            names = set(t.getnames())
            for n in ("hello.log", "slow.log", "fails.log", "timeline.txt", "gpu.txt"):
                check(f"{name}/{n}" in names, f"{n} in the tarball")
            log = t.extractfile(f"{name}/hello.log").read().decode()
            check(f"hello from /tmp/{name}" in log, f"R is the result folder: {log!r}")
    check(not os.path.exists(tgz + ".tmp"), "no temporary tarball left")
    subprocess.run(["rm", "-rf", f"/tmp/{name}"])
    # Bad arguments: one line, exit 2, before any job runs.
    for args, needle in ((["--deadline", "60", jobs], "--name"), (["--name", "x", "/nonexistent"], "not readable"),
                         (["--name", "x", "--deadline", "soon", jobs], "--deadline")):
        r = subprocess.run(["bash", harness] + args, cwd=tmp, env=env, capture_output=True, text=True, timeout=30)
        check(r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1,
              f"{args}: exit {r.returncode}, {r.stderr!r}")

for f in failures:
    print("FAILED:", f)
print("gpu_job_test:", "FAILED" if failures else "PASSED")
sys.exit(1 if failures else 0)
