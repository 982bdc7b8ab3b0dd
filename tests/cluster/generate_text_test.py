#!/usr/bin/env python3
"""cluster/generate_text.py round trip: text prompts in, their continuations out as text.

A WordLevel tokenizer trained here in memory (the `tokenizers` package) on a cycle of 17 words; a
qwen3-tiny model trained by `hydra train` for 60 steps on that cycle (tokenized by
cluster/tokenize_text.py), so its greedy continuation of any run of the cycle is the cycle's next
words. The model's folder holds tokenizer.json and a tokenizer_config.json with a chat template.
Checked: the continuations come back as the expected text (plain prompts, a .txt with --lines, a
chat rendered with the folder's template), on one process and under mpirun -np 2 (--sp 1) alike;
--logprobs K gives K alternatives per token, the greedy token first; --stop ends at a stop string,
across token boundaries and inside a token (the text up to it); without tokenizer_config.json the
tokenizer's <|endoftext|> is the default stop; --repetition-penalty and the sampling flags reach hydra (the tokens are hydra generate's
own with those flags on the prompt file the script wrote); bad input (no tokenizer.json, an empty prompt, a prompt over the
model's limit, an empty --stop, a chat message without a role, a chat template that does not parse or fails)
is one line in this tool's name, exit 2, before any work, and leaves no output. Skipped (exit 77) without
tokenizers, h5py and numpy; the chat case says so without jinja2."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

hydra, root = sys.argv[1], sys.argv[2]
try:
    import h5py  # noqa: F401
    import numpy  # noqa: F401
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
try:
    import jinja2  # noqa: F401
    have_jinja = True
except ImportError:
    have_jinja = False

script = os.path.join(root, "cluster", "generate_text.py")
# 17 words: training windows of 64 tokens start at every word of the cycle (64 mod 17 = 13), so the
# model learns what follows a word, not what follows a position.
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec").split()
failures = []
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    if r.returncode != 0:
        print(" ".join(cmd), "\n", r.stdout[-2000:], r.stderr[-2000:])
    return r


def following(word, n):
    i = WORDS.index(word)
    return " ".join(WORDS[(i + 1 + k) % len(WORDS)] for k in range(n))


def lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


with tempfile.TemporaryDirectory() as d:
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS)] * 4, trainers.WordLevelTrainer(special_tokens=["<unk>", "<|endoftext|>"]))
    with open(os.path.join(d, "corpus.txt"), "w") as f:
        f.write(" ".join(WORDS * 300))
    tok.save(os.path.join(d, "tokenizer.json"))
    r = run([sys.executable, os.path.join(root, "cluster", "tokenize_text.py"), "--tokenizer", os.path.join(d, "tokenizer.json"),
             "--out", os.path.join(d, "train.h5"), os.path.join(d, "corpus.txt")])
    check(r.returncode == 0, "tokenize_text.py tokenizes the cycle")
    r = run([hydra, "init", "--preset", "qwen3-tiny", "--weight-seed", "1", "--out", os.path.join(d, "init.h5")])
    check(r.returncode == 0, "hydra init")
    r = run([hydra, "train", "--stage", "pretrain", "--model", os.path.join(d, "init.h5"), "--data", os.path.join(d, "train.h5"),
             "--seq-len", "64", "--steps", "60", "--batch-seqs", "2", "--out-dir", os.path.join(d, "run"),
             "--device", "cpu"])
    check(r.returncode == 0, "hydra train learns the cycle")
    if failures:
        sys.exit(1)
    # The model's folder: the weights, the tokenizer, a chat template joining the messages' contents.
    folder = os.path.join(d, "model")
    os.makedirs(folder)
    shutil.copy(os.path.join(d, "run", "step-000060", "model.h5"), os.path.join(folder, "model.h5"))
    shutil.copy(os.path.join(d, "tokenizer.json"), folder)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}", "eos_token": "<|endoftext|>"}, f)
    model = os.path.join(folder, "model.h5")
    base = [sys.executable, script, "--model", model, "--hydra", hydra, "--device", "cpu", "--max-new-tokens", "6"]

    prompts = os.path.join(d, "prompts.jsonl")
    cases = [({"prompt": "delta echo foxtrot"}, following("foxtrot", 6)), ({"prompt": "november oscar"}, following("oscar", 6))]
    if have_jinja:
        cases.append(({"messages": [{"role": "user", "content": "india juliet"}, {"role": "user", "content": "kilo lima"}]},
                      following("lima", 6)))
    else:
        print("chat template case skipped: no jinja2 (pip install jinja2)")
    with open(prompts, "w") as f:
        for obj, _ in cases:
            f.write(json.dumps(obj) + "\n")
    outs = {}
    for name, extra in (("one", []), ("two", ["--np", "2", "--mpirun-args=--oversubscribe", "--sp", "1"])):
        out = os.path.join(d, f"{name}.jsonl")
        r = run(base + ["--prompts", prompts, "--logprobs", "3", "--out", out] + extra)
        check(r.returncode == 0, f"generate_text.py runs ({name})")
        if r.returncode != 0:
            continue
        got = lines(out)
        outs[name] = got
        check(len(got) == len(cases) + 1 and got[-1].get("summary") is True, f"{name}: a line per prompt and hydra's summary")
        check(json.loads(r.stdout.strip().splitlines()[-1])["new_tokens"] == 6 * len(cases), f"{name}: its own summary line")
        for i, (obj, want) in enumerate(cases):
            line = got[i]
            check(line["index"] == i and line["text"] == want,
                  f"{name}: prompt {i} continues as {want!r} (got {line['text']!r})")
            check(line["ids"] == tok.encode(want).ids, f"{name}: prompt {i}'s ids are the continuation's")
            check(line["prompt_ids"] == tok.encode(line["prompt"]).ids, f"{name}: prompt {i}'s prompt ids")
            check(len(line["logprobs"]) == 6 and all(len(step) == 3 for step in line["top_logprobs"])
                  and all(step[0][0] == t and step[0][1] == tok.id_to_token(t) for step, t in zip(line["top_logprobs"], line["ids"])),
                  f"{name}: prompt {i}: 3 alternatives per token, the greedy one first")
        if have_jinja:
            check(got[2]["prompt"] == "india juliet kilo lima ", f"{name}: the chat is rendered with the folder's template")
    if "one" in outs and "two" in outs:
        check([x["ids"] for x in outs["one"][:-1]] == [x["ids"] for x in outs["two"][:-1]], "1 and 2 ranks: the same tokens")

    # A .txt of prompts, one a line; --stop at a word: the text ends before it.
    txt = os.path.join(d, "prompts.txt")
    with open(txt, "w") as f:
        f.write("charlie delta\n\nmike\n")
    r = run(base + ["--prompts", txt, "--lines", "--stop", "golf", "--out", os.path.join(d, "txt.jsonl")])
    check(r.returncode == 0, "a .txt of prompts runs")
    if r.returncode == 0:
        got = lines(os.path.join(d, "txt.jsonl"))
        check(len(got) == 3, ".txt --lines: two prompts (the blank line skipped)")
        check(got[0]["text"] == "echo foxtrot " and got[0]["stopped"] and got[0]["ids"][-1] == tok.token_to_id("golf")
              and got[0]["stop_string"] == "golf",
              f"--stop golf ends 'charlie delta' after 'echo foxtrot ' (got {got[0]['text']!r})")
        check(got[1]["text"] == following("mike", 6) and not got[1]["stopped"], "'mike' runs its 6 tokens")

    # Stop strings are text, not tokens (at 6777ccb --stop took one token of the vocabulary): "lf ho"
    # spans "golf hotel", two tokens and the space the decoder puts between them; "xt" lies inside
    # "foxtrot"; a string that never occurs lets all 6 tokens come.
    for stop, ids_end, text in (("lf ho", "hotel", "echo foxtrot go"), ("xt", "foxtrot", "echo fo"), ("zulu", None, None)):
        r = run(base + ["--prompts", txt, "--lines", "--stop", stop, "--out", os.path.join(d, "stop.jsonl")])
        check(r.returncode == 0, f"--stop {stop!r} runs")
        if r.returncode != 0:
            continue
        got = lines(os.path.join(d, "stop.jsonl"))[0]
        if ids_end is None:
            check(not got["stopped"] and len(got["ids"]) == 6 and "stop_string" not in got,
                  f"--stop {stop!r}, never generated: 6 tokens, not stopped")
        else:
            check(got["stopped"] and got.get("stop_string") == stop and got["ids"][-1] == tok.token_to_id(ids_end)
                  and got["text"] == text, f"--stop {stop!r} ends at {ids_end!r} with the text {text!r} (got {got})")

    # The default stop without tokenizer_config.json or generation_config.json: the tokenizer's
    # <|endoftext|> (the separator tokenize_text.py ends documents with), as hydra generate's log says.
    plain = os.path.join(d, "plain")
    os.makedirs(plain)
    shutil.copy(model, os.path.join(plain, "model.h5"))
    shutil.copy(os.path.join(d, "tokenizer.json"), plain)
    r = run(base[:3] + [os.path.join(plain, "model.h5")] + base[4:] + ["--prompts", txt, "--lines",
                                                                        "--out", os.path.join(d, "plain.jsonl")])
    eos = tok.token_to_id("<|endoftext|>")
    check(r.returncode == 0 and f"stopping at the tokenizer's eos {eos}" in r.stderr,
          f"no tokenizer_config.json: hydra generate stops at <|endoftext|> ({eos}) by default: {r.stderr[-300:]}")

    # --repetition-penalty and sampling reach hydra: the ids are hydra generate's own on the prompt file
    # the script wrote (its semantics are tested in tests/launch/generate_cli_test.cpp).
    kept = os.path.join(d, "kept.h5")
    flags = ["--repetition-penalty", "1.7", "--temperature", "0.8", "--seed", "3"]
    r = run(base + ["--prompts", prompts, "--keep-prompt-file", kept, "--out", os.path.join(d, "sampled.jsonl")] + flags)
    check(r.returncode == 0, "--repetition-penalty with sampling runs")
    r2 = run([hydra, "generate", "--model", model, "--prompt", kept, "--max-new-tokens", "6", "--device", "cpu",
              "--out", os.path.join(d, "direct.jsonl")] + flags)
    if r.returncode == 0 and r2.returncode == 0:
        got, direct = lines(os.path.join(d, "sampled.jsonl")), lines(os.path.join(d, "direct.jsonl"))
        check([x["ids"] for x in got[:-1]] == [x["tokens"] for x in direct[:-1]] and got[-1]["repetition_penalty"] == 1.7,
              "the script's tokens are hydra generate's with the same flags")

    # Bad input: one line, exit 2, no output, before hydra runs (its binary is not even valid here).
    bare = os.path.join(d, "bare")
    os.makedirs(bare)
    shutil.copy(model, os.path.join(bare, "model.h5"))
    empty = os.path.join(d, "empty.jsonl")
    with open(empty, "w") as f:
        f.write(json.dumps({"prompt": "alpha"}) + "\n" + json.dumps({"prompt": "  "}) + "\n")
    limited = os.path.join(d, "limited")
    shutil.copytree(folder, limited)
    with open(os.path.join(limited, "config.json"), "w") as f:
        json.dump({"max_position_embeddings": 8}, f)
    # The chat renderer (shared with tokenize_text.py) speaks as this tool: a message without a role, a
    # chat template that does not parse, one that fails on the messages.
    roleless = os.path.join(d, "roleless.jsonl")
    with open(roleless, "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "alpha"}, {"content": "bravo"}]}) + "\n")
    renderer_cases = [(["--model", model, "--prompts", roleless], "line 1: every message needs a \"role\" string")]
    if have_jinja:
        for name, template, needle in (("unparsed", "{% for m in messages %}", "its chat_template does not parse"),
                                       ("undefined", "{{ messages[0].content.nothing() }}", "the chat template fails"),
                                       ("raising", "{{ raise_exception('only one user turn, please') }}",
                                        "(TemplateError: only one user turn, please)")):
            broken = os.path.join(d, name)
            shutil.copytree(folder, broken)
            with open(os.path.join(broken, "tokenizer_config.json"), "w") as f:
                json.dump({"chat_template": template}, f)
            renderer_cases.append((["--model", os.path.join(broken, "model.h5"), "--prompts", prompts], needle))
    bad = [sys.executable, script, "--hydra", "/nonexistent/hydra", "--device", "cpu", "--max-new-tokens", "6"]
    for args, needle in [
            (["--model", os.path.join(bare, "model.h5"), "--prompts", prompts], "no tokenizer.json"),
            (["--model", model, "--prompts", empty], "prompt 1 (line 2) is empty"),
            (["--model", os.path.join(limited, "model.h5"), "--prompts", prompts], "exceed the model's limit of 8"),
            (["--model", model, "--prompts", prompts, "--stop", ""], "--stop: an empty stop string")] + renderer_cases:
        out = os.path.join(d, "refused.jsonl")
        r = run(bad + args + ["--out", out])
        err = r.stderr.strip()
        check(r.returncode == 2 and err.startswith("generate_text: ") and needle in err and len(err.splitlines()) == 1
              and not os.path.exists(out), f"refused in one line: {needle!r} (exit {r.returncode}: {err!r})")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all passed")
