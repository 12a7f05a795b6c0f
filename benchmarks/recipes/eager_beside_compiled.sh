#!/usr/bin/env bash
# Eager beside a compiled copy in one process (issue 35): interleaved runs, threads left to the scheduler,
# pinned one core each, and one thread; each run's summary and change points (benchmarks/recipes/eager_beside_compiled.py).
#   bash scripts/record.sh benchmarks/results/cpu-2core/eager_beside_compiled.txt bash benchmarks/recipes/eager_beside_compiled.sh 4
set -euo pipefail
pairs=${1:-4}
for r in $(seq "$pairs"); do
  for mode in "--bind none" "--bind pinned" "--threads 1"; do
    echo "== run $r: $mode"
    python benchmarks/recipes/eager_beside_compiled.py --windows 120 $mode | grep -E "^(change point|summary)"
  done
done
