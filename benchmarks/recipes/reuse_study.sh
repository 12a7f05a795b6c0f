#!/usr/bin/env bash
# Issue 52 on the quiet 2-core VM: the default gpt2-tiny study from two run roots sharing one tracking store, one after
# the other (the second re-verifies the first's answer), then the same with study.reuse=off (a full study). Each is
# recorded with scripts/record.sh (load, wall) under $OUT (default benchmarks/results/cpu-2core/issue52). MODEL picks
# another model config (default gpt2-tiny; e.g. MODEL=llama-tiny, transformers' LlamaForCausalLM).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/results/cpu-2core/issue52}
ROOT=${ROOT:-/tmp/issue52}
MODEL=${MODEL:-gpt2-tiny}
STORE=sqlite:///$ROOT/mlflow.db
mkdir -p "$ROOT" "$OUT"
for run in first second; do
  bash scripts/record.sh "$OUT/$run.txt" python -m autocompile +model=$MODEL output_root=$ROOT/$run tracking.uri=$STORE
done
if [ -n "${WITH_OFF:-}" ]; then
  bash scripts/record.sh "$OUT/reuse_off.txt" python -m autocompile +model=$MODEL output_root=$ROOT/off \
    tracking.uri=$STORE study.reuse=off
fi
