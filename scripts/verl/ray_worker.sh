#!/usr/bin/env bash
# Join this node to the Ray cluster whose head runs scripts/verl/ray_head.sh (docs/verl.md, "2 nodes").
#   bash scripts/verl/ray_worker.sh HEAD_IP [PORT]
# Needs the head's token: the head's ~/.ray/auth_token copied to this node, or RAY_AUTH_TOKEN set.
# Environment: RAY_NUM_GPUS (default: all visible), SAGE_RL_VERL_VENV (.venv-verl).
set -euo pipefail
cd "$(dirname "$0")/../.."
HEAD=${1:?usage: bash scripts/verl/ray_worker.sh HEAD_IP [PORT]}
PORT=${2:-${RAY_PORT:-6379}}
VENV=${SAGE_RL_VERL_VENV:-.venv-verl}
if [ ! -x "$VENV/bin/ray" ]; then
  echo "error: $VENV/bin/ray not found; build the venv first: bash scripts/setup_verl.sh --gpu" >&2
  exit 2
fi
if [ -z "${RAY_AUTH_TOKEN:-}" ] && [ ! -s "$HOME/.ray/auth_token" ]; then
  echo "error: no Ray token: copy the head node's ~/.ray/auth_token here, or export RAY_AUTH_TOKEN" >&2
  exit 2
fi
export RAY_AUTH_MODE=token
args=(start --address="$HEAD:$PORT")
[ -n "${RAY_NUM_GPUS:-}" ] && args+=(--num-gpus="$RAY_NUM_GPUS")
"$VENV/bin/ray" "${args[@]}"
echo "[ray-worker] joined $HEAD:$PORT"
