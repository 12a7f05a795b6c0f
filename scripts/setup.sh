#!/usr/bin/env bash
# Set up a fresh machine for development and the tests: the package with the CPU torch 2.13 wheel
# and the dev extras, plus (as root on Debian) the PostgreSQL server that the shared-study test
# starts on 127.0.0.1. GPU users: pip install -e ".[dev]" with their own torch instead.
#
# PostgreSQL is part of the setup: where it cannot be installed (not root, no apt) this script fails,
# since on CI (CI=true) the shared-study test fails without it. AUTOCOMPILE_SKIP_POSTGRES=1 opts out on a
# development machine (the test is then skipped, with its reason in pytest's summary).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -e ".[cpu,dev]"
have_postgres() { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v runuser >/dev/null; }
if ! have_postgres; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  elif [ "${AUTOCOMPILE_SKIP_POSTGRES:-0}" = 1 ]; then
    echo "setup: PostgreSQL not installed (AUTOCOMPILE_SKIP_POSTGRES=1): its test will be skipped (and fail on CI)" >&2
    exit 0
  fi
  if ! have_postgres; then
    echo "setup: error: PostgreSQL (initdb) and runuser are needed for the shared-study test and could not be" \
         "installed (needs root and apt-get); install them, or set AUTOCOMPILE_SKIP_POSTGRES=1 off CI" >&2
    exit 1
  fi
fi
