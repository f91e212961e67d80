#!/usr/bin/env bash
# Start Ray's head on this node, for a SAGE run on verl over several nodes (docs/verl.md, "2 nodes").
#   bash scripts/verl/ray_head.sh            # then, on every other node: bash scripts/verl/ray_worker.sh HEAD_IP
#   .venv-verl/bin/python -m sage_rl.integrations.verl.main train CONFIG --address auto   # on this node
#   .venv-verl/bin/ray stop                  # on every node, when done
# Every node needs the same checkout at the same path, with .venv-verl built by `scripts/setup_verl.sh --gpu`
# (the agent-loop workers import sage-rl and run its sandbox or AppWorld on whichever node Ray puts them).
# Ray 2.60 authenticates with a token: this script makes one (~/.ray/auth_token) if there is none; give
# the worker nodes the same file, or export RAY_AUTH_TOKEN=<its contents> there, before ray_worker.sh.
# Environment: RAY_PORT (6379), RAY_NUM_GPUS (default: all visible), SAGE_RL_VERL_VENV (.venv-verl).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${SAGE_RL_VERL_VENV:-.venv-verl}
PORT=${RAY_PORT:-6379}
if [ ! -x "$VENV/bin/ray" ]; then
  echo "error: $VENV/bin/ray not found; build the venv first: bash scripts/setup_verl.sh --gpu" >&2
  exit 2
fi
export RAY_AUTH_MODE=token
"$VENV/bin/ray" get-auth-token --generate >/dev/null
args=(start --head --port="$PORT" --dashboard-host=127.0.0.1)
[ -n "${RAY_NUM_GPUS:-}" ] && args+=(--num-gpus="$RAY_NUM_GPUS")
"$VENV/bin/ray" "${args[@]}"
ip=$(hostname -I 2>/dev/null | awk '{print $1}')
echo "[ray-head] up at ${ip:-<this node>}:$PORT. On each worker node: copy ~/.ray/auth_token from this node"
echo "           (or export RAY_AUTH_TOKEN), then: bash scripts/verl/ray_worker.sh ${ip:-HEAD_IP}"
