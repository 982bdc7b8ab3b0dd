#!/usr/bin/env python3
"""The clean stage of build_corpus.py: a package's archive fetched once, every file (and every member
of the archives it ships) read as text by its kind, markup stripped (markup.py), and the documents
kept or dropped with the reason counted -> SCRATCH/clean/LABEL.jsonl and LABEL.stats.json.

A separate file so that what cleans is one digest (this file and markup.py, cleaner_digest()): a
package's stats carry the digest of the code that cleaned it, and build_corpus.py cleans again a
package cleaned by other code, while edits elsewhere (merge, tokenizer, the command line) reuse the
cleaned text, which takes an hour to make for the whole package list.
"""
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import markup  # noqa: E402  (beside this file)

PROSE_KINDS = ("info", "texinfo", "text", "dict", "pod", "html", "man")  # also the order of preference for one stem
CODE_EXT = {".c", ".h", ".cc", ".cpp", ".cxx", ".hh", ".hpp", ".hxx", ".S", ".py", ".pl", ".pm", ".el", ".rs", ".go",
            ".java", ".js", ".ts", ".rb", ".sh", ".bash", ".m4", ".ac", ".awk", ".tcl", ".tk", ".lisp", ".lsp", ".cl",
            ".scm", ".ss", ".hs", ".ml", ".mli", ".ads", ".adb", ".f", ".f90", ".f95", ".d", ".lua", ".sql", ".y",
            ".l", ".cmake", ".mk", ".php", ".kt", ".scala", ".cs", ".m", ".r", ".R", ".jl", ".sed", ".rkt", ".erl",
            ".ex", ".exs", ".clj", ".vim", ".proto", ".td", ".def"}
CODE_NAMES = re.compile(r"^(Makefile.*|Kconfig.*|Kbuild|CMakeLists\.txt|configure\.ac|meson\.build)$")
TEXT_EXT = {".txt", ".rst", ".md", ".markdown", ".text", ".adoc", ".org"}
TEXT_NAMES = re.compile(r"^(README|NEWS|INSTALL|HACKING|TODO|FAQ|THANKS|AUTHORS)([._-].*)?$")
SKIP_NAMES = re.compile(r"^(changelog.*|ChangeLog.*|copyright|COPYING.*|LICEN[CS]E.*)$", re.I)
# A translation's folder (fr-FR, pt_BR, zh-TW: a language and a region), English's aside: a partly
# translated manual keeps its untranslated paragraphs in English, so the language test alone keeps
# it, and each translation is then another copy of the manual (debian-handbook ships 25).
LOCALE_DIR = re.compile(r"(^|/)(?!en[-_])[a-z]{2,3}[-_][A-Z]{2}/")
ARCHIVES = (".tar.xz", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar", ".zip")
STOPWORDS = {"the", "of", "and", "to", "is", "that", "for", "with", "this", "are", "be", "by", "from", "which", "it",
             "as", "on", "you", "not", "or", "an", "if", "can", "will", "was", "have", "has", "at", "its", "when"}
MAX_FILE = 64 << 20   # a member larger than this is data, not text
SPLIT_AT = 1 << 20    # documents above this are cut at paragraph ends into pieces of about PIECE
PIECE = 256 << 10

def fail(message):
    print(f"build_corpus: {message}", file=sys.stderr)
    sys.exit(2)


def log(message):
    print(f"[corpus {time.strftime('%H:%M:%S')}] {message}", flush=True)


def cleaner_digest():
    """What cleans a package: this file's and markup.py's bytes. A package cleaned by other code (an
    earlier revision of a rule) is cleaned again, so the corpus is always what these rules make."""
    h = hashlib.sha256()
    for path in (os.path.abspath(__file__), os.path.abspath(markup.__file__)):
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def hash_unit(s):
    """A number in [0, 1) from a string: the same on every machine and run."""
    return int.from_bytes(hashlib.sha256(s.encode("utf-8", "surrogatepass")).digest()[:8], "big") / 2.0 ** 64


# -------------------------------------------------------------------------------------------- fetch
def fetch(pkg, scratch):
    """The package's archive (a .deb, an sdist) or folder; downloaded once into SCRATCH/archives."""
    if pkg["kind"] == "file":
        return pkg["name"], None
    d = os.path.join(scratch, "archives", pkg["label"])
    os.makedirs(d, exist_ok=True)
    have = [f for f in os.listdir(d) if not f.startswith(".")]
    if not have:
        if pkg["kind"] == "deb":
            cmd = ["apt-get", "download", pkg["name"]]
        else:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
                   "-q", "-d", ".", pkg["name"]]
        r = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
        have = [f for f in os.listdir(d) if not f.startswith(".")]
        if r.returncode != 0 or len(have) != 1:
            fail(f"{' '.join(cmd)} failed ({r.returncode}): {(r.stderr or r.stdout).strip().splitlines()[-1:] or have}")
    return os.path.join(d, have[0]), have[0]


def members(path, scratch, label):
    """(relative name, bytes) of every regular file of a package: a .deb unpacked with dpkg -x, an
    archive or a folder walked; archives inside it (a source tarball, a src.zip) read member by member."""
    if os.path.isdir(path):
        root = path
    elif path.endswith(".deb"):
        root = os.path.join(scratch, "unpacked", label)
        if not os.path.isdir(root):
            if os.path.isdir(root + ".tmp"):
                shutil.rmtree(root + ".tmp")  # an unpacking that was cut off
            os.makedirs(os.path.dirname(root), exist_ok=True)
            r = subprocess.run(["dpkg", "-x", path, root + ".tmp"], capture_output=True, text=True)
            if r.returncode != 0:
                fail(f"dpkg -x {path} failed: {r.stderr.strip()}")
            os.replace(root + ".tmp", root)
    else:
        yield from archive_members(path, os.path.basename(path), open(path, "rb"))
        return
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(dirpath, f)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            rel = os.path.relpath(p, root)
            if f.endswith(ARCHIVES):
                with open(p, "rb") as fh:
                    yield from archive_members(p, rel, fh)
            elif os.path.getsize(p) <= MAX_FILE:
                with open(p, "rb") as fh:
                    yield rel, fh.read()
            else:
                yield rel, None


def archive_members(path, rel, fh):
    """(name, bytes) of an archive's files; (rel, False) once when it is no readable archive (a test
    fixture named .tar.gz, a truncated file): what it yielded before stays."""
    try:
        if path.endswith(".zip"):
            with zipfile.ZipFile(fh) as z:
                for info in sorted(z.infolist(), key=lambda i: i.filename):
                    if not info.is_dir():
                        yield f"{rel}/{info.filename}", z.read(info) if info.file_size <= MAX_FILE else None
            return
        with tarfile.open(fileobj=fh, mode="r|*") as t:  # streamed: a 1 GB tarball is never on disk
            for m in t:
                if m.isfile():
                    yield f"{rel}/{m.name}", t.extractfile(m).read() if m.size <= MAX_FILE else None
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, ValueError, zlib.error):
        yield rel, False


# -------------------------------------------------------------------------------------------- clean
def kind_of(name):
    """(kind, stem) of a file by its name (after a .gz/.dz suffix is dropped), or (None, None)."""
    base = os.path.basename(name)
    if SKIP_NAMES.match(base) or "/.git/" in name:
        return None, None
    low = base.lower()
    if re.search(r"(^|/)man\d?[a-z]*/", name) and re.search(r"\.\d[a-z+]*$", low) or low.endswith(".man"):
        return "man", re.sub(r"\.\d[a-z+]*$|\.man$", "", low)
    ext = os.path.splitext(base)[1]
    if low.endswith((".html", ".htm", ".xhtml")):
        return "html", low.rsplit(".", 1)[0]
    if low.endswith((".texi", ".texinfo", ".txi")):
        return "texinfo", low.rsplit(".", 1)[0]
    if re.search(r"\.info(-\d+)?$", low):
        return "info", re.sub(r"\.info(-\d+)?$", "", low)
    if low.endswith(".pod"):
        return "pod", low[:-4]
    if low.endswith(".dict"):
        return "dict", low[:-5]
    if ext in CODE_EXT or CODE_NAMES.match(base):
        return "code", None
    if ext.lower() in TEXT_EXT or TEXT_NAMES.match(base) or "/fortunes/" in name and not ext:
        # Sphinx keeps a page's source as _sources/PAGE.rst.txt beside PAGE.html: one stem.
        return "text", re.sub(r"(\.(rst|md|txt|text))+$", "", low)
    return None, None


def to_text(kind, raw):
    if kind == "html":
        return markup.from_html(raw)
    if kind == "man":
        return markup.from_roff(raw)
    if kind == "texinfo":
        return markup.from_texinfo(raw)
    if kind == "info":
        return markup.from_info(raw)
    if kind == "pod":
        return markup.from_pod(raw)
    return raw


def normalise(text):
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "\n")
    text = re.sub(r"[\x00-\x08\x0b\x0e-\x1f\x7f]", "", text)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n") + "\n"


def why_dropped(kind, text, min_bytes):
    """The reason a cleaned document is not kept, or None."""
    n = len(text.encode("utf-8"))
    if n < min_bytes:
        return "small"
    non_ascii = 0 if text.isascii() else len(text) - len(text.encode("ascii", "ignore"))  # at C speed
    if non_ascii > 0.05 * len(text):
        return "non-ascii"
    if kind != "code":
        words = re.findall(r"[A-Za-z]+", text[:200000])
        if len(words) < 20 or sum(1 for w in words if w.lower() in STOPWORDS) < 0.06 * len(words):
            return "not-english"
    if n > 4096 and len(zlib.compress(text.encode("utf-8"), 1)) < 0.12 * n:
        return "repetitive"
    if kind == "code":
        lines = text.split("\n")
        if sum(1 for ln in lines if len(ln) > 400) > 0.05 * len(lines):
            return "long-lines"
    return None


def boilerplate(docs):
    """Lines that recur across a package's HTML pages (site headers, footers, nav text) dropped."""
    pages = [d for d in docs if d["kind"] == "html"]
    if len(pages) < 20:
        return
    count = {}
    for d in pages:
        for line in set(d["text"].split("\n")):
            if line.strip():
                count[line] = count.get(line, 0) + 1
    limit = max(5, 0.05 * len(pages))
    common = {line for line, c in count.items() if c > limit}
    for d in pages:
        d["text"] = normalise("\n".join(ln for ln in d["text"].split("\n") if ln not in common))
    return len(common)


def split_long(text):
    if len(text) <= SPLIT_AT:
        return [text]
    out, start = [], 0
    while start < len(text):
        end = text.find("\n\n", start + PIECE, start + 4 * PIECE)  # a paragraph end, else a line end
        if end < 0:
            end = text.find("\n", start + PIECE)
        end = len(text) if end < 0 or len(text) - end < PIECE // 4 else end + 1
        out.append(text[start:end])
        start = end
    return out


def _chain(first, rest):
    if first is not None:
        yield first
    yield from rest


def clean_package(pkg, scratch, min_bytes, cleaner):
    """SCRATCH/clean/LABEL.jsonl (documents) and LABEL.stats.json (with `cleaner`, the digest of the code
    that cleaned it: a package cleaned by other code is cleaned again); returns the stats."""
    out = os.path.join(scratch, "clean", pkg["label"])
    if os.path.exists(out + ".stats.json"):
        with open(out + ".stats.json") as f:
            old = json.load(f)
        if old.get("cleaner") == cleaner:
            return old
        log(f"{pkg['label']}: cleaned by other code ({old.get('cleaner') or 'unrecorded'}, now {cleaner}): cleaned again")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    t0 = time.time()
    path, archive = fetch(pkg, scratch)
    stats = {"package": pkg["name"], "kind": pkg["kind"], "keep": pkg["keep"], "archive": archive, "cleaner": cleaner,
             "archive_bytes": os.path.getsize(path) if os.path.isfile(path) else None,
             "files": 0, "files_read": 0, "bytes_read": 0, "dropped": {}, "documents": 0, "bytes": 0, "by_kind": {}}
    drop = lambda why: stats["dropped"].__setitem__(why, stats["dropped"].get(why, 0) + 1)
    # A package with Info manuals ships its HTML pages (and their Sphinx sources) as the same text cut
    # otherwise (python3.X-doc, the GNU manuals): those go, unread. A .deb's names are listed first.
    docs, info, listing = [], False, members(path, scratch, pkg["label"])
    unpacked = os.path.join(scratch, "unpacked", pkg["label"])
    first = next(listing, None)  # unpacks a .deb
    if os.path.isdir(unpacked):
        info = any(re.search(r"\.info(-\d+)?(\.gz)?$", f) for _, _, fs in os.walk(unpacked) for f in fs)
    for name, data in _chain(first, listing):
        stats["files"] += 1
        if data is False:
            drop("bad-archive")
            continue
        plain = re.sub(r"\.(gz|dz)$", "", name)
        kind, stem = kind_of(plain)
        if kind is None:
            drop("other-format")
            continue
        if kind != "code" and LOCALE_DIR.search(name):
            drop("translation")
            continue
        if info and (kind == "html" or "/_sources/" in name):
            drop("other-format-of-same-doc")
            continue
        # Sampled by stem, so the formats of one document are kept or left together.
        if pkg["keep"] < 1 and hash_unit(stem or name) >= pkg["keep"]:
            drop("not-sampled")
            continue
        if data is None:
            drop("too-large")
            continue
        if plain != name:
            try:
                data = gzip.decompress(data)
            except (OSError, EOFError, zlib.error):
                drop("bad-gzip")
                continue
        stats["files_read"] += 1
        stats["bytes_read"] += len(data)
        if kind == "info":  # Info marks index nodes with NUL-backspace brackets
            data = data.replace(b"\x00\x08[index\x00\x08]", b"").replace(b"\x00\x08", b"")
        if b"\x00" in data:
            drop("binary")
            continue
        try:
            raw = data.decode("utf-8")
        except UnicodeDecodeError:
            # Older text (GCIDE, some man pages) is Latin-1: taken as such when it is almost all ASCII.
            if sum(1 for b in data if b > 127) > 0.02 * len(data):
                drop("not-utf8")
                continue
            raw = data.decode("latin-1")
            stats["latin1"] = stats.get("latin1", 0) + 1
        docs.append({"name": name, "kind": kind, "stem": stem, "text": normalise(to_text(kind, raw))})
    stats["boilerplate_lines"] = boilerplate(docs)
    # One format of a document the package ships in several (one stem): every file of the kind with the
    # most text once cleaned (Sphinx's _sources of an API page is a stub, its HTML the whole docstring;
    # an Info manual's parts, and pages of one name in several folders, share a stem and a kind), ties
    # to the first in PROSE_KINDS.
    text_of_kind = {}
    for d in docs:
        if d["stem"] is not None:
            text_of_kind[(d["stem"], d["kind"])] = text_of_kind.get((d["stem"], d["kind"]), 0) + len(d["text"])
    best = {}
    for (stem, kind), n in text_of_kind.items():
        best[stem] = min(best.get(stem, (0, len(PROSE_KINDS), None)), (-n, PROSE_KINDS.index(kind), kind))
    tmp = out + ".jsonl.tmp"
    with open(tmp, "w") as f:
        for i, d in enumerate(docs):
            if d["stem"] is not None and best[d["stem"]][2] != d["kind"]:
                drop("other-format-of-same-doc")
                continue
            why = why_dropped(d["kind"], d["text"], min_bytes)
            if why:
                drop(why)
                continue
            for i, piece in enumerate(split_long(d["text"])):
                f.write(json.dumps({"text": piece, "kind": d["kind"], "name": d["name"] + (f"#{i}" if i else "")}) + "\n")
                stats["documents"] += 1
                stats["bytes"] += len(piece.encode("utf-8"))
                stats["by_kind"][d["kind"]] = stats["by_kind"].get(d["kind"], 0) + len(piece.encode("utf-8"))
    os.replace(tmp, out + ".jsonl")
    stats["seconds"] = round(time.time() - t0, 1)
    with open(out + ".stats.json.tmp", "w") as f:
        json.dump(stats, f, indent=1)
    os.replace(out + ".stats.json.tmp", out + ".stats.json")
    return stats
