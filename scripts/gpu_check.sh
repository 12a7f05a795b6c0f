#!/usr/bin/env bash
# One command of the GPU check, on a machine that has torch but no package index (the project's GPU
# boxes): install the carried wheels (.whl/, made by scripts/prepare_wheels.sh on a machine with
# pip access) and this package into $SITE, then run scripts/gpu_check.py with any arguments given.
# The whole check is three device commands of at most 9 minutes (`python scripts/gpu_check.py --dry-run`
# prints them with their budgets); results in $OUT or benchmarks/results/<device>/:
#   bash scripts/gpu_check.sh --stage tests,tf32
#   bash scripts/gpu_check.sh --stage table
#   bash scripts/gpu_check.sh --stage autotune,study
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=${SITE:-/tmp/site}
export GPU_CHECK_COMMAND="bash scripts/gpu_check.sh $*"
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
else
  echo "gpu_check: no .whl/ folder: the tuner's packages must already be installed (scripts/prepare_wheels.sh)" >&2
fi
# The package itself, non-editable (checks that its configs ship); without setuptools the tree on
# PYTHONPATH serves instead (trials import it from there anyway).
if ! "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . \
    >/tmp/gpu_check_install.log 2>&1; then
  echo "gpu_check: installing the package failed (see /tmp/gpu_check_install.log); using the tree" >&2
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" scripts/gpu_check.py "$@"
