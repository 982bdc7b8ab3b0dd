#!/usr/bin/env python3
"""PyTorch anchors for hydra's decode step, one layer of each model, on the same GPU in the
same job as `hydra bench --op decode`:

  - attention of one new query row per sequence against a bf16 cache of `context` keys with
    torch.nn.functional.scaled_dot_product_attention (q [B, Hq, 1, d], k/v [B, Hk, T, d], GQA through
    enable_gqa where torch has it, else K/V repeated to Hq heads once, outside the timing; the line
    says which), as hydra's ops::attention_decode does for the FA heads of a layer:
    hydrahead-1.7b Hq = 2, Hk = 1; qwen3-1.7b Hq = 16, Hk = 8; d = 128;
  - the GDN heads' single-token state update of a layer (hydrahead-1.7b: 14 heads, d = 128, fp32 state
    [B, H, d, d]) with flash-linear-attention's fused_recurrent_gated_delta_rule (T = 1, initial and
    final state), when fla is importable, and written in plain PyTorch ops (eager), as hydra's
    ops::delta_rule_step does.

Prints one JSON line per measurement: median milliseconds of --repeat CUDA-event timings after
--warmup, and the GB/s of the bytes the op must move (the cache read; the state read and written).
A cell that does not fit the free GPU memory is skipped with a line saying so.
"""
import argparse
import json
import math
import sys

import torch

MODELS = {"hydrahead-1.7b": {"hq": 2, "hk": 1, "gdn": 14}, "qwen3-1.7b": {"hq": 16, "hk": 8, "gdn": 0}}
D = 128


def timed(fn, warmup, repeat):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def emit(record):
    print(json.dumps(record), flush=True)


def size(text):
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
    return int(text[:-1] if text[-1:] in "KM" else text) * scale


def sdpa(model, context, batch, warmup, repeat):
    hq, hk = MODELS[model]["hq"], MODELS[model]["hk"]
    need = 2 * batch * hk * context * D * 2
    gqa = "enable_gqa" in torch.nn.functional.scaled_dot_product_attention.__doc__
    if not gqa and hq != hk:
        need *= 1 + hq // hk  # the repeated copy
    free, _ = torch.cuda.mem_get_info()
    base = {"anchor": "torch.sdpa", "model": model, "context": context, "batch": batch, "heads": hq, "kv_heads": hk}
    if need > 0.9 * free:
        emit({**base, "skipped": f"the cache needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"})
        return
    q = torch.randn(batch, hq, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, hk, context, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, hk, context, D, device="cuda", dtype=torch.bfloat16)
    if gqa:
        run = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hk)
    else:
        if hq != hk:
            k = k.repeat_interleave(hq // hk, dim=1)
            v = v.repeat_interleave(hq // hk, dim=1)
        run = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)
    ms = timed(run, warmup, repeat)
    emit({**base, "gqa": "enable_gqa" if gqa else "repeated K/V", "ms": ms,
          "gb_per_s": 2 * batch * hk * context * D * 2 / (ms * 1e-3) / 1e9})
    del q, k, v
    torch.cuda.empty_cache()


def gdn_step(batch, warmup, repeat):
    h = MODELS["hydrahead-1.7b"]["gdn"]
    moved = 2 * batch * h * D * D * 4  # the fp32 state, read and written
    q = torch.nn.functional.normalize(torch.randn(batch, 1, h, D, device="cuda"), dim=-1).to(torch.bfloat16)
    k = torch.nn.functional.normalize(torch.randn(batch, 1, h, D, device="cuda"), dim=-1).to(torch.bfloat16)
    v = torch.randn(batch, 1, h, D, device="cuda", dtype=torch.bfloat16)
    g = -0.1 * torch.rand(batch, 1, h, device="cuda")
    beta = torch.rand(batch, 1, h, device="cuda")
    state = 0.02 * torch.randn(batch, h, D, D, device="cuda")
    base = {"model": "hydrahead-1.7b", "batch": batch, "heads": h}
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        run = lambda: fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=state,
                                                       output_final_state=True, scale=D ** -0.5)
        ms = timed(run, warmup, repeat)
        emit({**base, "anchor": "fla.fused_recurrent_gated_delta_rule", "ms": ms, "gb_per_s": moved / (ms * 1e-3) / 1e9})
    except Exception as e:  # not installed, or an fla/Triton version that fails here
        emit({**base, "anchor": "fla.fused_recurrent_gated_delta_rule", "skipped": f"{type(e).__name__}: {e}"[:300]})

    def eager():  # S ← e^g S; δ = β (v − Sᵀk); S += k δᵀ; o = Sᵀq / √d
        s = state * torch.exp(g[:, 0, :, None, None])
        kf, qf, vf = k[:, 0].float(), q[:, 0].float(), v[:, 0].float()
        delta = beta[:, 0, :, None] * (vf - torch.einsum("bhkv,bhk->bhv", s, kf))
        s = s + kf[..., :, None] * delta[..., None, :]
        return torch.einsum("bhkv,bhk->bhv", s, qf) * D ** -0.5, s

    ms = timed(eager, warmup, repeat)
    emit({**base, "anchor": "torch eager delta step", "ms": ms, "gb_per_s": moved / (ms * 1e-3) / 1e9})


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", default="32K,128K,512K,1M")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=10)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"anchor": "all", "skipped": "no CUDA device visible to torch"}))
        return 0
    contexts = [size(c) for c in a.contexts.split(",")]
    batches = [int(b) for b in a.batches.split(",")]
    emit({"anchor": "environment", "torch": torch.__version__, "gpu": torch.cuda.get_device_name()})
    for model in MODELS:
        for context in contexts:
            for batch in batches:
                sdpa(model, context, batch, a.warmup, a.repeat)
    for batch in batches:
        gdn_step(batch, a.warmup, a.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
