#!/usr/bin/env python3
"""The decode benchmark's table (cluster/bench/decode_bench.sh): `hydra bench --op decode` lines beside
the PyTorch anchors of cluster/bench/decode_anchor.py, then the decode targets.

  decode_table.py DECODE.jsonl [ANCHORS.jsonl]

Markdown on stdout: one row per (model, context, batch) cell with ms per step, tokens/s, cache KiB per
token and GiB in all, peak GiB, GB/s and its fraction of a device copy, our one-layer attention and
GDN-step times next to SDPA's and fla's; skipped cells with their reason; then each target with
PASS / MISS / not measured.
"""
import json
import sys


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


def main(argv):
    ours = [r for r in load(argv[1]) if r.get("op") == "decode"]
    anchors = load(argv[2]) if len(argv) > 2 else []
    sdpa = {(a["model"], a["context"], a["batch"]): a for a in anchors if a.get("anchor") == "torch.sdpa"}
    fla = {a["batch"]: a for a in anchors if a.get("anchor") == "fla.fused_recurrent_gated_delta_rule"}
    eager = {a["batch"]: a for a in anchors if a.get("anchor") == "torch eager delta step"}
    env = next((a for a in anchors if a.get("anchor") == "environment"), None)
    print("## Decode: hydra (whole model, one H200) beside PyTorch (one layer)\n")
    if env:
        print(f"torch {env.get('torch')} on {env.get('gpu')}\n")
    print("| model | context | batch | ms/step | tokens/s | cache KiB/token | cache GiB | peak GiB | GB/s (of copy) "
          "| attn layer ms | SDPA layer ms | GDN step ms | fla step ms | eager step ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    skipped = []
    for r in ours:
        key = (r["model"], r["context"], r["batch"])
        if "skipped" in r:
            skipped.append(f"- {r['model']} {label(r['context'])} batch {r['batch']}: {r['skipped']}")
            continue
        a = sdpa.get(key, {})
        f = fla.get(r["batch"], {}) if r.get("gdn_step_layer_ms") else {}
        e = eager.get(r["batch"], {}) if r.get("gdn_step_layer_ms") else {}
        print(f"| {r['model']} | {label(r['context'])} | {r['batch']} | {r['ms_per_step']:.3f} | {r['tokens_per_s']:.1f} "
              f"| {r['cache_bytes_per_token'] / 1024:.1f} | {r['cache_gib']:.1f} | {r['peak_memory_gib']:.1f} "
              f"| {r['gb_per_s']:.0f} ({r['fraction_of_copy']:.2f}) | {fmt(r.get('attention_layer_ms'))} "
              f"| {fmt(a.get('ms'))} | {fmt(r.get('gdn_step_layer_ms'), '.4f')} | {fmt(f.get('ms'), '.4f')} "
              f"| {fmt(e.get('ms'), '.4f')} |")
    for a in anchors:
        if "skipped" in a and a.get("anchor") != "environment":
            skipped.append(f"- anchor {a.get('anchor')} {a.get('model', '')} {label(a['context']) if 'context' in a else ''} "
                           f"batch {a.get('batch', '')}: {a['skipped']}")
    if skipped:
        print("\nSkipped:\n" + "\n".join(skipped))
    cell = {(r["model"], r["context"], r["batch"]): r for r in ours if "skipped" not in r}
    hy = cell.get(("hydrahead-1.7b", 512 * 1024, 1))
    te = cell.get(("qwen3-1.7b", 512 * 1024, 1))
    one_m = cell.get(("hydrahead-1.7b", 1024 * 1024, 1))

    def verdict(ok):
        return "not measured" if ok is None else ("PASS" if ok else "MISS")

    print("\nTargets (one H200):")
    print(f"- hybrid 512K batch 1 <= 3.2 ms/token: {fmt(hy and hy['ms_per_step'])} ms: {verdict(hy and hy['ms_per_step'] <= 3.2)}")
    print(f"- teacher 512K batch 1 <= 18 ms/token: {fmt(te and te['ms_per_step'])} ms: {verdict(te and te['ms_per_step'] <= 18)}")
    ratio = te['ms_per_step'] / hy['ms_per_step'] if hy and te else None
    print(f"- hybrid >= 4.5x faster than the teacher at 512K: {fmt(ratio, '.2f')}x: {verdict(None if ratio is None else ratio >= 4.5)}")
    print(f"- hybrid decodes at 1M on one GPU: {verdict(None if one_m is None else True)}"
          + (f" ({one_m['ms_per_step']:.3f} ms/token, peak {one_m['peak_memory_gib']:.1f} GiB)" if one_m else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
