#!/usr/bin/env bash
# Issue 37: compile's activation memory budget against per-block checkpointing on gpt2-tiny, side by side
# (task=compare: step time paired window by window; peak memory and cold compile from each candidate's cold run
# alone). Run alone on the machine (check `uptime`); recorded with its load by scripts/record.sh.
#   bash benchmarks/recipes/memory_budget.sh [RESULTS_DIR]        # default benchmarks/results/cpu-2core
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-benchmarks/results/cpu-2core}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bash scripts/record.sh "$dir/memory_budget_gpt2-tiny.txt" python -m autocompile +model=gpt2-tiny task=compare \
  workload.device=cpu output_root="$out" tracking.enabled=false compare.processes=3 \
  'compare.candidates=["compile.scope=module","compile.scope=module ac.policy=block","compile.scope=module ac.policy=budget_0.5","compile.scope=module ac.policy=budget_0.25"]'
