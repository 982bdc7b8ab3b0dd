#!/usr/bin/env python3
"""CTest hf_remote_code.cpu: `hydra export` folders opened by transformers alone, as a user opens them.

    python3 tests/cluster/hf_remote_code_test.py BUILD/bin/hydra SOURCE_DIR

Hydra makes the models and the folders: a Qwen3 teacher (random weights, rope_theta 1e6 so a
misread RoPE key shows) and from it, by `hydra convert --fa-heads uniform:1`, a hybrid of every
fusion variant with its fusion tensors perturbed (convert starts them at the identity); each is
exported with a tokenizer this test trains in memory (`tokenizers`, saved through transformers), the
hybrids in f32 and one in bf16. A fresh Python process started with -I (no PYTHONPATH, no script
folder: cluster/torch is not importable, which it checks) and an empty HF_MODULES_CACHE then does
what the README tells a transformers user to do:

* AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True) for a hybrid (the folder's
  own hydrahead.py, found through config.json's auto_map), plain from_pretrained for the teacher
  (transformers' Qwen3ForCausalLM, no remote code); AutoTokenizer on the same folder encodes the
  prompts to the ids given to hydra, and generation_config.json carries the tokenizer's bos/eos/pad;
  each hybrid's class comes from its own folder's hydrahead.py (not the first folder's, reused);
* logits of one sequence equal `hydra forward --output` (CPU, float32) to 1e-4 of the largest logit
  (TOLERANCE: two float32 implementations, hydra's norms and softmax sum in float64; measured near
  1e-6) — the bf16 folder is loaded as bfloat16 by default and compared in float32;
* model.generate(do_sample=False) on a left-padded batch of two prompts gives `hydra generate`'s
  greedy tokens (`--stop-token` the tokenizer's eos, which generate stops on), token for token;
* no warning about the config keys hydra writes (dtype, torch_dtype, rope_theta, rope_parameters) nor
  about config.json read by another class (AutoTokenizer gets trust_remote_code=True too: it reads
  config.json, and without it transformers asks whether to run the folder's code).

Without torch, transformers, tokenizers, numpy or h5py the test exits 77, which CTest reports as
skipped (SKIP_RETURN_CODE); CMake's HYDRA_TORCH_PYTHON names the interpreter.
"""
import json
import os
import sys
import tempfile
from pathlib import Path

SKIP = 77
TOLERANCE = 1e-4  # of max |logit|: two float32 implementations (hydra sums norms and softmax in float64)
NEW_TOKENS = 8
FUSIONS = ("scale_norm", "norm", "scale", "concat", "gate")
# Warnings that fail the test: about the config keys hydra writes, or a config read by the wrong class.
BAD_WARNINGS = ("torch_dtype", "dtype", "rope_theta", "rope_parameters", "rope_scaling", "to instantiate a model of type")

try:
    import h5py
    import numpy as np
    import tokenizers  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
except ImportError as e:
    print(f"SKIPPED: {e.name} is not installed (the test needs torch, transformers, tokenizers, numpy and h5py)")
    sys.exit(SKIP)

from hydra_testlib import hydra_logits, run  # noqa: E402 (it needs numpy and h5py, checked above)

# What a transformers user runs, in a fresh interpreter: argv[1] a JSON job file, argv[2] the result file.
CHILD = r'''
import importlib.util, json, logging, sys
import numpy as np, torch
assert importlib.util.find_spec("hydrahead") is None, "hydrahead is importable: the test must not see cluster/torch"
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
hf_logging.set_verbosity_warning()
hf_logging.get_logger().addHandler(Keep(level=logging.WARNING))

job = json.load(open(sys.argv[1]))
results = {}
for name, m in job["models"].items():
    folder = m["folder"]
    warnings.clear()
    kwargs = {"trust_remote_code": True} if m["remote"] else {}
    model = AutoModelForCausalLM.from_pretrained(folder, **kwargs).eval()
    loaded_dtype = str(model.dtype)
    model = model.float()
    tok = AutoTokenizer.from_pretrained(folder, **kwargs)  # it reads config.json too: the same remote code
    prompts = [tok(text)["input_ids"] for text in job["texts"]]
    with torch.no_grad():
        logits = model(torch.tensor([job["ids"]])).logits[0]
    np.save(m["logits_out"], logits.double().numpy())
    # Left-padded batch, as transformers batches prompts of different lengths.
    width = max(map(len, prompts))
    pad = model.generation_config.pad_token_id
    batch = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(batch, attention_mask=mask, max_new_tokens=job["new_tokens"], do_sample=False)
    g = model.generation_config
    results[name] = {
        "class": type(model).__name__, "module": type(model).__module__, "loaded_dtype": loaded_dtype,
        "module_file": getattr(sys.modules[type(model).__module__], "__file__", None),
        "prompts": prompts, "new": out[:, width:].tolist(),
        "generation": {"bos": g.bos_token_id, "eos": g.eos_token_id, "pad": g.pad_token_id},
        "tokenizer": {"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id},
        "warnings": list(warnings),
    }
json.dump(results, open(sys.argv[2], "w"))
'''


def train_tokenizer(folder):
    """A small BPE tokenizer (vocabulary under the tiny models' 256) with bos/eos/pad, saved as a
    transformers user's tokenizer folder (tokenizer.json + tokenizer_config.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    text = ["the quick brown fox jumps over the lazy dog", "a needle hides in a haystack of words",
            "hydra heads attend to everything they see", "gated delta rules keep a running state"] * 20
    tok = Tokenizer(models.BPE(unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.BPEDecoder()
    tok.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<|unk|>", "<|pad|>", "<|bos|>", "<|eos|>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                   pad_token="<|pad|>", unk_token="<|unk|>")
    fast.save_pretrained(folder)
    return tok


def hydra_generate(hydra, model, prompts, eos, tmp):
    """`hydra generate` greedy: the new tokens of each prompt, in prompt order."""
    path, out = tmp / "prompts.h5", tmp / "generated.jsonl"
    with h5py.File(path, "w") as f:
        f["input_ids"] = np.concatenate([np.asarray(p, dtype=np.int64) for p in prompts])
        f["prompt_offsets"] = np.cumsum([0] + [len(p) for p in prompts]).astype(np.int64)
    run(hydra, "generate", "--model", model, "--prompt", path, "--max-new-tokens", NEW_TOKENS, "--stop-token", eos,
        "--out", out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    rows = sorted((r for r in rows if "prompt_index" in r), key=lambda r: r["prompt_index"])
    return [r["tokens"] for r in rows]


def until_eos(tokens, eos):
    """transformers pads a finished row after its eos; hydra stops there (eos kept, as generate keeps it)."""
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


def main():
    hydra = Path(sys.argv[1])
    ok = True
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        tokdir = tmp / "tokenizer"
        tok = train_tokenizer(tokdir)
        special = {k: tok.token_to_id(f"<|{k}|>") for k in ("bos", "eos", "pad")}
        texts = ["the lazy dog jumps over a needle", "hydra heads keep a running state of words they see and attend"]
        prompts = [tok.encode(t).ids for t in texts]
        rng = np.random.default_rng(7)
        ids = rng.integers(0, 200, size=61).tolist()

        # The teacher, with Qwen3's rope_theta, and the hybrids converted from it.
        teacher = tmp / "teacher.h5"
        run(hydra, "init", "--preset", "qwen3-tiny", "--weight-seed", "4", "--out", teacher)
        with h5py.File(teacher, "r+") as f:
            config = json.loads(f.attrs["config"])
            config["rope_theta"] = 1e6
            f.attrs["config"] = np.bytes_(json.dumps(config))
        checkpoints = {"teacher": teacher}
        for fusion in FUSIONS:
            path = tmp / f"hybrid-{fusion}.h5"
            run(hydra, "convert", "--teacher", teacher, "--fa-heads", "uniform:1", "--seed", "2", "--fusion", fusion,
                "--out", path)
            with h5py.File(path, "r+") as f:
                for name in f:
                    if ".self_attn.fuse_" in name:
                        data = f[name][...]
                        f[name][...] = (data + rng.normal(0, 0.5, size=data.shape)).astype(data.dtype)
            checkpoints[f"hybrid-{fusion}"] = path

        job = {"ids": ids, "texts": texts, "new_tokens": NEW_TOKENS, "models": {}}
        expected = {}
        for name, model in list(checkpoints.items()) + [("hybrid-scale_norm-bf16", checkpoints["hybrid-scale_norm"])]:
            folder = tmp / f"{name}-hf"
            dtype = "bf16" if name.endswith("-bf16") else "f32"
            run(hydra, "export", "--model", model, "--out", folder, "--tokenizer", tokdir, "--dtype", dtype)
            # hydra's reference is the exported weights themselves: the bf16 folder re-imported.
            reference = model
            if dtype == "bf16":
                reference = tmp / f"{name}.h5"
                run(hydra, "import", "--hf", folder, "--out", reference)
            remote = name != "teacher"
            has_code = (folder / "hydrahead.py").exists()
            if has_code != remote:
                print(f"FAILED: {name}: hydrahead.py {'missing from' if remote else 'in'} the folder")
                ok = False
            expected[name] = {"logits": hydra_logits(hydra, reference, ids, tmp).astype(np.float64),
                              "generated": hydra_generate(hydra, reference, prompts, special["eos"], tmp)}
            job["models"][name] = {"folder": str(folder), "remote": remote,
                                   "logits_out": str(tmp / f"{name}-logits.npy")}

        (tmp / "job.json").write_text(json.dumps(job))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env.update(HF_MODULES_CACHE=str(tmp / "hf-modules"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   HF_HOME=str(tmp / "hf-home"))
        run(sys.executable, "-I", "-c", CHILD, tmp / "job.json", tmp / "results.json", env=env)
        results = json.loads((tmp / "results.json").read_text())

        # Each hybrid's class comes from its own folder's hydrahead.py (the module transformers made of
        # it, a byte-for-byte copy), not from the first folder loaded in the process.
        modules = {r["module"] for n, r in results.items() if n != "teacher"}
        own = len(modules) == len(results) - 1 and all(
            Path(r["module_file"]).read_bytes() == (Path(job["models"][n]["folder"]) / "hydrahead.py").read_bytes()
            for n, r in results.items() if n != "teacher")
        print(f"{'ok' if own else 'FAILED'}: each hybrid's class from its own folder's hydrahead.py "
              f"({len(modules)} modules for {len(results) - 1} folders)")
        ok &= own
        for name, r in results.items():
            want_class = "Qwen3ForCausalLM" if name == "teacher" else "HydraHeadForCausalLM"
            from_folder = name == "teacher" or r["module"].startswith("transformers_modules.")
            good = r["class"] == want_class and from_folder
            print(f"{'ok' if good else 'FAILED'}: {name}: loaded as {r['class']} from {r['module']}"
                  f" ({r['loaded_dtype']})")
            ok &= good
            want_dtype = "torch.bfloat16" if name.endswith("-bf16") else "torch.float32"
            if r["loaded_dtype"] != want_dtype:
                print(f"FAILED: {name}: loaded as {r['loaded_dtype']}, the folder stores {want_dtype}")
                ok = False
            ids_ok = r["prompts"] == prompts and r["tokenizer"] == special and r["generation"] == special
            print(f"{'ok' if ids_ok else 'FAILED'}: {name}: AutoTokenizer ids = tokenizers' ids; generation_config "
                  f"bos/eos/pad {r['generation']} = the tokenizer's {special}")
            ok &= ids_ok
            got = np.load(job["models"][name]["logits_out"])
            ref = expected[name]["logits"]
            err = float(np.abs(got - ref).max() / np.abs(ref).max())
            print(f"{'ok' if err <= TOLERANCE else 'FAILED'}: {name}: transformers logits vs hydra forward: max |Δ| = "
                  f"{np.abs(got - ref).max():.3e}, {err:.3e} of max |logit| {np.abs(ref).max():.3f} "
                  f"(tolerance {TOLERANCE:g})")
            ok &= err <= TOLERANCE
            hf_new = [until_eos(row, special["eos"]) for row in r["new"]]
            same = hf_new == expected[name]["generated"]
            print(f"{'ok' if same else 'FAILED'}: {name}: generate (greedy, left-padded batch of 2) = hydra generate: "
                  f"{hf_new}" + ("" if same else f" vs {expected[name]['generated']}"))
            ok &= same
            noisy = [w for w in r["warnings"] if any(k in w for k in BAD_WARNINGS)]
            if noisy:
                print(f"FAILED: {name}: transformers warned: {noisy}")
                ok = False
            elif r["warnings"]:
                print(f"note: {name}: other transformers warnings: {r['warnings']}")
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
