#!/usr/bin/env bash
# Issue 36: a script study's confirmation timed side by side in the script's own process (the default) against
# fresh-process rounds (pass study.side_by_side=false). The script is the two-block model of
# tests/test_script_sidebyside.py (its loop runs until the agent ends it), written to a temporary folder.
#
#   bash scripts/record.sh benchmarks/results/cpu-2core/scripts/blocks_confirm_side_by_side.txt \
#       bash benchmarks/recipes/script_side_by_side.sh
#   bash scripts/record.sh benchmarks/results/cpu-2core/scripts/blocks_confirm_fresh_processes.txt \
#       bash benchmarks/recipes/script_side_by_side.sh study.side_by_side=false
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python -c "from tests.test_script_sidebyside import BLOCKS; print(BLOCKS)" > "$dir/blocks.py"
cd "$dir"
python -m autocompile script.path=blocks.py output_root="$dir/runs" study.n_trials=4 study.verdicts=none \
    compile.backend=aot_eager tracking.enabled=false "$@"
