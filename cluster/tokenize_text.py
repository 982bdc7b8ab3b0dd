#!/usr/bin/env python3
"""Tokenizes text into hydra token files (HDF5: input_ids [N], document_offsets [D+1], loss_mask [N]).

The way real text reaches `hydra train --data`, `hydra forward --input`, `hydra convert --calib`
and `hydra select-heads --lm-text`: the model's own Hugging Face tokenizer (tokenizer.json, read
with the `tokenizers` library) encodes the inputs, streamed, on several processes, into shards.

Inputs (any mix):
  .txt      one document per file (a file larger than --chunk-bytes is cut at line ends into pieces
            of about that size, each its own document)
  .jsonl    one document per line, its --text-field (default "text")
  .parquet  one document per row, its --text-field column (needs pyarrow)
With --supervised, .jsonl lines are examples, {"prompt": P, "response": R} or {"messages": [{"role",
"content"}, ...]} (chat messages, rendered with the tokenizer folder's chat template when its
tokenizer_config.json has one (needs jinja2), else "<|im_start|>ROLE\\nCONTENT<|im_end|>\\n"), and
loss_mask = 1 on the response tokens only (the assistant messages'), so training counts exactly them.

--out FILE.h5 keeps the single-file form: the .txt files concatenated whole into int32 ids, a separator
between files, --documents for document_offsets, --max-tokens to stop early.

Output (--out DIR): shards DIR/shard-JJJJJ-SSSS.h5, J the job, S the shard within it. A job is a run
of consecutive inputs in the order given (whole files, or --chunk-bytes pieces of a large .jsonl/.txt)
of at most --chunk-bytes together, so many small files share shards instead of making one each; its
documents are packed in order into shards of at most --shard-tokens tokens (a document longer than
that is cut), each with
  input_ids         the narrowest of uint8/uint16/int32 that holds the vocabulary
  document_offsets  int64 [D+1]: document d is input_ids[o_d, o_{d+1}) (always written)
  loss_mask         uint8 [N] (--supervised only)
and attributes tokenizer, vocab_size; DIR/manifest.json lists the shards by their file names in DIR
(plain names, relative to the manifest: the folder can be moved or copied whole), their tokens and
documents in order. hydra takes the folder as one corpus: hydra train --data DIR (or DIR/manifest.json;
DIR:0.7,OTHER/:0.3 blends corpora). The shards are the same whatever --processes; each is written
atomically (a .tmp renamed). A
separator (the tokenizer's <|endoftext|>, </s> or <eos>; --separator overrides, -1: none) ends every
document (counted with the response in supervised mode: the model learns to stop). Memory per
process: one shard's ids (4 bytes a token) and one batch of documents.

    python3 cluster/tokenize_text.py --tokenizer Qwen3-1.7B/tokenizer.json --out corpus/ a.txt web.jsonl
    python3 cluster/tokenize_text.py --tokenizer Qwen3-1.7B/tokenizer.json --out sft/ --supervised chat.jsonl

Checked before any work, each one line (exit 1, "tokenize_text: ..."), nothing written or left
behind: a missing or unreadable input, a tokenizer.json the `tokenizers` library cannot load, a size
that is not one (--shard-tokens abc), a --separator outside the tokenizer's vocabulary or that the
ids' stored type cannot hold, an --out that is a file (folder output) or names an input or the
tokenizer, .parquet inputs without pyarrow. Met while reading, each one line naming the file and
the record, and the shards written so far removed: text that is not UTF-8, a .jsonl line that is not
a JSON object, a text field that is not a string (null, a number, a list), a supervised prompt or
response that is not a string, a chat with no messages, an unknown role (not system, developer,
user, assistant or tool) or no assistant message (nothing to train on), ids beyond the vocabulary,
and inputs that hold no tokens at all.

Needs tokenizers, h5py and numpy.
"""
import argparse
import json
import os
import sys


def fail(message):
    """This tool's one-line error."""
    raise SystemExit(f"tokenize_text: {message}")


def parse_size(text, flag):
    """A positive size: digits with an optional K/M/G suffix (powers of 1024)."""
    units = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    t = text.strip().upper()
    scale = units.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in units else t
    if not digits.isdigit() or int(digits) * scale < 1:
        fail(f"{flag} {text}: not a positive size (examples: 4096, 64M)")
    return int(digits) * scale


def id_dtype(vocab, np):
    for dt in (np.uint8, np.uint16, np.int32):
        if vocab - 1 <= np.iinfo(dt).max:
            return dt
    fail(f"a vocabulary of {vocab} does not fit int32")


def same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def load_tokenizer(path):
    """The tokenizers library's Tokenizer of a tokenizer.json, or this tool's one-line error."""
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # the library raises a plain Exception with serde's message
        fail(f"--tokenizer {path}: not a tokenizer.json the tokenizers library reads ({str(e).splitlines()[0][:200]})")


def check_separator(sep, vocab):
    """The separator is an id of the vocabulary (-1: none): the ids' stored type (id_dtype) holds every
    id below the vocabulary size, so such a separator never wraps (300 in uint8 was stored as 44)."""
    if sep is None or sep == -1:
        return
    if not 0 <= sep < vocab:
        fail(f"--separator {sep} is not an id of the tokenizer's vocabulary of {vocab} (0..{vocab - 1}, or -1 for none)")


def check_ids(ids, vocab, where):
    """Every id lies in [0, vocab): a tokenizer whose added tokens lie beyond its vocabulary size would
    otherwise be written as is (or wrap in a narrow stored type)."""
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        bad = int(ids.max()) if int(ids.max()) >= vocab else int(ids.min())
        fail(f"{where}: token id {bad} lies outside the tokenizer's vocabulary of {vocab}")


def jobs_of(pieces, chunk_bytes):
    """Consecutive pieces grouped into jobs of at most chunk_bytes together (a piece larger than that,
    a .parquet file, alone): small inputs share shards. The same jobs whatever the process count."""
    jobs, size = [], 0
    for path, begin, end in pieces:
        n = end - begin
        if not jobs or size + n > chunk_bytes or path.endswith(".parquet") or jobs[-1][-1][0].endswith(".parquet"):
            jobs.append([])
            size = 0
        jobs[-1].append((path, begin, end))
        size += n
    return jobs


def pieces_of(files, chunk_bytes):
    """(file, begin, end) byte ranges: whole files, .jsonl/.txt larger than chunk_bytes cut into pieces
    whose boundaries are moved to the next line start (the same pieces whatever the process count)."""
    out = []
    for path in files:
        size = os.path.getsize(path)
        if path.endswith(".parquet") or size <= chunk_bytes:
            out.append((path, 0, size))
            continue
        cuts = [0]
        with open(path, "rb") as f:
            at = chunk_bytes
            while at < size:
                f.seek(at)
                f.readline()
                at = f.tell()
                if at >= size:
                    break
                if at > cuts[-1]:
                    cuts.append(at)
                at += chunk_bytes
        cuts.append(size)
        out += [(path, a, b) for a, b in zip(cuts, cuts[1:]) if b > a]
    return out


def decode_utf8(data, where):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"{where}: not UTF-8 text (byte {e.start} of it: {e.reason})")


def records(path, begin, end, a):
    """The piece's records, each (where, record): a .jsonl line's JSON value; a .txt piece's text and a
    .parquet row's value as {--text-field: value}."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        row = 0
        try:
            batches = pq.ParquetFile(path).iter_batches(columns=[a.text_field])
            for batch in batches:
                for t in batch.column(0).to_pylist():
                    row += 1
                    yield f"{path} (row {row})", {a.text_field: t}
        except (OSError, KeyError, ValueError) as e:  # pyarrow's errors derive from these
            fail(f"{path} (row {row + 1}): cannot be read as parquet with a '{a.text_field}' column ({e})")
        return
    with open(path, "rb") as f:
        f.seek(begin)
        if path.endswith(".jsonl"):
            line_no = 0
            while f.tell() < end:
                line = f.readline()
                line_no += 1
                where = f"{path} (byte {begin}+, line {line_no})"
                if not line.strip():
                    continue
                try:
                    obj = json.loads(decode_utf8(line, where))
                except json.JSONDecodeError as e:
                    fail(f"{where}: not JSON: {e}")
                yield where, obj
        else:  # .txt: one document, in pieces of whole lines
            where = f"{path} (byte {begin}+)"
            yield where, {a.text_field: decode_utf8(f.read(end - begin), where)}


def text_of(rec, where, a):
    """A plain record's text: its --text-field string."""
    if not isinstance(rec, dict):
        fail(f"{where}: a JSON object with a '{a.text_field}' string expected, got {json.dumps(rec)[:80]}")
    if a.text_field not in rec:
        fail(f"{where}: no '{a.text_field}' field (--text-field)")
    text = rec[a.text_field]
    if not isinstance(text, str):
        fail(f"{where}: field '{a.text_field}' is {json.dumps(text)[:80]}, not a string")
    return text


class Renderer:
    """Prompt and response text of a supervised example. `fail(message)` reports an error in the
    calling tool's own words (its name first, its exit code) and does not return."""

    def __init__(self, tokenizer_path, fail):
        self.fail = fail
        self.template = None
        config = os.path.join(os.path.dirname(os.path.abspath(tokenizer_path)), "tokenizer_config.json")
        if os.path.exists(config):
            try:
                with open(config) as f:
                    template = json.load(f).get("chat_template")
            except (OSError, ValueError, AttributeError) as e:
                fail(f"{config}: not a JSON object ({e})")
            if template:
                try:
                    import jinja2
                except ImportError:
                    fail("the tokenizer has a chat template: pip install jinja2 to render it")
                env = jinja2.Environment()

                def raise_exception(message):  # as transformers' apply_chat_template: the template's own refusal
                    raise jinja2.TemplateError(message)

                env.globals["raise_exception"] = raise_exception
                try:
                    self.template = env.from_string(template)
                except jinja2.TemplateError as e:
                    fail(f"{config}: its chat_template does not parse ({type(e).__name__}: {e})")

    ROLES = ("system", "developer", "user", "assistant", "tool")

    def check(self, messages, where):
        """Messages are a non-empty list of objects with a "role" string, one of ROLES (and a "content"
        string without a template)."""
        if not isinstance(messages, list):
            self.fail(f"{where}: \"messages\" must be a list")
        if not messages:
            self.fail(f"{where}: \"messages\" is empty")
        for m in messages:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                    and (self.template is not None or isinstance(m.get("content"), str))):
                needs = "a \"role\" string" + (" and a \"content\" string" if self.template is None else "")
                self.fail(f"{where}: every message needs {needs} (got {json.dumps(m)[:80]})")
            if m["role"] not in self.ROLES:
                self.fail(f"{where}: unknown role {json.dumps(m['role'])[:40]} (expected one of {', '.join(self.ROLES)})")

    def render(self, messages, add_generation_prompt, where):
        self.check(messages, where)
        if self.template is not None:
            import jinja2
            try:
                return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt)
            except (jinja2.TemplateError, TypeError, ValueError) as e:
                self.fail(f"{where}: the chat template fails on these messages ({type(e).__name__}: {e})")
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def segments(self, obj, where):
        """[(text, counted)]: the example's pieces in order, counted = the response's."""
        if "prompt" in obj and "response" in obj:
            for key in ("prompt", "response"):
                if not isinstance(obj[key], str):
                    self.fail(f"{where}: \"{key}\" is {json.dumps(obj[key])[:80]}, not a string")
            return [(obj["prompt"], False), (obj["response"], True)]
        if "messages" in obj:
            msgs = obj["messages"]
            self.check(msgs, where)
            if not any(m["role"] == "assistant" for m in msgs):
                self.fail(f"{where}: no assistant message: the example has nothing to train on")
            out, done = [], ""
            for i, m in enumerate(msgs):
                # The text each message adds to the rendering of those before it.
                if m.get("role") == "assistant":
                    head = self.render(msgs[:i], True, where)
                    out.append((head[len(done):], False))
                    full = self.render(msgs[:i + 1], False, where)
                    out.append((full[len(head):], True))
                    done = full
            rest = self.render(msgs, False, where)[len(done):]
            if rest:
                out.append((rest, False))
            return out
        self.fail(f"{where}: a supervised example needs prompt and response, or messages")


class InputError(Exception):
    """A bad input met inside a worker process. A worker that raised SystemExit would die and leave
    Pool.map waiting for its piece forever; an exception reaches the parent, which reports it."""


def tokenize_piece_reporting(job):
    """tokenize_piece with its one-line refusal (SystemExit), or any other failure (a full disk), turned
    into an InputError for the parent, which reports it as one line."""
    try:
        return tokenize_piece(job)
    except SystemExit as e:
        raise InputError(str(e.code)) from None
    except Exception as e:
        (_, (path, begin, _)), _ = job
        raise InputError(f"tokenize_text: {path} (byte {begin}+): {type(e).__name__}: {e}") from None


def tokenize_piece(job):
    """Tokenizes one job (its pieces in order) into its shards; returns their (name, tokens, documents, counted)."""
    (index, pieces), a = job
    import h5py
    import numpy as np
    tok = load_tokenizer(a.tokenizer)
    vocab = tok.get_vocab_size()
    dtype = id_dtype(vocab, np)
    renderer = Renderer(a.tokenizer, fail) if a.supervised else None
    shards, ids, mask, lengths = [], [], [], []
    held = [0]  # tokens in ids

    def write_shard():
        if not lengths:
            return
        out = os.path.join(a.out, f"shard-{index:05d}-{len(shards):04d}.h5")
        wide = np.concatenate(ids)
        check_ids(wide, vocab, f"{path} (byte {begin}+)")
        all_ids = wide.astype(dtype)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        with h5py.File(out + ".tmp", "w") as f:
            f.create_dataset("input_ids", data=all_ids)
            f.create_dataset("document_offsets", data=offsets)
            counted = 0
            if a.supervised:
                m = np.concatenate(mask).astype(np.uint8)
                f.create_dataset("loss_mask", data=m)
                counted = int(m.sum())
            f.attrs["tokenizer"] = os.path.basename(a.tokenizer)
            f.attrs["vocab_size"] = vocab
        os.replace(out + ".tmp", out)
        shards.append((os.path.basename(out), len(all_ids), len(lengths), counted))
        ids.clear(), mask.clear(), lengths.clear()
        held[0] = 0

    def add(doc_ids, doc_mask):
        # A document longer than a shard is cut into shard-sized documents.
        for at in range(0, max(len(doc_ids), 1), a.shard_tokens):
            part = doc_ids[at:at + a.shard_tokens]
            if not len(part):
                return
            if held[0] + len(part) > a.shard_tokens:
                write_shard()
            ids.append(np.asarray(part, dtype=np.int64))
            if doc_mask is not None:
                mask.append(np.asarray(doc_mask[at:at + a.shard_tokens], dtype=np.uint8))
            lengths.append(len(part))
            held[0] += len(part)

    sep = [a.separator] if a.separator >= 0 else []
    batch = []

    def flush():
        if not batch:
            return
        if a.supervised:
            flat = [text for segs in batch for text, _ in segs]
            enc = tok.encode_batch(flat, add_special_tokens=False) if flat else []
            k = 0
            for segs in batch:
                doc, m = [], []
                for text, counted in segs:
                    e = enc[k].ids
                    k += 1
                    doc += e
                    m += [1 if counted else 0] * len(e)
                doc += sep
                m += [1] * len(sep)
                add(doc, m)
        else:
            for e in tok.encode_batch(batch, add_special_tokens=False):
                add(e.ids + sep, None)
        batch.clear()

    for path, begin, end in pieces:
        for where, rec in records(path, begin, end, a):
            if a.supervised:
                if not isinstance(rec, dict):
                    fail(f"{where}: a supervised example must be a JSON object")
                batch.append(renderer.segments(rec, where))
            else:
                batch.append(text_of(rec, where, a))
            if len(batch) >= 256:
                flush()
    flush()
    write_shard()
    return shards


def single_file(a, tok):
    """--out FILE.h5: the text files concatenated in the order given into one int32 file, separated by the
    separator (before each file after the first), with --documents each file a document; read whole."""
    import h5py
    import numpy as np
    if a.supervised:
        fail("--supervised writes a folder of shards (--out DIR)")
    sep = a.separator
    limit = parse_size(a.max_tokens, "--max-tokens") if a.max_tokens else None
    vocab = tok.get_vocab_size()
    pieces, total = [], 0
    for i, path in enumerate(a.files):
        with open(path, "rb") as f:
            ids = tok.encode(decode_utf8(f.read(), path)).ids
        if i > 0 and sep >= 0:
            ids = [sep] + ids
        pieces.append(np.asarray(ids, dtype=np.int64))
        total += len(ids)
        if limit is not None and total >= limit:
            break
    ids = np.concatenate(pieces)[:limit]
    if not len(ids):
        fail(f"the inputs hold no tokens ({', '.join(a.files[:3])}{', ...' if len(a.files) > 3 else ''}): nothing to write")
    check_ids(ids, vocab, "the inputs")
    ids = ids.astype(np.int32)
    # Document i is ids[offsets[i]:offsets[i + 1]]; a document cut by --max-tokens ends at the cut.
    # An empty file is its separator alone (a 1-token document), or nothing without a separator
    # (offsets strictly increase).
    ends = np.minimum(np.cumsum([len(x) for x in pieces]), len(ids))
    offsets = np.unique(np.concatenate([[0], ends])).astype(np.int64)
    temp = os.path.join(os.path.dirname(a.out) or ".", f".{os.path.basename(a.out)}.tmp-{os.getpid()}")
    try:
        with h5py.File(temp, "w") as f:
            f["input_ids"] = ids
            if a.documents:
                f["document_offsets"] = offsets
            f.attrs["tokenizer"] = a.tokenizer
            f.attrs["vocab_size"] = vocab
        os.replace(temp, a.out)
    except OSError as e:
        if os.path.exists(temp):
            os.remove(temp)
        fail(f"--out {a.out}: cannot be written ({e})")
    print(f"tokenize_text: {len(ids)} tokens from {len(pieces)} file(s)"
          f"{f', {len(offsets) - 1} documents' if a.documents else ''}, ids < {int(ids.max()) + 1} "
          f"(tokenizer vocabulary {vocab}) -> {a.out}")
    return 0


def check_inputs(a):
    """Before any work: the inputs and the tokenizer exist and are readable files, the sizes parse, the
    output names none of them (it would replace what is read), pyarrow is there for .parquet."""
    for f in a.files:
        if not os.path.isfile(f):
            fail(f"{f}: no such file")
        if not os.access(f, os.R_OK):
            fail(f"{f}: not readable")
    if not os.path.isfile(a.tokenizer):
        fail(f"--tokenizer {a.tokenizer}: no such file")
    for inp in a.files + [a.tokenizer]:
        if same_file(a.out, inp):
            fail(f"--out {a.out} is {inp}, an input of this run: name another output (it would be replaced)")
    if a.processes < 1:
        fail(f"--processes {a.processes} must be at least 1")
    if a.separator is not None and a.separator < -1:
        fail(f"--separator {a.separator}: an id of the vocabulary, or -1 for none")
    if any(f.endswith(".parquet") for f in a.files):
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            fail("reading .parquet inputs needs pyarrow (pip install pyarrow)")


def remove_shards(folder):
    """The shards of this run (the folder held none when it began: checked first) and their temporaries."""
    for n in os.listdir(folder):
        if n.startswith("shard-"):
            os.remove(os.path.join(folder, n))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("files", nargs="+", help=".txt, .jsonl or .parquet inputs")
    p.add_argument("--tokenizer", required=True, help="the model's tokenizer.json (Hugging Face format)")
    p.add_argument("--out", required=True, help="output folder (created; must not hold shards already), or FILE.h5; "
                   "never an input")
    p.add_argument("--separator", type=int, default=None,
                   help="id ending every document, in the vocabulary (default: the tokenizer's <|endoftext|>, </s> or "
                        "<eos>; -1: none)")
    p.add_argument("--shard-tokens", default="256M", help="tokens per shard at most (accepts 64M)")
    p.add_argument("--chunk-bytes", default="256M",
                   help="inputs larger than this are cut into pieces of it (at line ends); smaller consecutive inputs are "
                        "tokenized together up to this size, sharing shards")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--text-field", default="text", help="the text of a .jsonl line or a .parquet row (a string)")
    p.add_argument("--supervised", action="store_true",
                   help=".jsonl of prompt/response or chat messages: loss_mask 1 on the response tokens only")
    p.add_argument("--max-tokens", default=None, help="--out FILE.h5 only: stop after this many tokens (accepts 1M)")
    p.add_argument("--documents", action="store_true",
                   help="--out FILE.h5 only: write document_offsets, each file a document (the folder output always does)")
    a = p.parse_args()
    try:
        import h5py  # noqa: F401
        import numpy as np
        import tokenizers  # noqa: F401
    except ImportError as e:
        fail(f"{e} (pip install tokenizers h5py numpy)")
    check_inputs(a)
    tok = load_tokenizer(a.tokenizer)
    vocab = tok.get_vocab_size()
    if a.separator is None:
        a.separator = next((tok.token_to_id(t) for t in ("<|endoftext|>", "</s>", "<eos>")
                            if tok.token_to_id(t) is not None), -1)
    check_separator(a.separator, vocab)
    if a.out.endswith(".h5"):
        return single_file(a, tok)
    if a.max_tokens or a.documents:
        fail("--max-tokens and --documents go with --out FILE.h5 (a folder always has documents)")
    for f in a.files:
        if not f.endswith((".txt", ".jsonl", ".parquet")):
            fail(f"{f}: not .txt, .jsonl or .parquet")
        if a.supervised and not f.endswith(".jsonl"):
            fail(f"{f}: --supervised reads .jsonl examples")
    a.shard_tokens = parse_size(a.shard_tokens, "--shard-tokens")
    a.chunk_bytes = parse_size(a.chunk_bytes, "--chunk-bytes")
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        fail(f"--out {a.out} is a file, not a folder (FILE.h5 writes one file)")
    created = not os.path.exists(a.out)
    try:
        os.makedirs(a.out, exist_ok=True)
    except OSError as e:
        fail(f"--out {a.out}: cannot be created ({e})")
    if any(n.startswith("shard-") for n in os.listdir(a.out)):
        fail(f"{a.out} holds shards already: choose an empty folder")
    jobs = [((i, job), a) for i, job in enumerate(jobs_of(pieces_of(a.files, a.chunk_bytes), a.chunk_bytes))]
    try:
        if a.processes > 1 and len(jobs) > 1:
            import multiprocessing
            with multiprocessing.get_context("spawn").Pool(min(a.processes, len(jobs))) as pool:
                results = pool.map(tokenize_piece_reporting, jobs, chunksize=1)
        else:
            results = [tokenize_piece_reporting(j) for j in jobs]
        shards = [s for r in results for s in r]
        if not shards:
            fail(f"the inputs hold no tokens ({', '.join(a.files[:3])}{', ...' if len(a.files) > 3 else ''}): nothing "
                 "to write")
    except (InputError, SystemExit, KeyboardInterrupt, Exception) as e:
        # The folder held no shards when the run began: the ones there now are this run's, and a
        # manifest was never written. Remove them so the same command runs again once the input is fixed.
        remove_shards(a.out)
        if created and not os.listdir(a.out):
            os.rmdir(a.out)
        if isinstance(e, KeyboardInterrupt):
            sys.exit("tokenize_text: interrupted; the shards written are removed")
        if isinstance(e, (InputError, SystemExit)):
            sys.exit(str(e) if isinstance(e, InputError) else e.code)
        sys.exit(f"tokenize_text: {type(e).__name__}: {e}")
    manifest = {"tokenizer": a.tokenizer, "vocab_size": vocab, "supervised": a.supervised,
                "shards": [s[0] for s in shards], "tokens": [s[1] for s in shards], "documents": [s[2] for s in shards],
                "counted": [s[3] for s in shards] if a.supervised else None}
    with open(os.path.join(a.out, "manifest.json.tmp"), "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(os.path.join(a.out, "manifest.json.tmp"), os.path.join(a.out, "manifest.json"))
    total = sum(manifest["tokens"])
    counted = f", {sum(manifest['counted'])} counted (loss_mask)" if a.supervised else ""
    dtype = id_dtype(vocab, np).__name__
    print(f"tokenize_text: {total} tokens, {sum(manifest['documents'])} documents from {len(a.files)} input(s) in "
          f"{len(shards)} shard(s){counted} (ids {dtype}, vocabulary {vocab}) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
