#!/usr/bin/env bash
# Issue 29: each example script in examples/scripts/ tuned end to end on the CPU, as its README line says, with
# a 6-trial search; train_gpt.py answers every question, the others the ones they are there to show (a script
# runs the verdicts in fresh-process rounds, about 30 s a process here), so the four fit in about an hour on 2
# cores. Run alone (check `uptime`): each study is recorded by scripts/record.sh under
# benchmarks/results/cpu-2core/scripts/ with its load.
#
#   bash benchmarks/recipes/example_studies.sh                       # all four
#   bash benchmarks/recipes/example_studies.sh train_gpt_prepare     # one (train_gpt, train_gpt_prepare, train_hf, train_ddp)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=benchmarks/results/cpu-2core/scripts
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(study.n_trials=6 tracking.enabled=false)

for name in "${@:-train_gpt train_gpt_prepare train_hf train_ddp}"; do
  for one in $name; do
    case $one in
      train_gpt) extra=("script.args=--max_iters=5000") ;;  # side by side: every candidate in one process
      train_gpt_prepare)  # prepare() opens ac.policy and optim.impl
        extra=("script.args=--max_iters=5000" "study.verdicts=[compile.scope,ac.policy,optim.impl]") ;;
      train_hf) extra=("script.args=--max_iters=100" "study.verdicts=[compile.scope]") ;;
      train_ddp) extra=("script.args=--max_iters=50" workload.nproc_per_node=2 "study.verdicts=[compile.scope]") ;;
      *) echo "unknown example $one (train_gpt, train_gpt_prepare, train_hf, train_ddp)" >&2; exit 2 ;;
    esac
    bash scripts/record.sh "$out/study_$one.txt" python -m autocompile "script.path=examples/scripts/$one.py" \
      "${extra[@]}" "${common[@]}" "output_root=$work/$one"
  done
done
