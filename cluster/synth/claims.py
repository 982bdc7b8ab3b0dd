"""The paper's claims, each reproduced / not reproduced / undecided with its paired interval: claims.md
and claims.json from the comparisons decide.py made (decisions.json). Called by report.py and by
`decide.py RESULTS`.

Each claim is read off one primary comparison of decisions.json, in the band where the paper makes
it (beyond the finetune length, depths 0–75, the tasks the teacher solves; inside when a plan has no
longer length), with the others that bear on it listed beside it:

  selection > random          the 7:1 head set chosen by head scores (top-global:K, K = the per-layer
                              choice's size; else select-heads' per-layer heads) against random-global
                              draws of K heads; else the largest K of E2; else E1 (one head)
  scale_norm best             scale_norm against each other fusion: better than every one
  concat worst                each other fusion against concat: every one better
  static > gate beyond L      scale_norm against gate outside the finetune length
  head-wise ≈ layer-wise      7:1 head-wise against layer-wise at every layer position (pooled), same FA
                              budget; an equivalence claim
  the three stages each help  the full pipeline against the pipeline without align, without distill,
                              without finetune: better than each
  extrapolation beyond FA     7:1 head-wise against the fair all-FA arm (the RoPE teacher fine-tuned with
                              the students' finetune tokens) outside; the NoPE all-FA student beside it

A directional claim (A > B) is **reproduced** when the comparison's verdict is "A better", **not
reproduced** when it is "B better" or "equivalent", **undecided** when the interval straddles the
margin or both arms sit at the ceiling or floor (decide.py never calls those equivalent); an
equivalence claim is reproduced when the verdict is "equivalent", not reproduced when either arm is
better. A claim whose arms the plan did not run is "no data". Standard library only.
"""
import json
import os
import re

OUTSIDE = "outside, depths 0–75"
INSIDE = "inside, depths 0–75"


def _rows(decisions, prefix, band):
    return [r for r in decisions.get("comparisons", []) if r["question"].startswith(prefix) and r.get("band") == band]


def _direction(row):
    """'A', 'B', 'equivalent', 'bound', 'undecided' or 'missing' for one comparison row."""
    if row is None or "diff" not in row:
        return "missing"
    if row.get("bound"):
        return "bound"
    v = row["verdict"]
    if v.startswith("equivalent"):
        return "equivalent"
    if v == "undecided" or v == "missing data":
        return "undecided" if v == "undecided" else "missing"
    if row.get("lo", 0) > 0:
        return "A"
    if row.get("hi", 0) < 0:
        return "B"
    return "undecided"


def _directional(row):
    d = _direction(row)
    return {"A": "reproduced", "B": "not reproduced", "equivalent": "not reproduced",
            "bound": "undecided (at ceiling/floor)", "undecided": "undecided", "missing": "no data"}[d]


def _equivalence(row):
    d = _direction(row)
    return {"A": "not reproduced", "B": "not reproduced", "equivalent": "reproduced",
            "bound": "undecided (at ceiling/floor)", "undecided": "undecided", "missing": "no data"}[d]


def _all(verdicts):
    """A claim made of several comparisons that must all hold."""
    if not verdicts:
        return "no data"
    if any(v == "not reproduced" for v in verdicts):
        return "not reproduced"
    if all(v == "reproduced" for v in verdicts):
        return "reproduced"
    if all(v == "no data" for v in verdicts):
        return "no data"
    return "undecided" if not any(v.startswith("undecided (at") for v in verdicts) else "undecided (at ceiling/floor)"


def fmt(row):
    if row is None or "diff" not in row:
        return "—"
    s = f"{row['arm_a']} vs {row['arm_b']}: " if row.get("arm_a") else ""
    if "acc_a" in row:
        s += f"{row['acc_a']:.3f} vs {row['acc_b']:.3f}, "
    s += f"Δ {row['diff']:+.3f} [{row['lo']:+.3f}, {row['hi']:+.3f}]"
    if "items" in row:
        s += f", {row['items']} items"
    if row.get("bound"):
        s += f" ({row['bound']})"
    return s


def claims(decisions, plan):
    band = OUTSIDE if decisions.get("outside") else INSIDE
    out = []

    def add(claim, verdict, primary, evidence=()):
        out.append({"claim": claim, "verdict": verdict, "band": band, "primary": primary,
                    "evidence": [r for r in evidence if r is not primary]})

    # Selection > random.
    sel = _rows(decisions, "S per-layer top vs random", band)
    e2 = sorted(((int(m.group(1)), r) for r in _rows(decisions, "E2 K=", band)
                 for m in [re.match(r"E2 K=(\d+)", r["question"])] if m and r["arm_b"].startswith("random")),
                key=lambda kr: -kr[0])
    e1 = _rows(decisions, "E1 selected vs random head", band)
    k_sel = None
    if sel:
        m = re.search(r"K=(\d+)", sel[0]["question"])
        k_sel = int(m.group(1)) if m else None
    top_k = [r for k, r in e2 if k == k_sel]
    primary = (top_k or [r for _, r in e2] or sel or e1 or [None])[0]
    add("selection beats random choice (heads chosen by score vs random-global draws of as many)",
        _directional(primary), primary, sel + [r for _, r in e2] + e1)

    # Fusions.
    best = [r for r in _rows(decisions, "F scale_norm vs ", band) if "interaction" not in r["question"]]
    add("scale_norm is the best fusion (better than concat, gate, norm and scale)",
        _all([_directional(r) for r in best]), next((r for r in best if r["question"].endswith("concat")), best[0] if best else None), best)
    worst = _rows(decisions, "F concat worst:", band)
    sn_concat = next((r for r in best if r["question"].endswith("concat")), None)
    worst_all = worst + ([sn_concat] if sn_concat else [])
    add("concat is the worst fusion (every other fusion better)", _all([_directional(r) for r in worst_all]),
        sn_concat or (worst[0] if worst else None), worst_all)
    gate = next((r for r in best if r["question"] == "F scale_norm vs gate"), None)
    inter = [r for r in decisions.get("comparisons", []) if r["question"].endswith("gate: interaction")]
    add("static fusion (scale_norm) beats the gate beyond the training length", _directional(gate) if band == OUTSIDE else "no data",
        gate, inter)

    # Head-wise ≈ layer-wise.
    pooled = _rows(decisions, "L head-wise vs layer-wise ", band)
    single = [r for r in _rows(decisions, "L head-wise vs layerwise:", band)]
    primary = (pooled or single or [None])[0]
    add("head-wise ≈ layer-wise (the layer-wise FA layer at every position)", _equivalence(primary), primary, pooled + single)

    # The three stages.
    stages = _rows(decisions, "T full vs no ", band)
    verdicts = [_directional(r) for r in stages]
    need = {"align", "distill", "finetune"}
    have = {re.sub(r"^T full vs no ", "", r["question"]) for r in stages}
    v = _all(verdicts) if stages else "no data"
    if v == "reproduced" and not need <= have:
        v = f"undecided (no ablation of {', '.join(sorted(need - have))})"
    add("each of the three stages (align, distill, finetune) helps", v, stages[0] if stages else None, stages)

    # Extrapolation beyond full attention.
    fair = _rows(decisions, "X head-wise vs fair all-FA", band)
    nope = _rows(decisions, "L head-wise vs all-FA", band)
    add("the hybrid extrapolates beyond full attention (vs the RoPE teacher fine-tuned with the same tokens)",
        _directional(fair[0]) if fair and band == OUTSIDE else "no data", fair[0] if fair else None, nope)
    return out


def write(res, decisions, plan):
    rows = claims(decisions, plan)
    lines = ["# The paper's claims on this run", "",
             "Each claim is read off one paired comparison of decisions.md (Δ = A − B accuracy on the NIAH items both "
             "arms answered, 95% paired-bootstrap interval over items and the arms' seeds / draws / positions), in the "
             f"band named: **reproduced** when the interval lies on the claim's side of 0 (an equivalence claim: within "
             f"±{decisions.get('margin', 0.05):g}), **not reproduced** when it lies on the other side (or a difference "
             "is claimed and the arms are equivalent), **undecided** when it straddles, and **undecided (at "
             "ceiling/floor)** when both arms score ≥ 0.95 (or ≤ chance + 0.05): such items cannot show a difference. "
             "Other comparisons that bear on the claim follow it. cluster/synth/claims.py says how each claim is chosen.", "",
             "| claim | verdict | band | primary comparison: A vs B accuracy, Δ [95%], items | also |", "|---|---|---|---|---|"]
    for c in rows:
        also = "; ".join(f"{r['question']} ({r['band']}): {r['verdict']}, Δ {r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]"
                         for r in c["evidence"] if "diff" in r) or "—"
        lines.append(f"| {c['claim']} | **{c['verdict']}** | {c['band']} | {fmt(c['primary'])} | {also} |")
    with open(os.path.join(res, "claims.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(res, "claims.json"), "w") as f:
        json.dump([{"claim": c["claim"], "verdict": c["verdict"], "band": c["band"],
                    "primary": {k: c["primary"][k] for k in ("question", "arm_a", "arm_b", "band", "diff", "lo", "hi", "items",
                                                             "acc_a", "acc_b", "verdict", "bound") if k in c["primary"]}
                    if c["primary"] else None} for c in rows], f, indent=1)
    return lines
