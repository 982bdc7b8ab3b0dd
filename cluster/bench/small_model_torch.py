#!/usr/bin/env python3
"""The PyTorch anchor of a small-model training step: the qwen3-synth shape (vocab 512, D 256, 4
layers, 8 query heads of d = 64 in 4 KV groups, MLP 768, untied embeddings), next-token
cross-entropy over B windows of T tokens, AdamW (fused), bf16 autocast — what a plain PyTorch
user would write (q/k RMSNorm, RoPE, SDPA with GQA and causal masking, SwiGLU). Times the step
eagerly and under torch.compile, and prints one JSON line per mode:
  {"anchor": "pytorch-small-model", "mode": "eager"|"compiled", "batch": B, "seq_len": T,
   "step_ms": ..., "tokens_per_s": ...}
A compile that fails is reported as {"mode": "compiled", "error": ...} (the eager figure stands).

    python3 cluster/bench/small_model_torch.py --batch 64 --seq-len 256 --steps 30
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

V, D, L, H, G, HD, I = 512, 256, 4, 8, 4, 64, 768
THETA = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.w = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.w).to(x.dtype)


def rope(x, cos, sin):  # x [B, h, T, d], rotate-half
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = RMSNorm(D), RMSNorm(D)
        self.qkv = nn.Linear(D, (H + 2 * G) * HD, bias=False)
        self.qn, self.kn = RMSNorm(HD), RMSNorm(HD)
        self.o = nn.Linear(H * HD, D, bias=False)
        self.gu = nn.Linear(D, 2 * I, bias=False)
        self.down = nn.Linear(I, D, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).split([H * HD, G * HD, G * HD], dim=-1)
        q = rope(self.qn(q.reshape(b, t, H, HD)).transpose(1, 2), cos, sin)
        k = rope(self.kn(k.reshape(b, t, G, HD)).transpose(1, 2), cos, sin)
        v = v.reshape(b, t, G, HD).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, H * HD))
        g, u = self.gu(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.layers = nn.ModuleList(Layer() for _ in range(L))
        self.norm = RMSNorm(D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, ids, targets, cos, sin):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def run(mode, batch, seq_len, steps, warmup):
    torch.manual_seed(0)
    dev = "cuda"
    model = Model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    pos = torch.arange(seq_len, device=dev, dtype=torch.float32)
    inv = THETA ** (-torch.arange(0, HD // 2, device=dev, dtype=torch.float32) * 2 / HD)
    ang = pos[:, None] * inv[None, :]
    cos, sin = ang.cos()[None, None], ang.sin()[None, None]
    ids = torch.randint(0, V, (batch, seq_len + 1), device=dev)
    fwd = torch.compile(model) if mode == "compiled" else model

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(ids[:, :-1], ids[:, 1:], cos, sin)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / steps * 1e3
    return {"anchor": "pytorch-small-model", "mode": mode, "batch": batch, "seq_len": seq_len, "step_ms": ms,
            "tokens_per_s": batch * seq_len / (ms / 1e3), "loss": float(loss), "torch": torch.__version__}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--modes", default="eager,compiled")
    a = ap.parse_args()
    for mode in a.modes.split(","):
        try:
            print(json.dumps(run(mode, a.batch, a.seq_len, a.steps, a.warmup)), flush=True)
        except Exception as e:  # noqa: BLE001 - a failed compile is reported, the other mode stands
            print(json.dumps({"anchor": "pytorch-small-model", "mode": mode, "error": repr(e)[:300]}), flush=True)


if __name__ == "__main__":
    main()
