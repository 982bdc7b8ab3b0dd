#!/usr/bin/env python3
"""HydraHead hybrids and Qwen3 teachers in plain PyTorch, loaded from a `hydra export` folder.

The reference a Python user can read: every line of the forward is DESIGN.md §1.1-1.2 written
with torch ops (it is not a translation of hydra's kernels).

    from transformers import AutoModelForCausalLM                       # no import of this file needed:
    model = AutoModelForCausalLM.from_pretrained("export-dir", trust_remote_code=True, dtype=torch.bfloat16)
    logits = model(input_ids).logits                                   # [B, T, V]
    out = model.generate(input_ids, max_new_tokens=32, do_sample=False)  # transformers' generate

    from hydrahead import load_model                                   # or with this file on sys.path
    model = load_model("export-dir", dtype=torch.bfloat16, device="cuda")

The folder is what `hydra export` writes: config.json (model_type "hydrahead" or "qwen3") and
model.safetensors or shards with model.safetensors.index.json, tensors named as in hydra's
checkpoints (model/params.h). A hybrid's folder also holds this file as hydrahead.py (hydra is
built with it compiled in, model/embed_text.cmake, so an edit here reaches exports after a rebuild)
and config.json's auto_map names its classes: transformers' trust_remote_code imports it from the
folder. It therefore imports nothing but the standard library, torch and transformers (and
safetensors, flash-linear-attention when present). With transformers installed the classes are a
PretrainedConfig / PreTrainedModel + GenerationMixin pair registered with AutoConfig /
AutoModelForCausalLM, so transformers' `generate` (stopping on the folder's generation_config.json
eos ids) and lm-eval-harness's `hf` model (cluster/torch/lm_eval_hydra.py) use them; without it, a
plain nn.Module with a greedy `generate`.

Conventions (DESIGN.md §1): positions are 0-based over the whole sequence (left padding does not
count: a row's first real token is position 0); RoPE is rotate-half, pairing channels c and c + d/2
with angle i·θ^(−2c/d), computed in float64. FA heads: q_norm / k_norm, no RoPE, τ(i) =
ln(i + a)/ln(a) multiplying the scores, causal SDPA, output gate σ(W_fgate x̂). GDN heads: causal
depthwise conv (K taps) + SiLU on q, k, v; RoPE on q, k; L2 norm; β = σ(w_b·x̂); g = −e^{A_log}
softplus(w_a·x̂ + dt_bias); the gated delta rule (flash-linear-attention's chunk_gated_delta_rule
when importable and on CUDA, else the token-by-token loop below, state in float32 or float64).
Every head is fused by the config's `hydrahead_fusion` (absent: scale_norm): scale_norm y_h = γ_h
RMSNorm(o_h; w_fuse[h]); norm y_h = RMSNorm(o_h; w_fuse[h]); scale y_h = γ_h o_h; concat y_h = o_h;
gate y_h = 2σ(u_h·x̂ + b_h) γ_h RMSNorm(o_h; w_fuse[h]) (x̂ the layer input after input_layernorm);
then W_o, the residual, and the SwiGLU MLP.

Left padding (transformers' convention for batched generation) is exact: padded positions add
nothing to any state (their q/k/v rows are zeroed before the conv, β = 0 and g = 0 there, and FA
keys there are masked). Right padding never reaches earlier positions (the model is causal).
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

try:  # transformers is optional: generate() and lm-eval-harness need it, the forward does not
    from transformers import (AutoConfig, AutoModelForCausalLM, GenerationConfig, GenerationMixin, PretrainedConfig,
                              PreTrainedModel)
    from transformers.modeling_outputs import CausalLMOutputWithPast
    HAVE_TRANSFORMERS = True
except ImportError:  # pragma: no cover - exercised where transformers is absent
    HAVE_TRANSFORMERS = False

MODEL_TYPE = "hydrahead"
EXPORT_VERSION = 1  # config.json "hydrahead_version" this module reads


# ---- Files --------------------------------------------------------------------------------------

_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def _read_safetensors(path: Path) -> dict:
    """A safetensors file as {name: tensor} (CPU). Uses the `safetensors` package when installed,
    else reads the format directly: 8-byte little-endian header length, JSON header, raw data."""
    try:
        from safetensors.torch import load_file
        return load_file(str(path))
    except ImportError:
        pass
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        dtype = _ST_DTYPES[e["dtype"]]
        flat = torch.frombuffer(bytearray(data[base + begin:base + end]), dtype=dtype)
        out[name] = flat.reshape(e["shape"])
    return out


def read_folder(folder) -> tuple[dict, dict]:
    """(config.json as a dict, {tensor name: CPU tensor}) of an exported folder."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    tensors = {}
    for f in files:
        tensors.update(_read_safetensors(folder / f))
    return config, tensors


# ---- Config -------------------------------------------------------------------------------------

_DEFAULTS = dict(vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=64, intermediate_size=256, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                 fa_heads=None, fa_log_base=362.0, conv_kernel=4, l2_norm_eps=1e-6, max_position_embeddings=131072,
                 hydrahead_fusion="scale_norm")
FUSIONS = ("scale_norm", "norm", "scale", "concat", "gate")

_ConfigBase = PretrainedConfig if HAVE_TRANSFORMERS else object


class HydraHeadConfig(_ConfigBase):
    """config.json of an export. `fa_heads` None means a Qwen3 teacher (model_type "qwen3")."""
    model_type = MODEL_TYPE

    def __init__(self, **kwargs):
        # transformers 5 writes rope_theta inside rope_parameters (hydra export writes both places):
        # the nested value wins, as in transformers and hydra import.
        rope = kwargs.get("rope_parameters")
        if isinstance(rope, dict):
            if rope.get("rope_type", rope.get("type", "default")) != "default":
                raise ValueError(f"rope_parameters {rope} is not the default rotary embedding (the only one hydra has)")
            if "rope_theta" in rope:
                kwargs["rope_theta"] = rope["rope_theta"]
        version = kwargs.pop("hydrahead_version", None)
        if version is not None and version > EXPORT_VERSION:
            raise ValueError(f"hydrahead_version {version} is newer than this module ({EXPORT_VERSION})")
        own = {k: kwargs.pop(k, v) for k, v in _DEFAULTS.items()}
        if own["hydrahead_fusion"] not in FUSIONS:
            raise ValueError(f"hydrahead_fusion {own['hydrahead_fusion']!r} is not one of {', '.join(FUSIONS)}")
        self.arch = "hydrahead" if own["fa_heads"] is not None else "qwen3"
        for k, v in own.items():
            setattr(self, k, v)
        if HAVE_TRANSFORMERS:
            super().__init__(tie_word_embeddings=own["tie_word_embeddings"], **kwargs)
        else:
            for k, v in kwargs.items():
                setattr(self, k, v)

    @classmethod
    def from_json_dict(cls, d: dict) -> "HydraHeadConfig":
        kind = d.get("model_type")
        if kind == "qwen3":
            d = {k: v for k, v in d.items() if k not in ("fa_heads",)}
        elif kind != MODEL_TYPE:
            raise ValueError(f"model_type {kind!r} is not a hydra export (expected 'hydrahead' or 'qwen3')")
        keep = {k: d[k] for k in _DEFAULTS if k in d}
        for k in ("rope_parameters", "hydrahead_version"):  # read (and checked) by __init__
            if k in d:
                keep[k] = d[k]
        return cls(**keep)


# ---- Math (DESIGN.md §1) ------------------------------------------------------------------------

def rms_norm(x, w, eps):
    """w ⊙ x / sqrt(mean(x²) + eps), statistics in float32 at least."""
    xf = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (w.to(y.dtype) * y).to(x.dtype)


def rope(x, pos, theta):
    """Rotate-half RoPE: channels (c, c + d/2) turned by pos·θ^(−2c/d). x [B, T, n, d], pos [B, T]."""
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(half, device=x.device, dtype=torch.float64) * 2.0 / x.shape[-1])
    ang = pos.to(torch.float64)[..., None] * inv  # [B, T, d/2], float64 like hydra's angles
    cos, sin = ang.cos()[:, :, None, :], ang.sin()[:, :, None, :]
    xf = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    a, b = xf[..., :half], xf[..., half:]
    return torch.cat([a * cos.to(xf.dtype) - b * sin.to(xf.dtype), b * cos.to(xf.dtype) + a * sin.to(xf.dtype)], -1).to(x.dtype)


def causal_conv_silu(x, taps, tail):
    """SiLU(Σ_m w[c][m] x_{i−K+1+m}) per channel, zeros before the first token (or `tail`, the last
    K−1 inputs of the previous call). x [B, T, C], taps [C, K], tail [B, K−1, C] or None."""
    k = taps.shape[1]
    if tail is None:
        tail = x.new_zeros(x.shape[0], k - 1, x.shape[2])
    xp = torch.cat([tail, x], 1)  # [B, K−1+T, C]
    y = F.conv1d(xp.transpose(1, 2), taps.to(x.dtype)[:, None, :], groups=x.shape[2]).transpose(1, 2)
    return F.silu(y), xp[:, xp.shape[1] - (k - 1):]


def delta_rule_recurrent(q, k, v, g, beta, scale, state=None):
    """The gated delta rule token by token (DESIGN.md §1.2), state S [B, H, d_k, d_v]:
    S ← e^{g} S;  δ = β (v − Sᵀk);  S ← S + k δᵀ;  o = Sᵀ(q·scale).
    q, k, v [B, T, H, d]; g, beta [B, T, H]. Float32 arithmetic (float64 for float64 inputs)."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v, g, beta = (t.to(acc) for t in (q, k, v, g, beta))
    B, T, H, dk = k.shape
    S = q.new_zeros(B, H, dk, v.shape[-1]) if state is None else state.to(acc)
    out = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        delta = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * delta[:, :, None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t] * scale))
    return torch.stack(out, 1), S


def _fla_chunk():
    if os.environ.get("HYDRA_TORCH_NO_FLA"):
        return None
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        return chunk_gated_delta_rule
    except Exception:
        return None


def delta_rule(q, k, v, g, beta, scale, state=None):
    """flash-linear-attention's chunked kernel on CUDA for prefills, else the recurrent loop."""
    chunk = _fla_chunk() if q.is_cuda and q.shape[1] > 1 and q.dtype != torch.float64 else None
    if chunk is None:
        return delta_rule_recurrent(q, k, v, g, beta, scale, state)
    o, s = chunk(q, k, v, g.float(), beta.float(), scale=scale,
                 initial_state=None if state is None else state.float(), output_final_state=True)
    return o, s


def l2_normalize(x, eps):
    xf = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


def attention(q, k, v, query_pos, key_valid, causal_offset):
    """softmax(q·k/sqrt(d)) v over visible keys (SDPA). q [B, T, n, d], k/v [B, S, n, d] (S = past +
    T, one KV per query head), key_valid [B, S] (False at padding); query t sees keys ≤ offset + t.
    A query always sees its own slot, so padded query rows stay finite (their outputs are unused)."""
    T, S = q.shape[1], k.shape[1]
    rows = torch.arange(T, device=q.device)[:, None] + causal_offset
    cols = torch.arange(S, device=q.device)[None, :]
    mask = (cols <= rows)[None] & key_valid[:, None, :]
    mask = mask | (cols == rows)[None]
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None])
    return o.transpose(1, 2)


# ---- Modules ------------------------------------------------------------------------------------

def _linear(n_out, n_in):
    return nn.Linear(n_in, n_out, bias=False)


class Attention(nn.Module):
    """One layer's attention block: the teacher's (fa_heads None) or a HydraHead layer's."""

    def __init__(self, c: HydraHeadConfig, layer: int):
        super().__init__()
        self.c, H, G, d, D = c, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size
        self.teacher = c.arch == "qwen3"
        self.fa = list(range(H)) if self.teacher else sorted(c.fa_heads[layer])
        self.gdn = [] if self.teacher else [h for h in range(H) if h not in self.fa]
        self.kv = list(range(G)) if self.teacher else sorted({h // (H // G) for h in self.fa})
        self.q_proj = _linear(H * d, D)
        self.o_proj = _linear(D, H * d)
        if self.fa:
            self.k_proj, self.v_proj = _linear(len(self.kv) * d, D), _linear(len(self.kv) * d, D)
            self.q_norm, self.k_norm = nn.Module(), nn.Module()
            self.q_norm.weight = nn.Parameter(torch.ones(d))
            self.k_norm.weight = nn.Parameter(torch.ones(d))
            if not self.teacher:
                self.fa_gate_proj = _linear(len(self.fa) * d, D)
        if self.gdn:
            n, K = len(self.gdn), c.conv_kernel
            self.gdn_k_proj, self.gdn_v_proj = _linear(n * d, D), _linear(n * d, D)
            self.gdn_q_conv, self.gdn_k_conv, self.gdn_v_conv = nn.Module(), nn.Module(), nn.Module()
            for m in (self.gdn_q_conv, self.gdn_k_conv, self.gdn_v_conv):
                m.weight = nn.Parameter(torch.zeros(n * d, K))
            self.gdn_a_proj, self.gdn_b_proj = _linear(n, D), _linear(n, D)
            self.gdn_A_log = nn.Parameter(torch.zeros(n))
            self.gdn_dt_bias = nn.Parameter(torch.zeros(n))
        self.fusion = None if self.teacher else c.hydrahead_fusion
        if self.fusion in ("scale_norm", "norm", "gate"):
            self.fuse_norm = nn.Module()
            self.fuse_norm.weight = nn.Parameter(torch.ones(H, d))
        if self.fusion in ("scale_norm", "scale", "gate"):
            self.fuse_gamma = nn.Parameter(torch.ones(H))
        if self.fusion == "gate":
            self.fuse_gate = nn.Linear(D, H, bias=True)

    def forward(self, xn, pos, valid, cache: Optional[dict]):
        c, B, T = self.c, xn.shape[0], xn.shape[1]
        H, d, eps = c.num_attention_heads, c.head_dim, c.rms_norm_eps
        q_all = self.q_proj(xn).view(B, T, H, d)
        heads = [None] * H
        if self.fa:
            q = rms_norm(q_all[:, :, self.fa], self.q_norm.weight, eps)
            k = rms_norm(self.k_proj(xn).view(B, T, len(self.kv), d), self.k_norm.weight, eps)
            v = self.v_proj(xn).view(B, T, len(self.kv), d)
            if self.teacher:  # §1.1: RoPE on q and k
                q, k = rope(q, pos, c.rope_theta), rope(k, pos, c.rope_theta)
            else:  # §1.2: scores scaled by τ(i) = ln(i + a)/ln(a), i.e. q·τ(i) before the product
                a = c.fa_log_base
                tau = torch.log(pos.to(torch.float64) + a) / math.log(a)  # [B, T]
                acc = torch.float64 if q.dtype == torch.float64 else torch.float32
                q = (q.to(acc) * tau.to(acc)[..., None, None]).to(q.dtype)
            offset = 0
            if cache is not None:
                offset = cache["k"].shape[1] if "k" in cache else 0
                k = torch.cat([cache["k"], k], 1) if "k" in cache else k
                v = torch.cat([cache["v"], v], 1) if "v" in cache else v
                cache["k"], cache["v"] = k, v
            key_valid = valid if cache is None else cache["valid"]
            group = [self.kv.index(h // (H // c.num_key_value_heads)) for h in self.fa]
            o = attention(q, k[:, :, group], v[:, :, group], pos, key_valid, offset)
            if not self.teacher:
                o = o * torch.sigmoid(self.fa_gate_proj(xn).view(B, T, len(self.fa), d))
            for i, h in enumerate(self.fa):
                heads[h] = o[:, :, i]
        if self.gdn:
            n = len(self.gdn)
            pad = valid[:, -T:, None].to(xn.dtype)  # zero the padded rows' inputs (left padding)
            raw = {"q": q_all[:, :, self.gdn].reshape(B, T, n * d) * pad,
                   "k": self.gdn_k_proj(xn) * pad, "v": self.gdn_v_proj(xn) * pad}
            conv = {}
            for name, x in raw.items():
                tail = cache.get("conv_" + name) if cache is not None else None
                y, new_tail = causal_conv_silu(x, getattr(self, f"gdn_{name}_conv").weight, tail)
                conv[name] = y.view(B, T, n, d)
                if cache is not None:
                    cache["conv_" + name] = new_tail
            q = l2_normalize(rope(conv["q"], pos, c.rope_theta), c.l2_norm_eps)
            k = l2_normalize(rope(conv["k"], pos, c.rope_theta), c.l2_norm_eps)
            acc = torch.float64 if xn.dtype == torch.float64 else torch.float32
            beta = torch.sigmoid(self.gdn_b_proj(xn).to(acc)) * pad.to(acc)
            g = -torch.exp(self.gdn_A_log.to(acc)) * F.softplus(self.gdn_a_proj(xn).to(acc) + self.gdn_dt_bias.to(acc))
            g = g * pad.to(acc)
            state = cache.get("state") if cache is not None else None
            o, state = delta_rule(q, k, conv["v"], g, beta, 1.0 / math.sqrt(d), state)
            if cache is not None:
                cache["state"] = state
            o = o.to(xn.dtype)
            for i, h in enumerate(self.gdn):
                heads[h] = o[:, :, i]
        if self.fusion is not None:  # §1.2 fusion, the config's variant
            if hasattr(self, "fuse_norm"):  # RMSNorm(o_h; w_fuse[h])
                heads = [rms_norm(heads[h], self.fuse_norm.weight[h], eps) for h in range(H)]
            if hasattr(self, "fuse_gamma"):  # γ_h ·
                heads = [self.fuse_gamma[h].to(xn.dtype) * heads[h] for h in range(H)]
            if self.fusion == "gate":  # 2σ(u_h·x̂ + b_h) ·, per token
                gate = 2 * torch.sigmoid(self.fuse_gate(xn))  # [B, T, H]
                heads = [gate[:, :, h, None] * heads[h] for h in range(H)]
        return self.o_proj(torch.stack(heads, 2).reshape(B, T, H * d))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = _linear(c.intermediate_size, c.hidden_size)
        self.up_proj = _linear(c.intermediate_size, c.hidden_size)
        self.down_proj = _linear(c.hidden_size, c.intermediate_size)

    def forward(self, z):
        return self.down_proj(F.silu(self.gate_proj(z)) * self.up_proj(z))


class DecoderLayer(nn.Module):
    def __init__(self, c, layer):
        super().__init__()
        self.c = c
        self.input_layernorm, self.post_attention_layernorm = nn.Module(), nn.Module()
        self.input_layernorm.weight = nn.Parameter(torch.ones(c.hidden_size))
        self.post_attention_layernorm.weight = nn.Parameter(torch.ones(c.hidden_size))
        self.self_attn = Attention(c, layer)
        self.mlp = MLP(c)

    def forward(self, x, pos, valid, cache):
        eps = self.c.rms_norm_eps
        x = x + self.self_attn(rms_norm(x, self.input_layernorm.weight, eps), pos, valid, cache)
        return x + self.mlp(rms_norm(x, self.post_attention_layernorm.weight, eps))


class Backbone(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, l) for l in range(c.num_hidden_layers))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(c.hidden_size))

    def forward(self, ids, pos, valid, caches):
        x = self.embed_tokens(ids)
        for l, layer in enumerate(self.layers):
            x = layer(x, pos, valid, None if caches is None else caches[l])
        return rms_norm(x, self.norm.weight, self.c.rms_norm_eps)


class HydraCache:
    """What generation carries between steps: per layer the FA keys/values (after norms), the GDN
    conv tails and states, and per row the count of real tokens seen (the next position)."""

    def __init__(self, layers: int):
        self.layers = [{} for _ in range(layers)]
        self.length = 0          # tokens consumed, padding included
        self.seen = None         # [B] real tokens consumed
        self.valid = None        # [B, length] False at padding


def _positions_and_mask(ids, attention_mask, cache: Optional[HydraCache]):
    """Positions [B, T] of the new tokens and the validity of every key [B, past + T]."""
    B, T = ids.shape
    if attention_mask is None:
        new_valid = torch.ones(B, T, dtype=torch.bool, device=ids.device)
    else:
        new_valid = attention_mask[:, -T:].to(torch.bool)
    seen = torch.zeros(B, dtype=torch.long, device=ids.device) if cache is None or cache.seen is None else cache.seen
    pos = (seen[:, None] + new_valid.long().cumsum(1) - 1).clamp(min=0)
    valid = new_valid if cache is None or cache.valid is None else torch.cat([cache.valid, new_valid], 1)
    if cache is not None:
        cache.seen, cache.valid, cache.length = seen + new_valid.long().sum(1), valid, cache.length + T
        for layer in cache.layers:
            layer["valid"] = valid
    return pos, valid


_ModelBase = (PreTrainedModel, GenerationMixin) if HAVE_TRANSFORMERS else (nn.Module,)


if HAVE_TRANSFORMERS:
    @dataclass
    class HydraCausalLMOutput(CausalLMOutputWithPast):
        hydra_cache: Optional[HydraCache] = None
else:
    @dataclass
    class HydraCausalLMOutput:
        logits: torch.Tensor = None
        hydra_cache: Optional[HydraCache] = None


class HydraHeadForCausalLM(*_ModelBase):
    """The whole model: embedding, decoder layers, final norm, LM head (the embedding when tied)."""
    config_class = HydraHeadConfig
    base_model_prefix = "model"
    _no_split_modules = ["DecoderLayer"]
    main_input_name = "input_ids"

    def __init__(self, config: HydraHeadConfig):
        if HAVE_TRANSFORMERS:
            super().__init__(config)
        else:
            super().__init__()
            self.config = config
        self.model = Backbone(config)
        self.lm_head = None if config.tie_word_embeddings else _linear(config.vocab_size, config.hidden_size)
        if HAVE_TRANSFORMERS:
            self.post_init()

    # transformers' hooks
    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def _init_weights(self, module):  # weights come from the export; nothing to draw
        pass

    def forward(self, input_ids, attention_mask=None, hydra_cache: Optional[HydraCache] = None, use_cache=None,
                labels=None, return_dict=True, **unused):
        pos, valid = _positions_and_mask(input_ids, attention_mask, hydra_cache)
        hidden = self.model(input_ids, pos, valid, None if hydra_cache is None else hydra_cache.layers)
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(hidden, weight)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        if HAVE_TRANSFORMERS:
            return HydraCausalLMOutput(loss=loss, logits=logits, hydra_cache=hydra_cache)
        return HydraCausalLMOutput(logits=logits, hydra_cache=hydra_cache)

    # Generation: the cache is hydra's own (FA keys/values plus GDN states), passed as `hydra_cache`
    # so transformers' key/value cache classes never see it.
    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, hydra_cache=None, **kwargs):
        if hydra_cache is None:
            hydra_cache = HydraCache(self.config.num_hidden_layers)
        return {"input_ids": input_ids[:, hydra_cache.length:], "attention_mask": attention_mask,
                "hydra_cache": hydra_cache, "use_cache": True}

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, *args, **kwargs):
        if HAVE_TRANSFORMERS:
            model_kwargs = super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)
        model_kwargs["hydra_cache"] = outputs.hydra_cache
        return model_kwargs

    if not HAVE_TRANSFORMERS:
        @torch.no_grad()
        def generate(self, input_ids, max_new_tokens=16, attention_mask=None, **unused):
            """Greedy decoding with the cache (what transformers' generate does with do_sample=False)."""
            cache = HydraCache(self.config.num_hidden_layers)
            ids, mask, step = input_ids, attention_mask, input_ids
            for _ in range(max_new_tokens):
                nxt = self.forward(step, attention_mask=mask, hydra_cache=cache).logits[:, -1].argmax(-1, keepdim=True)
                ids = torch.cat([ids, nxt], 1)
                if mask is not None:
                    mask = torch.cat([mask, torch.ones_like(nxt)], 1)
                step = nxt
            return ids

    @classmethod
    def from_pretrained(cls, folder, *args, torch_dtype=None, dtype=None, device_map=None, config=None, **kwargs):
        """Loads an export folder (the transformers entry point; extra arguments are ignored)."""
        want = dtype if dtype is not None else torch_dtype
        if isinstance(want, str):
            want = None if want == "auto" else getattr(torch, want)
        device = device_map if isinstance(device_map, (str, torch.device)) and device_map != "auto" else None
        if device_map == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if isinstance(device_map, dict) and device_map:
            device = next(iter(device_map.values()))
            device = f"cuda:{device}" if isinstance(device, int) else device
        model = load_model(folder, dtype=want, device=device or "cpu", model_class=cls)
        if HAVE_TRANSFORMERS and (Path(folder) / "generation_config.json").is_file():
            # the tokenizer's bos/eos/pad ids (hydra export --tokenizer), which generate() stops on
            model.generation_config = GenerationConfig.from_pretrained(folder)
        return model


def load_model(folder, dtype=None, device="cpu", model_class=None):
    """The export in `folder` as a HydraHeadForCausalLM in eval mode. dtype None: the stored one."""
    raw, tensors = read_folder(folder)
    config = HydraHeadConfig.from_json_dict(raw)
    model_class = model_class or HydraHeadForCausalLM
    with torch.device("meta"):
        model = model_class(config)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    missing, unexpected = set(shapes) - set(tensors), set(tensors) - set(shapes)
    if missing or unexpected:
        raise ValueError(f"{folder}: tensors missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    for name, t in tensors.items():
        want = shapes[name]
        if tuple(t.shape) != want:
            raise ValueError(f"{folder}: tensor {name!r} has shape {list(t.shape)}, the config needs {list(want)}")
    model.load_state_dict(tensors, strict=True, assign=True)
    stored = next(iter(tensors.values())).dtype
    return model.to(device=device, dtype=dtype or stored).eval()


# Imported by hand (sys.path): registered, so AutoModelForCausalLM.from_pretrained(folder) and lm-eval's
# "hf" model find the class. Imported by transformers from an export's folder (trust_remote_code, a
# module under transformers_modules): not registered, since a registered class counts as local code
# and would then serve every later folder in the process instead of each folder's own hydrahead.py.
if HAVE_TRANSFORMERS and not __name__.startswith("transformers_modules"):
    try:
        AutoConfig.register(MODEL_TYPE, HydraHeadConfig)
        AutoModelForCausalLM.register(HydraHeadConfig, HydraHeadForCausalLM)
    except ValueError:  # registered already (module imported twice under different names)
        pass
