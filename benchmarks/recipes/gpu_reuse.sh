#!/usr/bin/env bash
# Issue 52's GPU item, within one device call: the README's GPU study (GPT-2 124M, 4 search trials, the best two
# confirmed side by side in 3 processes, no verdicts) from one run root, then the same command from a second run root
# on the same tracking store: the second finds the first's answer by key and re-verifies it (the winner against eager
# and torch.compile(model), side by side, 3 processes); its wall is the number to show (goal: under 4 minutes).
# Writes both logs and summaries to $OUT (or ./gpu_reuse_out).
#   bash benchmarks/recipes/gpu_reuse.sh            # on the GPU box, with .whl/ carried (docs/gpu.md)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu_reuse_out}
mkdir -p "$OUT"
source benchmarks/recipes/gpu_env.sh
STORE=sqlite:////tmp/gpu_reuse/mlflow.db
mkdir -p /tmp/gpu_reuse
ARGS=(+model=gpt2 study.n_trials=4 study.confirm_top=2 compare.processes=3 study.verdicts=none study.warm_start=false
      tracking.uri=$STORE "$@")
rc=0
for root in first second; do
  start=$(date +%s)
  timeout "${STUDY_TIMEOUT_S:-330}" "$PY" -m autocompile "${ARGS[@]}" output_root=/tmp/gpu_reuse/$root \
    > "$OUT/$root.txt" 2>&1 || rc=$?
  echo "$root: exit $rc; wall $(( $(date +%s) - start )) s" | tee -a "$OUT/walls.txt"
  cp /tmp/gpu_reuse/$root/*/summary.json "$OUT/$root.summary.json" 2>/dev/null
done
grep -h "Reused\|reusing" "$OUT/second.txt" | head -3
exit "$rc"
