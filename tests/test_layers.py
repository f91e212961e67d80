"""The layer rule of docs/architecture.md: a lower layer never imports a higher one.

Every module of the package is read (imports inside functions and ``TYPE_CHECKING`` blocks count:
a lazy import is still a dependency) and imported. The layers, top to bottom, are the table below;
modules of one layer may import each other.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import sage_rl

#: (layer, module prefixes), top to bottom: docs/architecture.md, "Layers".
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("commands", ("sage_rl.cli", "sage_rl.recipe", "sage_rl.integrations.verl.main")),
    ("run functions", ("sage_rl.runs",)),
    ("composition root", ("sage_rl.build", "sage_rl.settings", "sage_rl.integrations.verl")),
    (
        "trainers and integrations",
        ("sage_rl.train", "sage_rl.integrations", "sage_rl.collect", "sage_rl.collect_store", "sage_rl.view"),
    ),
    ("rollout core and evaluation", ("sage_rl.rollout", "sage_rl.eval")),
    (
        "agent, policies, skills",
        (
            "sage_rl.agent",
            "sage_rl.policies",
            "sage_rl.engine",
            "sage_rl.skills",
            "sage_rl.data",
            "sage_rl.models",
        ),
    ),
    ("environments and sandbox", ("sage_rl.envs", "sage_rl.sandbox")),
    ("core types and config", ("sage_rl.types", "sage_rl.config", "sage_rl")),
)


def modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(sage_rl.__path__, "sage_rl."))


def height(module: str) -> int:
    """0 for the top layer; the longest matching prefix decides. A new top-level module must be
    placed explicitly (``sage_rl`` matches the package's own ``__init__`` only)."""
    best = max(
        (
            (len(p), i)
            for i, (_, prefixes) in enumerate(LAYERS)
            for p in prefixes
            if module == p or (p != "sage_rl" and module.startswith(p + "."))
        ),
        default=None,
    )
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")
    return best[1]


def _ours(name: str) -> bool:
    return name == "sage_rl" or name.startswith("sage_rl.")


def imported(module: str) -> set[str]:
    """The sage_rl modules ``module`` imports anywhere in its source."""
    source = Path(importlib.util.find_spec(module).origin)
    out = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if _ours(a.name)}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _ours(node.module or ""):
            out.add(node.module)
    return out


#: Modules that run only in a separate virtualenv (verl's, scripts/setup_verl.sh; AppWorld's
#: episode worker, loaded by its own processes): their imports are still read from source below;
#: importing them is tested where they run.
OWN_VENV = {"sage_rl.integrations.verl": "verl", "sage_rl.integrations.appworld.episode": "appworld"}


def test_every_module_belongs_to_a_layer_and_imports():
    for m in modules():
        height(m)
        if m.endswith("__main__"):  # __main__ runs the command line
            continue
        if any(m.startswith(p) and importlib.util.find_spec(d) is None for p, d in OWN_VENV.items()):
            continue
        importlib.import_module(m)


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{m} ({LAYERS[height(m)][0]}) imports {dep} ({LAYERS[height(dep)][0]})"
        for m in modules()
        for dep in sorted(imported(m))
        if height(dep) < height(m)
    ]
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize(
    ("low", "high"),
    [("sage_rl.rollout.chain", "sage_rl.build"), ("sage_rl.envs.base", "sage_rl.policies.base")],
)
def test_the_rule_is_checked_the_right_way_round(low, high):
    assert height(high) < height(low)
