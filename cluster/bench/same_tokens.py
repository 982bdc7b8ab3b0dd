#!/usr/bin/env python3
"""Two `hydra generate` outputs of the same prompts, the decode step replayed as a CUDA graph and
launched eagerly (cluster/bench/decode_job.jobs): the same tokens for every prompt, and the summary
lines say which mode each ran.

  same_tokens.py GRAPH.jsonl EAGER.jsonl

Prints one line: whether the tokens are equal (and where the first difference is), each run's decode
tokens/s and cuda_graph flag. Exit status 0 only when every prompt's tokens are equal and the first
file ran the graph and the second did not.
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
    if len(argv) != 3:
        print("usage: same_tokens.py GRAPH.jsonl EAGER.jsonl", file=sys.stderr)
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
    if gs.get("cuda_graph") is not True or es.get("cuda_graph") is not False:
        problems.append(f"modes: cuda_graph {gs.get('cuda_graph')} and {es.get('cuda_graph')} (want true, false)")
    tokens = sum(len(j["tokens"]) for j in graph)
    print(f"generate tokens equal (graph vs eager): {'yes' if not problems else 'NO: ' + '; '.join(problems)}; "
          f"{len(graph)} prompt(s), {tokens} new tokens; decode tokens/s: graph {gs.get('decode_tokens_per_s', 0):.1f}, "
          f"eager {es.get('decode_tokens_per_s', 0):.1f}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
