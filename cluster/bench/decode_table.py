#!/usr/bin/env python3
"""The decode table: `hydra bench --op decode` lines (cluster/bench/decode_job.jobs,
cluster/bench/decode_bench.sh) beside the PyTorch anchors of cluster/bench/decode_anchor.py, then the
decode targets of issue 57.

  decode_table.py DECODE.jsonl [ANCHORS.jsonl]

Markdown on stdout: one row per (model, context, batch, mode) cell, mode being how the step ran
(eager: the kernels launched one by one; graph: replayed as a CUDA graph; + PDL: programmatic
dependent launch, HYDRA_DECODE_PDL=1) and, on lines that name one other than the default, the decode
attention's split CTAs per SM (attn N/SM, hydra bench --decode-ctas-per-sm; each beside the default,
as many as fit, in a section of its own), ", gemv" where the step's projections ran the GEMV of
kernels/gemv/ (", gemv+norm": with the norms fused, --decode-gemv hydra-norm; hydra bench
--decode-gemv; each such line beside the cuBLAS line of the same cell, mode and attention in a
section of its own) and ", prefetch N MiB" where the step prefetched each
layer's weights into L2 (HYDRA_DECODE_PREFETCH / hydra bench --decode-prefetch; each cap beside the
same cell without it in a section of its own): ms per step (= per token at batch 1), tokens/s, the bytes a
step must read (every weight once, every row's cache, the GDN states read and written), GB/s and
its fraction of a device copy measured in the same run and of the card's datasheet bandwidth, our
one-layer attention and GDN-step times next to SDPA's and fla's; skipped cells with their reason;
the graph's speed-up over eager per cell; then each target with PASS / MISS / not measured, taken
at each cell's fastest mode (named). Figures of two different cards are never compared: rows from
several cards are listed, and the targets are left out.
"""
import json
import sys

TARGET_FRACTION = 0.70  # of the datasheet bandwidth, hydrahead-1.7b at batch 1, 32K and 512K
TARGET_RATIO = 5.0      # hydrahead-1.7b at least this many times faster than the teacher, 512K batch 1
HYBRID, TEACHER = "hydrahead-1.7b", "qwen3-1.7b"


def load(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    rows.append(json.loads(line))
    except FileNotFoundError:
        pass
    return rows


def label(n):
    return f"{n // (1024 * 1024)}M" if n % (1024 * 1024) == 0 else f"{n // 1024}K" if n % 1024 == 0 else str(n)


def fmt(x, spec=".3f"):
    return "—" if x is None else format(x, spec)


def step_mode(r):
    return ("graph" if r.get("cuda_graph") else "eager") + (" + PDL" if r.get("pdl") else "")


def attention(r):
    """The decode attention's split CTAs per SM of a line (--decode-ctas-per-sm), or '' at the default."""
    n = r.get("decode_ctas_per_sm")
    return f"{n}/SM" if n else ""


def gemv(r):
    """The step's projections: 'cublas', 'gemv' or 'gemv+norm' (the norms fused: --decode-gemv hydra-norm)."""
    if not r.get("gemv_in_step"):
        return "cublas"
    return "gemv+norm" if r.get("decode_gemv") == "hydra-norm" else "gemv"


DEFAULT_TUNING = "warps=0,ahead=4,prefetch=first-slices"


def tuning(r):
    """' [warps=..,ahead=..,prefetch=..]' where the step's GEMV ran another launch shape
    (HYDRA_GEMV_TUNING / --gemv-tunings, in lines since issue 57's h70), else ''."""
    t = r.get("gemv_tuning")
    return f" [{t}]" if r.get("gemv_in_step") and t and t != DEFAULT_TUNING else ""


def mode(r):
    a = attention(r)
    g = r.get("gdn_step")  # the GDN branch's decode kernels (--gdn-step), in lines since issue 57's h62
    return (step_mode(r) + (f", attn {a}" if a else "") + (f", GDN {g}" if g else "")
            + (f", {gemv(r)}{tuning(r)}" if gemv(r) != "cublas" else "") + prefetch(r))


def prefetch(r):
    """', prefetch N MiB' where the line's step prefetched weights into L2, else ''."""
    n = r.get("decode_prefetch_mib")
    return f", prefetch {n} MiB" if n else ""


def main(argv):
    if len(argv) < 2:
        print("usage: decode_table.py DECODE.jsonl [ANCHORS.jsonl]", file=sys.stderr)
        return 2
    ours = [r for r in load(argv[1]) if r.get("op") == "decode"]
    anchors = load(argv[2]) if len(argv) > 2 else []
    sdpa = {(a["model"], a["context"], a["batch"]): a for a in anchors if a.get("anchor") == "torch.sdpa"}
    fla = {a["batch"]: a for a in anchors if a.get("anchor") == "fla.fused_recurrent_gated_delta_rule"}
    eager_step = {a["batch"]: a for a in anchors if a.get("anchor") == "torch eager delta step"}
    env = next((a for a in anchors if a.get("anchor") == "environment"), None)
    measured = [r for r in ours if "skipped" not in r]
    cards = sorted({r.get("gpu", "a GPU the lines do not name") for r in measured})
    print(f"## Decode: hydra (whole model) on {', '.join(cards) if cards else 'no GPU (nothing measured)'}\n")
    if env:
        print(f"PyTorch anchors (one layer): torch {env.get('torch')} on {env.get('gpu')}\n")
    print("| model | context | batch | mode | ms/step | tokens/s | GB read/step | GB/s | of copy | of datasheet "
          "| attn layer ms | SDPA layer ms | GDN step ms | fla step ms | eager step ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    skipped = []
    for r in ours:
        if "skipped" in r:
            skipped.append(f"- {r['model']} {label(r['context'])} batch {r['batch']} ({mode(r)}): {r['skipped']}")
            continue
        a = sdpa.get((r["model"], r["context"], r["batch"]), {})
        f = fla.get(r["batch"], {}) if r.get("gdn_step_layer_ms") else {}
        e = eager_step.get(r["batch"], {}) if r.get("gdn_step_layer_ms") else {}
        print(f"| {r['model']} | {label(r['context'])} | {r['batch']} | {mode(r)} | {r['ms_per_step']:.3f} "
              f"| {r['tokens_per_s']:.1f} | {r['bytes_per_step'] / 1e9:.2f} | {r['gb_per_s']:.0f} "
              f"| {r['fraction_of_copy']:.2f} | {fmt(r.get('fraction_of_peak'), '.2f')} "
              f"| {fmt(r.get('attention_layer_ms'))} | {fmt(a.get('ms'))} | {fmt(r.get('gdn_step_layer_ms'), '.4f')} "
              f"| {fmt(f.get('ms'), '.4f')} | {fmt(e.get('ms'), '.4f')} |")
    for a in anchors:
        if "skipped" in a and a.get("anchor") != "environment":
            skipped.append(f"- anchor {a.get('anchor')} {a.get('model', '')} {label(a['context']) if 'context' in a else ''} "
                           f"batch {a.get('batch', '')}: {a['skipped']}")
    if skipped:
        print("\nSkipped:\n" + "\n".join(skipped))
    if len(cards) > 1:
        print(f"\nRows from {len(cards)} cards ({', '.join(cards)}): figures of different cards are not compared; "
              "no speed-ups or targets.")
        return 0

    # Per cell, every mode measured; the graph's speed-up over eager where both ran.
    cells = {}
    for r in measured:
        cells.setdefault((r["model"], r["context"], r["batch"]), {})[mode(r)] = r
    speedups = []
    for (model, context, batch), by_mode in cells.items():
        if "eager" not in by_mode:
            continue
        base = by_mode["eager"]["ms_per_step"]
        others = [f"{m} {base / r['ms_per_step']:.2f}x ({r['ms_per_step']:.3f} ms)" for m, r in by_mode.items() if m != "eager"]
        if others:
            speedups.append(f"- {model} {label(context)} batch {batch}: eager {base:.3f} ms; " + "; ".join(others))
    if speedups:
        print("\nSpeed-up over eager (the same kernels launched one by one):\n" + "\n".join(speedups))

    # The decode attention's split CTAs per SM of one cell and step mode beside the default (as many
    # as fit), where a job ran several (hydra bench --decode-ctas-per-sm). The other kernel choices
    # (--gdn-step, --decode-gemv, --decode-prefetch) are part of the cell: each CTA count is compared with the default
    # run with the same ones.
    def other_kernels(r):
        return ", ".join(([f"GDN {r['gdn_step']}"] if r.get("gdn_step") else []) + ([gemv(r)] if gemv(r) != "cublas" else [])
                         + ([prefetch(r)[2:]] if prefetch(r) else []))

    variants = {}
    for r in measured:
        if "decode_ctas_per_sm" in r:
            sm = step_mode(r) + (f", {other_kernels(r)}" if other_kernels(r) else "")
            variants.setdefault((r["model"], r["context"], r["batch"], sm), []).append(r)
    lines = []
    for (model, context, batch, sm), rs in variants.items():
        base = next((r for r in rs if not attention(r)), None)
        if base is None or len(rs) < 2:
            continue
        parts = []
        for r in rs:
            if r is base:
                continue
            a, b = r.get("attention_layer_ms"), base.get("attention_layer_ms")
            layer = f"layer {a:.4f} ms ({b / a:.2f}x)" if a and b else "layer —"
            parts.append(f"{attention(r)}: {layer}, step {r['ms_per_step']:.3f} ms ({base['ms_per_step'] / r['ms_per_step']:.2f}x)")
        b = base.get("attention_layer_ms")
        lines.append(f"- {model} {label(context)} batch {batch} ({sm}): as many as fit: layer {fmt(b, '.4f')} ms, "
                     f"step {base['ms_per_step']:.3f} ms; " + "; ".join(parts))
    if lines:
        print("\nDecode attention split CTAs per SM against as many as fit (one layer alone; the whole step):\n"
              + "\n".join(lines))

    # The projections through the GEMV (and the GEMV with the norms fused) beside cuBLAS
    # (cluster/bench/decode_gemv.jobs, decode_fused.jobs): the same cell, step mode, attention variant
    # and GDN kernels, the whole step's time.
    pairs = {}
    for r in measured:
        if "decode_gemv" in r:
            key = (r["model"], r["context"], r["batch"], step_mode(r) + prefetch(r), attention(r), r.get("gdn_step"),
                   tuning(r))  # other launch shapes: rows of their own in the table, not paired here
            pairs.setdefault(key, {})[gemv(r)] = r
    lines = []
    for (model, context, batch, sm, attn, _, _), by in pairs.items():
        if "cublas" not in by or len(by) < 2:
            continue
        c = by["cublas"]["ms_per_step"]
        parts = [f"{name} {by[kind]['ms_per_step']:.3f} ms ({c / by[kind]['ms_per_step']:.2f}x, "
                 f"{c - by[kind]['ms_per_step']:+.3f} ms a step)"
                 for kind, name in (("gemv", "GEMV"), ("gemv+norm", "GEMV with the norms fused")) if kind in by]
        lines.append(f"- {model} {label(context)} batch {batch} ({sm}{', attn ' + attn if attn else ''}): "
                     f"cuBLAS {c:.3f} ms, " + ", ".join(parts))
    if lines:
        print("\nThe step's projections through the GEMV against cuBLAS (whole step):\n" + "\n".join(lines))

    # The L2 weight prefetch's caps beside the same cell without it (cluster/bench/decode_prefetch.jobs):
    # the same step mode and other kernels, the whole step's time and the one-layer attention's.
    caps = {}
    for r in measured:
        if "decode_prefetch_mib" in r:
            key = (r["model"], r["context"], r["batch"], mode(r)[: len(mode(r)) - len(prefetch(r))])
            caps.setdefault(key, {})[r["decode_prefetch_mib"]] = r
    lines = []
    for (model, context, batch, m), by in caps.items():
        off = by.get(0)
        if off is None or len(by) < 2:
            continue
        parts = []
        for n, r in sorted(by.items()):
            if n == 0:
                continue
            a, b = r.get("attention_layer_ms"), off.get("attention_layer_ms")
            parts.append(f"{n} MiB {r['ms_per_step']:.3f} ms ({off['ms_per_step'] / r['ms_per_step']:.2f}x, "
                         f"{fmt(r.get('fraction_of_peak'), '.2f')} of the datasheet"
                         + (f"; attn layer {a:.4f} ms" if a and b else "") + ")")
        lines.append(f"- {model} {label(context)} batch {batch} ({m}): off {off['ms_per_step']:.3f} ms "
                     f"({fmt(off.get('fraction_of_peak'), '.2f')} of the datasheet"
                     + (f"; attn layer {off['attention_layer_ms']:.4f} ms" if off.get("attention_layer_ms") else "")
                     + "); " + "; ".join(parts))
    if lines:
        print("\nThe L2 weight prefetch against none (whole step; the one-layer attention, whose cache loads the "
              "prefetch marks evict-first):\n" + "\n".join(lines))

    def fastest(model, context, batch):
        by_mode = cells.get((model, context, batch))
        return min(by_mode.values(), key=lambda r: r["ms_per_step"]) if by_mode else None

    def verdict(ok):
        return "not measured" if ok is None else ("PASS" if ok else "MISS")

    print(f"\nTargets (issue 57; each cell at its fastest mode; {cards[0] if cards else 'no card'}):")
    for context in (32 * 1024, 512 * 1024):
        r = fastest(HYBRID, context, 1)
        frac = r.get("fraction_of_peak") if r else None
        what = (f"{r['ms_per_step']:.3f} ms/token ({mode(r)}), {r['gb_per_s']:.0f} GB/s = {fmt(frac, '.2f')} of the datasheet"
                if r else "—")
        if r and frac is None:
            what += " (a card without a datasheet figure)"
        print(f"- {HYBRID} {label(context)} batch 1 >= {TARGET_FRACTION:.2f} of the card's bandwidth: {what}: "
              f"{verdict(None if frac is None else frac >= TARGET_FRACTION)}")
    hy, te = fastest(HYBRID, 512 * 1024, 1), fastest(TEACHER, 512 * 1024, 1)
    ratio = te["ms_per_step"] / hy["ms_per_step"] if hy and te else None
    what = (f"{te['ms_per_step']:.3f} ms ({mode(te)}) / {hy['ms_per_step']:.3f} ms ({mode(hy)}) = {ratio:.2f}x"
            if ratio is not None else "—")
    print(f"- {HYBRID} >= {TARGET_RATIO:.0f}x faster than {TEACHER} at 512K batch 1: {what}: "
          f"{verdict(None if ratio is None else ratio >= TARGET_RATIO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
