#!/usr/bin/env python3
"""Trains a byte-level BPE tokenizer on raw text: the tokenizer of a model trained here from scratch.

    python3 cluster/train_tokenizer.py --vocab 4096 --out tok/ books/*.txt web.jsonl
    hydra init --preset qwen3-tiny --vocab 4096 --out model.h5      # a model for that vocabulary

Inputs: .txt files (the text as it is) and .jsonl files (each line's --text-field). The model is a
byte-level BPE (the `tokenizers` package; GPT-2/Qwen's scheme: every byte is a symbol, so any text
encodes and decodes back exactly, with no unknown token): a ByteLevel pre-tokenizer without a
prefix space, the ByteLevel decoder, `--vocab` ids in all. The special tokens take the first ids,
in this order: <|endoftext|> (0: the document separator cluster/tokenize_text.py appends and the
default stop of generation), <|im_start|> and <|im_end|> (the chat turns); then the 256 bytes, then
the merges.

Output (--out DIR, created; must not hold a tokenizer already), each file written atomically:
  tokenizer.json          the tokenizer (what hydra's Python tools read: tokenize_text.py,
                          generate_text.py, niah/build_niah_set.py; `hydra generate --tokenizer`)
  tokenizer_config.json   for transformers' AutoTokenizer: tokenizer_class PreTrainedTokenizerFast,
                          eos_token and pad_token <|endoftext|>, no bos, model_max_length
                          (--max-length), and a ChatML chat_template (the Qwen format:
                          <|im_start|>ROLE\\nCONTENT<|im_end|>\\n per message, the assistant's turn
                          opened by add_generation_prompt) whose turns end with <|im_end|>
  special_tokens_map.json the same special tokens, for older transformers
Training is deterministic for the same inputs and flags (one thread per tokenizers' own pool).
Needs tokenizers.
"""
import argparse
import json
import os
import sys

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, as Qwen's templates write it (the same rendering tokenize_text.py uses without a template).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def fail(message):
    print(f"train_tokenizer: {message}", file=sys.stderr)
    sys.exit(2)


def texts(files, field):
    """The training text: each .txt whole, each .jsonl line's field, in the order given."""
    for path in files:
        if path.endswith(".jsonl"):
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        fail(f"{path}: line {n} is not JSON ({e})")
                    text = obj.get(field) if isinstance(obj, dict) else None
                    if not isinstance(text, str):
                        fail(f"{path}: line {n} has no \"{field}\" string (--text-field)")
                    yield text
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                yield f.read()


def write_json(path, obj):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(path + ".tmp", path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("files", nargs="+", help=".txt or .jsonl inputs")
    p.add_argument("--vocab", type=int, required=True, help="vocabulary size: special tokens + 256 bytes + merges")
    p.add_argument("--out", required=True, help="output folder (tokenizer.json, tokenizer_config.json, ...)")
    p.add_argument("--min-frequency", type=int, default=2, help="a merge needs a pair seen this often (default 2)")
    p.add_argument("--text-field", default="text", help="the text of a .jsonl line (default text)")
    p.add_argument("--max-length", type=int, default=131072, help="model_max_length in tokenizer_config.json")
    a = p.parse_args()
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    except ImportError as e:
        fail(f"{e} (pip install tokenizers)")
    floor = len(SPECIAL) + 256
    if a.vocab < floor + 1 or a.vocab >= 2 ** 31:
        fail(f"--vocab {a.vocab}: a byte-level BPE needs more than {floor} ids ({len(SPECIAL)} special tokens and 256 bytes)")
    if a.min_frequency < 1 or a.max_length < 1:
        fail("--min-frequency and --max-length must be at least 1")
    for f in a.files:
        if not os.path.isfile(f):
            fail(f"{f}: no such file")
        if not f.endswith((".txt", ".jsonl")):
            fail(f"{f}: not .txt or .jsonl")
    if os.path.exists(os.path.join(a.out, "tokenizer.json")):
        fail(f"{a.out} holds a tokenizer.json already: choose another folder")
    os.makedirs(a.out, exist_ok=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, min_frequency=a.min_frequency, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts(a.files, a.text_field), trainer=trainer)
    size = tok.get_vocab_size()
    for i, t in enumerate(SPECIAL):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))

    tok.save(os.path.join(a.out, "tokenizer.json.tmp"))
    os.replace(os.path.join(a.out, "tokenizer.json.tmp"), os.path.join(a.out, "tokenizer.json"))
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for i, t in enumerate(SPECIAL)}
    write_json(os.path.join(a.out, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": added, "bos_token": None,
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "additional_special_tokens": SPECIAL[1:], "model_max_length": a.max_length, "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE})
    write_json(os.path.join(a.out, "special_tokens_map.json"), {
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "additional_special_tokens": SPECIAL[1:]})
    print(json.dumps({"command": "train_tokenizer", "vocab": size, "requested": a.vocab, "inputs": len(a.files),
                      "out": a.out, "special_tokens": SPECIAL}))
    if size < a.vocab:
        print(f"train_tokenizer: the text held merges for {size} ids, fewer than --vocab {a.vocab}; give the model "
              f"--vocab {size} (or more text)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
