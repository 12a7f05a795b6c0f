#!/usr/bin/env bash
# Set up a fresh machine for development and the tests: the package with the CPU torch 2.13 wheel
# and the dev extras, plus (as root on Debian) the PostgreSQL server that the shared-study test
# starts on 127.0.0.1. GPU users: pip install -e ".[dev]" with their own torch instead.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -e ".[cpu,dev]"
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  else
    echo "setup: PostgreSQL not installed (needs root and apt); its test will be skipped" >&2
  fi
fi
