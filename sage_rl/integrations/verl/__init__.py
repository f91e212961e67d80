"""SAGE on verl: sage-rl's rollout core driven by verl's distributed trainer (issue 13).

verl runs the cluster: vLLM rollout servers, FSDP actor workers, Ray, the data loader and the
optimizer. sage-rl keeps what makes the algorithm SAGE: the chain of K tasks with its growing
skill library, the sandboxed environment, the skill-integrated reward, the per-(task sequence,
position) advantages and the paper's loss scale. The pieces:

    config.py      VerlRunConfig: the sage-rl side of a run, and the verl keys it sets (pure pydantic)
    bridge.py      the one module that touches sage-rl's rollout internals (suite, runner, chains)
    policy.py      VerlServerPolicy: a sage-rl Policy over verl's LLM server client (token in, token out)
    agent_loop.py  SageChainAgentLoop: one verl session = one chain of K tasks -> K outputs
    advantages.py  per-(row, position) advantages and the loss scale, pure (no verl import)
    trainer.py     SageTrainer (verl's sync V1 trainer with SAGE's advantage step) and its task runner
    compose.py     the verl Hydra config of a run
    data.py        PocketWorld / AppWorld task sequences -> verl's parquet dataset files
    main.py        ``python -m sage_rl.integrations.verl.main {prepare-data,show-config,train}``
    testing.py     fakes of verl's server client and TransferQueue for CPU tests

verl is pinned exactly (``VERL_VERSION``): the V1 trainer's internals this adapter relies on are
private and change between minor versions (docs/verl.md, tests/test_verl_contract.py). It lives
in its own virtual environment, ``.venv-verl`` (``bash scripts/setup_verl.sh``).
"""

from __future__ import annotations

VERL_VERSION = "0.9.1"


class VerlMissingError(RuntimeError):
    """verl is not installed here, or not the pinned version. The message says how to install it."""


def require_verl() -> None:
    """Raise ``VerlMissingError`` unless verl ``VERL_VERSION`` is importable."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("verl")
    except PackageNotFoundError:
        raise VerlMissingError(
            f"verl is not installed in this environment; run `bash scripts/setup_verl.sh` and use "
            f".venv-verl/bin/python (verl=={VERL_VERSION} needs its own virtualenv, docs/verl.md)"
        ) from None
    if found != VERL_VERSION:
        raise VerlMissingError(
            f"verl {found} is installed but sage-rl's adapter is pinned to verl=={VERL_VERSION} "
            "(its private V1 trainer API changes between versions); rerun `bash scripts/setup_verl.sh`"
        )
