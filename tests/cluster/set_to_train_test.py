#!/usr/bin/env python3
"""CTest niah_set.training: the retrieval training data of the language teacher (issue 58), under a BPE
tokenizer trained here in memory on sentences that each start with a capital letter:
  * build_niah_set.py --vary-haystack: every sample's haystack starts at a sentence of the text drawn
    from the seed (the samples of a set do not share one opening, as they do without the flag, and
    each opens on a capital); the same seed gives the same file, another seed another file;
  * --calibration: only samples whose answer length at least two different answers share (what
    select-heads needs to corrupt a prompt with another answer), the others dropped;
  * cluster/niah/set_to_train.py: the samples of several sets back to back with one trailing token, so
    hydra train's windows (seq_len + 1 at stride seq_len) are the samples; loss_mask 1 exactly on
    each sample's answer tokens (--loss answers), or on every target but a sample's first token
    (--loss all); document_offsets one document a sample; document_task each sample's set; with --lm,
    language windows cut in order from a token file, every target but the first counted; then
    `hydra train` reads the file and counts as many targets as the mask says;
  * bad input: a sample of another length, --out naming an input, --lm without --lm-windows, a file
    that is no set: one line, exit 1 or 2, nothing written.
Skipped (exit 77) without tokenizers, numpy and h5py.
Usage: set_to_train_test.py HYDRA REPO_ROOT
"""
import json
import os
import random
import string
import subprocess
import sys
import tempfile
from hydra_testlib import check, failures

hydra, root = sys.argv[1], sys.argv[2]
try:
    import h5py
    import numpy as np
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

build = os.path.join(root, "cluster", "niah", "build_niah_set.py")
to_train = os.path.join(root, "cluster", "niah", "set_to_train.py")
rng = random.Random(11)
WORDS = "the a of sky river stone light north quiet garden market winter morning city letter window story".split()
sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "." for _ in range(3000)]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
tok.decoder = decoders.Metaspace(prepend_scheme="never")
# Some two-digit numbers in the training text: their merges make a 4-digit answer 2 to 4 tokens, so
# answer lengths vary (what --calibration sorts by).
numbers = [" ".join(f"{rng.randrange(10, 60)}" for _ in range(30)) for _ in range(40)]
tok.train_from_iterator(sentences + numbers, trainers.BpeTrainer(vocab_size=240, special_tokens=["<unk>"],
                                                       initial_alphabet=list(string.printable)))
L = 512


def run(cmd):
    return subprocess.run([sys.executable] + cmd, capture_output=True, text=True)


def read_set(path):
    with h5py.File(path) as f:
        ids, off = f["input_ids"][...], f["sample_offset"][...]
        return ([ids[off[k]:off[k + 1]] for k in range(len(off) - 1)], f["answer_start"][...], f["answer_length"][...],
                f["depth"][...])


with tempfile.TemporaryDirectory() as d:
    tj = os.path.join(d, "tokenizer.json")
    tok.save(tj)
    hay = os.path.join(d, "hay.txt")
    with open(hay, "w") as f:
        f.write(" ".join(sentences))

    def make(name, task, *extra, seed=3, samples=6, depths="0,100"):
        out = os.path.join(d, name)
        r = run([build, "--tokenizer", tj, "--haystack", hay, "--task", task, "--lengths", str(L), "--depths", depths,
                 "--samples", str(samples), "--seed", str(seed), "--digits", "4", "--out", out, *extra])
        check(r.returncode == 0, f"build_niah_set {name}: exit 0: {r.stderr[-600:]}")
        return out

    # ---- --vary-haystack --------------------------------------------------------------------------
    fixed = read_set(make("fixed.h5", "single"))
    varied_path = make("varied.h5", "single", "--vary-haystack")
    varied = read_set(varied_path)
    # Depth 100: the needle sits at the end, so what follows the instruction is the haystack's opening:
    # without the flag every sample's haystack is the text's first stretch (its length varies with the
    # needle's), with it each is a stretch of its own from anywhere in the text.
    text = " ".join(sentences)

    def openings(st):
        texts = [tok.decode(list(x)) for x, depth in zip(st[0], st[3]) if depth == 100]
        return [text.find(t[t.index("afterwards.") + 11:].lstrip()[:60]) for t in texts]
    check(len(openings(fixed)) == 6 and 0 <= min(openings(fixed)) and max(openings(fixed)) < 4000,
          f"without --vary-haystack every haystack is the text's opening stretch: at characters {openings(fixed)}")
    check(min(openings(varied)) >= 0 and len(set(openings(varied))) == 6 and max(openings(varied)) > 20000,
          f"with --vary-haystack each sample's haystack is its own stretch of the text: at characters {openings(varied)}")
    again = read_set(make("varied2.h5", "single", "--vary-haystack"))
    check(all(np.array_equal(a, b) for a, b in zip(varied[0], again[0])), "the same seed gives the same samples")
    other = read_set(make("varied3.h5", "single", "--vary-haystack", seed=4))
    check(set(openings(other)) != set(openings(varied)), "another seed gives other haystacks")
    for s, a, n, _ in zip(*varied):
        check(len(s) == L and a + n == L, "every sample is --lengths long and ends with its answer")

    # ---- --calibration ----------------------------------------------------------------------------
    plain = read_set(make("calib0.h5", "single", samples=3))
    calib = read_set(make("calib1.h5", "single", "--calibration", samples=3))
    by_len = {}
    for s, a, n, _ in zip(*plain):
        by_len.setdefault(int(n), set()).add(tuple(s[a:a + n]))
    keep = sum(1 for n in plain[2] if len(by_len[int(n)]) >= 2)
    check(len(calib[0]) == keep and 0 < keep < len(plain[0]), f"--calibration keeps the {keep} samples whose answer length two answers share "
                                      f"(got {len(calib[0])} of {len(plain[0])})")
    for s, a, n, _ in zip(*calib):
        others = {tuple(x[b:b + m]) for x, b, m, _ in zip(*calib) if m == n}
        check(len(others) >= 2, f"calibration sample: another answer of its length {n} exists")

    none = os.path.join(d, "calib2.h5")  # 2 samples a depth: no answer length is shared
    r = run([build, "--tokenizer", tj, "--haystack", hay, "--task", "single", "--lengths", str(L), "--depths", "0,100",
             "--samples", "2", "--seed", "3", "--digits", "4", "--calibration", "--out", none])
    check(r.returncode != 0 and "--calibration: no two samples have different answers of one token length" in r.stderr
          and r.stderr.strip().count("\n") == 0 and not os.path.exists(none), f"--calibration with nothing to keep: {r.stderr!r}")

    # ---- set_to_train.py ----------------------------------------------------------------------------
    mk_path = make("mk.h5", "multikey", "--vary-haystack", samples=3)
    out = os.path.join(d, "retrieval.h5")
    r = run([to_train, "--seq-len", str(L), "--seed", "5", "--out", out, varied_path, mk_path])
    check(r.returncode == 0, f"set_to_train: exit 0: {r.stderr[-600:]}")
    sets = {"single": varied, "multikey": read_set(mk_path)}
    with h5py.File(out) as f:
        ids, mask, offs, task = f["input_ids"][...], f["loss_mask"][...], f["document_offsets"][...], f["document_task"][...]
        tasks = f.attrs["tasks"].split(",")
    n = len(task)
    check(n == 12 + 6 and len(ids) == n * L + 1 and len(mask) == len(ids), f"18 samples back to back plus one token: {len(ids)}")
    check(list(offs) == list(range(0, n * L, L)) + [n * L + 1], "one document a sample, the trailing token in the last")
    check(tasks == ["single", "multikey"] and sorted(np.bincount(task).tolist()) == [6, 12], f"document_task: {tasks} {np.bincount(task)}")
    check(ids[-1] == ids[0], "the trailing token is the first sample's first")
    check(not os.path.exists(out + ".tmp"), "written atomically")
    want_counted = 0
    for k in range(n):
        window = ids[k * L:(k + 1) * L]
        s, a, m, _ = sets[tasks[task[k]]]
        hits = [j for j in range(len(s)) if np.array_equal(s[j], window)]
        if not check(len(hits) == 1, f"window {k} is one sample of its set ({tasks[task[k]]})"):
            continue
        j = hits[0]
        expect = np.zeros(L, dtype=np.uint8)
        expect[a[j]:a[j] + m[j]] = 1
        check(np.array_equal(mask[k * L:(k + 1) * L], expect), f"window {k}: loss_mask 1 exactly on its answer")
        want_counted += int(m[j])
    check(int(mask.sum()) == want_counted, f"counted targets: {int(mask.sum())} = the answers' {want_counted}")
    r = run([to_train, "--seq-len", str(L), "--seed", "5", "--loss", "all", "--out", os.path.join(d, "all.h5"), varied_path])
    with h5py.File(os.path.join(d, "all.h5")) as f:
        m_all = f["loss_mask"][...]
    check(r.returncode == 0 and int(m_all.sum()) == 12 * (L - 1) and all(m_all[k * L] == 0 for k in range(12)),
          f"--loss all: every target but each sample's first ({int(m_all.sum())})")

    # --lm: language windows cut in order from a token file, every target but the first counted.
    lm = os.path.join(d, "lm.h5")
    lm_ids = np.array(tok.encode(" ".join(sentences[:1500])).ids, dtype=np.uint16)
    with h5py.File(lm, "w") as f:
        f["input_ids"] = lm_ids
    check(len(lm_ids) > 4 * L + 1, f"the language file holds 4 windows: {len(lm_ids)} tokens")
    stage = os.path.join(d, "stage.h5")
    r = run([to_train, "--seq-len", str(L), "--seed", "6", "--lm", lm, "--lm-windows", "4", "--out", stage, mk_path])
    check(r.returncode == 0 and "6 samples" in r.stdout and "4 language windows" in r.stdout, f"--lm: {r.stdout} {r.stderr[-400:]}")
    with h5py.File(stage) as f:
        ids, mask, task = f["input_ids"][...], f["loss_mask"][...], f["document_task"][...]
    lang = [k for k in range(len(task)) if task[k] == -1]
    check(len(lang) == 4, f"four language windows: {task}")
    got = sorted(tuple(ids[k * L:(k + 1) * L]) for k in lang)
    check(got == sorted(tuple(lm_ids[w * L:(w + 1) * L]) for w in range(4)), "the first four windows of the file")
    check(all(mask[k * L] == 0 and mask[k * L + 1:(k + 1) * L].all() for k in lang), "a language window counts every target but its first")

    # hydra train reads the file: one epoch (18 windows, 2 a step) counts exactly the masked targets.
    model = os.path.join(d, "tiny.h5")
    r = subprocess.run([hydra, "init", "--preset", "hydrahead-tiny", "--weight-seed", "2", "--out", model], capture_output=True, text=True)
    check(r.returncode == 0, f"hydra init: {r.stderr[-300:]}")
    run_dir = os.path.join(d, "run")
    r = subprocess.run([hydra, "train", "--stage", "pretrain", "--model", model, "--data", out, "--seq-len", str(L), "--steps", "9",
                        "--batch-seqs", "2", "--lr", "1e-3", "--save-every", "-1", "--out-dir", run_dir, "--device", "cpu"],
                       capture_output=True, text=True)
    if check(r.returncode == 0, f"hydra train on the file: {r.stderr[-600:]}"):
        steps = [j for j in map(json.loads, open(os.path.join(run_dir, "train.jsonl"))) if j.get("type") == "step"]
        check(len(steps) == 9 and sum(j["counted_tokens"] for j in steps) == want_counted,
              f"one epoch counts the {want_counted} answer tokens: {[j['counted_tokens'] for j in steps]}")

    # ---- bad input: one line, nothing written -------------------------------------------------------
    bad = os.path.join(d, "bad.h5")
    for args, words in (([varied_path], "has 512 tokens, not --seq-len 128"),
                        ([varied_path, "--out", varied_path], "is one of the inputs"),
                        ([varied_path, "--lm", lm], "--lm and --lm-windows N > 0 go together"),
                        ([tj], "not an HDF5 file"),
                        ([lm], "not a hydrahead-niah-set")):
        cmd = [to_train, "--seq-len", "128" if "128" in words else str(L), "--out", bad] + args
        if "--out" in args:
            cmd = [to_train, "--seq-len", str(L)] + args
        r = run(cmd)
        check(r.returncode != 0 and words in r.stderr and r.stderr.strip().count("\n") == 0 and not os.path.exists(bad),
              f"set_to_train {args[1:] or args}: one line naming '{words}': {r.stderr!r}")

print(f"set_to_train_test: {len(failures)} failure(s)")
print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
sys.exit(1 if failures else 0)
