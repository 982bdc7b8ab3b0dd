#!/usr/bin/env python3
"""The files of a results folder, wherever they sit: plain, gzipped beside their name, or archived.

A folder under cluster/results keeps its README, tables, plots and commands as files; its raw logs and
per-sample files (eval lines, training logs, JSON records) go into one archive, FOLDER/raw.tar.xz,
under their paths relative to the folder (`pack`). The tools that read results folders
(cluster/synth/report.py, decide.py, curves.py, merge_results.py, ruler_report.py) open every file
through this module, so they read a folder the same before and after it is packed:

  exists(path), read_text(path), read_bytes(path), listdir(folder), glob(pattern)

A path is looked for as a file, then as path + ".gz" (decompressed), then inside an archive above it:
a folder's raw.tar.xz (member: the path below that folder), or the archive of one of its folders,
DIR.tar.xz or DIR.tgz beside DIR (member: the path below DIR; how the GPU jobs deliver their logs).
Archives inside archives are read the same way. Standard library only.

  python3 cluster/results_files.py pack cluster/results/FOLDER    # raw files into FOLDER/raw.tar.xz
  python3 cluster/results_files.py list cluster/results/FOLDER    # every file the tools can read
  python3 cluster/results_files.py cat  cluster/results/FOLDER/evals/x.niah.jsonl
  python3 cluster/results_files.py extract cluster/results/FOLDER/teacher.h5 /tmp/teacher.h5   # a file, as bytes

pack keeps in place: README files; at the folder's top level tables (*.md, *.tsv), plots (*.svg,
*.png) and commands (*.sh, *.jobs, *.env, *.py); below it *.md, *.svg, *.sh, *.jobs and *.env.
Everything else goes into the archive, written deterministically (members sorted, owner 0, mtime 0),
and is removed from the folder (git rm when the folder is tracked). An existing raw.tar.xz is kept
and its members joined by the new ones.
"""
import fnmatch
import gzip
import io
import os
import subprocess
import sys
import tarfile

ARCHIVE = "raw.tar.xz"
_archives = {}  # path -> {member: bytes} or None


def _norm(name):
    name = name[2:] if name.startswith("./") else name
    return name.rstrip("/")


def _archive(path):
    """The members of the archive at `path` ({name: bytes}), or None when there is none."""
    path = os.path.normpath(path)
    if path not in _archives:
        data = read_bytes(path)
        members = None
        if data is not None:
            members = {}
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                for m in tar.getmembers():
                    if m.isfile():
                        members[_norm(m.name)] = tar.extractfile(m).read()
        _archives[path] = members
    return _archives[path]


def _archives_above(path):
    """(archive path, member name) pairs where `path` may live, nearest folder first."""
    parts = os.path.normpath(path).split(os.sep)
    for i in range(len(parts) - 1, 0, -1):
        folder, rest = os.sep.join(parts[:i]) or os.sep, parts[i:]
        yield os.path.join(folder, ARCHIVE), "/".join(rest)
        if len(rest) > 1:
            for ext in (".tar.xz", ".tgz"):
                yield os.path.join(folder, rest[0] + ext), "/".join(rest[1:])


def read_bytes(path):
    """The file's bytes (a .gz beside it decompressed; else from an archive above it), or None."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            return f.read()
    if os.path.isfile(path + ".gz"):
        with gzip.open(path + ".gz", "rb") as f:
            return f.read()
    for archive, member in _archives_above(path):
        if os.path.normpath(archive) == os.path.normpath(path):
            continue
        members = _archive(archive)
        if members is None:
            continue
        if member in members:
            return members[member]
        if member + ".gz" in members:
            return gzip.decompress(members[member + ".gz"])
    return None


def exists(path):
    return read_bytes(path) is not None


def read_text(path):
    data = read_bytes(path)
    if data is None:
        raise FileNotFoundError(path)
    return data.decode("utf-8")


def open_text(path):
    """A text stream over the file (for `for line in ...` and json.load)."""
    return io.StringIO(read_text(path))


def listdir(folder):
    """The names directly in `folder`: its files and those archived (a .gz name without .gz as well)."""
    names = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    for archive, member in _archives_above(os.path.join(folder, "x")):
        members = _archive(archive)
        if not members:
            continue
        prefix = member[:-1]  # the folder's path inside the archive ("" at its top)
        for name in members:
            if name.startswith(prefix) and "/" not in name[len(prefix):]:
                names.add(name[len(prefix):])
    for name in list(names):
        if name.endswith(".gz"):
            names.add(name[:-3])
    return sorted(names)


def glob(pattern):
    """Paths matching `pattern`, whose wildcards are in its last component only."""
    folder, leaf = os.path.split(pattern)
    return [os.path.join(folder, n) for n in listdir(folder or ".") if fnmatch.fnmatch(n, leaf)]


# ---- packing ----

KEEP_TOP = (".md", ".tsv", ".svg", ".png", ".sh", ".jobs", ".env", ".py")
KEEP_BELOW = (".md", ".svg", ".sh", ".jobs", ".env")


def kept(relpath):
    name = os.path.basename(relpath)
    if name.startswith("README") or relpath == ARCHIVE:
        return True
    return name.endswith(KEEP_TOP if "/" not in relpath else KEEP_BELOW)


def pack(folder):
    files = []
    for root, _, names in os.walk(folder):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), folder).replace(os.sep, "/")
            if not kept(rel):
                files.append(rel)
    if not files:
        print(f"{folder}: nothing to pack")
        return
    members = dict(_archive(os.path.join(folder, ARCHIVE)) or {})
    for rel in files:
        with open(os.path.join(folder, rel), "rb") as f:
            members[rel] = f.read()
    out = os.path.join(folder, ARCHIVE)
    with open(out + ".tmp", "wb") as raw:
        with tarfile.open(fileobj=raw, mode="w:xz", format=tarfile.PAX_FORMAT, preset=9) as tar:
            for name in sorted(members):
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(members[name]), 0, 0o644
                tar.addfile(info, io.BytesIO(members[name]))
    os.replace(out + ".tmp", out)
    _archives.pop(os.path.normpath(out), None)
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", "--", *files], cwd=folder,
                             capture_output=True).returncode == 0
    if tracked:
        subprocess.run(["git", "rm", "-q", "--", *files], cwd=folder, check=True)
    else:
        for rel in files:
            os.remove(os.path.join(folder, rel))
    for root, dirs, _ in os.walk(folder, topdown=False):
        for d in dirs:
            p = os.path.join(root, d)
            if not os.listdir(p):
                os.rmdir(p)
    print(f"{folder}: {len(files)} files into {ARCHIVE} ({os.path.getsize(out)} bytes, {len(members)} members)")


def main(argv):
    if not ((len(argv) == 3 and argv[1] in ("pack", "list", "cat")) or (len(argv) == 4 and argv[1] == "extract")):
        sys.exit("usage: results_files.py pack FOLDER | list FOLDER | cat PATH | extract PATH DEST")
    if argv[1] == "pack":
        pack(argv[2])
    elif argv[1] == "list":
        def walk(folder, rel=""):
            for n in listdir(folder):
                p = os.path.join(folder, n)
                if n.endswith(".gz") and n[:-3] in listdir(folder):
                    continue
                sub = listdir(p) if not read_bytes(p) else []
                if sub:
                    walk(p, rel + n + "/")
                else:
                    print(rel + n)
        walk(argv[2])
    elif argv[1] == "cat":
        sys.stdout.write(read_text(argv[2]))
    else:
        data = read_bytes(argv[2])
        if data is None:
            sys.exit(f"results_files.py: {argv[2]}: not in the folder, gzipped beside it, nor in an archive above it")
        with open(argv[3] + ".tmp", "wb") as f:
            f.write(data)
        os.replace(argv[3] + ".tmp", argv[3])


if __name__ == "__main__":
    main(sys.argv)
