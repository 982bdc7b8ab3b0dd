#!/usr/bin/env python3
"""Builds a natural-language needle-in-a-haystack eval set for `hydra eval-niah --dataset`.

Why this exists: the built-in NIAH generator (model/eval/niah.h) works in token space, which is right
for random-weight smoke runs and tests but says little about a real checkpoint (an imported Qwen3).
This tool builds the same tasks (NIAH's three and RULER's other four) from text, with the checkpoint's Hugging Face
`tokenizer.json` (the `tokenizers` library), and writes the HDF5 eval-set format that the C++ side
reads (model/eval/niah_set.h, format "hydrahead-niah-set" v1). The C++ side never tokenizes.

A sample of exactly `length` tokens, in token space (pieces are tokenized separately and joined):

    [instruction][haystack tokens with needle sentences inserted][query][answer]

  needle     " The special magic number for <key> is <value>."   (multivalue: "One of the special
             magic numbers for <key> is <value>.")
  query      "\\nWhat is the special magic number for <key>? The special magic number for <key> is"
             (multivalue: "... What are all the special magic numbers for <key>? The special magic
             numbers for <key> are")
  answer     " <value>."; query and answer are tokenized together and split at the answer's first
             character, so the answer tokens are the ones the model would produce after the query.
             The answer is scored token by token by teacher forcing (exact match under greedy
             decoding), so it includes the final period: a model that stops the number early fails.
             multivalue: " <v1>, <v2>, <v3>" in context order, each value tokenized alone with its
             leading space and the values joined by the id of ",", written as the set's
             item_separator, so eval-niah scores recall value by value in any order (RULER's
             string_match_all) beside the exact match. It has no final period: the period would
             join the last value's item, and a model listing the values in another order would
             lose that value. single and multikey answers are one item (no item_separator), as
             in eval-niah's token-space tasks.
  keys       "<adjective>-<noun>" from built-in word lists (RULER style), distinct per sample;
  values     7-digit numbers (--digits), distinct per sample.

Tasks, depth and determinism follow the built-in generator: `single` has one needle; `multikey`
adds --distractors needles with other keys and other values; `multivalue` has --values needles
with one key. Let F be the number of haystack tokens in the sample. The primary needle (the one
asked about; multivalue: the first value drawn) goes after round(depth * F / 100) haystack tokens;
the other needles after a uniform random number of haystack tokens in [0, F]. An insertion point
strictly inside the haystack is moved back to the start of the sentence it falls in (after a
token ending in . ! ? or a newline), so needles do not split sentences; points 0 and F stay. At
equal points the primary goes first when depth <= 50, else last. The haystack is the F-token
window of --haystack (repeated when too short) that ends at the first sentence end at or after
token F, so the sentence before the query (and a depth-100 needle) is whole; the window's first
sentence may be cut. Keys, values and the other
needles' points are drawn from a random.Random seeded by "seed/task/length/index", so the samples
of one (task, length, index) at different depths share keys, values and haystack and differ in
where the primary needle sits (and, for multivalue, in the order of the answer's values).

RULER's other families (--task multiquery, vartrack, cwe, fwe; RULER's templates, with eval-niah
--task's knobs: --queries, --chains, --hops, --common-words, --common-freq, --uncommon-freq,
--zipf-alpha, --fwe-words, --top-words) are built by cluster/niah/ruler_text.py (its docstring gives
each layout). Their answers are lists, as multivalue's: the set's item_separator attribute (the id of
",") lets eval-niah score recall item by item, order-free, beside the exact match.

Usage (the tokenizer.json of the checkpoint you evaluate):
    python3 cluster/niah/build_niah_set.py --tokenizer Qwen3-1.7B/tokenizer.json \\
        --haystack essays.txt --task single --lengths 4K,16K,64K --depths 0,25,50,75,100 \\
        --samples 4 --seed 0 --out niah_single.h5
    mpirun -np 8 build/bin/hydra eval-niah --model qwen3.h5 --dataset niah_single.h5 --out r.jsonl
    python3 cluster/niah/build_niah_set.py --tokenizer Qwen3-1.7B/tokenizer.json --haystack essays.txt \
        --task vartrack --hops 4 --lengths 4K,16K --depths 0,50,100 --samples 4 --out vt.h5

Needs: tokenizers, h5py, numpy.
"""

import argparse
import json
import os
import random
import sys
import tempfile

import h5py
import numpy as np
from tokenizers import Tokenizer

import ruler_text
from niah_text import ADJECTIVES, NOUNS, arrange, assemble, distinct, draw_key, draw_value

FORMAT = "hydrahead-niah-set"
FORMAT_VERSION = 1
NIAH_TASKS = ("single", "multikey", "multivalue")
TASKS = NIAH_TASKS + ("multiquery", "vartrack", "cwe", "fwe")  # the last four: cluster/niah/ruler_text.py

def parse_size(text):
    """'4096', '4K', '1M' -> tokens (K = 1024), as hydra's --lengths."""
    text = text.strip()
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale != 1 else text
    if not digits.isdigit():
        raise SystemExit(f"build_niah_set: '{text}' is not a length (examples: 4096, 4K, 1M)")
    return int(digits) * scale


def parse_list(text, parse, what):
    try:
        return [parse(part) for part in text.split(",")]
    except ValueError:
        raise SystemExit(f"build_niah_set: {what}: '{text}' is not a comma-separated list")


def separator_in_text(pieces, sep=","):
    """The one id `sep` is between two words of running text ("7, 8"), found by the tokens' offsets.
    Encoded alone it may be more: a tokenizer that marks a string's start (Metaspace's default
    prepend_scheme "always") encodes "," by itself as "▁" ","; inside text it is the "," after a word,
    which is what a model reads and writes between a list's items."""
    text = f"7{sep} 8"
    enc = pieces.encode(text)
    begin, end = 1, 1 + len(sep)
    covering = [(i, a, b) for i, (a, b) in zip(enc.ids, enc.offsets) if a < end and b > begin]
    if len(covering) != 1 or covering[0][1:] != (begin, end):
        raise SystemExit(f"build_niah_set: {sep!r} is not one token between two words in this tokenizer "
                         f"({text!r} encodes as {enc.tokens}); task {pieces.task} needs it as one (its answers' item "
                         "separator)")
    return covering[0][0]


class Items:
    """An answer of several items: each tokenized alone (leading space), joined by the separator id,
    the id of "," as running text holds it (the set's item_separator)."""

    def __init__(self, pieces):
        self.pieces = pieces
        self.separator = separator_in_text(pieces)

    def answer(self, items):
        ids = []
        for k, item in enumerate(items):
            item_ids = self.pieces.ids(" " + item)
            if self.separator in item_ids:
                raise SystemExit(f"build_niah_set: the answer item {item!r} holds the separator ','")
            ids += ([self.separator] if k else []) + item_ids
        return ids


class TextPieces:
    """The tokenized pieces of one task: instruction, needles, query + answer, and the haystack."""

    def __init__(self, tokenizer, task):
        self.tok = tokenizer
        self.task = task
        self.items = Items(self) if task != "single" and task != "multikey" else None  # list answers

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False)

    def ids(self, text):
        return self.encode(text).ids

    def instruction(self):
        if self.task == "multivalue":
            text = ("Some special magic numbers are hidden within the following text. Make sure to memorize "
                    "them. I will quiz you about the numbers afterwards.\n")
        else:
            text = ("A special magic number is hidden within the following text. Make sure to memorize it. "
                    "I will quiz you about the number afterwards.\n")
        return self.ids(text)

    def needle(self, key, value):
        if self.task == "multivalue":
            return self.ids(f" One of the special magic numbers for {key} is {value}.")
        return self.ids(f" The special magic number for {key} is {value}.")

    def query_and_answer(self, key, values):
        if self.task == "multivalue":
            query = (f"\nWhat are all the special magic numbers for {key}? The special magic numbers for {key} "
                     "are")
            return self.ids(query), self.items.answer(values)
        query = f"\nWhat is the special magic number for {key}? The special magic number for {key} is"
        answer = f" {values[0]}."
        enc = self.encode(query + answer)
        boundary = len(query)
        split = next((i for i, (start, _) in enumerate(enc.offsets) if start >= boundary), len(enc.ids))
        straddles = any(end > boundary for _, end in enc.offsets[:split])
        if straddles or split == len(enc.ids):
            # A token spans the query/answer boundary: tokenize the two apart instead.
            return self.ids(query), self.ids(answer)
        return enc.ids[:split], enc.ids[split:]


def haystack_tokens(pieces, text, needed):
    """At least `needed` token ids of the text (repeated if short) and the sentence starts among them."""
    if not text.strip():
        raise SystemExit("build_niah_set: the haystack text is empty")
    repeated = text
    while True:
        enc = pieces.encode(repeated)
        if len(enc.ids) >= needed:
            break
        repeated = repeated + "\n" + text
    ids, offsets = enc.ids, enc.offsets
    starts = [0]
    for i in range(1, len(ids)):
        end = offsets[i - 1][1]
        if end > 0 and repeated[end - 1] in ".!?\n":
            starts.append(i)
    starts.append(len(ids))  # the text's end closes its last sentence
    return ids, np.array(starts, dtype=np.int64)


def build_sample(pieces, hay, starts, args, length, depth, index):
    rng = random.Random(f"{args.seed}/{args.task}/{length}/{index}")
    n_needles = {"single": 1, "multikey": 1 + args.distractors, "multivalue": args.values}[args.task]
    n_keys = n_needles if args.task == "multikey" else 1
    keys = distinct(n_keys, lambda: draw_key(rng))
    values = distinct(n_needles, lambda: draw_value(rng, args.digits))
    needles = [pieces.needle(keys[j if n_keys > 1 else 0], values[j]) for j in range(n_needles)]
    fractions = [rng.random() for _ in range(n_needles - 1)]  # the other needles' points, as fractions of F
    instruction = pieces.instruction()
    fixed = len(instruction) + sum(len(n) for n in needles)
    # The answer's token count does not depend on the order of multivalue's values (each is tokenized
    # alone), so F is known before the needles are placed; the answer then lists them in context order.
    query, answer = pieces.query_and_answer(keys[0], values if args.task == "multivalue" else values[:1])
    fill = length - fixed - len(query) - len(answer)
    if fill < 0:
        raise SystemExit(f"build_niah_set: length {length} is too short for task {args.task}: the instruction, "
                         f"needles, query and answer take {length - fill} tokens")
    points = [round(depth * fill / 100)] + [min(fill, int(f * (fill + 1))) for f in fractions]
    text_window, points, order = arrange(hay, starts, fill, points, depth)
    if args.task == "multivalue":
        query, answer = pieces.query_and_answer(keys[0], [values[j] for j in order])
    ids, answer_start, primary_position = assemble(instruction, text_window, points, order, needles, query, answer)
    assert len(ids) == length, (len(ids), length)
    return ids, answer_start, len(answer), primary_position


def write_set(path, task, source, vocab_size, samples, item_separator=None):
    """Writes the eval set atomically: a temporary file in the target directory, then a rename."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".niah-", suffix=".h5.tmp", dir=directory)
    os.close(fd)
    try:
        with h5py.File(temp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["format_version"] = np.int64(FORMAT_VERSION)
            f.attrs["task"] = task
            f.attrs["source"] = source
            f.attrs["tokenizer_vocab_size"] = np.int64(vocab_size)
            if item_separator is not None:  # answers of several items (model/eval/niah_set.h)
                f.attrs["item_separator"] = np.int64(item_separator)
            f["input_ids"] = np.concatenate([np.asarray(s["ids"], dtype=np.int32) for s in samples])
            f["sample_offset"] = np.concatenate([[0], np.cumsum([len(s["ids"]) for s in samples])]).astype(np.int64)
            for name in ("answer_start", "answer_length", "length", "depth", "sample_index", "needle_position"):
                f[name] = np.asarray([s[name] for s in samples], dtype=np.int64)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", required=True, help="Hugging Face tokenizer.json of the model to evaluate")
    p.add_argument("--haystack", required=True, help="UTF-8 text file: the haystack (repeated if short)")
    p.add_argument("--task", default="single", choices=TASKS)
    p.add_argument("--lengths", required=True, help="sample lengths in tokens, e.g. 4K,16K,128K")
    p.add_argument("--depths", default="0,10,20,30,40,50,60,70,80,90,100", help="needle depths in percent")
    p.add_argument("--samples", type=int, default=4, help="samples per (length, depth) cell")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--distractors", type=int, default=3, help="multikey: needles with other keys")
    p.add_argument("--values", type=int, default=3, help="multivalue: values of the queried key")
    p.add_argument("--digits", type=int, default=7, help="digits of each value")
    # RULER families (cluster/niah/ruler_text.py), with eval-niah's flags and defaults.
    p.add_argument("--queries", type=int, default=4, help="multiquery: keys asked in one query, all values answered")
    p.add_argument("--chains", type=int, default=1, help="vartrack: chains of assignments")
    p.add_argument("--hops", type=int, default=4, help="vartrack: assignments after the first in each chain")
    p.add_argument("--common-words", type=int, default=10, help="cwe: the common words to answer")
    p.add_argument("--common-freq", type=int, default=30, help="cwe: occurrences of each common word")
    p.add_argument("--uncommon-freq", type=int, default=3, help="cwe: occurrences of each other word, as many as fit")
    p.add_argument("--words", help="cwe: word list, one a line (default: the haystack's distinct lowercase words)")
    p.add_argument("--zipf-alpha", type=float, default=2.0, help="fwe: exponent of the Zipf law of the words")
    p.add_argument("--fwe-words", type=int, default=0, help="fwe: distinct words (0: a quarter of the occurrences)")
    p.add_argument("--top-words", type=int, default=3, help="fwe: the most frequent words to answer")
    p.add_argument("--out", required=True, help="eval set to write (.h5)")
    p.add_argument("--preview", action="store_true", help="print the decoded end of the first sample")
    p.add_argument("--calibration", action="store_true",
                   help="a select-heads --calib set: only samples whose answer length two different answers share")
    p.add_argument("--vary-haystack", action="store_true",
                   help="each sample's haystack is cut from the text from a sentence start of its own (seeded like its "
                        "keys), not from the text's start: training sets, where one haystack for all samples would be learnt")
    args = p.parse_args()

    lengths = parse_list(args.lengths, parse_size, "--lengths")
    depths = parse_list(args.depths, int, "--depths")
    if any(d < 0 or d > 100 for d in depths):
        raise SystemExit(f"build_niah_set: --depths must lie in 0..100 (got {args.depths})")
    if args.samples < 1 or args.digits < 1 or args.distractors < 1 or args.values < 2:
        raise SystemExit("build_niah_set: need --samples >= 1, --digits >= 1, --distractors >= 1, --values >= 2")
    if args.distractors + 1 > len(ADJECTIVES) * len(NOUNS) // 2 or args.values > 9 * 10 ** (args.digits - 1) // 2:
        raise SystemExit("build_niah_set: too many needles for the distinct keys/values available")
    if (args.queries < 1 or args.chains < 1 or args.hops < 1 or args.common_words < 1 or args.uncommon_freq < 1
            or args.common_freq <= args.uncommon_freq or args.top_words < 1 or args.zipf_alpha <= 0
            or (args.fwe_words and args.fwe_words <= args.top_words)):
        raise SystemExit("build_niah_set: need --queries, --chains, --hops, --common-words, --uncommon-freq, --top-words "
                         ">= 1, --common-freq > --uncommon-freq, --zipf-alpha > 0, --fwe-words 0 or > --top-words")
    if args.words and not os.path.isfile(args.words):
        raise SystemExit(f"build_niah_set: --words {args.words}: no such file")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise SystemExit(f"build_niah_set: {args.out}: the output directory does not exist")
    for flag, path in (("--tokenizer", args.tokenizer), ("--haystack", args.haystack), ("--words", args.words)):
        if path and not os.path.isfile(path):
            raise SystemExit(f"build_niah_set: {flag} {path}: no such file")
        if path and os.path.exists(args.out) and os.path.samefile(args.out, path):
            raise SystemExit(f"build_niah_set: --out {args.out} is {flag} {path}, an input: name another output "
                             "(it would be replaced)")
    try:
        tokenizer = Tokenizer.from_file(args.tokenizer)
    except Exception as e:  # the library raises a plain Exception with serde's message
        raise SystemExit(f"build_niah_set: --tokenizer {args.tokenizer}: not a tokenizer.json the tokenizers library "
                         f"reads ({str(e).splitlines()[0][:200]})")
    try:
        with open(args.haystack, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise SystemExit(f"build_niah_set: --haystack {args.haystack}: not UTF-8 text (byte {e.start}: {e.reason})")
    pieces = TextPieces(tokenizer, args.task)
    # With --vary-haystack the whole text is encoded (at least one sample's room past any start).
    hay, starts = haystack_tokens(pieces, text, max(lengths) + 2048 if not args.vary_haystack else 0)
    hay, starts = (hay, starts) if len(hay) >= max(lengths) + 2048 else haystack_tokens(pieces, text, max(lengths) + 2048)

    def haystack_of(task, length, index):
        """The haystack of one sample: the text from a sentence start drawn from (seed, task, length,
        index) with --vary-haystack (room for the sample after it), else the text's start."""
        if not args.vary_haystack:
            return hay, starts
        room = len(hay) - (length + 2048)
        choices = starts[starts <= room]
        o = int(choices[random.Random(f"{args.seed}/{task}/{length}/{index}/haystack").randrange(len(choices))])
        return hay[o:], starts[starts >= o] - o

    samples = []
    separator = pieces.items.separator if pieces.items else None  # list answers: multivalue and RULER's four
    if args.task in NIAH_TASKS:
        for length in lengths:
            for depth in depths:
                for index in range(args.samples):
                    h, st = haystack_of(args.task, length, index)
                    ids, answer_start, answer_length, needle = build_sample(pieces, h, st, args, length, depth, index)
                    samples.append(dict(ids=ids, answer_start=answer_start, answer_length=answer_length, length=length,
                                        depth=depth, sample_index=index, needle_position=needle))
    else:
        pool = ruler_text.word_pool(args, text) if args.task == "cwe" else None
        for length in lengths:
            # cwe and fwe place nothing at a depth: one cell per length (depth 0), as eval-niah --task.
            for depth in depths if ruler_text.HAS_DEPTH[args.task] else [0]:
                for index in range(args.samples):
                    h, st = haystack_of(args.task, length, index)
                    sample, _ = ruler_text.build_family(pieces, pieces.items, h, st, pool, args, length, depth, index)
                    samples.append(dict(sample, length=length, depth=depth, sample_index=index))
    if args.calibration:
        # select-heads corrupts a prompt with another sample's answer of the same token length: keep the
        # samples whose answer length at least two different answers have.
        answers = {}
        for x in samples:
            a = tuple(x["ids"][x["answer_start"]:x["answer_start"] + x["answer_length"]])
            answers.setdefault(len(a), set()).add(a)
        samples = [x for x in samples if len(answers[x["answer_length"]]) >= 2]
        if not samples:
            raise SystemExit("build_niah_set: --calibration: no two samples have different answers of one token length "
                             "(more --samples)")
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    source = (f"build_niah_set.py tokenizer={os.path.basename(args.tokenizer)} "
              f"haystack={os.path.basename(args.haystack)} seed={args.seed}")
    write_set(args.out, args.task, source, vocab_size, samples, separator)
    if args.preview:
        first = samples[0]
        tail = first["ids"][max(0, first["answer_start"] - 40):]
        print("preview (end of sample 0):", repr(tokenizer.decode(tail)), file=sys.stderr)
        print("answer:", repr(tokenizer.decode(first["ids"][first["answer_start"]:])), file=sys.stderr)
    print(json.dumps({"command": "build_niah_set", "task": args.task, "samples": len(samples),
                      "tokens": sum(len(s["ids"]) for s in samples), "max_id": int(max(max(s["ids"]) for s in samples)),
                      "tokenizer_vocab_size": vocab_size, "item_separator": separator, "out": args.out}))


if __name__ == "__main__":
    main()
