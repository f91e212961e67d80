"""Shared test fixtures. Keep this file small: fixtures used across the project only."""

from __future__ import annotations

from typing import Any

import pytest
from appworld_support import suite, venv, world  # noqa: F401 - AppWorld fixtures, built once a session


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    """``(model, tokenizer)``: a 2-layer random Llama (seed 0) with the real SmolLM2 tokenizer.

    Session-scoped and shared: a test that trains it must work on a copy (``copy.deepcopy``).
    """
    import torch

    from sage_rl.models import tiny_model

    torch.set_num_threads(1)
    return tiny_model(seed=0)
