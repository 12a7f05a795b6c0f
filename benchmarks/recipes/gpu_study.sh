#!/usr/bin/env bash
# The README's own study on one GPU, within one device call (issue 35): GPT-2 124M, 4 search trials (the
# practitioner's four: eager, torch.compile(model), regional and the compiled train step, in bf16 autocast on a
# GPU that runs it natively), the best two (and the best of each scope the search cannot rule out) confirmed side
# by side in 4 processes (issue 50: the 2 processes of the 2026-11-27 record left +9.2 % [-10.9, +33.7]; a decision
# needs at least 3; the default 7 would not fit one 9-minute call at ~60 s a process), no verdicts, no
# warm-start re-measure, no MLflow. Writes the study's output, summary and trial table to $OUT (or ./gpu_study_out).
# Issue 50's GPU item: this command decides the train step against torch.compile(model) in bf16 in its confirmation.
#   bash benchmarks/recipes/gpu_study.sh            # on the GPU box, with .whl/ carried (docs/gpu.md)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu_study_out}
mkdir -p "$OUT"
source benchmarks/recipes/gpu_env.sh
ARGS=(+model=gpt2 study.n_trials=4 study.confirm_top=2 compare.processes="${PROCESSES:-4}" study.verdicts=none
      study.warm_start=false tracking.enabled=false output_root=/tmp/gpu_study "$@")
{
  echo "command: python -m autocompile ${ARGS[*]}"
  echo "date: $(date -u '+%F %T') UTC; host: $(nproc) CPUs; $(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
  "$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  git log -1 --format='commit %H' 2>/dev/null || true
} | tee "$OUT/gpu_study.txt"
start=$(date +%s)
timeout "${STUDY_TIMEOUT_S:-500}" "$PY" -m autocompile "${ARGS[@]}" 2>&1 | tee -a "$OUT/gpu_study.txt"
rc=${PIPESTATUS[0]}
echo "exit $rc; wall $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu_study.txt"
run=$(ls -d /tmp/gpu_study/*/ 2>/dev/null | head -1)
if [ -n "$run" ]; then
  cp "$run/summary.json" "$OUT/" 2>/dev/null
  cp "$run/best_config.py" "$OUT/" 2>/dev/null
  find "$run" -maxdepth 3 -name result.json | head -40 | tar -czf "$OUT/results.tgz" -T - 2>/dev/null
fi
exit "$rc"
