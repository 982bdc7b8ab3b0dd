#!/usr/bin/env python3
"""Two `hydra generate` outputs of the same prompts, the decode step replayed as a CUDA graph and
launched eagerly (cluster/bench/decode_job.jobs): the same tokens for every prompt, and the summary
lines say which mode each ran. With --same-mode, two runs in one mode with kernel choices that must
keep the bits (cluster/bench/decode_fused.jobs: the GEMV with the norms fused against the GEMV).

  same_tokens.py [--same-mode] GRAPH.jsonl EAGER.jsonl
  same_tokens.py --same-mode A.jsonl B.jsonl

Prints one line: whether the tokens are equal (and where the first difference is), each run's decode
tokens/s and cuda_graph flag. Exit status 0 only when every prompt's tokens are equal and the first
file ran the graph and the second did not (--same-mode: both ran the same mode).
"""
import json
import sys


def read(path):
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    prompts = [j for j in lines if not j.get("summary")]
    summary = next((j for j in lines if j.get("summary")), {})
    return prompts, summary


def main(argv):
    same_mode = len(argv) > 1 and argv[1] == "--same-mode"
    if same_mode:
        argv = argv[:1] + argv[2:]
    if len(argv) != 3:
        print("usage: same_tokens.py [--same-mode] GRAPH.jsonl EAGER.jsonl", file=sys.stderr)
        return 2
    (graph, gs), (eager, es) = read(argv[1]), read(argv[2])
    problems = []
    if len(graph) != len(eager) or not graph:
        problems.append(f"{len(graph)} prompts vs {len(eager)}")
    for i, (a, b) in enumerate(zip(graph, eager)):
        if a["tokens"] != b["tokens"]:
            n = next((k for k, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y),
                     min(len(a["tokens"]), len(b["tokens"])))
            problems.append(f"prompt {i} differs from token {n} of {len(a['tokens'])}")
    if same_mode and (gs.get("cuda_graph") not in (True, False) or gs.get("cuda_graph") != es.get("cuda_graph")):
        problems.append(f"modes: cuda_graph {gs.get('cuda_graph')} and {es.get('cuda_graph')} (want the same)")
    if not same_mode and (gs.get("cuda_graph") is not True or es.get("cuda_graph") is not False):
        problems.append(f"modes: cuda_graph {gs.get('cuda_graph')} and {es.get('cuda_graph')} (want true, false)")
    tokens = sum(len(j["tokens"]) for j in graph)
    first, second = ("first", "second") if same_mode else ("graph", "eager")
    print(f"generate tokens equal ({'same mode, other kernels' if same_mode else 'graph vs eager'}): "
          f"{'yes' if not problems else 'NO: ' + '; '.join(problems)}; "
          f"{len(graph)} prompt(s), {tokens} new tokens; decode tokens/s: {first} {gs.get('decode_tokens_per_s', 0):.1f}, "
          f"{second} {es.get('decode_tokens_per_s', 0):.1f}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
