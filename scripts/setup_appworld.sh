#!/usr/bin/env bash
# AppWorld's own virtualenv (.venv-appworld: appworld==0.1.3.post1 pins pydantic<2, so it cannot
# share .venv), its decrypted app code (inside that venv only: never commit it), and optionally its
# task data. Idempotent: a second run only checks (about a second).
#   bash scripts/setup_appworld.sh                                   # venv + code, no data
#   SAGE_RL_APPWORLD_BUNDLE=/path/data-0.1.0.bundle bash scripts/setup_appworld.sh   # + data (sha256 checked)
#   SAGE_RL_APPWORLD_DOWNLOAD=1 bash scripts/setup_appworld.sh       # + `appworld download data`
# Locations: $SAGE_RL_APPWORLD_VENV (default .venv-appworld), $SAGE_RL_APPWORLD_ROOT (default .cache/appworld).
set -euo pipefail
cd "$(dirname "$0")/.."
args=(setup)
if [ -n "${SAGE_RL_APPWORLD_BUNDLE:-}" ]; then
  args+=(--bundle "$SAGE_RL_APPWORLD_BUNDLE")
elif [ "${SAGE_RL_APPWORLD_DOWNLOAD:-0}" = 1 ]; then
  args+=(--download)
fi
exec .venv/bin/python -m sage_rl.cli.appworld "${args[@]}"
