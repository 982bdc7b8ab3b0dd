#!/usr/bin/env python3
"""CTest corpus.build: cluster/corpus/build_corpus.py end to end on packages made here (no network):
two .deb packages built with dpkg-deb and a source archive, holding every kind of file the builder
reads or drops, with the answer known for each:
  * 22 HTML pages with a shared footer and navigation (boilerplate: the footer line goes, the nav
    block goes, the body stays), a guide repeated in the source archive (kept once), a tiny file, a
    binary file, a Latin-1 file (kept as Latin-1) and one that is not text at all;
  * a man page (roff: text joined into paragraphs), an Info manual with Info's NUL-backspace index
    marks (kept, not "binary"), the same manual as Texinfo and as HTML (other formats of it: dropped),
    POD, a German and a Japanese text (dropped: not English, not ASCII), a register table
    (repetitive), a minified script (long lines), C code with comments, and a tarball inside the
    package whose members are read;
  * keep=F sampling by name: the same documents at every run.
Then the held-out split, the tokenizer (vocabulary as asked), the token shards (tokenize_text.py) and
the manifest's counts. Skipped (77) without dpkg-deb, tokenizers, h5py or numpy.
Usage: corpus_build_test.py REPO_ROOT
"""
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

root = sys.argv[1]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hydra_testlib import check, failures  # noqa: E402

try:
    import h5py  # noqa: F401
    import numpy  # noqa: F401
    import tokenizers  # noqa: F401
except ImportError as e:
    print(f"SKIPPED: {e} (corpus.build needs tokenizers, h5py and numpy)")
    sys.exit(77)
if shutil.which("dpkg-deb") is None:
    print("SKIPPED: dpkg-deb is not installed")
    sys.exit(77)

WORDS = ("the of and to in is that for it as with was on be by this are from or which at an have not but had they "
         "his her can all there would their we been has when who will more no if out so said what up its about into "
         "than them only other new some could time these two may then do first any my now such like our over man me "
         "even most made after also did many before must through back years where much your way well down should "
         "because each just those people how too little state good very make world still own see men work long get "
         "here between both life being under never day same another know while last might us great old year off come "
         "since against go came right used take three file program reader archive manual section text line tool "
         "package system value number order table page chapter example option command output input error version").split()


def para(i, n=60):
    """Sentences of common English words drawn from seed i: text that compresses like prose, not like a table."""
    import random
    rng = random.Random(i)
    out = []
    for _ in range(n):
        w = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
        out.append(" ".join(w).capitalize() + rng.choice(".?!") + f" ({i}.{len(out)})")
    return " ".join(out)


def code(prefix, seed):
    import random
    rng = random.Random(seed)
    return "".join(f"/* {para(seed * 100 + i, 2)} */\nint {prefix}{i}(int {rng.choice('xyzw')}) {{\n"
                   f"  return {rng.choice('xyzw')} * {rng.randint(2, 999)} + {rng.randint(0, 10 ** 6)};\n}}\n"
                   for i in range(40))


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def deb(tmp, name, files):
    d = os.path.join(tmp, "src", name)
    for rel, data in files.items():
        write(os.path.join(d, rel), data)
    write(os.path.join(d, "DEBIAN", "control"), f"Package: {name}\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\n"
                                                  f"Description: test\n test package\n")
    out = os.path.join(tmp, f"{name}.deb")
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", d, out], check=True, capture_output=True)
    return out


def tar_gz(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for rel, data in files.items():
            b = data.encode("utf-8")
            info = tarfile.TarInfo(rel)
            info.size = len(b)
            t.addfile(info, io.BytesIO(b))
    return buf.getvalue()


page = lambda i: (f"<html><head><title>Page {i}</title><script>var x = 1;</script></head><body>"
                  f"<nav class='sidebar'>Home | Index | Search the toy documentation</nav>"
                  f"<div class='body'><h1>Chapter {i}</h1><p>{para(i)}</p><pre>  indented code {i}\n  second line</pre></div>"
                  f"<p>Copyright the toy project authors, all rights reserved forever and ever.</p></body></html>")
man = (".TH TOOL 1\n.SH NAME\ntool \\- does things with files\n.SH DESCRIPTION\n.B tool\nreads the files\nthat it is given"
       " and writes\nwhat it finds.\n.PP\n" + para(90) + "\n.\\\" a roff comment the reader never sees\n")
info = ("This is manual.info, produced by makeinfo.\n\n\x1f\nFile: manual.info,  Node: Top,  Next: Intro\n\n" + para(70) +
        "\n\n\x1f\nFile: manual.info,  Node: Index\n\n* Menu:\n\n\x00\x08[index\x00\x08]\n* tool:  Intro.\n\n" + para(71) + "\n")
texinfo = "@node Top\n@chapter The manual\n@cindex manual\n" + para(70) + " Use @code{tool} to read @var{file}.\n@bye\n"
pod = "=head1 NAME\n\nTool - the tool\n\n=head1 DESCRIPTION\n\nThe C<tool> reads B<files>.\n\n" + para(80) + "\n\n=cut\n"
german = " ".join(["Die Datei wird von dem Programm gelesen und der Text wird in das Archiv geschrieben, wenn er lesbar ist."] * 30)
japanese = "これは日本語の文書です。プログラムはファイルを読み込みます。" * 40
registers = "".join(f"#define REG_BLOCK_{i // 8}_FIELD_{i % 8}_MASK 0x{i:08x}\n" for i in range(4000))
minified = "".join(f"var a{i}=[" + ",".join(str((i * 7919 + k * 104729) % 1000003) for k in range(80)) + "];\n" for i in range(40))
code_c = code("step_", 1)

with tempfile.TemporaryDirectory() as tmp:
    a = {f"usr/share/doc/toy/html/page{i:02d}.html": page(i) for i in range(22)}
    # A partly translated copy of a page (its paragraphs still English) in a locale folder: dropped;
    # the English one (en-US) and code in such a folder (a locale's formats) kept.
    a.update({"usr/share/doc/toy/html/fr-FR/intro.html": f"<html><body><p>{para(81)}</p></body></html>",
              "usr/share/doc/toy/html/en-US/intro.html": f"<html><body><p>{para(82)}</p></body></html>",
              "usr/src/toy/locale/pt_BR/formats.c": code("encoder_", 3)})
    a.update({"usr/share/doc/toy/tiny.txt": "too small", "usr/share/doc/toy/guide.txt": para(33),
              "usr/share/doc/toy/blob.txt": b"\x7fELF\x00\x00 binary " * 100,
              "usr/share/doc/toy/latin.txt": (para(60) + " Caf\xe9 na\xefve.").encode("latin-1"),
              "usr/share/doc/toy/notes.txt": ("\xff\xfe" * 400 + "x").encode("latin-1"),
              "usr/share/man/man1/tool.1.gz": gzip.compress(man.encode()),
              "usr/share/doc/toy/german.txt": german, "usr/share/doc/toy/japanese.txt": japanese,
              "usr/src/toy/fixture.tar.gz": b"a test fixture named like a tarball" * 8,
              "usr/src/toy/regs.h": registers, "usr/src/toy/min.js": minified, "usr/src/toy/reader.c": code_c,
              "usr/src/toy-src.tar.gz": tar_gz({"toy/lib/inner.c": code("inner_", 2),
                                                 "toy/doc/inner.rst": para(50)})})
    b = {"usr/share/info/manual.info.gz": gzip.compress(info.encode()),
         # the manual's second part (one stem, one kind: kept with the first), and two pages of one name
         # in two folders (kept both)
         "usr/share/info/manual.info-2.gz": gzip.compress(para(72).encode()),
         "usr/share/doc/manual/a/index.txt": para(73), "usr/share/doc/manual/b/index.txt": para(74),
         "usr/share/doc/manual/manual.texi": texinfo,
         "usr/share/doc/manual/html/manual.html": f"<html><body><p>{para(70)}</p></body></html>",
         "usr/share/doc/manual/html/other.html": f"<html><body><p>{para(75)}</p></body></html>",
         "usr/share/perl/Tool.pod": pod}
    for i in range(40):  # for keep=0.5: documents enough to sample
        b[f"usr/share/doc/manual/extra/part{i:02d}.txt"] = para(200 + i)
    deb_a, deb_b = deb(tmp, "toy-a", a), deb(tmp, "toy-b", b)
    sdist = os.path.join(tmp, "toy_sdist-1.0.tar.gz")
    write(sdist, tar_gz({"toy_sdist-1.0/docs/guide.txt": para(33), "toy_sdist-1.0/README.md": para(40)}))
    lst = os.path.join(tmp, "packages.txt")
    write(lst, f"# test packages\nfile:{deb_a}\nfile:{deb_b} keep=0.5   # half of b's documents\nfile:{sdist}\n")
    out = os.path.join(tmp, "corpus")
    cmd = [sys.executable, os.path.join(root, "cluster/corpus/build_corpus.py"), "--packages", lst, "--out", out,
           "--vocab", "400", "--heldout", "0.25", "--min-bytes", "300", "--tokenizer-bytes", "1e6"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(r.stdout[-3000:], r.stderr[-3000:])
    check(r.returncode == 0, f"build_corpus exited {r.returncode}")
    KEEP = out
    m = json.load(open(os.path.join(out, "manifest.json")))
    src = {os.path.basename(s["package"]): s for s in m["sources"]}
    A, B, S = src["toy-a.deb"], src["toy-b.deb"], src["toy_sdist-1.0.tar.gz"]
    for why, n in (("translation", 1), ("bad-archive", 1), ("small", 1), ("binary", 1), ("not-utf8", 1), ("not-english", 1), ("non-ascii", 1), ("repetitive", 1),
                   ("long-lines", 1)):
        check(A["dropped"].get(why) == n, f"toy-a: {n} dropped as {why}: {A['dropped']}")
    check(A["latin1"] == 1, f"toy-a: one Latin-1 file read as such: {A.get('latin1')}")
    check(A["boilerplate_lines"] >= 1, f"toy-a: the shared footer found: {A['boilerplate_lines']}")
    check(B["dropped"].get("other-format-of-same-doc") == 3, f"toy-b: the Texinfo and both HTML pages dropped beside the Info manual: {B['dropped']}")
    check("binary" not in B["dropped"] and B["by_kind"].get("info", 0) > 0, f"toy-b: the Info manual kept: {B['by_kind']} {B['dropped']}")
    check(S["duplicates"] == 1, f"the sdist's copy of the guide is a duplicate: {S['duplicates']}")
    docs = {}
    for name in ("prose-train", "prose-heldout", "code-train", "code-heldout"):
        with open(os.path.join(out, "text", name + ".jsonl")) as f:
            for line in f:
                d = json.loads(line)
                docs[(d["source"], d["name"])] = (name, d["text"])
    text_of = lambda suffix: next((t for (s, n), (_, t) in docs.items() if n.endswith(suffix)), "")
    p5 = text_of("page05.html")
    check("Chapter 5" in p5 and "(5.7)" in p5 and "indented code 5" in p5, "HTML body kept")
    check("all rights reserved" not in p5 and "Search the toy" not in p5 and "var x" not in p5,
          f"footer, navigation and script gone: {p5[:300]!r}")
    tool = text_of("tool.1.gz")
    check("reads the files that it is given and writes what it finds." in tool and "roff comment" not in tool and "(90.3)" in tool,
          f"man page: text joined, comments gone: {tool[:300]!r}")
    check("(72.3)" in text_of("manual.info-2.gz") and "(73.3)" in text_of("a/index.txt") and "(74.3)" in text_of("b/index.txt"),
          "every part of the Info manual and both pages of one name kept")
    check("\x00" not in text_of("manual.info.gz") and "(71.3)" in text_of("manual.info.gz"), "Info text without its NUL marks")
    check("reads files" in text_of("Tool.pod") and "C<" not in text_of("Tool.pod"), "POD markup gone")
    check("(82.3)" in text_of("en-US/intro.html") and not text_of("fr-FR/intro.html") and "encoder_2" in text_of("pt_BR/formats.c"),
          "the translation's copy dropped, the English page and the code kept")
    check("inner_3" in text_of("toy/lib/inner.c") and "(50.2)" in text_of("toy/doc/inner.rst"), "tarball members read")
    check({n for (s, t), (n, _) in docs.items() if t.endswith(".c")} <= {"code-train", "code-heldout"}, "C files are code")
    extra = sorted(t for (s, t) in docs if "extra/part" in t)
    check(0 < len(extra) < 40, f"keep=0.5 kept some of b's 40 extra documents: {len(extra)}")
    split = {t: n for (s, t), (n, _) in docs.items()}
    check(any(n.endswith("heldout") for n in split.values()) and any(n.endswith("train") for n in split.values()),
          "both splits hold documents")
    tok = json.load(open(os.path.join(out, "tokenizer", "tokenizer.json")))
    check(len(tok["model"]["vocab"]) + len([t for t in tok["added_tokens"] if t["content"] not in tok["model"]["vocab"]]) == 400,
          "tokenizer: 400 ids")
    total = sum(v["tokens"] for v in m["tokens"].values())
    check(m["train_tokens"] + m["heldout_tokens"] == total and m["heldout_tokens"] > 0, f"tokens: {m['tokens']}")
    for name, v in m["tokens"].items():
        man_ = json.load(open(os.path.join(out, "tokens", name, "manifest.json")))
        check(sum(man_["documents"]) == m["text"][name]["documents"], f"{name}: every document tokenized")
    check("tokenize_text.py" in open(os.path.join(out, "commands.sh")).read(), "commands.sh holds the tokenize commands")
    r = subprocess.run([sys.executable, os.path.join(root, "cluster/corpus/build_corpus.py"), "--out", out, "--summary"],
                       capture_output=True, text=True)
    check(r.returncode == 0 and "| toy-a.deb |" in r.stdout and "| toy-b.deb (keep 0.5) |" in r.stdout
          and f"| prose-heldout | {m['text']['prose-heldout']['documents']} |" in r.stdout, f"--summary: {r.stdout[:600]}")
    # cut_corpus.py: what the teacher's recipe reads, at a size that travels. Whole documents of the
    # training prose (about half its tokens, by hash), the held-out shards and text whole, the first
    # 50 KB of the training prose text, the tokenizer as it is; no code when none is asked for.
    cut = os.path.join(tmp, "cut")
    half = m["tokens"]["prose-train"]["tokens"] // 2
    r = subprocess.run([sys.executable, os.path.join(root, "cluster/corpus/cut_corpus.py"), "--corpus", out, "--out", cut,
                        "--prose-tokens", str(half), "--code-tokens", "0", "--hay-mb", "0.05"], capture_output=True, text=True)
    check(r.returncode == 0, f"cut_corpus: {r.stderr[-600:]}")

    def documents(path):
        with h5py.File(path, "r") as f:
            ids, off = f["input_ids"][...], f["document_offsets"][...]
        return [tuple(ids[off[k]:off[k + 1]].tolist()) for k in range(len(off) - 1)]
    src_docs = documents(os.path.join(out, "tokens", "prose-train", "shard-00000-0000.h5"))
    cut_man = json.load(open(os.path.join(cut, "tokens", "prose-train", "manifest.json")))
    cut_docs = documents(os.path.join(cut, "tokens", "prose-train", cut_man["shards"][0]))
    check(0 < len(cut_docs) < len(src_docs) and all(d_ in set(src_docs) for d_ in cut_docs)
          and cut_man["tokens"] == [sum(map(len, cut_docs))] and cut_man["documents"] == [len(cut_docs)],
          f"the cut holds whole training documents, some not all: {len(cut_docs)} of {len(src_docs)}, {cut_man['tokens']} tokens")
    check(sum(json.load(open(os.path.join(cut, "tokens", "prose-heldout", "manifest.json")))["tokens"]) == m["tokens"]["prose-heldout"]["tokens"]
          and not os.path.exists(os.path.join(cut, "tokens", "code-train")), "held-out shards whole, no code asked, none")
    hay_lines = open(os.path.join(cut, "text", "prose-train.jsonl")).readlines()
    src_lines = open(os.path.join(out, "text", "prose-train.jsonl")).readlines()
    check(hay_lines == src_lines[:len(hay_lines)] and sum(map(len, hay_lines)) >= min(50000, sum(map(len, src_lines)))
          and sum(map(len, hay_lines[:-1])) < 50000, f"the haystack text: the first 50 KB of documents ({len(hay_lines)} lines)")
    check(open(os.path.join(cut, "tokenizer", "tokenizer.json"), "rb").read() == open(os.path.join(out, "tokenizer", "tokenizer.json"), "rb").read()
          and json.load(open(os.path.join(cut, "cut.json")))["prose-train"]["tokens"] == cut_man["tokens"][0], "tokenizer and cut.json")
    r = subprocess.run([sys.executable, os.path.join(root, "cluster/corpus/cut_corpus.py"), "--corpus", out, "--out", cut,
                        "--prose-tokens", "1K", "--code-tokens", "0"], capture_output=True, text=True)
    check(r.returncode != 0 and "exists and is not empty" in r.stderr, f"cut_corpus into a full folder: {r.stderr!r}")
    # The same list again: every package comes from the scratch folder, and the same documents result.
    before = {k: v[1] for k, v in docs.items()}
    shutil.rmtree(os.path.join(out, "text"))
    r = subprocess.run(cmd[:-6] + ["--stop-after", "merge", "--heldout", "0.25", "--min-bytes", "300"], capture_output=True, text=True)
    again = {}
    for name in ("prose-train", "prose-heldout", "code-train", "code-heldout"):
        for line in open(os.path.join(out, "text", name + ".jsonl")):
            d = json.loads(line)
            again[(d["source"], d["name"])] = d["text"]
    check(r.returncode == 0 and again == before, "a second run gives the same documents")
    # What is up to date is reused, what is stale is made again: the whole build once more changes
    # nothing; a package cleaned by other code (another cleaner digest) is cleaned again, and the
    # same text keeps the tokenizer; other text (--heldout 0.4) trains the tokenizer and tokenizes again.
    tok_path = os.path.join(out, "tokenizer", "tokenizer.json")
    made = lambda: (os.stat(tok_path).st_mtime_ns,
                    {n: os.stat(os.path.join(out, "tokens", n, "manifest.json")).st_mtime_ns for n in m["tokens"]})
    first = made()
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 0 and "again" not in r.stdout and made() == first,
          f"an up-to-date corpus: every stage reused: {r.stdout[-800:]}")
    stats_a = os.path.join(out, "scratch", "clean", "file-toy-a.deb.stats.json")
    st = json.load(open(stats_a))
    check(len(st.get("cleaner", "")) == 16, f"the cleaner's digest in the stats: {st.get('cleaner')}")
    st["cleaner"] = "0" * 16
    write(stats_a, json.dumps(st).encode())
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 0 and "file-toy-a.deb: cleaned by other code (0000000000000000" in r.stdout
          and "file-toy-b.deb: cleaned" not in r.stdout and made() == first,
          f"a package cleaned by other code is cleaned again (same text: tokenizer and shards kept): {r.stdout[-800:]}")
    check(json.load(open(stats_a))["cleaner"] == m["cleaner"], "re-cleaned: the stats carry this code's digest")
    r = subprocess.run(cmd[:-6] + ["--heldout", "0.4", "--min-bytes", "300", "--tokenizer-bytes", "1e6"],
                       capture_output=True, text=True)
    m2 = json.load(open(os.path.join(out, "manifest.json")))
    check(r.returncode == 0 and "tokenizer: trained on other text" in r.stdout and made()[0] != first[0],
          f"other training text: the tokenizer trained again: {r.stdout[-800:]}")
    for name, v in m2["tokens"].items():
        man_ = json.load(open(os.path.join(out, "tokens", name, "manifest.json")))
        src_ = json.load(open(os.path.join(out, "tokens", name, "source.json")))
        check(sum(man_["documents"]) == m2["text"][name]["documents"] and src_["text"] == m2["text"][name]["sha256"],
              f"{name}: the shards hold the new split's documents ({m2['text'][name]['documents']}) and say so: {src_}")
    # Bad input: one line, exit 2.
    write(lst, "deb:\n")
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 2 and "is not deb:NAME" in r.stderr and r.stderr.count("\n") == 1, f"bad list: {r.stderr!r}")
    write(lst, "pypi:Django\n")
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 2 and "needs an exact version" in r.stderr, f"unpinned pypi: {r.stderr!r}")

print(f"corpus_build_test: {len(failures)} failure(s)")
print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
sys.exit(1 if failures else 0)
