#!/usr/bin/env python3
"""CTest torch_export.cpu: `hydra export` folders loaded by PyTorch give hydra's logits.

    python3 tests/cluster/torch_export_test.py BUILD/bin/hydra SOURCE_DIR

For a Qwen3 teacher and HydraHead hybrids (hydrahead-tiny with random weights, f32 and bf16, a
layer-wise hybrid from `hydra convert` with an all-GDN and an all-FA layer, and a converted student of
each other fusion variant, its fusion tensors perturbed), the logits of
cluster/torch/hydrahead.py equal `hydra forward --output` (CPU, fp32) to 1e-4 of the largest logit;
a sharded export loads to the same model; left padding, the generation cache and transformers'
`generate` are checked against plain forwards; with transformers installed,
Qwen3ForCausalLM.from_pretrained on the teacher's folder gives hydra's logits too, and
AutoModelForCausalLM finds the hybrid class. Without torch, numpy or h5py the test exits 77, which
CTest reports as skipped (SKIP_RETURN_CODE); without transformers its checks are skipped with a line
saying so.
"""
import sys
import tempfile
from pathlib import Path

SKIP = 77
TOLERANCE = 1e-4  # of max |logit|: two fp32 implementations (hydra sums norms and softmax in fp64)

try:
    import h5py
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIPPED: {e.name} is not installed (the test needs torch, numpy and h5py)")
    sys.exit(SKIP)

from hydra_testlib import hydra_logits, run  # noqa: E402 (it needs numpy and h5py, checked above)


def relative_error(got, ref):
    return ((got.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def check(name, got, ref, tolerance=TOLERANCE):
    err = relative_error(got, ref)
    status = "ok" if err <= tolerance else "FAILED"
    print(f"{status}: {name}: max |Δ| = {(got.double() - ref.double()).abs().max().item():.3e}, "
          f"{err:.3e} of max |logit| {ref.abs().max().item():.3f} (tolerance {tolerance:g})")
    return err <= tolerance


def main():
    hydra = Path(sys.argv[1])
    torch.manual_seed(0)
    ok = True
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ids = torch.randint(0, 256, (77,))
        models = {}
        for preset, dtype in [("qwen3-tiny", "f32"), ("hydrahead-tiny", "f32"), ("hydrahead-tiny", "bf16")]:
            models[f"{preset}-{dtype}"] = tmp / f"{preset}-{dtype}.h5"
            run(hydra, "init", "--preset", preset, "--weight-seed", "4", "--dtype", dtype, "--out", models[f"{preset}-{dtype}"])
        models["layerwise"] = tmp / "layerwise.h5"  # layer 0 all-GDN, layer 1 all-FA
        run(hydra, "convert", "--teacher", models["qwen3-tiny-f32"], "--fa-heads", "layerwise:2", "--seed", "2",
            "--out", models["layerwise"])
        # Every fusion variant but the default (hydrahead-tiny above), on mixed FA/GDN layers; the
        # fusion tensors are made non-trivial in the checkpoint (convert starts u, b at 0, w_fuse at 1).
        rng = np.random.default_rng(7)
        for fusion in ("norm", "scale", "concat", "gate"):
            models[f"fusion-{fusion}"] = tmp / f"fusion-{fusion}.h5"
            run(hydra, "convert", "--teacher", models["qwen3-tiny-f32"], "--fa-heads", "uniform:1", "--seed", "2",
                "--fusion", fusion, "--out", models[f"fusion-{fusion}"])
            with h5py.File(models[f"fusion-{fusion}"], "r+") as f:
                for name in f:
                    if ".self_attn.fuse_" in name:
                        data = f[name][...]
                        f[name][...] = (data + rng.normal(0, 0.5, size=data.shape)).astype(data.dtype)
        for name, model in models.items():
            folder = tmp / f"{name}-hf"
            run(hydra, "export", "--model", model, "--out", folder)
            ref = torch.from_numpy(hydra_logits(hydra, model, ids, tmp))
            m = hydrahead.load_model(folder, dtype=torch.float32)
            with torch.no_grad():
                got = m(ids[None]).logits[0]
            ok &= check(f"{name}: hydrahead.py vs hydra forward", got, ref)
            models[name] = (folder, ref, got)

        # A sharded export is the same model.
        sharded = tmp / "sharded-hf"
        run(hydra, "export", "--model", tmp / "hydrahead-tiny-f32.h5", "--out", sharded, "--max-shard-size", "100K")
        assert (sharded / "model.safetensors.index.json").exists()
        with torch.no_grad():
            a = hydrahead.load_model(sharded, dtype=torch.float32)(ids[None]).logits[0]
        ok &= check("sharded export vs one file (hydrahead.py)", a, models["hydrahead-tiny-f32"][2], 0.0)

        # Left padding, the cache, generate: against plain forwards of the same module.
        for name in ("qwen3-tiny-f32", "hydrahead-tiny-f32", "layerwise", "fusion-gate", "fusion-concat"):
            m = hydrahead.load_model(models[name][0], dtype=torch.float32)
            ok &= check_generation(name, m, ids)

        if hydrahead.HAVE_TRANSFORMERS:
            from transformers import AutoModelForCausalLM, Qwen3ForCausalLM
            folder, ref, _ = models["qwen3-tiny-f32"]
            hf = Qwen3ForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
            with torch.no_grad():
                ok &= check("qwen3-tiny: transformers Qwen3ForCausalLM vs hydra forward", hf(ids[None]).logits[0], ref)
            auto = AutoModelForCausalLM.from_pretrained(models["hydrahead-tiny-f32"][0], torch_dtype=torch.float32)
            if type(auto).__name__ != "HydraHeadForCausalLM":
                print(f"FAILED: AutoModelForCausalLM gave {type(auto).__name__}")
                ok = False
        else:
            print("SKIPPED (part): transformers is not installed: Qwen3ForCausalLM and AutoModelForCausalLM not checked "
                  "(generate was the module's own greedy loop)")
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


def check_generation(name, m, ids):
    ok = True
    with torch.no_grad():
        full = m(ids[None]).logits[0]
        # Left padding: the padded row's real positions give the unpadded logits.
        n, pad = 40, 5
        batch = torch.stack([ids[:n], torch.cat([torch.zeros(pad, dtype=ids.dtype), ids[:n - pad]])])
        mask = torch.ones_like(batch)
        mask[1, :pad] = 0
        padded = m(batch, attention_mask=mask).logits
        ok &= check(f"{name}: left-padded row", padded[1, pad:], full[:n - pad], 1e-5)
        ok &= check(f"{name}: unpadded row beside it", padded[0], full[:n], 1e-5)
        # The cache: a prefix, then token by token, equals the full forward.
        cache = hydrahead.HydraCache(m.config.num_hidden_layers)
        steps = [m(ids[None, :50], hydra_cache=cache).logits[0]]
        for t in range(50, 60):
            steps.append(m(ids[None, t:t + 1], hydra_cache=cache).logits[0])
        ok &= check(f"{name}: cached prefill + decode", torch.cat(steps), full[:60], 1e-5)
        # Greedy generation with the cache equals argmax over plain forwards, on a padded batch too.
        prompt = batch
        generated = m.generate(prompt, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        expect = []
        for row, p in ((0, ids[:n]), (1, ids[:n - pad])):
            seq = p.clone()
            for _ in range(6):
                seq = torch.cat([seq, m(seq[None]).logits[0, -1].argmax()[None]])
            expect.append(seq[-6:])
        same = torch.equal(generated[:, -6:], torch.stack(expect))
        print(f"{'ok' if same else 'FAILED'}: {name}: generate (cache, left padding) = greedy over plain forwards")
        ok &= same
    return ok


if __name__ == "__main__":
    sys.path.insert(0, str(Path(sys.argv[2]) / "cluster" / "torch"))
    import hydrahead
    sys.exit(main())
