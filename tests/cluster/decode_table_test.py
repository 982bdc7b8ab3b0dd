#!/usr/bin/env python3
"""cluster/bench/decode_table.py on bench lines written here (no GPU): a row per cell and mode with
the datasheet fraction, skipped cells with their reason, the graph's speed-up over eager, the issue's
targets at each cell's fastest mode (PASS and MISS where the figures say so, "not measured" for a
missing cell), the kernel variants beside their baselines, and no comparison at all when the lines
come from two cards."""
import json
import os
import subprocess
import sys
import tempfile

root = sys.argv[1]
script = os.path.join(root, "cluster", "bench", "decode_table.py")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def cell(model, context, batch, ms, graph, pdl=False, gpu="NVIDIA H100 80GB HBM3", peak=3350.0, moved=4.2e9):
    gbs = moved / (ms * 1e-3) / 1e9
    return {"command": "bench", "op": "decode", "model": model, "context": context, "batch": batch, "ms_per_step": ms,
            "tokens_per_s": batch * 1000.0 / ms, "bytes_per_step": moved, "gb_per_s": gbs, "fraction_of_copy": gbs / 3000.0,
            "gpu": gpu, "peak_gb_per_s": peak, "fraction_of_peak": gbs / peak if peak else None, "cuda_graph": graph,
            "pdl": pdl, "attention_layer_ms": 0.03, "gdn_step_layer_ms": 0.008 if model.startswith("hydra") else None}


def run(lines):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "decode.jsonl")
        with open(path, "w") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
        r = subprocess.run([sys.executable, script, path], capture_output=True, text=True, timeout=60)
        check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
        return r.stdout


K32, K512 = 32 * 1024, 512 * 1024
# 32K batch 1: 4.2 GB in 1.6 ms on an H100 = 2625 GB/s = 0.78 of 3350 (PASS); 512K batch 1: 11.3 GB in
# 5.0 ms = 0.67 (MISS); the teacher 512K at 17 ms: 3.4x (MISS).
lines = [cell("hydrahead-1.7b", K32, 1, 4.7, False), cell("hydrahead-1.7b", K32, 1, 1.8, True),
         cell("hydrahead-1.7b", K32, 1, 1.6, True, pdl=True),
         cell("hydrahead-1.7b", K512, 1, 5.0, True, moved=11.25e9),
         cell("qwen3-1.7b", K512, 1, 17.0, True, moved=63.8e9),
         {"command": "bench", "op": "decode", "model": "hydrahead-1.7b", "context": K512, "batch": 32,
          "cuda_graph": True, "pdl": False, "skipped": "the cache (224.8 GiB) ... exceed 95% of the GPU's free 76.0 GiB"}]
out = run(lines)
check("on NVIDIA H100 80GB HBM3" in out, "the card in the title")
check("| hydrahead-1.7b | 32K | 1 | graph + PDL | 1.600 |" in out, "the PDL row")
check("| hydrahead-1.7b | 32K | 1 | eager | 4.700 |" in out, "the eager row")
check("| 0.78 |" in out, "the datasheet fraction of the 32K PDL row (2625 / 3350)")
check("512K batch 32 (graph): the cache (224.8 GiB)" in out, "the skipped cell and its reason")
check("eager 4.700 ms; graph 2.61x (1.800 ms); graph + PDL 2.94x (1.600 ms)" in out, "the speed-ups over eager")
check("32K batch 1 >= 0.70 of the card's bandwidth: 1.600 ms/token (graph + PDL), 2625 GB/s = 0.78 of the datasheet: PASS"
      in out, "the 32K target (fastest mode)")
check("512K batch 1 >= 0.70 of the card's bandwidth: 5.000 ms/token (graph), 2250 GB/s = 0.67 of the datasheet: MISS" in out,
      "the 512K target")
check("17.000 ms (graph) / 5.000 ms (graph) = 3.40x: MISS" in out, "the teacher ratio")

# Without the teacher's cell the ratio is not measured; an unlisted card has no datasheet verdict.
out = run([cell("hydrahead-1.7b", K32, 1, 1.6, True, gpu="NVIDIA A100-SXM4-80GB", peak=0.0)])
check("of the datasheet (a card without a datasheet figure): not measured" in out, f"an unlisted card: {out}")
check("512K batch 1 >= 0.70 of the card's bandwidth: —: not measured" in out, "a missing cell")
check("faster than qwen3-1.7b at 512K batch 1: —: not measured" in out, "a missing ratio")

# Two cards: listed, never compared.
out = run([cell("hydrahead-1.7b", K32, 1, 4.7, False), cell("hydrahead-1.7b", K32, 1, 1.2, True, gpu="NVIDIA H200", peak=4800.0)])
check("Rows from 2 cards" in out and "Targets" not in out and "Speed-up" not in out, f"two cards: {out}")

# The decode attention's split CTAs per SM on one cell (hydra bench --decode-ctas-per-sm): a row
# each, and each count beside the default (as many as fit), for the layer alone and the whole step.
def variant(ctas, ms, layer):
    r = cell("hydrahead-1.7b", K32, 1, ms, True, pdl=True)
    r.update({"decode_ctas_per_sm": ctas, "attention_layer_ms": layer})
    return r


out = run([variant(1, 2.8, 0.030), variant(0, 2.4, 0.012), variant(2, 2.5, 0.015)])
check("| hydrahead-1.7b | 32K | 1 | graph + PDL, attn 1/SM | 2.800 |" in out, f"the 1/SM row: {out}")
check("| hydrahead-1.7b | 32K | 1 | graph + PDL | 2.400 |" in out, f"the default row: {out}")
check("- hydrahead-1.7b 32K batch 1 (graph + PDL): as many as fit: layer 0.0120 ms, step 2.400 ms; "
      "1/SM: layer 0.0300 ms (0.40x), step 2.800 ms (0.86x); 2/SM: layer 0.0150 ms (0.80x), "
      "step 2.500 ms (0.96x)" in out, f"the CTA counts against the default: {out}")
check("1.600" not in out and "2.400 ms/token (graph + PDL)," in out, "the target at the fastest variant")

# The projections through the GEMV (cluster/bench/decode_gemv.jobs): a row each, the GEMV beside
# cuBLAS on the same cell; at batch 32 the GEMV is not in the step (more than 8 rows): one cuBLAS row
# mode each, no pair.
def gemv(kernel, batch, ms):
    r = cell("hydrahead-1.7b", K32, batch, ms, True, pdl=True)
    r.update({"decode_ctas_per_sm": 0, "decode_gemv": kernel,
              "gemv_in_step": kernel != "cublas" and batch <= 8})
    return r


out = run([gemv("cublas", 1, 2.8), gemv("hydra", 1, 2.4), gemv("cublas", 32, 4.0), gemv("hydra", 32, 4.1)])
check("| hydrahead-1.7b | 32K | 1 | graph + PDL, gemv | 2.400 |" in out, f"the GEMV row: {out}")
check("| hydrahead-1.7b | 32K | 1 | graph + PDL | 2.800 |" in out, "the cuBLAS row")
check("- hydrahead-1.7b 32K batch 1 (graph + PDL): cuBLAS 2.800 ms, GEMV 2.400 ms (1.17x, +0.400 ms a step)"
      in out, f"the GEMV against cuBLAS: {out}")
check("32K batch 32 (graph + PDL): cuBLAS" not in out, "no pair where the GEMV did not run")

# The GEMV's launch shapes (--gemv-tunings): a row each, named unless the default; the default shape
# still paired with cuBLAS.
tuned = gemv("hydra", 1, 2.2)
tuned["gemv_tuning"] = "warps=4,ahead=8,prefetch=tile"
plain = gemv("hydra", 1, 2.4)
plain["gemv_tuning"] = "warps=0,ahead=4,prefetch=first-slices"
out = run([gemv("cublas", 1, 2.8), plain, tuned])
check("| hydrahead-1.7b | 32K | 1 | graph + PDL, gemv [warps=4,ahead=8,prefetch=tile] | 2.200 |" in out, f"the tuned row: {out}")
check("| hydrahead-1.7b | 32K | 1 | graph + PDL, gemv | 2.400 |" in out, f"the default shape's row: {out}")
check("cuBLAS 2.800 ms, GEMV 2.400 ms" in out, f"the default shape against cuBLAS: {out}")

# The L2 weight prefetch (cluster/bench/decode_prefetch.jobs): a row per cap, each cap beside the
# same cell without it (whole step, datasheet fraction, the one-layer attention); the batch-8 cell
# compared on its own; the target taken at the fastest cap.
def prefetched(mib, batch, ms, layer):
    r = cell("hydrahead-1.7b", K32, batch, ms, True, pdl=True)
    r.update({"decode_ctas_per_sm": 0, "decode_gemv": "cublas", "gemv_in_step": False, "gdn_step": "separate",
              "decode_prefetch_mib": mib, "attention_layer_ms": layer})
    return r


out = run([prefetched(0, 1, 2.5, 0.0120), prefetched(8, 1, 2.4, 0.0121), prefetched(32, 1, 2.0, 0.0125),
           prefetched(0, 8, 4.0, 0.030), prefetched(32, 8, 3.9, 0.031)])
check("| hydrahead-1.7b | 32K | 1 | graph + PDL, GDN separate, prefetch 32 MiB | 2.000 |" in out, f"the 32 MiB row: {out}")
check("| hydrahead-1.7b | 32K | 1 | graph + PDL, GDN separate | 2.500 |" in out, f"the row without prefetch: {out}")
check("- hydrahead-1.7b 32K batch 1 (graph + PDL, GDN separate): off 2.500 ms (0.50 of the datasheet; attn layer "
      "0.0120 ms); 8 MiB 2.400 ms (1.04x, 0.52 of the datasheet; attn layer 0.0121 ms); 32 MiB 2.000 ms (1.25x, "
      "0.63 of the datasheet; attn layer 0.0125 ms)" in out, f"the caps against none at batch 1: {out}")
check("- hydrahead-1.7b 32K batch 8 (graph + PDL, GDN separate): off 4.000 ms" in out and "32 MiB 3.900 ms (1.03x" in out,
      f"the caps against none at batch 8: {out}")
check("2.000 ms/token (graph + PDL, GDN separate, prefetch 32 MiB)" in out, f"the target at the fastest cap: {out}")
check("cuBLAS" not in out, "no GEMV pairs where only cuBLAS ran")

# The GEMV with the norms fused (--decode-gemv hydra-norm) beside the GEMV and cuBLAS on one cell.
out = run([gemv("cublas", 1, 2.8), gemv("hydra", 1, 2.4), gemv("hydra-norm", 1, 2.2)])
check("| hydrahead-1.7b | 32K | 1 | graph + PDL, gemv+norm | 2.200 |" in out, f"the fused-norm row: {out}")
check("- hydrahead-1.7b 32K batch 1 (graph + PDL): cuBLAS 2.800 ms, GEMV 2.400 ms (1.17x, +0.400 ms a "
      "step), GEMV with the norms fused 2.200 ms (1.27x, +0.600 ms a step)" in out, f"the three projections: {out}")


for f in failures:
    print("FAILED:", f)
print("decode_table_test:", "FAILED" if failures else "PASSED")
sys.exit(1 if failures else 0)
