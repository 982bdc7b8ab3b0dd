#!/usr/bin/env bash
# A/B: the same command with two builds of hydra, side by side, in one job — the form every
# comparison in cluster/results takes (a figure is only compared with one measured in the same job).
#
#   cluster/ab.sh [options] COMMIT_A COMMIT_B -- COMMAND [ARG ...]
#
# Each commit is checked out in its own git worktree (under $AB_WORKDIR, default
# /tmp/hydra-ab/<commit>) and built there with cluster/build.sh (HYDRA_CMAKE_FLAGS and the other
# knobs of build.sh apply). Then COMMAND runs with build a, build b, a, b, ... (--repeat N rounds,
# interleaved, so a drift of the machine hits both alike). In COMMAND's arguments `{bin}` stands for
# the build's binary folder; the environment also holds HYDRA=<bin>/hydra, HYDRA_BIN_DIR=<bin>,
# AB_LABEL (a or b) and AB_COMMIT. Every run's output goes to OUT/a.log or OUT/b.log (appended,
# each run under a "== label commit round" line), and one summary line per run to OUT/runs.tsv
# (label, commit, round, exit status, seconds), which is also printed. The worktrees and their
# builds stay for the next run (`git worktree remove DIR` when done).
#
# Options:
#   --out DIR          where the logs go (default: ab-out/ in the current folder)
#   --repeat N         rounds (default 1)
#   --targets "T ..."  build targets (default: hydra; e.g. "hydra test_cuda")
#   --build-only       build both and print their binary folders; run nothing (build here, then
#                      carry the folders to a device machine and use --bins there)
#   --bins DIR_A DIR_B run with binaries built earlier (no checkout, no build; COMMIT_A/B are labels)
#
# Example (one GPU): the 64K finetune step of two commits, 3 rounds:
#   cluster/ab.sh --repeat 3 370d6ed HEAD -- {bin}/hydra train --stage finetune --preset hydrahead-1.7b \
#       --data tok.h5 --seq-len 64K --steps 4 --device cuda --out-dir /tmp/ab-run --save-every -1
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out=ab-out repeat=1 targets=hydra build_only=0 bin_a="" bin_b=""
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --targets) targets=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --bins) bin_a=$2; bin_b=$3; shift 3 ;;
    -h|--help) usage 0 ;;
    --) break ;;
    -*) echo "ab.sh: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || usage
commit_a=$1 commit_b=$2
shift 2
if [ "$build_only" = 0 ]; then
  [ "${1:-}" = "--" ] && [ $# -ge 2 ] || { echo "ab.sh: give the command after --" >&2; usage; }
  shift
fi
[[ "$repeat" =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: --repeat must be a positive integer (got '$repeat')" >&2; exit 2; }

# Checks out and builds one commit; prints its binary folder.
build() {
  local commit=$1 sha dir
  sha=$(git -C "$root" rev-parse --verify --short=12 "$commit^{commit}") || { echo "ab.sh: no commit '$commit'" >&2; exit 2; }
  dir="${AB_WORKDIR:-/tmp/hydra-ab}/$sha"
  if [ ! -d "$dir" ]; then
    git -C "$root" worktree add --detach "$dir" "$sha" >&2
  fi
  # shellcheck disable=SC2086
  HYDRA_BUILD_DIR="$dir/build" "$dir/cluster/build.sh" $targets >&2
  echo "$dir/build/bin"
}

if [ -z "$bin_a" ]; then
  bin_a=$(build "$commit_a")
  bin_b=$(build "$commit_b")
fi
for b in "$bin_a" "$bin_b"; do
  [ -x "$b/hydra" ] || { echo "ab.sh: $b/hydra is not an executable" >&2; exit 2; }
done
if [ "$build_only" = 1 ]; then
  printf 'a\t%s\t%s\nb\t%s\t%s\n' "$commit_a" "$bin_a" "$commit_b" "$bin_b"
  exit 0
fi

mkdir -p "$out"
printf 'label\tcommit\tround\texit\tseconds\n' > "$out/runs.tsv"
status=0
for round in $(seq 1 "$repeat"); do
  for label in a b; do
    if [ $label = a ]; then bin=$bin_a commit=$commit_a; else bin=$bin_b commit=$commit_b; fi
    args=()
    for arg in "$@"; do args+=("${arg//\{bin\}/$bin}"); done
    echo "== $label $commit round $round: ${args[*]}" >> "$out/$label.log"
    start=$(date +%s.%N)
    rc=0
    HYDRA="$bin/hydra" HYDRA_BIN_DIR="$bin" AB_LABEL=$label AB_COMMIT=$commit "${args[@]}" >> "$out/$label.log" 2>&1 || rc=$?
    seconds=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { print e - s }')
    printf '%s\t%s\t%s\t%s\t%.3f\n' "$label" "$commit" "$round" "$rc" "$seconds" >> "$out/runs.tsv"
    [ "$rc" = 0 ] || status=1
  done
done
column -t -s $'\t' "$out/runs.tsv" 2>/dev/null || cat "$out/runs.tsv"
exit $status
