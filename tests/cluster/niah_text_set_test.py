#!/usr/bin/env python3
"""cluster/niah/build_niah_set.py's tasks in natural language (NIAH's single, multikey, multivalue and
RULER's multiquery, vartrack, cwe, fwe), under a BPE tokenizer trained here in memory (the
`tokenizers` package, Metaspace, so decoding gives the text back): every sample is exactly its
length; its answer, read back from the decoded text by construction (the queried key's number and
period; multivalue: the key's numbers in context order; the needles' numbers of the queried keys in
query order; every variable whose chain of VAR statements reaches the queried value, in chain order;
the list's words that occur most, in order of first occurrence; the coded text's most frequent
words, most frequent first), is the answer in the file, split at the set's item_separator (the id of
","; single and multikey have none: one item); `hydra eval-niah --dataset` reads each set on a random
hydrahead-tiny without error, with one cell per (length, depth) (cwe and fwe: per length), reports
the file's answers, and scores recall item by item: the fraction of the file's items found in its
predicted tokens, recomputed here (multivalue also with each answer's first value overwritten by
the token the model predicts there: that value counts, so recall is at least 1/values, where one
item would score 0); impossible
requests (a length too short, too few words, too few distinct fwe words) are one line and write
nothing. The list tasks are also built under a default Metaspace BPE (prepend_scheme "always", which
encodes "," alone as two tokens but as one inside text) and a byte-level BPE: the item_separator is
the id "," has between two words of running text, and each answer split at it reads back as
constructed. Skipped (exit 77) without tokenizers, numpy and h5py."""
import json
import os
import random
import re
import shutil
import string
import subprocess
import sys
import tempfile
from hydra_testlib import check, failures

hydra, root = sys.argv[1], sys.argv[2]
try:
    import h5py
    import numpy as np  # noqa: F401
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

script = os.path.join(root, "cluster", "niah", "build_niah_set.py")

rng = random.Random(5)
WORDS = "the a of sky river stone light north quiet garden market winter morning city letter window story".split()
sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "." for _ in range(400)]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
tok.decoder = decoders.Metaspace(prepend_scheme="never")
tok.train_from_iterator(sentences, trainers.BpeTrainer(vocab_size=240, special_tokens=["<unk>"],
                                                       initial_alphabet=list(string.printable)))
assert tok.get_vocab_size() <= 256, tok.get_vocab_size()
SEP = tok.token_to_id(",")
LENGTHS, DEPTHS = [512, 1024], [0, 50, 100]
KNOBS = {"single": ["--digits", "5"], "multikey": ["--distractors", "3", "--digits", "5"],
         "multivalue": ["--values", "3", "--digits", "5"],
         "multiquery": ["--queries", "3", "--digits", "5"], "vartrack": ["--chains", "2", "--hops", "2", "--digits", "5"],
         "cwe": ["--common-words", "4", "--common-freq", "6", "--uncommon-freq", "2"], "fwe": ["--top-words", "3"]}


LISTS = ("multivalue", "multiquery", "vartrack", "cwe", "fwe")  # the tasks whose answers are lists


def items_of(answer, sep=SEP):
    out, cur = [], []
    for t in answer:
        if t == sep:
            out.append(cur)
            cur = []
        else:
            cur.append(t)
    return [x for x in out + [cur] if x]


def expected(task, context):
    """The answer items as strings, found in the decoded prompt by construction."""
    if task in ("single", "multikey"):
        key = re.search(r"What is the special magic number for (.+?)\? ", context).group(1)
        needles = re.findall(r"The special magic number for ([a-z]+-[a-z]+) is (\d+)\.", context)
        check(len(needles) == (4 if task == "multikey" else 1) and len({k for k, _ in needles}) == len(needles),
              f"{task}: {len(needles)} needles with distinct keys")
        return [v + "." for k, v in needles if k == key]
    if task == "multivalue":
        key = re.search(r"What are all the special magic numbers for (.+?)\? ", context).group(1)
        needles = re.findall(r"One of the special magic numbers for ([a-z]+-[a-z]+) is (\d+)\.", context)
        check(len(needles) == 3 and all(k == key for k, _ in needles), "multivalue: three needles of the key")
        return [v for _, v in needles]
    if task == "multiquery":
        keys = re.search(r"What are the special magic numbers for (.+?)\? ", context).group(1)
        keys = re.split(r", | and ", keys)
        return [re.search(rf"The special magic number for {re.escape(k)} is (\d+)\.", context).group(1) for k in keys]
    if task == "vartrack":
        value = re.search(r"assigned the value (\d+) in the text above", context).group(1)
        holds, order = {}, []
        for name, rhs in re.findall(r"VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d+)\.", context):
            order.append(name)
            holds[name] = holds[rhs[4:]] if rhs.startswith("VAR ") else rhs
        return [n for n in order if holds[n] == value]
    if task == "cwe":
        entries = re.findall(r"\n(\d+)\. ([a-z]+)", context)
        check([int(i) for i, _ in entries] == list(range(1, len(entries) + 1)), "cwe: the list is numbered 1..n")
        counts = {}
        for _, w in entries:
            counts[w] = counts.get(w, 0) + 1
        check(sorted(set(counts.values())) == [2, 6], f"cwe: counts are the two frequencies ({sorted(set(counts.values()))})")
        common = {w for w, c in counts.items() if c == 6}
        check(len(common) == 4, "cwe: four common words")
        firsts = []
        for _, w in entries:
            if w in common and w not in firsts:
                firsts.append(w)
        return firsts
    text = context[context.index("coded words.") + len("coded words."):context.index("\nQuestion:")]
    counts = {}
    for w in text.split():
        counts[w] = counts.get(w, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    check(ranked[2][1] > ranked[3][1] and ranked[0][1] > ranked[1][1] > ranked[2][1], "fwe: the top counts are strict")
    return [w for w, _ in ranked[:3]]


with tempfile.TemporaryDirectory() as d:
    tj = os.path.join(d, "tokenizer.json")
    tok.save(tj)
    with open(os.path.join(d, "hay.txt"), "w") as f:
        f.write(" ".join(sentences))
    syllables = ["ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "ve", "zu"]
    with open(os.path.join(d, "words.txt"), "w") as f:
        f.write("\n".join(a + b + c for a in syllables for b in syllables for c in syllables[:3]) + "\n")
    model = os.path.join(d, "tiny.h5")
    r = subprocess.run([hydra, "init", "--preset", "hydrahead-tiny", "--weight-seed", "2", "--out", model], capture_output=True, text=True)
    check(r.returncode == 0, f"hydra init: {r.stderr[-300:]}")
    for task, knobs in KNOBS.items():
        out = os.path.join(d, f"{task}_set.h5")
        cmd = [sys.executable, script, "--tokenizer", tj, "--haystack", os.path.join(d, "hay.txt"), "--task", task,
               "--lengths", ",".join(map(str, LENGTHS)), "--depths", ",".join(map(str, DEPTHS)), "--samples", "2",
               "--seed", "3", "--out", out] + knobs + (["--words", os.path.join(d, "words.txt")] if task == "cwe" else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if not check(r.returncode == 0, f"{task}: build_niah_set.py exits 0: {r.stderr[-800:]}"):
            continue
        with h5py.File(out) as f:
            ids, offsets = f["input_ids"][...], f["sample_offset"][...]
            starts, counts = f["answer_start"][...], f["answer_length"][...]
            lengths, depths = f["length"][...], f["depth"][...]
            sep = int(f.attrs["item_separator"]) if "item_separator" in f.attrs else -1
            check(f.attrs["task"] == task and sep == (SEP if task in LISTS else -1), f"{task}: task and item_separator {sep}")
        cells = len(LENGTHS) * (len(DEPTHS) if task not in ("cwe", "fwe") else 1)
        check(len(starts) == 2 * cells, f"{task}: {2 * cells} samples (got {len(starts)})")
        answers = []
        for i in range(len(starts)):
            sample = ids[offsets[i]:offsets[i + 1]].tolist()
            check(len(sample) == lengths[i], f"{task} sample {i}: {len(sample)} tokens, label {lengths[i]}")
            a, n = int(starts[i]), int(counts[i])
            check(a + n == len(sample), f"{task} sample {i}: the answer ends the sample")
            answer = sample[a:a + n]
            answers.append(answer)
            got = [tok.decode(item).strip() for item in items_of(answer, sep)]
            want = expected(task, tok.decode(sample[:a]))
            check(got == want, f"{task} sample {i} (length {lengths[i]}, depth {depths[i]}): answer {got}, "
                               f"by construction {want}")
        # hydra reads the set and scores recall over the file's items.
        res = os.path.join(d, f"{task}.jsonl")
        r = subprocess.run([hydra, "eval-niah", "--model", model, "--dataset", out, "--device", "cpu", "--out", res],
                           capture_output=True, text=True)
        if not check(r.returncode == 0, f"{task}: hydra eval-niah --dataset exits 0: {r.stderr[-800:]}"):
            continue
        with open(res) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        samples = [j for j in rows if j.get("type") == "sample"]
        check(len([j for j in rows if j.get("type") == "cell"]) == cells, f"{task}: {cells} cells")
        check(len(samples) == len(answers), f"{task}: every sample scored")
        for j, answer in zip(samples, answers):
            check(j["answer"] == answer, f"{task}: the scorer's answer is the file's")
            items = items_of(answer, sep)
            pred = j["predicted"]
            found = sum(any(pred[k:k + len(it)] == it for k in range(len(pred) - len(it) + 1)) for it in items)
            check(abs(j["recall"] - found / len(items)) < 1e-12,
                  f"{task}: recall {j['recall']} is the fraction of the {len(items)} items predicted ({found})")
        print(f"{task}: {len(answers)} samples checked, recalls {sorted({j['recall'] for j in samples})}")
        if task == "multivalue":
            # The random model finds no value, so recall is 0 read either way. The same file with each
            # answer's first value and separator overwritten by [p, SEP], p the token the model predicts
            # after the prompt (which the overwrite does not change): the item [p] is found, so
            # recall >= 1/items read item by item; read as one item it would be 0 (or 1).
            doctored = os.path.join(d, "multivalue_doctored.h5")
            shutil.copy(out, doctored)
            with h5py.File(doctored, "r+") as f:
                for i, j in enumerate(samples):
                    at = int(offsets[i] + starts[i])
                    f["input_ids"][at:at + 2] = [j["predicted"][0], SEP]
            r = subprocess.run([hydra, "eval-niah", "--model", model, "--dataset", doctored, "--device", "cpu", "--out", res],
                               capture_output=True, text=True)
            if check(r.returncode == 0, f"multivalue (doctored): eval-niah exits 0: {r.stderr[-800:]}"):
                with open(res) as f:
                    again = [j for j in map(json.loads, filter(str.strip, f)) if j.get("type") == "sample"]
                for j in again:
                    items = items_of(j["answer"], sep)
                    pred = j["predicted"]
                    found = sum(any(pred[k:k + len(it)] == it for k in range(len(pred) - len(it) + 1)) for it in items)
                    check(pred[0] == j["answer"][0] and found >= 1 and len(items) > 1
                          and abs(j["recall"] - found / len(items)) < 1e-12,
                          f"multivalue (doctored): recall {j['recall']} counts the predicted first item ({found} of "
                          f"{len(items)} items found)")
                print(f"multivalue (doctored): recalls {sorted({j['recall'] for j in again})}")

    # Other tokenizers: the list tasks' separator is "," as it encodes in running text (at 6777ccb a
    # default Metaspace BPE was refused: "',' is 2 tokens"), and every answer reads back as built.
    metaspace = Tokenizer(models.BPE(unk_token="<unk>"))
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    metaspace.decoder = decoders.Metaspace()
    metaspace.train_from_iterator(sentences, trainers.BpeTrainer(vocab_size=240, special_tokens=["<unk>"],
                                                                 initial_alphabet=list(string.printable)))
    bytelevel = Tokenizer(models.BPE())
    bytelevel.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bytelevel.decoder = decoders.ByteLevel()
    bytelevel.train_from_iterator(sentences, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    check(metaspace.encode(",").ids != [metaspace.token_to_id(",")], "the default Metaspace encodes ',' alone as more "
          f"than its one token ({metaspace.encode(',').tokens})")
    for name, other in (("metaspace-default", metaspace), ("byte-level", bytelevel)):
        otj = os.path.join(d, f"{name}.json")
        other.save(otj)
        comma = [i for i, (a, b) in zip(other.encode("7, 8").ids, other.encode("7, 8").offsets) if (a, b) == (1, 2)]
        for task in LISTS:
            out = os.path.join(d, f"{name}_{task}.h5")
            cmd = [sys.executable, script, "--tokenizer", otj, "--haystack", os.path.join(d, "hay.txt"), "--task", task,
                   "--lengths", "512", "--depths", "50", "--samples", "2", "--seed", "4", "--out", out] + KNOBS[task] + (
                       ["--words", os.path.join(d, "words.txt")] if task == "cwe" else [])
            r = subprocess.run(cmd, capture_output=True, text=True)
            if not check(r.returncode == 0, f"{name} {task}: build_niah_set.py exits 0: {r.stderr[-600:]}"):
                continue
            with h5py.File(out) as f:
                ids, offsets = f["input_ids"][...], f["sample_offset"][...]
                starts, counts = f["answer_start"][...], f["answer_length"][...]
                sep = int(f.attrs["item_separator"])
            check([sep] == comma, f"{name} {task}: item_separator {sep} is ',' in running text {comma}")
            for i in range(len(starts)):
                sample = ids[offsets[i]:offsets[i + 1]].tolist()
                a, n = int(starts[i]), int(counts[i])
                got = [other.decode(item).strip() for item in items_of(sample[a:a + n], sep)]
                want = expected(task, other.decode(sample[:a]))
                check(got == want, f"{name} {task} sample {i}: answer {got}, by construction {want}")
        print(f"{name}: the list tasks' answers split at ',' ({comma}) as constructed")

    # Impossible requests: one line naming the problem, no set written.
    tiny_words = os.path.join(d, "three.txt")
    with open(tiny_words, "w") as f:
        f.write("kalo\nmira\nsito\n")
    base = [sys.executable, script, "--tokenizer", tj, "--haystack", os.path.join(d, "hay.txt"), "--samples", "1"]
    for args, needle in ((["--task", "vartrack", "--lengths", "48"], "length 48 is too short"),
                         (["--task", "cwe", "--lengths", "512", "--words", tiny_words], "the pool has 3"),
                         (["--task", "fwe", "--lengths", "512", "--fwe-words", "2"], "--fwe-words 0 or > --top-words")):
        out = os.path.join(d, "refused.h5")
        r = subprocess.run(base + args + ["--out", out], capture_output=True, text=True)
        check(r.returncode != 0 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1 and not os.path.exists(out),
              f"refused: {needle!r} (exit {r.returncode}: {r.stderr.strip()[-300:]!r})")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all passed")
