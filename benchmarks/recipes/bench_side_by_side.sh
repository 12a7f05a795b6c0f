#!/usr/bin/env bash
# Side-by-side comparison on this machine, recorded under benchmarks/results/<dir>/ (scripts/record.sh:
# command, machine, load samples): an A/A test (default compile against itself) and eager against
# default compile, three separate runs. Run it alone on a quiet machine (uptime: load under ~1.2).
#
#   bash benchmarks/recipes/bench_side_by_side.sh [MODEL] [RESULTS_DIR]     # defaults: gpt2-tiny cpu-2core
set -uo pipefail  # one failed comparison is recorded, the rest still run
cd "$(dirname "$0")/../.."
model=${1:-gpt2-tiny}
dir=benchmarks/results/${2:-cpu-2core}
out=$(mktemp -d)
bash scripts/record.sh "$dir/compare_aa_$model.txt" python -m autocompile +model="$model" task=compare \
  'compare.candidates=["compile.scope=module","compile.scope=module"]' tracking.enabled=false output_root="$out/aa"
for run in 1 2 3; do
  bash scripts/record.sh "$dir/compare_eager_vs_compile_${model}_run$run.txt" python -m autocompile +model="$model" \
    task=compare 'compare.candidates=["compile.scope=module","compile.scope=none"]' tracking.enabled=false \
    output_root="$out/run$run"
done
for f in "$out"/*/*/compare.json; do
  python - "$f" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for p in r["pairs"]:
    s = p["step"]
    print(f"{sys.argv[1]}: {r['candidates'][p['b']]['label']} vs {r['candidates'][0]['label']}: {p['change']:+.2%} "
          f"[{s['low']:+.2%}, {s['high']:+.2%}] half-width {(s['high'] - s['low']) / 2:.2%} ({s['basis']}, "
          f"{s['processes']} processes, {s['rounds']} windows); wall {sum(r['wall_s'].values()):.0f} s")
EOF
done | tee "$dir/compare_summary_$model.txt"
