#!/usr/bin/env python3
"""Compares `hydra forward --device cuda` logits with PyTorch on the same exported folders.

    python3 cluster/torch/check_export_gpu.py --tokens TOKENS.h5 \
        --hybrid HYBRID_DIR HYBRID_LOGITS.h5 --teacher TEACHER_DIR TEACHER_LOGITS.h5 [--out result.json]
        [--device cuda]

The folders are `hydra export`s (bf16); the logits files hydra's `forward --output` of the tokens.
PyTorch runs on the GPU:
  hybrid   cluster/torch/hydrahead.py in float32 (weights upcast from bf16; the delta rule token by
           token: the reference) and in bfloat16 (flash-linear-attention's chunked kernel when
           importable, else the loop);
  teacher  transformers' Qwen3ForCausalLM.from_pretrained in float32, and hydrahead.py in float32.
hydra's GPU path stores bf16 and accumulates in fp32 (DESIGN.md §2), so the tolerance is the one its
own whole-model GPU tests use against the fp32 CPU path: max |Δ| ≤ 5e-2 of the largest reference
logit. Mean |Δ| relative to mean |logit| and the arg-max agreement are printed beside it. Prints one
line per comparison and a JSON summary; exits 1 if a comparison fails. `--device cpu` runs the same
comparisons on the CPU (a dry run of the script with tiny exports; nothing there is bf16).
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hydrahead  # noqa: E402

MAX_TOLERANCE = 5e-2  # of max |logit|, as tests/model/cuda_model_test.cpp holds whole models


DEVICE = "cuda"


def compare(name, logits_fn, ref, rows=512):
    """Max and mean |Δ| over every row of `ref` [T, V] (host), in chunks of `rows` rows on DEVICE."""
    t0 = time.time()
    got = logits_fn()  # [T, V] on the GPU
    max_err, sum_err, sum_ref, max_ref, agree = 0.0, 0.0, 0.0, 0.0, 0
    for b in range(0, ref.shape[0], rows):
        r = torch.from_numpy(ref[b:b + rows]).to(DEVICE)
        g = got[b:b + rows].float()
        d = (g - r).abs()
        max_err, sum_err = max(max_err, d.max().item()), sum_err + d.double().sum().item()
        max_ref, sum_ref = max(max_ref, r.abs().max().item()), sum_ref + r.abs().double().sum().item()
        agree += (g.argmax(-1) == r.argmax(-1)).sum().item()
    n = ref.shape[0] * ref.shape[1]
    res = {"name": name, "max_abs_err": max_err, "max_abs_logit": max_ref, "max_rel": max_err / max_ref,
           "mean_abs_err": sum_err / n, "mean_rel": sum_err / sum_ref, "argmax_agreement": agree / ref.shape[0],
           "seconds": time.time() - t0}
    res["ok"] = bool(res["max_rel"] <= MAX_TOLERANCE and np.isfinite(max_err))
    print(f"{'ok' if res['ok'] else 'FAILED'}: {name}: max |Δ| {max_err:.4f} = {res['max_rel']:.2e} of max |logit| "
          f"{max_ref:.3f} (tolerance {MAX_TOLERANCE:g}); mean |Δ| {res['mean_abs_err']:.2e} = {res['mean_rel']:.2e} of "
          f"mean |logit|; arg-max agrees on {100 * res['argmax_agreement']:.1f}% of rows ({res['seconds']:.1f} s)",
          flush=True)
    del got
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return res


def module_logits(folder, ids, dtype, no_fla=False):
    def run():
        if no_fla:
            os.environ["HYDRA_TORCH_NO_FLA"] = "1"
        try:
            model = hydrahead.load_model(folder, dtype=dtype, device=DEVICE)
            with torch.no_grad():
                return model(ids[None]).logits[0]
        finally:
            os.environ.pop("HYDRA_TORCH_NO_FLA", None)
    return run


def qwen3_logits(folder, ids):
    def run():
        from transformers import Qwen3ForCausalLM
        model = Qwen3ForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).to(DEVICE).eval()
        with torch.no_grad():
            return model(ids[None]).logits[0]
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", required=True)
    p.add_argument("--hybrid", nargs=2, metavar=("DIR", "LOGITS"))
    p.add_argument("--teacher", nargs=2, metavar=("DIR", "LOGITS"))
    p.add_argument("--out")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    # An output naming an input would replace what is read: refused before any work.
    for path in [a.tokens] + list(a.hybrid or []) + list(a.teacher or []):
        if a.out and os.path.exists(a.out) and os.path.exists(path) and os.path.samefile(a.out, path):
            raise SystemExit(f"check_export_gpu: --out {a.out} is {path}, an input: name another output (it would be replaced)")
    global DEVICE
    DEVICE = a.device
    # The float32 references in true float32: no TF32 in GEMMs or cuDNN convolutions.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with h5py.File(a.tokens, "r") as f:
        ids = torch.from_numpy(f["input_ids"][...].astype(np.int64)).to(DEVICE)
    fla = DEVICE == "cuda" and hydrahead._fla_chunk() is not None
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE
    print(f"torch {torch.__version__}, {where}, flash-linear-attention "
          f"{'importable' if fla else 'not importable (bf16 run uses the loop)'}, {ids.numel()} tokens", flush=True)
    results = []
    if a.hybrid:
        with h5py.File(a.hybrid[1], "r") as f:
            ref = f["logits"][...]
        results.append(compare(f"hybrid: hydrahead.py float32 (recurrent loop) vs hydra {DEVICE}",
                               module_logits(a.hybrid[0], ids, torch.float32, no_fla=True), ref))
        results.append(compare(f"hybrid: hydrahead.py bfloat16 ({'fla chunked' if fla else 'loop'}) vs hydra {DEVICE}",
                               module_logits(a.hybrid[0], ids, torch.bfloat16), ref))
        del ref
    if a.teacher:
        with h5py.File(a.teacher[1], "r") as f:
            ref = f["logits"][...]
        try:
            results.append(compare(f"teacher: transformers Qwen3ForCausalLM float32 vs hydra {DEVICE}",
                                   qwen3_logits(a.teacher[0], ids), ref))
        except ImportError as e:
            print(f"FAILED: transformers unavailable ({e})")
            results.append({"name": "teacher: transformers", "ok": False, "error": str(e)})
        results.append(compare(f"teacher: hydrahead.py float32 vs hydra {DEVICE}",
                               module_logits(a.teacher[0], ids, torch.float32), ref))
    ok = all(r["ok"] for r in results)
    summary = {"check": "export-gpu", "tokens": ids.numel(), "fla": fla, "torch": torch.__version__,
               "ok": ok, "results": results}
    print(json.dumps(summary))
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
