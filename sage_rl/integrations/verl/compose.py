"""verl's Hydra config for a SAGE run: verl's own ``ppo_trainer.yaml``, then the keys SAGE decides
(``config.derived_verl_keys``), then the run's ``verl:`` keys, then ``sage:`` for the workers.

The only place where sage-rl writes verl's Hydra keys (STYLE.md, principle 7). A ``verl:`` key must
exist in verl's config (a typo fails here, naming the key); a leading ``+`` adds a new key where
verl's schema has an open mapping (e.g. ``+actor_rollout_ref.rollout.engine_kwargs.vllm.x``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from sage_rl.config import ConfigError
from sage_rl.integrations.verl import VERL_VERSION, require_verl
from sage_rl.integrations.verl.config import VerlRunConfig, check_overrides, derived_verl_keys

_MISSING = object()


def verl_config_dir() -> str:
    import verl

    return os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


def base_config() -> DictConfig:
    """verl's ``ppo_trainer`` config with its Hydra defaults resolved (FSDP actor, vLLM rollout)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        return compose("ppo_trainer")


def _exists(config: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(config, parent, default=_MISSING) if parent else config
    # keys() lists mandatory (???) values too, which ``in`` and select() report as absent
    return isinstance(node, DictConfig) and leaf in node.keys()  # noqa: SIM118


def set_key(config: DictConfig, key: str, value: Any) -> None:
    """Set one dotted key of verl's config; it must exist unless written ``+key``."""
    add = key.startswith("+")
    key = key.lstrip("+")
    if not add and not _exists(config, key):
        raise ConfigError(f"verl key {key!r} does not exist in verl {VERL_VERSION}'s ppo_trainer config")
    if add:
        with open_dict(config):
            OmegaConf.update(config, key, value, merge=False, force_add=True)
    else:
        OmegaConf.update(config, key, value, merge=False)


def compose_config(cfg: VerlRunConfig) -> DictConfig:
    """The full verl config of ``cfg`` (raises ``ConfigError`` naming a bad key)."""
    require_verl()
    check_overrides(cfg)
    config = base_config()
    for key, value in {**derived_verl_keys(cfg), **cfg.verl}.items():
        set_key(config, key, value)
    fit = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    if fit not in cfg.verl and int(OmegaConf.select(config, fit)) < cfg.agent.context_limit:
        set_key(config, fit, cfg.agent.context_limit)  # verl's default (16k) is below the paper's 28k context
    check_lengths(config, cfg.agent.context_limit)
    with open_dict(config):
        config.sage = cfg.sage_section()
    return config


def check_lengths(config: DictConfig, context_limit: int) -> None:
    """A sequence may reach ``agent.context_limit`` tokens: verl's dynamic batching must fit one."""
    keys = (
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    )
    short = {k: OmegaConf.select(config, k) for k in keys}
    short = {k: v for k, v in short.items() if v is None or int(v) < context_limit}
    if short:
        raise ConfigError(
            f"{', '.join(f'{k}={v}' for k, v in short.items())}: must be at least agent.context_limit="
            f"{context_limit} (one whole sequence per micro-batch); set it under verl:"
        )


def validate(config: DictConfig) -> None:
    """verl's own start-up checks (as ``verl.trainer.main_ppo.main`` runs them)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        with contextlib.redirect_stdout(sys.stderr):  # verl prints its verdict; stdout is for the config
            validate_config(
                config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
            )
    except (AssertionError, ValueError) as e:
        raise ConfigError(f"verl rejects the config: {e}") from None
