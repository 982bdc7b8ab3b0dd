#!/usr/bin/env python3
"""The language teacher's numbers (cluster/corpus/teacher_recipe.sh's last step): OUT/teacher.json and
OUT/teacher.md from the run's files.

  LM          held-out next-token loss of prose and code (hydra eval-lm, evals/lm-*.json) and its
              perplexity e^loss; the last training loss of each phase (runs/*/train.jsonl)
  retrieval   per task at the training length, on sets built from held-out text (evals/niah-*.jsonl,
              generated answers): exact-match accuracy with its 95% Wilson interval and RULER's mean
              recall; depth 100 apart from depths 0-75
  heads       select-heads' concentration (heads.json): each layer's share of the positive direct
              effect, the effective number of heads, and the layers of the 8 heads of largest direct
              effect; "spread" is the issue's aim: no layer above half of the direct effect and the
              top 8 heads in at least 3 layers

    python3 cluster/corpus/teacher_report.py OUT --tasks single,multikey --train-len 1024 [--seconds S]
Standard library only. Missing pieces are reported as missing (null), never invented.
"""
import argparse
import json
import math
import os


def wilson(k, n, z=1.959964):
    if n <= 0:
        return None
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [max(0.0, c - h), min(1.0, c + h)]


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def niah(path):
    """Accuracy and mean recall of one eval-niah run, all depths and depths 0-75 / 100 apart."""
    if not os.path.exists(path):
        return None
    samples = [json.loads(l) for l in open(path) if l.strip() and json.loads(l).get("type") == "sample"]
    if not samples:
        return None
    out = {}
    for label, keep in (("all", lambda d: True), ("depths_0_75", lambda d: d < 100), ("depth_100", lambda d: d == 100)):
        s = [x for x in samples if keep(int(x["depth"]))]
        if s:
            k = sum(1 for x in s if x["correct"])
            out[label] = {"samples": len(s), "accuracy": k / len(s), "wilson95": wilson(k, len(s)),
                          "mean_recall": sum(float(x.get("recall", 0)) for x in s) / len(s)}
    return out


def concentration(heads):
    if not heads or "scores" not in heads:
        return None
    direct = heads["scores"].get("direct")
    sel = heads.get("selection", {})
    conc = sel.get("concentration") or {}
    out = {"layer_share": conc.get("layer_share"), "effective_heads": conc.get("effective_heads"),
           "top_share": conc.get("top_share"), "fa_heads": heads.get("fa_heads")}
    if direct:
        ranked = sorted(((v, l, h) for l, row in enumerate(direct) for h, v in enumerate(row)), key=lambda x: (-x[0], x[1], x[2]))
        top = [(l, h) for _, l, h in ranked[:8]]
        out["top8_heads"] = top
        out["top8_layers"] = sorted({l for l, _ in top})
    share = out.get("layer_share")
    if share and "top8_layers" in out:
        out["max_layer_share"] = max(share)
        out["spread"] = max(share) <= 0.5 and len(out["top8_layers"]) >= 3
    return out


def last_loss(path):
    if not os.path.exists(path):
        return None
    steps = [json.loads(l) for l in open(path) if l.strip() and json.loads(l).get("type") == "step"]
    return {"steps": steps[-1]["step"], "loss": steps[-1]["loss"]} if steps else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tasks", required=True)
    ap.add_argument("--train-len", type=int, required=True)
    ap.add_argument("--seconds", type=float)
    a = ap.parse_args()
    r = {"train_len": a.train_len, "seconds": a.seconds, "lm": {}, "retrieval": {}, "training": {}}
    for cat in ("prose", "code"):
        j = read_json(os.path.join(a.out, "evals", f"lm-{cat}.json"))
        r["lm"][cat] = {"loss": j["loss"], "perplexity": math.exp(j["loss"]), "tokens": j.get("counted_tokens")} if j else None
    for phase in ("lm", "mix"):
        r["training"][phase] = last_loss(os.path.join(a.out, "runs", phase, "train.jsonl"))
    for t in a.tasks.split(","):
        r["retrieval"][t] = niah(os.path.join(a.out, "evals", f"niah-{t}.jsonl"))
    r["heads"] = concentration(read_json(os.path.join(a.out, "heads.json")))
    with open(os.path.join(a.out, "teacher.json.tmp"), "w") as f:
        json.dump(r, f, indent=1)
    os.replace(os.path.join(a.out, "teacher.json.tmp"), os.path.join(a.out, "teacher.json"))

    f3 = lambda x: "—" if x is None else f"{x:.3f}"
    md = ["# The language teacher", "", f"Training length {a.train_len}; the whole recipe took {a.seconds} s.", "",
          "| held-out | loss (nats) | perplexity | tokens |", "|---|---|---|---|"]
    for cat, v in r["lm"].items():
        md.append(f"| {cat} | {f3(v and v['loss'])} | {f3(v and v['perplexity'])} | {v and v['tokens'] or '—'} |")
    md += ["", "| task (held-out haystacks, generated) | accuracy, all depths [95%] | depths 0–75 | depth 100 | mean recall |",
           "|---|---|---|---|---|"]
    for t, v in r["retrieval"].items():
        cell = lambda k: "—" if not v or k not in v else f"{v[k]['accuracy']:.2f} [{v[k]['wilson95'][0]:.2f}, {v[k]['wilson95'][1]:.2f}] of {v[k]['samples']}"
        md.append(f"| {t} | {cell('all')} | {cell('depths_0_75')} | {cell('depth_100')} | {f3(v and v['all']['mean_recall'])} |")
    h = r["heads"]
    md += [""]
    if h:
        md += [f"select-heads: effective heads {f3(h.get('effective_heads'))}; layer shares of the positive direct effect "
               f"{[round(x, 3) for x in h.get('layer_share') or []]}; the 8 heads of largest direct effect "
               f"{h.get('top8_heads')} lie in layers {h.get('top8_layers')}; spread (no layer above 0.5, top 8 in ≥ 3 layers): "
               f"**{h.get('spread')}**"]
    else:
        md += ["select-heads: no heads.json (the step failed: logs/select-heads.log)"]
    with open(os.path.join(a.out, "teacher.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
