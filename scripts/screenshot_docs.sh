#!/usr/bin/env bash
# Build the docs site and take a screenshot of its front page with headless Chromium
# (apt-get install chromium): docs/site-front-page.png.
set -euo pipefail
cd "$(dirname "$0")/.."
site=$(mktemp -d) profile=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; rm -rf "$site" "$profile"' EXIT
NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict -q --site-dir "$site"
python -m http.server 8765 --bind 127.0.0.1 --directory "$site" >/dev/null 2>&1 &
server=$!
sleep 1
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$profile" --window-size=1280,900 \
  --screenshot="$PWD/docs/site-front-page.png" http://127.0.0.1:8765/ 2>/dev/null
