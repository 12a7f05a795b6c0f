# Sourced by the GPU recipes (gpu_study.sh, gpu_reuse.sh) from the repository root: the carried wheels (.whl/, see
# docs/gpu.md) installed into $SITE, and the interpreter ($PY) that imports this checkout and them.
SITE=${SITE:-/tmp/site}
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
