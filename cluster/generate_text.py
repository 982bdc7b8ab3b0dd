#!/usr/bin/env python3
"""Text in, text out around `hydra generate`: prompts as text -> token ids -> hydra generate -> text.

Prompts (--prompts):
  .txt      the whole file is one prompt (one final newline dropped); with --lines every non-empty
            line is a prompt
  .jsonl    one prompt per line: {"prompt": TEXT} or {"messages": [{"role", "content"}, ...]}, chat
            messages rendered with the tokenizer folder's chat template (tokenizer_config.json's
            chat_template, needs jinja2; else "<|im_start|>ROLE\\nCONTENT<|im_end|>\\n") and the
            assistant's turn opened, exactly as cluster/tokenize_text.py renders training examples.
Plain prompts are encoded with the tokenizer's special tokens (its post-processor, e.g. a BOS);
rendered chats without (the template writes them).

The tokenizer is the Hugging Face tokenizer.json (the `tokenizers` package) of --tokenizer (the file
or its folder; default: the model's folder). The ids go to a prompt file (input_ids int32 [T],
prompt_offsets int64 [N+1], the format `hydra generate --prompt` reads), then `hydra generate` runs,
under `mpirun -np N` with --np N; --sp, the sampling flags, --logprobs and --repetition-penalty pass
through. Stops: --stop TEXT, a stop string matched on the decoded text across token boundaries (as
transformers' stop_strings: `--stop e` stops on "the"); --stop-token ids; and by default the
tokenizer's eos (generation_config.json's eos_token_id, else tokenizer_config.json's eos_token, else
<|endoftext|>, </s> or <eos>: what tokenize_text.py ends documents with), --no-default-stop for none —
all decided by hydra generate, which is given the tokenizer.

Output (--out, written atomically): one JSON line per prompt, in input order —
  index, prompt (the text encoded: a chat's rendering), prompt_ids, ids (the new ids), text (the new
  ids decoded, without the stop token that ended them, or up to the stop string), stopped, stop_string
  (when one ended them), and with --logprobs K: logprobs
  (per new id) and top_logprobs (per new id, [id, token, log p] of the K most likely)
— then hydra generate's summary line ("summary": true). hydra's log and summary go to stderr; stdout
gets one JSON line (command, prompts, prompt_tokens, new_tokens, out) for scripts.

Checked before any work, each one line: a missing tokenizer.json, model or prompt file, a
tokenizer.json the tokenizers library cannot load, an --out (or --keep-prompt-file) that names an
input, a chat with no messages or a message without a role or with one not system, developer,
user, assistant or tool, a chat template that does not parse or refuses the messages (its
raise_exception), an empty prompt (empty text or no ids), an empty --stop, a prompt whose ids the model's vocabulary does not hold, and a prompt
that with --max-new-tokens exceeds the model's limit (--max-length, else the folder's config.json
max_position_embeddings or tokenizer_config.json model_max_length when set).

    python3 cluster/generate_text.py --model run/model.h5 --tokenizer Qwen3-1.7B/ --prompts chat.jsonl \\
        --max-new-tokens 128 --np 8 --sp 2 --device cuda --out answers.jsonl

Needs tokenizers, h5py and numpy (jinja2 for chat templates).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenize_text import Renderer  # noqa: E402  (the chat rendering training data gets)

NAME = "generate_text"


def fail(message):
    """A user error: one line, exit 2 (as hydra's own)."""
    print(f"{NAME}: {message}", file=sys.stderr)
    sys.exit(2)


def tokenizer_file(a):
    path = a.tokenizer or os.path.dirname(os.path.abspath(a.model))
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        fail(f"{path}: no tokenizer.json (--tokenizer names the file or its folder)")
    return path


def folder_json(folder, name):
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        fail(f"{path}: not JSON ({e})")


def model_limit(a, folder):
    """The longest sequence (prompt + new tokens) the model takes; None: no limit known."""
    if a.max_length:
        return a.max_length
    limit = folder_json(folder, "config.json").get("max_position_embeddings")
    if limit is None:
        limit = folder_json(folder, "tokenizer_config.json").get("model_max_length")
    # transformers writes a huge sentinel (1e30) for "no limit".
    return int(limit) if isinstance(limit, (int, float)) and 0 < limit < 2 ** 40 else None


def model_vocab(path):
    """The vocabulary of a hydra checkpoint (its config attribute)."""
    import h5py
    try:
        with h5py.File(path, "r") as f:
            return int(json.loads(f.attrs["config"])["vocab_size"])
    except (OSError, KeyError, ValueError) as e:
        fail(f"{path}: not a hydra checkpoint with a config ({e})")


def read_prompts(a, renderer):
    """[(text, chat)] in input order; chat: rendered from messages."""
    path = a.prompts
    if not os.path.isfile(path):
        fail(f"{path}: no such prompt file")
    out = []
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"{path}: line {n} is not JSON ({e})")
                if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
                    out.append((obj["prompt"], False, n))
                elif isinstance(obj, dict) and isinstance(obj.get("messages"), list) and obj["messages"]:
                    out.append((renderer.render(obj["messages"], True, f"{path}: line {n}"), True, n))
                else:
                    fail(f"{path}: line {n} needs a \"prompt\" string or a non-empty \"messages\" list")
    elif path.endswith(".txt"):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if a.lines:
            out = [(line, False, n) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
        else:
            out = [(text[:-1] if text.endswith("\n") else text, False, 1)]
    else:
        fail(f"{path}: prompts are a .txt or a .jsonl")
    if not out:
        fail(f"{path}: holds no prompt")
    return out


def stop_ids(a):
    """--stop-token ids (hydra generate adds the tokenizer's eos unless --no-default-stop)."""
    ids = []
    for item in filter(None, (a.stop_token or "").split(",")):
        try:
            ids.append(int(item))
        except ValueError:
            fail(f"--stop-token: '{item}' is not a token id")
    for text in a.stop or []:
        if not text:
            fail("--stop: an empty stop string would stop at once")
    return sorted(set(ids))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--model", required=True, help="hydra checkpoint (.h5)")
    p.add_argument("--tokenizer", help="tokenizer.json or its folder (default: the model's folder)")
    p.add_argument("--prompts", required=True, help=".txt (one prompt, or one per line with --lines) or .jsonl")
    p.add_argument("--lines", action="store_true", help=".txt: every non-empty line is a prompt")
    p.add_argument("--out", required=True, help="output .jsonl (atomic)")
    p.add_argument("--max-new-tokens", type=int, required=True, help="new tokens per prompt (fewer on a stop token)")
    p.add_argument("--max-length", type=int, default=0,
                   help="the model's limit on prompt + new tokens (default: config.json / tokenizer_config.json)")
    p.add_argument("--hydra", default="hydra", help="the hydra binary")
    p.add_argument("--np", type=int, default=0, help="ranks: run hydra under mpirun -np N (0: one process, no mpirun)")
    p.add_argument("--mpirun", default="mpirun", help="the MPI launcher (with --np)")
    p.add_argument("--mpirun-args", default="", help="extra launcher arguments, one string (e.g. '--oversubscribe')")
    p.add_argument("--sp", type=int, default=0, help="hydra generate --sp: ranks per prompt (0: all)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--logprobs", type=int, default=0, help="K > 0: each new token's log-probability and the top K")
    p.add_argument("--stop-token", help="comma-separated stop ids")
    p.add_argument("--stop", action="append", help="a stop string (repeatable), matched on the decoded text across token "
                                                   "boundaries, e.g. '<|im_end|>' or '\\n\\n'")
    p.add_argument("--no-default-stop", action="store_true", help="do not stop on the tokenizer's eos")
    p.add_argument("--keep-prompt-file", help="also keep the prompt file hydra generate read (.h5)")
    a = p.parse_args()

    try:
        import h5py
        import numpy as np
        from tokenizers import Tokenizer
    except ImportError as e:
        fail(f"{e} (pip install tokenizers h5py numpy)")
    if a.max_new_tokens < 1:
        fail(f"--max-new-tokens must be at least 1 (got {a.max_new_tokens})")
    if not os.path.isfile(a.model):
        fail(f"--model {a.model}: no such file")
    tok_path = tokenizer_file(a)
    folder = os.path.dirname(tok_path)
    for flag, path in (("--model", a.model), ("--prompts", a.prompts), ("--tokenizer", tok_path)):
        for out_flag, out in (("--out", a.out), ("--keep-prompt-file", a.keep_prompt_file)):
            if out and os.path.exists(out) and os.path.exists(path) and os.path.samefile(out, path):
                fail(f"{out_flag} {out} is {flag} {path}, an input: name another output (it would be replaced)")
    try:
        tok = Tokenizer.from_file(tok_path)
    except Exception as e:  # the library raises a plain Exception with serde's message
        fail(f"{tok_path}: not a tokenizer.json the tokenizers library reads ({str(e).splitlines()[0][:200]})")
    prompts = read_prompts(a, Renderer(tok_path, fail))
    vocab, limit = model_vocab(a.model), model_limit(a, folder)
    encoded = []
    for text, chat, line in prompts:
        where = f"{a.prompts}: prompt {len(encoded)} (line {line})"
        if not text.strip():
            fail(f"{where} is empty")
        ids = tok.encode(text, add_special_tokens=not chat).ids
        if not ids:
            fail(f"{where} encodes to no tokens")
        if max(ids) >= vocab:
            fail(f"{where}: token id {max(ids)} is outside the model's vocabulary of {vocab} (another tokenizer?)")
        if limit is not None and len(ids) + a.max_new_tokens > limit:
            fail(f"{where}: {len(ids)} tokens + {a.max_new_tokens} new exceed the model's limit of {limit} "
                 "(--max-length overrides)")
        encoded.append(ids)
    stops = stop_ids(a)

    with tempfile.TemporaryDirectory(prefix="generate_text.") as work:
        prompt_file = a.keep_prompt_file or os.path.join(work, "prompts.h5")
        offsets = np.cumsum([0] + [len(ids) for ids in encoded]).astype(np.int64)
        with h5py.File(prompt_file + ".tmp", "w") as f:
            f["input_ids"] = np.concatenate([np.asarray(ids, dtype=np.int32) for ids in encoded])
            f["prompt_offsets"] = offsets
            f.attrs["tokenizer"] = tok_path
        os.replace(prompt_file + ".tmp", prompt_file)
        raw = os.path.join(work, "generated.jsonl")
        cmd = [a.hydra, "generate", "--model", a.model, "--prompt", prompt_file, "--max-new-tokens", str(a.max_new_tokens),
               "--device", a.device, "--temperature", repr(a.temperature), "--top-k", str(a.top_k), "--top-p", repr(a.top_p),
               "--seed", str(a.seed), "--repetition-penalty", repr(a.repetition_penalty), "--logprobs", str(a.logprobs),
               "--sp", str(a.sp), "--tokenizer", tok_path, "--out", raw]
        if stops:
            cmd += ["--stop-token", ",".join(map(str, stops))]
        for text in a.stop or []:
            cmd += ["--stop", text]
        if a.no_default_stop:
            cmd += ["--no-default-stop"]
        if a.np > 0:
            cmd = [a.mpirun, "-np", str(a.np)] + shlex.split(a.mpirun_args) + cmd
        print(f"{NAME}: {len(encoded)} prompt(s), {int(offsets[-1])} tokens: {shlex.join(cmd)}", file=sys.stderr)
        r = subprocess.run(cmd, stdout=sys.stderr)  # hydra's summary line joins its log; ours goes to stdout
        if r.returncode != 0:
            print(f"{NAME}: hydra generate exited {r.returncode}; {a.out} not written", file=sys.stderr)
            return r.returncode
        with open(raw) as f:
            lines = [json.loads(line) for line in f if line.strip()]

    results, summary = [], None
    for line in lines:
        if line.get("summary"):
            summary = line
            continue
        i = line["prompt_index"]
        ids = line["tokens"]
        stop = line.get("stop_string")
        if stop is not None:  # the text up to the stop string (which may have begun in the prompt: then nothing)
            text = tok.decode(ids, skip_special_tokens=False)
            text = text[:text.find(stop)] if stop in text else ""
        else:
            text = tok.decode(ids[:-1] if line["stopped"] else ids, skip_special_tokens=False)
        out = {"index": i, "prompt": prompts[i][0], "prompt_ids": encoded[i], "ids": ids, "text": text,
               "stopped": line["stopped"]}
        if stop is not None:
            out["stop_string"] = stop
        if a.logprobs > 0:
            out["logprobs"] = line["logprobs"]
            out["top_logprobs"] = [[[t, tok.id_to_token(t), lp] for t, lp in step] for step in line["top_logprobs"]]
        results.append(out)
    if len(results) != len(encoded) or summary is None:
        fail(f"hydra generate wrote {len(results)} of {len(encoded)} prompts' lines (summary: {summary is not None})")
    with open(a.out + ".tmp", "w") as f:
        for out in results:
            f.write(json.dumps(out, ensure_ascii=False) + "\n")
        f.write(json.dumps(summary) + "\n")
    os.replace(a.out + ".tmp", a.out)
    print(json.dumps({"command": NAME, "prompts": len(results), "prompt_tokens": int(offsets[-1]),
                      "new_tokens": sum(len(r["ids"]) for r in results), "out": a.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
