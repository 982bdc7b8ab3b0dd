#!/usr/bin/env python3
"""The anchors hydra's kernels are compared with, measured on the same GPU in the same job.

  - PyTorch SDPA forward (bf16, causal, head dim 128) with the cuDNN and the FlashAttention-2
    backends; TFLOP/s = 2·T²·d·H / time (the causal half of the 4·T²·d·H of full attention);
  - flash-linear-attention's chunk_gated_delta_rule forward (bf16 q/k/v, fp32 g/β, l2-normalised
    q and k passed in, as hydra's GDN heads receive them);
  - cuBLAS bf16 GEMM (torch.matmul) 8192³: the ceiling;
  - forward + backward (--attention-bwd, --gdn-bwd): SDPA-cuDNN (and FA2) with out.backward(dO),
    TFLOP/s = 7·T²·d·H / time (FlashAttention's convention: backward = 2.5× the causal forward's
    2·T²·d·H); flash-linear-attention's chunk_gated_delta_rule forward + backward, nominal TFLOP/s =
    3 × the forward count (compare milliseconds). fla's backward needs Triton ≥ 3.7.1 on Hopper; an
    error is reported as such.

Prints one JSON line per measurement (median of --repeat CUDA-event timings after warm-up).
fla is a pure-Python/Triton wheel: carry it with `pip download flash-linear-attention fla-core`.
"""
import argparse
import json
import sys

import torch


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


def gemm(n, warmup, repeat):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = timed(lambda: a @ b, warmup, repeat)
    emit({"anchor": "torch.matmul", "what": f"gemm {n}^3 bf16", "ms": ms, "tflops": 2 * n**3 / ms / 1e9})


def sdpa(t, h, d, backend_name, warmup, repeat):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend_name]
    q = torch.randn(1, h, t, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, h, t, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, h, t, d, device="cuda", dtype=torch.bfloat16)
    try:
        with sdpa_kernel(backend):
            run = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            ms = timed(run, warmup, repeat)
    except RuntimeError as e:
        emit({"anchor": f"sdpa-{backend_name}", "what": f"attention causal T={t} H={h} d={d}", "error": str(e)[:200]})
        return
    emit({"anchor": f"sdpa-{backend_name}", "what": f"attention causal T={t} H={h} d={d}", "ms": ms,
          "tflops": 2 * t * t * d * h / ms / 1e9})


def sdpa_bwd(t, h, d, backend_name, warmup, repeat):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend_name]
    what = f"attention fwd+bwd causal T={t} H={h} d={d}"
    q, k, v = (torch.randn(1, h, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, h, t, d, device="cuda", dtype=torch.bfloat16)

    def run():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(dout)

    try:
        with sdpa_kernel(backend):
            ms = timed(run, warmup, repeat)
    except RuntimeError as e:
        emit({"anchor": f"sdpa-{backend_name}", "what": what, "error": str(e)[:200]})
        return
    emit({"anchor": f"sdpa-{backend_name}", "what": what, "ms": ms, "tflops": 7 * t * t * d * h / ms / 1e9})


def fla_gdn_bwd(t, h, d, warmup, repeat):
    what = f"gdn fwd+bwd T={t} H={h} d={d}"
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        import fla.ops.common.chunk_o as fla_chunk_o
    except Exception as e:  # not installed
        emit({"anchor": "fla", "what": what, "error": f"fla unavailable: {e}"[:200]})
        return
    # fla refuses its gated backward on Hopper with Triton < 3.7.1 (wrong dq/dk there, fla #640).
    # The machine's Triton is older and a newer one is too large to carry, so the guard is bypassed:
    # the gradients are not used, only the time, which the bug does not change (same kernels run).
    if hasattr(fla_chunk_o, "TRITON_ABOVE_3_7_1"):
        fla_chunk_o.TRITON_ABOVE_3_7_1 = True
    q = torch.nn.functional.normalize(torch.randn(1, t, h, d, device="cuda"), dim=-1).bfloat16().requires_grad_()
    k = torch.nn.functional.normalize(torch.randn(1, t, h, d, device="cuda"), dim=-1).bfloat16().requires_grad_()
    v = torch.randn(1, t, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = (-0.5 * torch.rand(1, t, h, device="cuda", dtype=torch.float32)).requires_grad_()
    beta = torch.rand(1, t, h, device="cuda", dtype=torch.float32, requires_grad=True)
    dout = torch.randn(1, t, h, d, device="cuda", dtype=torch.bfloat16)

    def run():
        o, _ = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=False)
        o.backward(dout)

    try:
        ms = timed(run, warmup, repeat)
    except Exception as e:  # e.g. the Triton version guard of fla's backward
        emit({"anchor": "fla", "what": what, "error": f"{type(e).__name__}: {e}"[:200]})
        return
    emit({"anchor": "fla", "what": what, "ms": ms, "tflops": 3 * t * h * (6 * d * d + 8 * 64 * d) / ms / 1e9})


def fla_gdn(t, h, d, warmup, repeat):
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # not installed
        emit({"anchor": "fla", "what": f"gdn chunked T={t} H={h} d={d}", "error": f"fla unavailable: {e}"[:200]})
        return
    q = torch.nn.functional.normalize(torch.randn(1, t, h, d, device="cuda"), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(1, t, h, d, device="cuda"), dim=-1).bfloat16()
    v = torch.randn(1, t, h, d, device="cuda", dtype=torch.bfloat16)
    g = -0.5 * torch.rand(1, t, h, device="cuda", dtype=torch.float32)
    beta = torch.rand(1, t, h, device="cuda", dtype=torch.float32)
    run = lambda: chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=False)
    ms = timed(run, warmup, repeat)
    emit({"anchor": "fla", "what": f"gdn chunked T={t} H={h} d={d}", "ms": ms,
          "tflops": t * h * (6 * d * d + 8 * 64 * d) / ms / 1e9})


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attention", default="8192x16,32768x16,131072x2,524288x2", help="T x heads list")
    p.add_argument("--gdn", default="32768x14,131072x14,524288x14", help="T x heads list")
    p.add_argument("--attention-bwd", default="", help="T x heads list, forward + backward (e.g. 32768x16,131072x2,524288x2)")
    p.add_argument("--gdn-bwd", default="", help="T x heads list, forward + backward (e.g. 131072x14,524288x14)")
    p.add_argument("--sdpa-backends", default="cudnn,flash", help="SDPA backends to time (cudnn, flash)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=10)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    gemm(8192, a.warmup, a.repeat)
    for spec in filter(None, a.attention.split(",")):
        t, h = map(int, spec.split("x"))
        for backend in filter(None, a.sdpa_backends.split(",")):
            sdpa(t, h, a.head_dim, backend, a.warmup, a.repeat)
    for spec in filter(None, a.gdn.split(",")):
        t, h = map(int, spec.split("x"))
        fla_gdn(t, h, a.head_dim, a.warmup, a.repeat)
    for spec in filter(None, a.attention_bwd.split(",")):
        t, h = map(int, spec.split("x"))
        for backend in filter(None, a.sdpa_backends.split(",")):
            sdpa_bwd(t, h, a.head_dim, backend, a.warmup, a.repeat)
    for spec in filter(None, a.gdn_bwd.split(",")):
        t, h = map(int, spec.split("x"))
        fla_gdn_bwd(t, h, a.head_dim, a.warmup, a.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
