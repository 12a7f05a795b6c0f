#!/usr/bin/env bash
# Issue 49: the same programs and the same A/A before and after a restructuring of the timing core. Prints the
# compiled fingerprint of gpt2-tiny measured in each compile scope and of examples/scripts/train_gpt.py under
# compile.scope=module, then an A/A task=compare (module against itself) on each. Run it alone on a quiet VM:
#
#   bash benchmarks/recipes/same_programs.sh benchmarks/results/cpu-2core/issue49/before
set -uo pipefail  # one failed command is recorded, the rest still run
cd "$(dirname "$0")/../.."
dir=${1:?results folder}
mkdir -p "$dir"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(tracking.enabled=false workload.device=cpu)
for scope in module regional train_step; do
  bash scripts/record.sh "$dir/measure_gpt2-tiny_$scope.txt" python -m autocompile +model=gpt2-tiny task=measure \
    compile.scope=$scope "${common[@]}" output_root="$out/m_$scope"
done
bash scripts/record.sh "$dir/measure_train_gpt_module.txt" python -m autocompile \
  script.path=examples/scripts/train_gpt.py script.args=--max_iters=5000 task=measure compile.scope=module \
  "${common[@]}" output_root="$out/m_script"
bash scripts/record.sh "$dir/compare_aa_gpt2-tiny.txt" python -m autocompile +model=gpt2-tiny task=compare \
  'compare.candidates=["compile.scope=module","compile.scope=module"]' "${common[@]}" output_root="$out/aa"
bash scripts/record.sh "$dir/compare_aa_train_gpt.txt" python -m autocompile \
  script.path=examples/scripts/train_gpt.py script.args=--max_iters=5000 task=compare \
  'compare.candidates=["compile.scope=module","compile.scope=module"]' "${common[@]}" output_root="$out/aa_script"
for f in "$dir"/measure_*.txt; do echo "$(basename "$f"): $(grep -o 'program fingerprint.*' "$f" | head -1)"; done \
  | tee "$dir/fingerprints.txt"
for f in "$dir"/compare_aa_*.txt; do echo "$(basename "$f"):"; grep -A3 "vs #0\|vs the first\|paired" "$f" | head -8; done \
  | tee "$dir/aa_summary.txt"
