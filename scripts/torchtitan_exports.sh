#!/usr/bin/env bash
# Load autocompile's torchtitan exports with torchtitan's own config code at a pinned commit of each format:
#   TOML:   tag v0.2.2 (73a0e69, the last release that reads TOML; ConfigManager --job.config_file)
#   Python: main at b5bcd76 (2026-08-21; config functions since PR #2386, ConfigManager --module/--config)
# Each gets a virtual environment (beside this project's, its site packages visible: torch comes from there) with
# that torchtitan and its own dependencies, then tests/test_torchtitan_export.py runs with both
# (AUTOCOMPILE_TORCHTITAN_PYTHONS). Needs network access to GitHub and PyPI, or TORCHTITAN_REPO=<a local clone or
# mirror of pytorch/torchtitan> and a package index. torchtitan imports triton, which pip installs on a CPU machine too.
#   bash scripts/torchtitan_exports.sh [WORKDIR]      (default: /tmp/autocompile-torchtitan)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:-/tmp/autocompile-torchtitan}
REPO=${TORCHTITAN_REPO:-https://github.com/pytorch/torchtitan.git}
TOML_COMMIT=73a0e6979dd10b6b1904098eb3c8f62c18ab87ce     # v0.2.2
PYTHON_COMMIT=b5bcd76c66d0acb1a08b176d9639425bc55e0b2a   # autocompile/report/export/titan_python.py TITAN_PYTHON_COMMIT
mkdir -p "$WORK"
[ -d "$WORK/torchtitan.git" ] || git clone --bare --quiet "$REPO" "$WORK/torchtitan.git"

checkout() {  # commit dir: the torchtitan package sources at that commit (not its test assets)
    rm -rf "$2" && mkdir -p "$2"
    git --git-dir="$WORK/torchtitan.git" archive "$1" torchtitan pyproject.toml | tar -x -C "$2"
}

on_path() {  # venv dir: the venv imports torchtitan from dir
    echo "$2" > "$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torchtitan_src.pth"
}

venv() {  # dir: a venv that sees this interpreter's packages (torch) and has torchtitan's own dependencies
    python -m venv --system-site-packages "$1"
    "$1/bin/pip" install --quiet --upgrade pip
}

# TOML: the tag's sources (PyPI's torchtitan==0.2.2 wheel holds the same), with what its config code imports.
checkout "$TOML_COMMIT" "$WORK/toml-src"
venv "$WORK/toml-venv"
on_path "$WORK/toml-venv" "$WORK/toml-src"
"$WORK/toml-venv/bin/pip" install --quiet tyro triton tomli

# Python config functions: main at the pinned commit, with every dependency its pyproject names.
checkout "$PYTHON_COMMIT" "$WORK/python-src"
venv "$WORK/python-venv"
on_path "$WORK/python-venv" "$WORK/python-src"
deps=$("$WORK/python-venv/bin/python" -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' "$WORK/python-src/pyproject.toml")
mapfile -t deps <<< "$deps"
"$WORK/python-venv/bin/pip" install --quiet "${deps[@]}" triton

cd "$ROOT"
AUTOCOMPILE_TORCHTITAN_PYTHONS="$WORK/toml-venv/bin/python:$WORK/python-venv/bin/python" \
    python -m pytest -q -n 0 -rs tests/test_torchtitan_export.py
