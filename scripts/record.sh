#!/usr/bin/env bash
# Run a benchmark command and keep its output with what is needed to judge it: the command, the
# machine, torch, the wall time and the load average sampled every 30 s while it ran.
#
#   bash scripts/record.sh benchmarks/results/cpu-2core/NAME.txt python -m autocompile +model=gpt2-tiny ...
set -uo pipefail
out=$1
shift
mkdir -p "$(dirname "$out")"
loads=$(mktemp)
(while true; do cut -d' ' -f1 /proc/loadavg >> "$loads"; sleep 30; done) &
sampler=$!
started=$(date +%s)
body=$(mktemp)
"$@" > "$body" 2>&1
rc=$?
kill "$sampler" 2>/dev/null
wall=$(( $(date +%s) - started ))
{
  echo "# Command (from the repository root): $*"
  echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(python -c 'import platform, torch; print(platform.python_version(), "torch", torch.__version__)')"
  echo "# 1-min load average every 30 s (min / median / max over $(wc -l < "$loads") samples): $(sort -g "$loads" | awk '{a[NR]=$1} END {if (NR) print a[1], "/", a[int((NR+1)/2)], "/", a[NR]}')"
  echo "# exit $rc, wall ${wall} s"
  echo
  cat "$body"
} > "$out"
rm -f "$loads" "$body"
exit $rc
