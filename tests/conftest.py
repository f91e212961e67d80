"""Shared test fixtures. Keep this file small: fixtures used across the project only."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from appworld_support import suite, venv, world  # noqa: F401 - AppWorld fixtures, built once a session
from test_sandbox_support import sandbox  # noqa: F401 - one sandbox per test module
from view_support import collect_run, eval_run, train_run  # noqa: F401 - the viewer's runs, made once a session


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    """``(model, tokenizer)``: a 2-layer random Llama (seed 0) with the real SmolLM2 tokenizer.

    Session-scoped and shared: a test that trains it must work on a copy (``copy.deepcopy``).
    """
    import torch

    from sage_rl.models import tiny_model

    torch.set_num_threads(1)
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny) -> Any:
    """The ``tiny`` model saved as a plain checkpoint folder (``policy.model=<it>`` in a command)."""
    from sage_rl.models import save_plain

    model, tok = tiny
    d = tmp_path_factory.mktemp("tiny_model")
    save_plain(model, d)
    tok.save_pretrained(d)
    return d


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what collection imported (torch, transformers, every test module: ~460k objects) out of
    the collector's sight: a full collection (``release_memory`` after each recipe stage, and
    Python's own) then scans only what the tests made, ~0.3-0.6 s less each (docs/LOG.md)."""
    gc.collect()
    gc.freeze()
