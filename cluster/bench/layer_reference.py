#!/usr/bin/env python3
"""The PyTorch reference of a hydrahead-1.7b prefill: one decoder layer, timed on the GPU, × 28.

What a plain PyTorch implementation of the same model would run (random bf16 weights, one layer's
shapes: D = 2048, 16 query heads of d = 128, 8 KV heads, 2 FA heads + 14 GDN heads, MLP 6144):
  x̂ = RMSNorm(x); one fused projection (cuBLAS) for FA q, k, v, gate and GDN q, k, v, a, b;
  FA heads: q/k RMSNorm, q · τ(i), SDPA with the cuDNN backend (causal, GQA), sigmoid output gate;
  GDN heads: depthwise causal conv (K = 4) + SiLU on q, k, v, RoPE, L2 norm, β = σ(b),
  g = −e^{A_log} softplus(a + dt_bias), flash-linear-attention's chunk_gated_delta_rule;
  per-head RMSNorm · γ fusion; o_proj; residual; RMSNorm; SwiGLU MLP; residual.
The FA and GDN branches run one after the other on one stream. Prints one JSON line:
{"anchor": "pytorch-layer", "seq_len": T, "layer_ms": ..., "prefill_s": layer_ms · 28 / 1000}.
With --backward, the training step of the same layer instead: autograd forward + backward (every
weight a bf16 leaf with a gradient, the input too, dL/dy random), printed as "pytorch-layer-train"
with "step_s" = layer_ms · 28 / 1000 and TFLOP/s of 3 × the forward's model FLOPs.

    python3 cluster/bench/layer_reference.py --seq-len 524288 --repeat 3
    python3 cluster/bench/layer_reference.py --seq-len 65536 --backward
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

D, H, G, HD, MLP, LAYERS = 2048, 16, 8, 128, 6144, 28
FA_HEADS, GDN_HEADS = 2, 14
FA_KV = 1  # FA heads 0 and 1 share KV head 0
ROPE_THETA, LOG_BASE = 1e6, 362.0


def rms_norm(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


def rope(x, pos):  # x [T, h, d], rotate-half convention
    half = x.shape[-1] // 2
    inv = ROPE_THETA ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = pos[:, None].float() * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def make_weights(device):
    def w(*shape, scale=0.02):
        return (torch.randn(*shape, device=device) * scale).to(torch.bfloat16)
    rows = (FA_HEADS + 2 * FA_KV + FA_HEADS + 3 * GDN_HEADS) * HD + 2 * GDN_HEADS
    return {
        "in_norm": torch.ones(D, device=device), "post_norm": torch.ones(D, device=device),
        "in_proj": w(rows, D), "o_proj": w(D, H * HD), "mlp_in": w(2 * MLP, D), "mlp_out": w(D, MLP),
        "q_norm": torch.ones(HD, device=device), "k_norm": torch.ones(HD, device=device),
        "conv": (torch.randn(3 * GDN_HEADS * HD, 1, 4, device=device) * 0.5).to(torch.bfloat16),
        "a_log": torch.log(torch.empty(GDN_HEADS, device=device).uniform_(1, 16)),
        "dt_bias": torch.zeros(GDN_HEADS, device=device),
        "fuse": torch.ones(H, HD, device=device), "gamma": torch.ones(H, 1, device=device),
    }


def layer(x, w, pos, tau, chunk_gated_delta_rule):
    t = x.shape[0]
    xn = rms_norm(x, w["in_norm"])
    proj = xn @ w["in_proj"].t()
    o = 0
    fq, fk, fv, fg = (proj[:, o:(o := o + FA_HEADS * HD)], proj[:, o:(o := o + FA_KV * HD)],
                      proj[:, o:(o := o + FA_KV * HD)], proj[:, o:(o := o + FA_HEADS * HD)])
    gqkv, ga, gb = proj[:, o:(o := o + 3 * GDN_HEADS * HD)], proj[:, o:(o := o + GDN_HEADS)], proj[:, o:o + GDN_HEADS]
    # FA heads.
    q = rms_norm(fq.reshape(t, FA_HEADS, HD), w["q_norm"]) * tau[:, None, None]
    k = rms_norm(fk.reshape(t, FA_KV, HD), w["k_norm"])
    v = fv.reshape(t, FA_KV, HD)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        fa = F.scaled_dot_product_attention(q.transpose(0, 1).contiguous()[None],
                                            k.transpose(0, 1).expand(FA_HEADS, t, HD).contiguous()[None],
                                            v.transpose(0, 1).expand(FA_HEADS, t, HD).contiguous()[None], is_causal=True)
    fa = fa[0].transpose(0, 1) * torch.sigmoid(fg.reshape(t, FA_HEADS, HD))
    # GDN heads.
    c = F.silu(F.conv1d(F.pad(gqkv.t()[None], (3, 0)), w["conv"], groups=3 * GDN_HEADS * HD))[0].t()
    gq, gk, gv = (c[:, i * GDN_HEADS * HD:(i + 1) * GDN_HEADS * HD].reshape(t, GDN_HEADS, HD) for i in range(3))
    gq = F.normalize(rope(gq, pos).float(), dim=-1).to(torch.bfloat16)
    gk = F.normalize(rope(gk, pos).float(), dim=-1).to(torch.bfloat16)
    beta = torch.sigmoid(gb.float())
    g = -torch.exp(w["a_log"]) * F.softplus(ga.float() + w["dt_bias"])
    gdn, _ = chunk_gated_delta_rule(gq[None], gk[None], gv.contiguous()[None], g[None], beta[None],
                                    scale=1.0 / math.sqrt(HD), output_final_state=False)
    heads = torch.cat([fa, gdn[0]], dim=1)  # head order does not change the cost
    # γ_h · RMSNorm(o_h; w_fuse[h]) = RMSNorm(o_h; γ_h w_fuse[h]): γ folded into the fp32 weight, so
    # the result is bf16 like every other matmul operand (an fp32 y would not meet the bf16 o_proj).
    y = rms_norm(heads, w["fuse"] * w["gamma"]).reshape(t, H * HD)
    x = x + y @ w["o_proj"].t()
    gu = rms_norm(x, w["post_norm"]) @ w["mlp_in"].t()
    return x + (F.silu(gu[:, :MLP]) * gu[:, MLP:]) @ w["mlp_out"].t()


def forward_flops(t):
    """Model FLOPs of one layer's forward at T tokens (GEMMs, causal FA, chunked GDN at chunk 64)."""
    rows = (FA_HEADS + 2 * FA_KV + FA_HEADS + 3 * GDN_HEADS) * HD + 2 * GDN_HEADS
    gemm = 2 * t * D * (rows + H * HD + 3 * MLP)
    fa = 2 * t * t * HD * FA_HEADS  # causal: half of 4·T²·d per head
    gdn = t * GDN_HEADS * (6 * HD * HD + 8 * 64 * HD)
    return gemm + fa + gdn


def train_step(a):
    name = "pytorch-layer-train"
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        import fla.ops.common.chunk_o as fla_chunk_o
    except Exception as e:  # not installed
        print(json.dumps({"anchor": name, "seq_len": a.seq_len, "error": f"fla unavailable: {e}"[:200]}))
        return 0
    # As in anchors.py: fla refuses its gated backward on Hopper with Triton < 3.7.1 (wrong dq/dk there,
    # fla #640); the guard is bypassed because only the time is used, which that bug does not change.
    if hasattr(fla_chunk_o, "TRITON_ABOVE_3_7_1"):
        fla_chunk_o.TRITON_ABOVE_3_7_1 = True
    torch.manual_seed(0)
    dev = "cuda"
    w = {k: v.detach().requires_grad_(True) for k, v in make_weights(dev).items()}
    x = torch.randn(a.seq_len, D, device=dev).to(torch.bfloat16).requires_grad_(True)
    dy = torch.randn(a.seq_len, D, device=dev).to(torch.bfloat16)
    pos = torch.arange(a.seq_len, device=dev)
    tau = (torch.log(pos.float() + LOG_BASE) / math.log(LOG_BASE)).to(torch.bfloat16)

    def step():
        for v in list(w.values()) + [x]:
            v.grad = None
        layer(x, w, pos, tau, chunk_gated_delta_rule).backward(dy)

    try:
        for _ in range(a.warmup):
            step()
        torch.cuda.synchronize()
        times = []
        for _ in range(a.repeat):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    except Exception as e:  # e.g. fla's Triton version guard on its backward
        print(json.dumps({"anchor": name, "seq_len": a.seq_len, "error": f"{type(e).__name__}: {e}"[:300]}))
        return 0
    ms = sorted(times)[len(times) // 2]
    print(json.dumps({"anchor": name, "seq_len": a.seq_len, "layer_ms": ms, "step_s": ms * LAYERS / 1e3,
                      "tflops": 3 * forward_flops(a.seq_len) / ms / 1e9,
                      "peak_gib": torch.cuda.max_memory_allocated() / 2**30}), flush=True)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=524288)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--backward", action="store_true", help="time autograd forward + backward (a training step)")
    a = p.parse_args()
    if a.backward:
        return train_step(a)
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # not installed
        print(json.dumps({"anchor": "pytorch-layer", "seq_len": a.seq_len, "error": f"fla unavailable: {e}"[:200]}))
        return 0
    torch.manual_seed(0)
    dev = "cuda"
    w = make_weights(dev)
    x = torch.randn(a.seq_len, D, device=dev).to(torch.bfloat16)
    pos = torch.arange(a.seq_len, device=dev)
    tau = (torch.log(pos.float() + LOG_BASE) / math.log(LOG_BASE)).to(torch.bfloat16)
    with torch.no_grad():
        for _ in range(a.warmup):
            layer(x, w, pos, tau, chunk_gated_delta_rule)
        torch.cuda.synchronize()
        times = []
        for _ in range(a.repeat):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            layer(x, w, pos, tau, chunk_gated_delta_rule)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    ms = sorted(times)[len(times) // 2]
    print(json.dumps({"anchor": "pytorch-layer", "seq_len": a.seq_len, "layer_ms": ms, "prefill_s": ms * LAYERS / 1e3,
                      "peak_gib": torch.cuda.max_memory_allocated() / 2**30}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
