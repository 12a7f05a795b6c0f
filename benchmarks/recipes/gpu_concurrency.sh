#!/usr/bin/env bash
# Issue 51's GPU item, within one device call: the README's GPT-2 124M study (4 search trials, the best two confirmed
# side by side in 3 processes, no verdicts, no warm start, no MLflow), first with its processes in flight
# (launch.concurrency=0: from the 16 cores and the reference's peak memory; compiles overlap, each timed part has
# the GPU alone, the lease pausing the rest), then one process at a time (launch.concurrency=1), the order that
# leaves the in-flight run whole if the call runs short. Their walls and answers are the numbers to show; the
# 2026-11-27 record of the one-at-a-time study (benchmarks/results/h200/gpu_study.txt: 298 s with 2 confirmation
# processes) is the reference. Writes both logs, summaries and walls to $OUT (or ./gpu_concurrency_out).
#   bash benchmarks/recipes/gpu_concurrency.sh            # on the GPU box, with .whl/ carried (docs/gpu.md)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu_concurrency_out}
mkdir -p "$OUT"
source benchmarks/recipes/gpu_env.sh
ARGS=(+model=gpt2 study.n_trials=4 study.confirm_top=2 compare.processes=3 study.verdicts=none study.warm_start=false
      tracking.enabled=false "$@")
rc=0
for flight in 0 1; do
  start=$(date +%s)
  timeout "${STUDY_TIMEOUT_S:-270}" "$PY" -m autocompile "${ARGS[@]}" launch.concurrency=$flight \
    output_root=/tmp/gpu_concurrency/c$flight > "$OUT/concurrency$flight.txt" 2>&1 || rc=$?
  echo "launch.concurrency=$flight: exit $rc; wall $(( $(date +%s) - start )) s" | tee -a "$OUT/walls.txt"
  cp /tmp/gpu_concurrency/c$flight/*/summary.json "$OUT/concurrency$flight.summary.json" 2>/dev/null
  find /tmp/gpu_concurrency/c$flight -maxdepth 4 -name result.json | tar -czf "$OUT/results$flight.tgz" -T - 2>/dev/null
done
grep -h "^Best\|in flight" "$OUT"/concurrency*.txt | head -6
exit "$rc"
