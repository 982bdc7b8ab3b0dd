#!/usr/bin/env python3
"""cluster/tokenize_text.py at scale, under a BPE tokenizer trained here in memory (the
`tokenizers` package): .jsonl and .txt inputs cut into pieces and shards give the same shards on 1
and 3 processes; every document is exactly its own encoding plus the separator; ids are stored in
the narrowest type (uint8 for this vocabulary of < 256); supervised prompt/response and chat
examples get loss_mask = 1 on exactly the response tokens, also when the tokenizer folder has a
chat template (rendered with jinja2); a .parquet input gives the documents its .jsonl twin gives;
`hydra train` on the supervised shards counts exactly those tokens. Skipped (exit 77) without
tokenizers, numpy and h5py; the parquet and chat-template cases say so when pyarrow or jinja2 is
missing (cluster/install_deps.sh installs both)."""
import json
import os
import random
import subprocess
import sys
import tempfile

hydra, root = sys.argv[1], sys.argv[2]
try:
    import h5py
    import numpy as np
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

script = os.path.join(root, "cluster", "tokenize_text.py")
rng = random.Random(3)
words = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away", "blue", "sky", "under", "tree", "big"]


def sentence(n):
    return " ".join(rng.choice(words) for _ in range(n))


tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.train_from_iterator([sentence(12) for _ in range(400)],
                        trainers.BpeTrainer(vocab_size=120, special_tokens=["<|endoftext|>", "<unk>"]))
assert tok.get_vocab_size() <= 256, tok.get_vocab_size()
sep = tok.token_to_id("<|endoftext|>")
failures = []


def run(args):
    r = subprocess.run([sys.executable, script] + args, capture_output=True, text=True)
    print(r.stdout.strip(), r.stderr.strip()[-400:])
    if r.returncode != 0:
        failures.append(f"tokenize_text {' '.join(args[-3:])} exited {r.returncode}")
    return r


def shards(out):
    m = json.load(open(os.path.join(out, "manifest.json")))
    data = []
    for name in m["shards"]:
        if os.path.basename(name) != name:  # plain names, relative to the manifest's folder
            failures.append(f"{out}/manifest.json lists {name!r}, not a plain file name in its folder")
        with h5py.File(os.path.join(out, name)) as f:
            data.append({k: f[k][...] for k in f})
    return m, data


with tempfile.TemporaryDirectory() as d:
    tj = os.path.join(d, "tokenizer.json")
    tok.save(tj)
    docs = [sentence(rng.randint(1, 40)) for _ in range(300)]
    with open(os.path.join(d, "web.jsonl"), "w") as f:
        for t in docs:
            f.write(json.dumps({"text": t, "id": 1}) + "\n")
    book = "\n".join(sentence(10) for _ in range(5))
    open(os.path.join(d, "book.txt"), "w").write(book)
    inputs = [os.path.join(d, "web.jsonl"), os.path.join(d, "book.txt")]
    # Plain text: pieces of 4 KiB (several per .jsonl), shards of at most 700 tokens.
    outs = {}
    for procs in (1, 3):
        out = os.path.join(d, f"plain{procs}")
        run(["--tokenizer", tj, "--out", out, "--shard-tokens", "700", "--chunk-bytes", "4K", "--processes", str(procs)]
            + inputs)
        outs[procs] = shards(out)
    (m1, s1), (m3, s3) = outs[1], outs[3]
    if m1["shards"] != m3["shards"] or any(
            not np.array_equal(a["input_ids"], b["input_ids"]) or not np.array_equal(a["document_offsets"], b["document_offsets"])
            for a, b in zip(s1, s3)):
        failures.append("1 and 3 processes wrote different shards")
    if len(s1) < 3:
        failures.append(f"{len(s1)} shard(s): expected several of at most 700 tokens")
    got = []
    for s in s1:
        ids, off = s["input_ids"], s["document_offsets"]
        if ids.dtype != np.uint8:
            failures.append(f"ids stored as {ids.dtype}, expected uint8 (vocabulary {tok.get_vocab_size()})")
        if len(ids) > 700 or off[0] != 0 or off[-1] != len(ids):
            failures.append(f"a shard of {len(ids)} tokens with offsets {off[0]}..{off[-1]}")
        got += [ids[a:b].tolist() for a, b in zip(off, off[1:])]
    want = [tok.encode(t, add_special_tokens=False).ids + [sep] for t in docs + [book]]
    if got != want:
        failures.append(f"documents differ from their encodings ({len(got)} vs {len(want)} documents)")

    # Supervised: prompt/response pairs and chat messages (no chat template here: the default rendering).
    examples, counted = [], 0
    for i in range(120):
        if i % 2 == 0:
            p, r = sentence(rng.randint(1, 15)), sentence(rng.randint(1, 15))
            examples.append({"prompt": p, "response": r})
        else:
            examples.append({"messages": [{"role": "user", "content": sentence(5)},
                                          {"role": "assistant", "content": sentence(rng.randint(1, 9))},
                                          {"role": "user", "content": sentence(3)},
                                          {"role": "assistant", "content": sentence(4)}]})
    with open(os.path.join(d, "sft.jsonl"), "w") as f:
        for e in examples:
            f.write(json.dumps(e) + "\n")
    sft = os.path.join(d, "sft")
    run(["--tokenizer", tj, "--out", sft, "--supervised", "--shard-tokens", "100000", "--processes", "2",
         os.path.join(d, "sft.jsonl")])
    m, s = shards(sft)
    ids, mask, off = s[0]["input_ids"], s[0]["loss_mask"], s[0]["document_offsets"]
    for k, e in enumerate(examples):
        doc, dm = ids[off[k]:off[k + 1]].tolist(), mask[off[k]:off[k + 1]].tolist()
        if "prompt" in e:
            pi = tok.encode(e["prompt"], add_special_tokens=False).ids
            ri = tok.encode(e["response"], add_special_tokens=False).ids + [sep]
            if doc != pi + ri or dm != [0] * len(pi) + [1] * len(ri):
                failures.append(f"example {k}: ids/mask differ from prompt + response")
                break
        decoded = [tok.id_to_token(t) for t, c in zip(doc, dm) if c]
        if "messages" in e:
            answers = " ".join(msg["content"] for msg in e["messages"] if msg["role"] == "assistant").split()
            # The counted tokens are the assistant contents (their rendering's end tag and the separator besides).
            text = tok.decode([t for t, c in zip(doc, dm) if c]).split()
            if not all(w in text for w in answers) or any(w in text for w in e["messages"][0]["content"].split()
                                                          if w not in answers):
                failures.append(f"example {k}: the counted tokens are not the assistant messages: {text}")
                break
    # .parquet: the same documents as the .jsonl (one per row of the text column).
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        print("parquet case SKIPPED: pyarrow is not installed")
    else:
        pq.write_table(pa.table({"text": docs, "id": list(range(len(docs)))}), os.path.join(d, "web.parquet"),
                       row_group_size=64)
        pout = os.path.join(d, "parquet")
        run(["--tokenizer", tj, "--out", pout, "--shard-tokens", "700", os.path.join(d, "web.parquet")])
        _, ps = shards(pout)
        pdocs = [s["input_ids"][a:b].tolist() for s in ps for a, b in zip(s["document_offsets"], s["document_offsets"][1:])]
        if pdocs != want[:len(docs)]:
            failures.append(f"the .parquet input gave other documents than its .jsonl twin ({len(pdocs)} vs {len(docs)})")
        else:
            print(f"parquet: {len(pdocs)} documents equal to the .jsonl's")

    # A chat template in the tokenizer's folder (tokenizer_config.json): the rendering is the
    # template's, and the counted tokens are the assistant turns with the template's closing tag.
    try:
        import jinja2  # noqa: F401
    except ImportError:
        print("chat-template case SKIPPED: jinja2 is not installed")
    else:
        tdir = os.path.join(d, "templated")
        os.makedirs(tdir)
        tags = ["<user>", "</user>", "<assistant>", "</assistant>"]
        ttok = Tokenizer(models.BPE(unk_token="<unk>"))
        ttok.pre_tokenizer = pre_tokenizers.Whitespace()
        ttok.train_from_iterator([" ".join(tags) + " " + sentence(12) for _ in range(400)],
                                 trainers.BpeTrainer(vocab_size=160, special_tokens=["<|endoftext|>", "<unk>"]))
        ttok.save(os.path.join(tdir, "tokenizer.json"))
        template = ("{% for m in messages %}<{{ m.role }}> {{ m.content }} </{{ m.role }}> {% endfor %}"
                    "{% if add_generation_prompt %}<assistant> {% endif %}")
        json.dump({"chat_template": template}, open(os.path.join(tdir, "tokenizer_config.json"), "w"))
        chats = [e for e in examples if "messages" in e]
        with open(os.path.join(d, "chat.jsonl"), "w") as f:
            for e in chats:
                f.write(json.dumps(e) + "\n")
        cout = os.path.join(d, "chat")
        run(["--tokenizer", os.path.join(tdir, "tokenizer.json"), "--out", cout, "--supervised",
             os.path.join(d, "chat.jsonl")])
        _, cs = shards(cout)
        cids, cmask, coff = cs[0]["input_ids"], cs[0]["loss_mask"], cs[0]["document_offsets"]
        tsep = ttok.token_to_id("<|endoftext|>")
        for k, e in enumerate(chats):
            doc, dm = cids[coff[k]:coff[k + 1]].tolist(), cmask[coff[k]:coff[k + 1]].tolist()
            rendered = jinja2.Environment().from_string(template).render(messages=e["messages"], add_generation_prompt=False)
            squeeze = lambda text: "".join(text.split())  # noqa: E731 (the tokenizer's decode spaces its tokens)
            if squeeze(ttok.decode([t for t in doc if t != tsep])) != squeeze(rendered):
                failures.append(f"chat example {k}: the tokens are not the template's rendering")
                break
            counted_text = squeeze(ttok.decode([t for t, c in zip(doc, dm) if c and t != tsep]))
            expected = "".join(squeeze(m["content"]) + "</assistant>" for m in e["messages"] if m["role"] == "assistant")
            if counted_text != expected:
                failures.append(f"chat example {k}: counted {counted_text!r}, expected {expected!r}")
                break
        else:
            print(f"chat template: {len(chats)} examples rendered by the template, the assistant turns counted")
    # A malformed chat is one line in this tool's name (the renderer is shared with generate_text.py)
    # and writes nothing.
    bad_chat = os.path.join(d, "bad_chat.jsonl")
    with open(bad_chat, "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"content": "no role"}]}) + "\n")
    r = subprocess.run([sys.executable, script, "--tokenizer", tj, "--out", os.path.join(d, "bad_out"), "--supervised",
                        bad_chat], capture_output=True, text=True)
    err = r.stderr.strip()
    if not (r.returncode != 0 and err.startswith("tokenize_text: ") and "every message needs a \"role\" string" in err
            and len(err.splitlines()) == 1 and not os.path.exists(os.path.join(d, "bad_out", "manifest.json"))):
        failures.append(f"a message without a role: exit {r.returncode}, {err[-300:]!r}")
    else:
        print(f"a message without a role: {err}")
    # A bad record met by a worker process (--processes 2, the record in the second of several pieces)
    # is one line naming it, ends the run (it hung before: the worker died and its piece never came
    # back), and leaves no shards, so the same command runs once the input is fixed.
    bad_plain = os.path.join(d, "bad_plain.jsonl")
    with open(bad_plain, "w") as f:
        for i in range(300):
            f.write(json.dumps({"text": sentence(i)}) + "\n")
        f.write(json.dumps({"body": "no text field"}) + "\n")
        for i in range(300):
            f.write(json.dumps({"text": sentence(i)}) + "\n")
    bad_out = os.path.join(d, "bad_plain_out")
    try:
        r = subprocess.run([sys.executable, script, "--tokenizer", tj, "--out", bad_out, "--chunk-bytes", "4K",
                            "--processes", "2", bad_plain], capture_output=True, text=True, timeout=120)
        err = r.stderr.strip()
        left = sorted(os.listdir(bad_out)) if os.path.isdir(bad_out) else []
        if not (r.returncode != 0 and err.startswith("tokenize_text: ") and ", line " in err
                and "no 'text' field" in err and len(err.splitlines()) == 1 and not left):
            failures.append(f"a bad record in a worker: exit {r.returncode}, files {left}, {err[-300:]!r}")
        else:
            print(f"a bad record in a worker: {err}")
    except subprocess.TimeoutExpired:
        failures.append("a bad record in a worker: tokenize_text did not end within 120 s")
    counted = int(mask.sum())
    if m["counted"] != [counted]:
        failures.append(f"manifest counts {m['counted']}, the mask {counted}")
    # hydra train counts exactly the response tokens: one step over windows that cover every target
    # (seq_len = T − 1; position 0 is a prompt token and no document starts with a counted one).
    t = len(ids)
    r = subprocess.run([hydra, "train", "--stage", "finetune", "--preset", "qwen3-tiny", "--data", sft,
                        "--seq-len", str(t - 1), "--steps", "1", "--save-every", "-1", "--out-dir",
                        os.path.join(d, "run")], capture_output=True, text=True,
                       env=dict(os.environ, HYDRA_CACHE_DIR=os.path.join(d, "cache")))
    if r.returncode != 0:
        failures.append(f"hydra train exited {r.returncode}: {r.stderr.strip()[-400:]}")
    else:
        step = [json.loads(x) for x in open(os.path.join(d, "run", "train.jsonl")) if '"step"' in x][0]
        if step["counted_tokens"] != counted:
            failures.append(f"hydra train counted {step['counted_tokens']} targets, the responses hold {counted}")
        else:
            print(f"hydra train counted {counted} targets: the response tokens")

    # Many small inputs share shards: 15 files of a few sentences make one shard (at 6777ccb: 15 shards),
    # and the folder moved elsewhere still reads (paths relative to the manifest).
    small = []
    for i in range(15):
        small.append(os.path.join(d, f"small{i:02d}.txt"))
        open(small[-1], "w").write(sentence(rng.randint(3, 20)))
    run(["--tokenizer", tj, "--out", os.path.join(d, "small"), "--processes", "2"] + small)
    m, s = shards(os.path.join(d, "small"))
    if len(s) != 1 or len(s[0]["document_offsets"]) != 16:
        failures.append(f"15 small files: {len(s)} shard(s) with {[len(x['document_offsets']) - 1 for x in s]} documents, "
                        "expected one shard of 15")
    run(["--tokenizer", tj, "--out", os.path.join(d, "packed"), "--shard-tokens", "40", "--processes", "3"] + small)
    m, s = shards(os.path.join(d, "packed"))
    if any(len(x["input_ids"]) > 40 for x in s) or sum(len(x["document_offsets"]) - 1 for x in s) < 15:
        failures.append(f"shards of at most 40 tokens: got {[len(x['input_ids']) for x in s]}")
    os.rename(os.path.join(d, "small"), os.path.join(d, "moved"))
    shards(os.path.join(d, "moved"))
for f in failures:
    print("FAIL:", f)
print(f"tokenize_shards_test: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
