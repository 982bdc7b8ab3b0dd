#!/bin/bash
# eval-niah --sp 4 and --sp 2 on 4 ranks, 16 single-needle samples of 1K on hydrahead-tiny, five A/B pairs
# run back to back; prints wall seconds, eval_s (the summary line) and the load average.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
H=${HYDRA:-build-cpu/bin/hydra}
for i in 1 2 3 4 5; do
 for sp in 4 2; do
  t0=$(date +%s.%N)
  out=$(mpirun -np 4 --oversubscribe $H eval-niah --preset hydrahead-tiny --device cpu --task single --lengths 1K --depths 50 --samples 16 --sp $sp --out /tmp/sp$sp.jsonl 2>/dev/null | tail -1)
  t1=$(date +%s.%N)
  echo "pair $i sp $sp wall $(echo "$t1-$t0"|bc) eval_s $(echo "$out" | python3 -c 'import sys,json; print(json.loads(sys.stdin.read())["eval_s"])') load $(cut -d' ' -f1 /proc/loadavg)"
 done
done
