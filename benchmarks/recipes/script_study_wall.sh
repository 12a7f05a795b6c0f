#!/usr/bin/env bash
# Issue 36: the wall time of a whole script study, by phase, and its per-trial overhead. The script is the two-block
# model of tests/test_script_sidebyside.py (its loop runs until the agent ends it), written to a temporary folder;
# the study runs at the defaults but for the test backend and six trials. AUTOCOMPILE_TREE=DIR runs the autocompile
# of another checkout (a worktree of an earlier commit: the "before"), on the same script and command.
#
#   bash scripts/record.sh benchmarks/results/cpu-2core/scripts/blocks_study_wall_after.txt \
#       bash benchmarks/recipes/script_study_wall.sh
#   git worktree add /tmp/before 168cbd5 && AUTOCOMPILE_TREE=/tmp/before bash scripts/record.sh \
#       benchmarks/results/cpu-2core/scripts/blocks_study_wall_before.txt bash benchmarks/recipes/script_study_wall.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python -c "from tests.test_script_sidebyside import BLOCKS; print(BLOCKS)" > "$dir/blocks.py"
tree=${AUTOCOMPILE_TREE:-$PWD}
echo "autocompile at $(git -C "$tree" log --oneline -1)"
cd "$dir"
PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" python -m autocompile script.path=blocks.py output_root="$dir/runs" \
    study.n_trials=6 compile.backend=aot_eager tracking.enabled=false "$@"
# Per trial: its wall time and what of it was the process's own overhead (start, imports, the script's build).
python - "$dir/runs" <<'PY'
import json, pathlib, statistics, sys
rows = []
for f in sorted(pathlib.Path(sys.argv[1]).glob("*/trials/*/result.json")):
    r = json.loads(f.read_text())
    t = r.get("timeline") or {}
    if r.get("wall_s") and t.get("build_done") and t.get("launch"):
        rows.append((f.parent.name, r["wall_s"], t["build_done"] - t["launch"]))
for name, wall, over in rows:
    print(f"trial {name}: wall {wall:.1f} s, overhead before the first step {over:.1f} s")
if rows:
    print(f"median per search trial: wall {statistics.median(w for _, w, _ in rows):.1f} s, "
          f"overhead {statistics.median(o for _, _, o in rows):.1f} s")
PY
