#!/usr/bin/env python3
"""cluster/tokenize_text.py on bad input, as a careless user or a hostile file gives it (issue 54):
every case ends with exit status != 0, exactly one line on stderr that starts "tokenize_text: " and
names the problem, no traceback, no output written (no manifest, no shard, no .h5) and every input
unchanged; after a bad record met by a worker process the same command runs once the input is
fixed. A fuzzing-style pass then feeds .jsonl lines of every JSON kind in every field a record has
(plain and supervised) and requires the same outcome, or success.

    python3 tests/cluster/tokenize_hostile_test.py HYDRA ROOT [SCRIPT]

SCRIPT (default ROOT/cluster/tokenize_text.py) lets the cases run against another version of the
script, e.g. 6777ccb's, to see them fail there. Skipped (exit 77) without tokenizers, numpy and h5py.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

hydra, root = sys.argv[1], sys.argv[2]
script = os.path.abspath(sys.argv[3] if len(sys.argv) > 3 else os.path.join(root, "cluster", "tokenize_text.py"))
try:
    import h5py  # noqa: F401
    import numpy as np  # noqa: F401
    from tokenizers import Tokenizer, models, pre_tokenizers
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

failures = []


def word_tokenizer(path, n_words):
    """A word-level tokenizer of <|endoftext|>, <unk> and n_words - 2 words w0, w1, ..."""
    words = ["<|endoftext|>", "<unk>"] + [f"w{i}" for i in range(n_words - 2)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(path)
    assert tok.get_vocab_size() == n_words
    return path


def digest(folder):
    """Names and bytes of every file under `folder` (and its folders' names): what a refused run must
    leave as it found it."""
    out = {}
    for base, dirs, files in os.walk(folder):
        for n in dirs:
            out[os.path.relpath(os.path.join(base, n), folder) + "/"] = "folder"
        for n in files:
            p = os.path.join(base, n)
            out[os.path.relpath(p, folder)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def expect_refused(name, args, needle, work, env=None, written=()):
    """Runs the script in `work`; the run must end as the contract says. `written`: outputs that must not
    exist afterwards (beyond the folder's own unchanged files)."""
    before = digest(work)
    try:
        r = subprocess.run([sys.executable, script] + args, capture_output=True, text=True, cwd=work, timeout=120,
                           env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired:
        failures.append(f"{name}: did not end within 120 s")
        return
    err = r.stderr.strip()
    after = digest(work)
    problems = []
    if r.returncode == 0:
        problems.append("exit 0")
    if "Traceback" in err:
        problems.append("a traceback")
    if len(err.splitlines()) != 1 or not err.startswith("tokenize_text: "):
        problems.append(f"{len(err.splitlines())} line(s) on stderr, not one 'tokenize_text: ' line")
    if needle not in err:
        problems.append(f"'{needle}' not in the message")
    if after != before:
        changed = sorted(set(after.items()) ^ set(before.items()))
        problems.append(f"files changed: {sorted({k for k, _ in changed})}")
    for w in written:
        if os.path.exists(os.path.join(work, w)):
            problems.append(f"{w} was written")
    if problems:
        failures.append(f"{name}: {'; '.join(problems)} (exit {r.returncode}): {err[-400:]!r}")
    else:
        print(f"ok   {name}: {err}")


def write(path, data):
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return path


def jsonl(path, records):
    return write(path, "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


with tempfile.TemporaryDirectory() as work:
    t19 = word_tokenizer(os.path.join(work, "t19.json"), 19)
    t124 = word_tokenizer(os.path.join(work, "t124.json"), 124)
    good = jsonl(os.path.join(work, "good.jsonl"), [{"text": "w1 w2 w3"}, {"text": "w4 w5"}])
    write(os.path.join(work, "good.txt"), "w1 w2\nw3 w4\n")
    cases = [
        # Tracebacks before: bytes, records and fields of the wrong kind.
        ("non-UTF-8 .txt", ["--tokenizer", t19, "--out", "OUT", write(os.path.join(work, "latin1.txt"), b"w1 \xe9t\xe9 w2\n")],
         "not UTF-8"),
        ("non-UTF-8 .jsonl", ["--tokenizer", t19, "--out", "OUT",
                              write(os.path.join(work, "latin1.jsonl"), b'{"text": "w1 \xe9"}\n')], "not UTF-8"),
        ("text 5", ["--tokenizer", t19, "--out", "OUT", jsonl(os.path.join(work, "n.jsonl"), [{"text": 5}])],
         "field 'text' is 5, not a string"),
        ("text null", ["--tokenizer", t19, "--out", "OUT", jsonl(os.path.join(work, "null.jsonl"), [{"text": None}])],
         "field 'text' is null, not a string"),
        ("a number line", ["--tokenizer", t19, "--out", "OUT", jsonl(os.path.join(work, "num.jsonl"), ["5"])],
         "a JSON object with a 'text' string expected, got 5"),
        ("an array line", ["--tokenizer", t19, "--out", "OUT", jsonl(os.path.join(work, "arr.jsonl"), ['["w1", "w2"]'])],
         "a JSON object with a 'text' string expected"),
        ("a null line", ["--tokenizer", t19, "--out", "OUT", jsonl(os.path.join(work, "nullline.jsonl"), ["null"])],
         "a JSON object with a 'text' string expected, got null"),
        ("a string line", ["--tokenizer", t19, "--out", "OUT", jsonl(os.path.join(work, "str.jsonl"), ['"w1 w2"'])],
         "a JSON object with a 'text' string expected"),
        ("text a list (was encoded as a pair)",
         ["--tokenizer", t19, "--out", "OUT", jsonl(os.path.join(work, "pair.jsonl"), [{"text": ["w1", "w2"]}])],
         "field 'text' is [\"w1\", \"w2\"], not a string"),
        ("supervised prompt 5", ["--tokenizer", t19, "--out", "OUT", "--supervised",
                                 jsonl(os.path.join(work, "p5.jsonl"), [{"prompt": 5, "response": "w1"}])],
         "\"prompt\" is 5, not a string"),
        ("supervised response null", ["--tokenizer", t19, "--out", "OUT", "--supervised",
                                      jsonl(os.path.join(work, "rnull.jsonl"), [{"prompt": "w1", "response": None}])],
         "\"response\" is null, not a string"),
        ("chat with an unknown role",
         ["--tokenizer", t19, "--out", "OUT", "--supervised",
          jsonl(os.path.join(work, "role.jsonl"), [{"messages": [{"role": "wizard", "content": "w1"},
                                                                 {"role": "assistant", "content": "w2"}]}])],
         "unknown role \"wizard\""),
        ("chat with no messages", ["--tokenizer", t19, "--out", "OUT", "--supervised",
                                   jsonl(os.path.join(work, "empty_chat.jsonl"), [{"messages": []}])],
         "\"messages\" is empty"),
        ("chat with no assistant message",
         ["--tokenizer", t19, "--out", "OUT", "--supervised",
          jsonl(os.path.join(work, "no_asst.jsonl"), [{"messages": [{"role": "user", "content": "w1"}]}])],
         "no assistant message"),
        # Flags and files.
        ("--out an existing file (folder output)", ["--tokenizer", t19, "--out", "good.txt", good], "is a file, not a folder"),
        ("--out naming the input (FILE.h5)",
         ["--tokenizer", t19, "--out", "notes.h5", write(os.path.join(work, "notes.h5"), "w1 w2 w3\n")],
         "an input of this run"),
        ("--out a link to the input", ["--tokenizer", t19, "--out", "link.h5", "good.txt"], "an input of this run"),
        ("--shard-tokens abc", ["--tokenizer", t19, "--out", "OUT", "--shard-tokens", "abc", good],
         "--shard-tokens abc: not a positive size"),
        ("--chunk-bytes 0", ["--tokenizer", t19, "--out", "OUT", "--chunk-bytes", "0", good], "--chunk-bytes 0"),
        ("--max-tokens abc", ["--tokenizer", t19, "--out", "OUT.h5", "--max-tokens", "abc", "good.txt"],
         "--max-tokens abc: not a positive size"),
        ("a garbage tokenizer.json", ["--tokenizer", write(os.path.join(work, "garbage.json"), "{not a tokenizer"), "--out",
                                      "OUT", good], "not a tokenizer.json the tokenizers library reads"),
        ("a garbage tokenizer.json (FILE.h5)", ["--tokenizer", "garbage.json", "--out", "OUT.h5", "good.txt"],
         "not a tokenizer.json the tokenizers library reads"),
        ("a missing input (FILE.h5)", ["--tokenizer", t19, "--out", "OUT.h5", "absent.txt"], "absent.txt: no such file"),
        ("--separator 300 with 19 words (was stored as 44)", ["--tokenizer", t19, "--out", "OUT", "--separator", "300", good],
         "--separator 300 is not an id of the tokenizer's vocabulary of 19"),
        ("--separator 1000 with 124 words (was stored as 232)",
         ["--tokenizer", t124, "--out", "OUT", "--separator", "1000", good],
         "--separator 1000 is not an id of the tokenizer's vocabulary of 124"),
        ("an id beyond the vocabulary in an int32 file", ["--tokenizer", t19, "--out", "OUT.h5", "--separator", "5000",
                                                           "good.txt", "good.txt"], "--separator 5000 is not an id"),
        ("--separator -5", ["--tokenizer", t19, "--out", "OUT", "--separator", "-5", good], "--separator -5"),
        ("an empty input with --documents --separator -1 (hydra refused the file)",
         ["--tokenizer", t19, "--out", "OUT.h5", "--documents", "--separator", "-1",
          write(os.path.join(work, "empty.txt"), "")], "the inputs hold no tokens"),
        ("an empty .jsonl (folder output)", ["--tokenizer", t19, "--out", "OUT",
                                             write(os.path.join(work, "empty.jsonl"), "")], "the inputs hold no tokens"),
    ]
    os.symlink("good.txt", os.path.join(work, "link.h5"))
    for k, (name, args, needle) in enumerate(cases):  # each its own output: one case's leftovers never blame another
        args = [f"o{k}" if x == "OUT" else f"o{k}.h5" if x == "OUT.h5" else x for x in args]
        expect_refused(name, args, needle, work, written=(f"o{k}", f"o{k}.h5"))
    # .parquet without pyarrow: a pyarrow that cannot be imported first on the path.
    fake = os.path.join(work, "no_pyarrow")
    os.makedirs(os.path.join(fake, "pyarrow"))
    write(os.path.join(fake, "pyarrow", "__init__.py"), "raise ImportError('No module named pyarrow (test)')\n")
    write(os.path.join(work, "t.parquet"), b"PAR1 not really")
    expect_refused(".parquet without pyarrow", ["--tokenizer", t19, "--out", "op", "t.parquet"], "needs pyarrow", work,
                   env={"PYTHONPATH": fake}, written=("op",))
    os.remove(os.path.join(work, "t.parquet"))

    # A bad record met by a worker (--processes 2, the record in the second of several pieces): one
    # line, no traceback, no shard left; fixed, the same command runs.
    lines = [{"text": " ".join(f"w{(i * 7 + k) % 17}" for k in range(12))} for i in range(300)]
    bad = jsonl(os.path.join(work, "bad_worker.jsonl"), lines[:200] + [{"text": 5}] + lines[200:])
    command = ["--tokenizer", t19, "--out", "w", "--chunk-bytes", "2K", "--processes", "2", bad]
    os.makedirs(os.path.join(work, "w"))
    expect_refused("--processes 2 with a bad record", command, "field 'text' is 5, not a string", work,
                   written=("w/manifest.json",))
    left = os.listdir(os.path.join(work, "w"))
    if left:
        failures.append(f"--processes 2 with a bad record: left {left} behind")
    jsonl(bad, lines)
    r = subprocess.run([sys.executable, script] + command, capture_output=True, text=True, cwd=work, timeout=120)
    if r.returncode != 0 or not os.path.exists(os.path.join(work, "w", "manifest.json")):
        failures.append(f"the rerun after the fix: exit {r.returncode}: {r.stderr.strip()[-300:]!r}")
    else:
        print(f"ok   the rerun after the fix: {r.stdout.strip()}")

    # Fuzzing-style: each JSON kind in each field of a record, plain and supervised. Allowed outcomes:
    # success with a manifest, or the contract's refusal. A string is the one valid kind of a text.
    kinds = [5, -1, 1.5, 1e300, None, True, "", "w1", [], ["w1", "w2"], {}, {"a": 1}, "\u00e9t\u00e9"]
    shapes = []
    for v in kinds:
        shapes += [("plain", {"text": v}), ("plain", v), ("sup", {"prompt": v, "response": "w1"}),
                   ("sup", {"prompt": "w1", "response": v}), ("sup", {"messages": v}),
                   ("sup", {"messages": [{"role": v, "content": "w1"}, {"role": "assistant", "content": "w2"}]}),
                   ("sup", {"messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "content": v}]}),
                   ("sup", {"messages": [v, {"role": "assistant", "content": "w2"}]})]
    fuzz_ok = fuzz_refused = 0
    for i, (mode, rec) in enumerate(shapes):
        path = jsonl(os.path.join(work, f"fuzz{i}.jsonl"), [{"text": "w1 w2"} if mode == "plain" else
                                                             {"prompt": "w1", "response": "w2"}, rec])
        args = ["--tokenizer", t19, "--out", f"f{i}", "--processes", "1"] + (["--supervised"] if mode == "sup" else [])
        r = subprocess.run([sys.executable, script] + args + [path], capture_output=True, text=True, cwd=work, timeout=120)
        err = r.stderr.strip()
        if r.returncode == 0 and os.path.exists(os.path.join(work, f"f{i}", "manifest.json")):
            fuzz_ok += 1
        elif (r.returncode != 0 and "Traceback" not in err and len(err.splitlines()) == 1
              and err.startswith("tokenize_text: ") and not os.path.exists(os.path.join(work, f"f{i}"))):
            fuzz_refused += 1
        else:
            failures.append(f"fuzz {mode} {json.dumps(rec)[:80]}: exit {r.returncode}: {err[-300:]!r}")
    print(f"fuzz: {len(shapes)} records: {fuzz_ok} tokenized, {fuzz_refused} refused with one line")
    if fuzz_refused == 0:
        failures.append("fuzz: nothing was refused (is the fuzzer feeding anything?)")

for f in failures:
    print("FAIL:", f)
print(f"tokenize_hostile_test: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
