#!/usr/bin/env bash
# Build .whl/: the wheels the tuner needs on a GPU box that has no package index, made on a machine
# with pip access (any OS or Python: wheels are fetched for CPython 3.12 on x86-64 Linux).
#   bash scripts/prepare_wheels.sh            # then carry .whl (git-ignored) with the tree; see docs/gpu.md
#
# The GPU boxes already hold torch 2.11, triton, transformers, numpy, pyyaml, psutil, rich, tqdm,
# packaging, matplotlib, scipy, pytest (+ xdist, timeout): only what is missing travels, with --no-deps,
# so every dependency is named here. Versions are the ones the CPU tests run with.
#   optuna -> colorlog (imported by optuna.logging); alembic/sqlalchemy only for RDB storages: the
#     default journal-file storage needs neither, so they stay home.
#   hydra-core, omegaconf -> antlr4-python3-runtime 4.9.x, which PyPI has as an sdist only: built
#     into a pure-Python wheel here.
# Left out on purpose: mlflow (hundreds of MB with its dependencies; the GPU check runs the study with
# tracking.enabled=false) and plotly (only the MLflow parent run's plots use it).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-.whl}
PY=${PYTHON:-python3}
WHEELS=(optuna==5.0.0 colorlog==6.12.0 hydra-core==1.3.8 omegaconf==2.3.1)
SDISTS=(antlr4-python3-runtime==4.9.3)

rm -rf "$DEST"
mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "${WHEELS[@]}"
"$PY" -m pip wheel -q --no-deps -w "$DEST" "${SDISTS[@]}"

# A wheel that is not pure Python would have to match the GPU box's CPython 3.12 on x86-64 Linux.
for w in "$DEST"/*.whl; do
  case "$w" in
    *-py3-none-any.whl | *-py2.py3-none-any.whl | *-cp312-*manylinux*x86_64*.whl) ;;
    *) echo "prepare_wheels: $w does not install on CPython 3.12 x86-64 Linux" >&2; exit 1 ;;
  esac
done
ls -l "$DEST"
du -sh "$DEST"
