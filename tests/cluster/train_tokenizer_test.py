#!/usr/bin/env python3
"""cluster/train_tokenizer.py as a user meets it: a byte-level BPE trained on a .txt and a .jsonl,
the special tokens at ids 0, 1, 2, then the 256 bytes; any text (accents, CJK, emoji, a NUL byte)
encodes and decodes back exactly; the .jsonl's --text-field is what is learned; the same inputs give
the same tokenizer.json byte for byte; tokenizer_config.json's chat template renders ChatML; too
little text for --vocab is said, with the size to give the model; and bad input (--vocab below the
floor, an input of another kind, a .jsonl line without the field, a folder holding a tokenizer)
is one line naming the problem, leaving no tokenizer.json behind. Skipped (77) without tokenizers
or jinja2.

    train_tokenizer_test.py HYDRA_BINARY REPO_ROOT
"""
import json
import os
import subprocess
import sys
import tempfile

from hydra_testlib import check, failures

root = sys.argv[2]
try:
    import jinja2
    from tokenizers import Tokenizer
except ImportError as e:
    print(f"skipped: {e} (cluster/install_deps.sh installs tokenizers and jinja2)")
    sys.exit(77)

script = os.path.join(root, "cluster", "train_tokenizer.py")


def train(*args):
    return subprocess.run([sys.executable, script, *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))


with tempfile.TemporaryDirectory() as work:
    txt, jsonl = os.path.join(work, "a.txt"), os.path.join(work, "b.jsonl")
    with open(txt, "w", encoding="utf-8") as f:
        f.write(open(os.path.join(root, "README.md"), encoding="utf-8").read())  # real text: merges to spare
    with open(jsonl, "w", encoding="utf-8") as f:
        for _ in range(100):
            f.write(json.dumps({"body": " zyxwv" * 20, "text": " kqjkq" * 20}) + "\n")

    out = os.path.join(work, "tok")
    r = train("--vocab", 1000, "--text-field", "body", "--out", out, txt, jsonl)
    check(r.returncode == 0, f"trains (exit {r.returncode}): {r.stderr}")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        check(os.path.isfile(os.path.join(out, name)), f"{name} written")
    check(not [n for n in os.listdir(out) if n.endswith(".tmp")], f"no temporaries left: {os.listdir(out)}")
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    check(tok.get_vocab_size() == summary["vocab"] == 1000, f"1000 ids ({tok.get_vocab_size()}, summary {summary})")
    check([tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2],
          "the special tokens are ids 0, 1, 2")
    for text in ("naïve café — 日本語 🚀", "a\x00b\ttabs\r\n", " the runtime", "unseen: qqqqjjjj"):
        ids = tok.encode(text).ids
        check(tok.decode(ids) == text, f"{text!r} decodes back ({tok.decode(ids)!r})")
        check(all(0 <= i < 1000 for i in ids), f"{text!r}: ids in range")
    # Learned: the .jsonl's body field (one token for its repeated word), not its "text" field.
    check(len(tok.encode(" zyxwv").ids) == 1, f"the --text-field body was learned: {tok.encode(' zyxwv').tokens}")
    check(len(tok.encode(" kqjkq").ids) > 1, f"the other field was not: {tok.encode(' kqjkq').tokens}")
    config = json.load(open(os.path.join(out, "tokenizer_config.json")))
    check(config["eos_token"] == "<|endoftext|>" and config["pad_token"] == "<|endoftext|>", f"eos and pad: {config}")
    rendered = jinja2.Template(config["chat_template"]).render(
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], add_generation_prompt=True)
    check(rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>assistant\n",
          f"ChatML rendering: {rendered!r}")

    again = os.path.join(work, "again")
    check(train("--vocab", 1000, "--text-field", "body", "--out", again, txt, jsonl).returncode == 0, "trains again")
    check(open(os.path.join(out, "tokenizer.json"), "rb").read() == open(os.path.join(again, "tokenizer.json"), "rb").read(),
          "the same inputs give the same tokenizer.json")

    small, few = os.path.join(work, "small"), os.path.join(work, "few.txt")
    open(few, "w").write("the runtime trains the model. " * 50)
    r = train("--vocab", 5000, "--out", small, few)
    check(r.returncode == 0 and "give the model --vocab" in r.stderr, f"too little text for --vocab is said: {r.stderr}")

    # Bad input: one line naming the problem, no tokenizer written.
    md = os.path.join(work, "notes.md")
    open(md, "w").write("text")
    bad_line = os.path.join(work, "bad.jsonl")
    open(bad_line, "w").write('{"text": "fine"}\n{"title": "no text"}\n')
    for args, words, folder in (
            (["--vocab", 200, "--out", os.path.join(work, "b1"), txt], "--vocab 200", "b1"),
            (["--vocab", 1000, "--out", os.path.join(work, "b2"), md], "notes.md: not .txt or .jsonl", "b2"),
            (["--vocab", 1000, "--out", os.path.join(work, "b3"), os.path.join(work, "missing.txt")], "missing.txt: no such file", "b3"),
            (["--vocab", 1000, "--out", os.path.join(work, "b4"), bad_line], "bad.jsonl: line 2 has no \"text\" string", "b4"),
            (["--vocab", 1000, "--out", out, txt], "holds a tokenizer.json already", None)):
        r = train(*args)
        lines = r.stderr.strip().splitlines()
        check(r.returncode != 0 and len(lines) == 1 and words in lines[0], f"{words}: refused in one line ({r.returncode}: {r.stderr!r})")
        if folder:
            check(not os.path.exists(os.path.join(work, folder, "tokenizer.json")), f"{words}: no tokenizer.json written")
    check(open(os.path.join(out, "tokenizer.json"), "rb").read() == open(os.path.join(again, "tokenizer.json"), "rb").read(),
          "a refused run leaves the tokenizer already there as it was")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("train_tokenizer.py: trained, round trips, chat template, refusals")
