#!/bin/bash
# eval-niah --sp 4 and --sp 2 on 4 ranks, 16 single-needle samples of 1K on hydrahead-tiny, A/B pairs
# run back to back; prints wall seconds, eval_s (the summary line) and the load average.
# Environment: HYDRA (the binary), PAIRS (5), MPI_ARGS (--oversubscribe: 4 ranks on this folder's
# 2 cores; "--bind-to core" gives each rank a core of its own where there are 4),
# OPENBLAS_NUM_THREADS (passed to the ranks as it is set).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
H=${HYDRA:-build-cpu/bin/hydra}
PAIRS=${PAIRS:-5}
read -ra mpi_args <<< "${MPI_ARGS:---oversubscribe}"
[[ -n "${OPENBLAS_NUM_THREADS:-}" ]] && mpi_args+=(-x OPENBLAS_NUM_THREADS)
echo "cores $(nproc), mpirun ${mpi_args[*]}, OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-unset}"
for i in $(seq 1 "$PAIRS"); do
 for sp in 4 2; do
  t0=$(date +%s.%N)
  out=$(mpirun -np 4 "${mpi_args[@]}" $H eval-niah --preset hydrahead-tiny --device cpu --task single --lengths 1K --depths 50 --samples 16 --sp $sp --out /tmp/sp$sp.jsonl 2>/dev/null | tail -1)
  t1=$(date +%s.%N)
  echo "pair $i sp $sp wall $(awk -v a="$t1" -v b="$t0" 'BEGIN { printf "%.3f", a - b }') eval_s $(echo "$out" | python3 -c 'import sys,json; print(json.loads(sys.stdin.read())["eval_s"])') load $(cut -d' ' -f1 /proc/loadavg)"
 done
done
# The two groupings' verdicts, sample for sample (the last pair's outputs).
python3 - /tmp/sp4.jsonl /tmp/sp2.jsonl <<'PY'
import json, sys
rows = [[r for r in map(json.loads, open(p)) if r.get("type") == "sample"] for p in sys.argv[1:]]
same = [(a["predicted"], a["correct"]) == (b["predicted"], b["correct"]) for a, b in zip(*rows)]
dlp = max(abs(a["logprob"] - b["logprob"]) for a, b in zip(*rows))
print(f"predictions and verdicts equal on {sum(same)} of {len(rows[0])}/{len(rows[1])} samples; max |logprob difference| {dlp:.3g}")
PY
