#!/usr/bin/env python3
"""The experiment plan of cluster/synth/pipeline.sh: which students go through the stages.

A plan file is JSON:

  {"description": "...",
   "settings": {"samples": 16, "depths": "0,25,50,75,100", ...},   # optional: pipeline.sh --set NAME=VALUE
   "students": [
     {"name": "selected", "heads": "selected", "fusion": "scale_norm", "seed": 1, "curves": true},
     {"name": "random",   "heads": "random:1"},
     {"name": "head",     "heads": "each-head@2,3", "curves": false},
     ...]}

Per student: `name` (letters, digits, . _ -; unique), `heads` (below), `fusion` (hydra convert
--fusion; default scale_norm), `seed` (training seed: hydra train --seed, the data order, and
hydra convert --seed, the new GDN weights; default 1), `curves` (default true: NIAH at the
training length and the held-out losses at each quarter of every stage, hydra train --eval-every),
`stages` (the training stages it goes through, a comma list in order from align, distill, finetune;
default all three: a shorter list is a stage ablation, e.g. "distill,finetune" is "no align").
`heads` is any `hydra convert --fa-heads` spec, or
  teacher           no conversion: the teacher itself through the finetune stage with the students'
                    finetune tokens (the fair all-FA arm: RoPE attention fine-tuned at the finetune
                    length); its stages are "finetune" (the default for it, and the only choice);
  selected          the per-layer heads select-heads chose (file:RESULTS/heads.json, --per-layer, --budget
                    the setting select_budget, default 1);
  top-global:K, bottom-global:K   ranked by select-heads' composite scores (--scores heads.json is added);
  all-fa            every head full attention (uniform:H): the all-FA student, through the same stages;
  each-head[@L1,L2][/H1,H2]  one student per head of the listed layers (all without @) and heads (all
                    without /), named NAME-L.H, each a file: set with that one head: the single-head
                    landscape (a fixed subset of head indices is a fair sample of it: heads are
                    exchangeable before training);
  same-layer:N      the N-th best head (composite) of the layer that holds the model's best head
                    (same-layer:2: another head of the retrieval layer), one head in all;
  other-layer:N     the N-th best head outside that layer (other-layer:1: the best head elsewhere).
The last two are resolved from heads.json once select-heads has run (plan.py resolve).

  plan.py check PLAN                          validate (one line per problem, exit 2)
  plan.py students PLAN --layers L --heads H --results DIR
                                              the expanded students, one tab-separated line each:
                                              name, --fa-heads spec (or teacher), --scores file or -,
                                              fusion, seed, curves, stages
  plan.py probe-spec SPEC --heads H           a head set of the same cost for the step-time probe
                                              (one that needs no select-heads output)
  plan.py resolve SPEC --results DIR          same-layer:N / other-layer:N -> file:DIR/head_sets/SPEC.json
                                              from DIR/heads.json (other specs unchanged)
Standard library only.
"""
import argparse
import json
import os
import re
import sys

NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
EACH_HEAD = re.compile(r"^each-head(@(\d+(,\d+)*))?(/(\d+(,\d+)*))?$")
FUSIONS = ("scale_norm", "norm", "scale", "concat", "gate")
KINDS = ("uniform", "random", "random-global", "top-global", "bottom-global", "layerwise", "file")
STAGES = ("align", "distill", "finetune")
FULL = ",".join(STAGES)


def problems(plan):
    """Every problem of a plan, as one-line messages ([] when it is sound)."""
    out = []
    if not isinstance(plan, dict):
        return ["the plan must be a JSON object"]
    settings = plan.get("settings", {})
    if not isinstance(settings, dict) or not all(isinstance(v, (str, int, float)) for v in settings.values()):
        out.append("'settings' must map setting names to strings or numbers")
    students = plan.get("students")
    if not isinstance(students, list) or not students:
        return out + ["'students' must be a non-empty list"]
    seen = set()
    for i, s in enumerate(students):
        where = f"students[{i}]"
        if not isinstance(s, dict):
            out.append(f"{where} is not an object")
            continue
        unknown = set(s) - {"name", "heads", "fusion", "seed", "curves", "note", "stages"}
        if unknown:
            out.append(f"{where}: unknown keys {sorted(unknown)}")
        name = s.get("name")
        if not isinstance(name, str) or not NAME.match(name) or name == "teacher":
            out.append(f"{where}: name {name!r} must be letters, digits, . _ - (and not 'teacher')")
        elif name in seen:
            out.append(f"{where}: name {name!r} is used twice")
        seen.add(name)
        heads = s.get("heads")
        if not isinstance(heads, str):
            out.append(f"{where} ({name}): 'heads' must be a string")
        elif not (heads in ("selected", "all-fa", "teacher") or EACH_HEAD.match(heads) or re.match(r"^(same|other)-layer:[1-9]\d*$", heads)
                  or heads.split(":", 1)[0] in KINDS and ":" in heads):
            out.append(f"{where} ({name}): heads {heads!r} is not selected, all-fa, teacher, each-head[@L,...][/H,...], "
                       "same-layer:N, other-layer:N or a --fa-heads spec")
        if s.get("fusion", "scale_norm") not in FUSIONS:
            out.append(f"{where} ({name}): fusion {s.get('fusion')!r} is not one of {', '.join(FUSIONS)}")
        seed = s.get("seed", 1)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            out.append(f"{where} ({name}): seed {seed!r} must be an integer >= 0")
        if not isinstance(s.get("curves", True), bool):
            out.append(f"{where} ({name}): curves must be true or false")
        stages = s.get("stages", "finetune" if heads == "teacher" else FULL)
        parts = stages.split(",") if isinstance(stages, str) else None
        if not parts or any(p not in STAGES for p in parts) or parts != sorted(set(parts), key=STAGES.index):
            out.append(f"{where} ({name}): stages {stages!r} must be a comma list of {', '.join(STAGES)}, in that order, "
                       "each once")
        elif heads == "teacher" and stages != "finetune":
            out.append(f"{where} ({name}): the teacher arm goes through finetune only (align and distill would "
                       f"match the teacher to itself), not {stages!r}")
    return out


def load(path):
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"plan.py: {path}: {e}")
    bad = problems(plan)
    if bad:
        for b in bad:
            print(f"plan.py: {path}: {b}", file=sys.stderr)
        sys.exit(2)
    return plan


def write_heads_file(path, layers, heads, chosen):
    fa = [[h for (l, h) in chosen if l == layer] for layer in range(layers)]
    doc = {"format": "hydrahead-fa-heads", "version": 1, "num_layers": layers, "num_heads": heads, "fa_heads": fa}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def expand(plan, layers, heads, results):
    """The plan's students with every shorthand resolved: (name, spec, scores, fusion, seed, curves, stages)."""
    heads_json = os.path.join(results, "heads.json")
    rows = []
    for s in plan["students"]:
        fusion, seed, curves = s.get("fusion", "scale_norm"), s.get("seed", 1), s.get("curves", True)
        stages = s.get("stages", "finetune" if s["heads"] == "teacher" else FULL)
        spec, scores = s["heads"], "-"
        m = EACH_HEAD.match(spec)
        if m:
            which = [int(x) for x in m.group(2).split(",")] if m.group(2) else list(range(layers))
            which_heads = [int(x) for x in m.group(5).split(",")] if m.group(5) else list(range(heads))
            bad = [l for l in which if not 0 <= l < layers]
            if bad:
                sys.exit(f"plan.py: student {s['name']}: each-head names layers {bad}, the model has 0..{layers - 1}")
            bad = [h for h in which_heads if not 0 <= h < heads]
            if bad:
                sys.exit(f"plan.py: student {s['name']}: each-head names heads {bad}, the model has 0..{heads - 1}")
            os.makedirs(os.path.join(results, "head_sets"), exist_ok=True)
            for l in which:
                for h in which_heads:
                    path = os.path.join(results, "head_sets", f"{l}.{h}.json")
                    write_heads_file(path, layers, heads, [(l, h)])
                    rows.append((f"{s['name']}-{l}.{h}", f"file:{path}", "-", fusion, seed, curves, stages))
            continue
        if spec == "selected":
            spec = f"file:{heads_json}"
        elif spec == "all-fa":
            spec = f"uniform:{heads}"
        elif spec.split(":", 1)[0] in ("top-global", "bottom-global"):
            scores = heads_json
        rows.append((s["name"], spec, scores, fusion, seed, curves, stages))
    names = [r[0] for r in rows]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        sys.exit(f"plan.py: the expanded plan names {dup} twice")
    return rows


def resolve(spec, results):
    """same-layer:N / other-layer:N as a file: set from results/heads.json; other specs unchanged."""
    m = re.match(r"^(same|other)-layer:(\d+)$", spec)
    if not m:
        return spec
    path = os.path.join(results, "heads.json")
    try:
        with open(path) as f:
            composite = json.load(f)["scores"]["composite"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"plan.py: {spec} needs select-heads' scores.composite in {path}: {e}")
    layers, heads = len(composite), len(composite[0])
    ranked = sorted(((composite[l][h], l, h) for l in range(layers) for h in range(heads)), key=lambda x: (-x[0], x[1], x[2]))
    top_layer = ranked[0][1]
    pool = [(l, h) for _, l, h in ranked if (l == top_layer) == (m.group(1) == "same")]
    n = int(m.group(2))
    if not 1 <= n <= len(pool):
        sys.exit(f"plan.py: {spec}: there are {len(pool)} such heads")
    os.makedirs(os.path.join(results, "head_sets"), exist_ok=True)
    out = os.path.join(results, "head_sets", f"{spec.replace(':', '-')}.json")
    write_heads_file(out, layers, heads, [pool[n - 1]])
    return f"file:{out}"


def probe_spec(spec, heads):
    """A head set with the same number of FA heads that needs no select-heads output."""
    if spec.startswith("each-head") or "/head_sets/" in spec or re.match(r"^(same|other)-layer:", spec):
        return "random-global:1"
    if spec == "selected" or spec.startswith("file:"):
        return "uniform:1"
    if spec in ("all-fa", "teacher"):
        return f"uniform:{heads}"  # the teacher's finetune costs what an all-FA student's does
    kind, _, arg = spec.partition(":")
    if kind in ("top-global", "bottom-global"):
        return f"random-global:{arg}"
    return spec


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("plan")
    st = sub.add_parser("students")
    st.add_argument("plan")
    st.add_argument("--layers", type=int, required=True)
    st.add_argument("--heads", type=int, required=True)
    st.add_argument("--results", required=True)
    ps = sub.add_parser("settings")
    ps.add_argument("plan")
    rs = sub.add_parser("resolve")
    rs.add_argument("spec")
    rs.add_argument("--results", required=True)
    pr = sub.add_parser("probe-spec")
    pr.add_argument("spec")
    pr.add_argument("--heads", type=int, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "check":
        load(a.plan)
    elif a.cmd == "students":
        for row in expand(load(a.plan), a.layers, a.heads, a.results):
            print("\t".join(str(x).lower() if isinstance(x, bool) else str(x) for x in row))
    elif a.cmd == "settings":
        for k, v in load(a.plan).get("settings", {}).items():
            print(f"{k}={v}")
    elif a.cmd == "resolve":
        print(resolve(a.spec, a.results))
    elif a.cmd == "probe-spec":
        print(probe_spec(a.spec, a.heads))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
