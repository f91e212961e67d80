"""The layer rule, read from its one table: the diagram under "Layers" in docs/architecture.md.

The diagram lists, top to bottom, the layers (separated by a ``|`` line) and in each the folders
and modules of ``sage_rl/`` that belong to it (an entry is a line starting with a path). From it:

- every module of the package is in exactly one layer, and every path the diagram names exists;
- no module imports a module of a higher layer;
- no package imports another that imports it back (same-layer imports included);
- ``rollout/`` and ``eval/`` see policies and environments only through their protocols;
- no module outside ``cli/`` imports ``sage_rl.cli``.

Every module is read (imports inside functions and ``TYPE_CHECKING`` blocks count: a lazy import is
still a dependency; ``from sage_rl import x`` is resolved to the module ``sage_rl.x``) and imported.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

import sage_rl

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = Path(sage_rl.__file__).parent

#: What rollout and evaluation may see of the layers below them that hold backends: only the
#: protocols (docs/architecture.md, "The interfaces").
PROTOCOLS_ONLY = {
    "sage_rl.rollout": ("sage_rl.policies.base", "sage_rl.envs.base"),
    "sage_rl.eval": ("sage_rl.policies.base", "sage_rl.envs.base"),
}
BACKENDS = ("sage_rl.policies", "sage_rl.envs", "sage_rl.engine", "sage_rl.sandbox")

#: Modules that run only in a separate virtualenv (verl's, scripts/setup_verl.sh; AppWorld's
#: episode worker and its scoring child, loaded by its own processes): their imports are still
#: read from source below; importing them is tested where they run.
OWN_VENV = {
    "sage_rl.integrations.verl": "verl",
    "sage_rl.integrations.appworld.episode": "appworld",
    "sage_rl.integrations.appworld.scoring": "appworld",
}


# ------------------------------------------------------------------ the table
@cache
def layers() -> tuple[tuple[str, ...], ...]:
    """The diagram's entries (paths under sage_rl/), one tuple per layer, top to bottom."""
    text = DOC.read_text()
    block = text[text.index("## Layers") :].split("```")[1]
    out: list[list[str]] = [[]]
    for line in block.splitlines():
        if line.strip() == "|":
            out.append([])
        elif line and not line[0].isspace():
            out[-1].append(line.split()[0])
    return tuple(tuple(layer) for layer in out if layer)


def module_of(entry: str) -> tuple[str, bool]:
    """(module name, whether it covers the modules below it) of a diagram entry: ``train/`` is
    the package and all below it, ``build.py`` one module, ``x/__init__.py`` the package alone."""
    if entry.endswith("/"):
        return ".".join(["sage_rl", *entry.strip("/").split("/")]), True
    parts = entry.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["sage_rl", *parts]), False


def height(module: str) -> int:
    """0 for the top layer; the longest matching entry decides."""
    best = max(
        (
            (len(name), i)
            for i, layer in enumerate(layers())
            for name, below in map(module_of, layer)
            if module == name or (below and module.startswith(name + "."))
        ),
        default=None,
    )
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to the diagram in docs/architecture.md")
    return best[1]


def layer_name(module: str) -> str:
    return " ".join(layers()[height(module)])


# ------------------------------------------------------------------ the imports
@cache
def modules() -> tuple[str, ...]:
    return tuple(sorted(m.name for m in pkgutil.walk_packages(sage_rl.__path__, "sage_rl.")))


def _ours(name: str) -> bool:
    return name == "sage_rl" or name.startswith("sage_rl.")


def _source(module: str) -> Path:
    path = PACKAGE.joinpath(*module.split(".")[1:])
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"


@cache
def imported(module: str) -> frozenset[str]:
    """The sage_rl modules ``module`` imports anywhere in its source. ``from P import x`` counts
    as an import of ``P.x`` when that is a module, else of ``P``; relative imports are resolved."""
    source = _source(module)
    known = set(modules()) | {"sage_rl"}
    out = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if _ours(a.name)}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if source.name == "__init__.py" else module.rpartition(".")[0]
                package = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{package}.{base}" if base else package
            if not _ours(base):
                continue
            subs = {f"{base}.{a.name}" for a in node.names} & known
            out |= subs or {base}
    out.discard(module)
    return frozenset(out)


def package(module: str) -> str:
    """The package a module belongs to, for the cycle rule: ``sage_rl.<name>``, or
    ``sage_rl.integrations.<name>`` (each integration is its own package)."""
    parts = module.split(".")
    n = 3 if len(parts) > 2 and parts[1] == "integrations" else 2
    return ".".join(parts[:n])


# ------------------------------------------------------------------ the rules
def test_the_diagram_names_what_exists_and_places_every_module():
    for layer in layers():
        for entry in layer:
            assert (PACKAGE / entry).exists(), f"docs/architecture.md names {entry}, which does not exist"
    assert len(layers()) >= 5
    for m in modules():
        height(m)


def test_every_module_imports():
    for m in modules():
        if m.endswith("__main__"):  # __main__ runs the command line
            continue
        if any(m.startswith(p) and importlib.util.find_spec(d) is None for p, d in OWN_VENV.items()):
            continue
        importlib.import_module(m)


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{m} ({layer_name(m)}) imports {dep} ({layer_name(dep)})"
        for m in modules()
        for dep in sorted(imported(m))
        if height(dep) < height(m)
    ]
    assert not upward, "\n".join(upward)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def package_edges() -> tuple[dict[str, set[str]], dict[tuple[str, str], str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    example: dict[tuple[str, str], str] = {}
    for m in modules():
        for dep in imported(m):
            a, b = package(m), package(dep)
            if a != b and b != "sage_rl":
                edges[a].add(b)
                example.setdefault((a, b), f"{m} imports {dep}")
    return edges, example


def test_no_package_imports_another_that_imports_it_back():
    edges, example = package_edges()
    problems = []
    for component in _cycles(edges):
        links = [example[(a, b)] for a in component for b in sorted(edges[a]) if b in component]
        problems.append(f"cycle {' <-> '.join(component)}: " + "; ".join(links))
    assert not problems, "\n".join(problems)


def test_rollout_and_evaluation_see_only_the_protocols():
    wrong = [
        f"{m} imports {dep}"
        for m in modules()
        for prefix, allowed in PROTOCOLS_ONLY.items()
        if m == prefix or m.startswith(prefix + ".")
        for dep in sorted(imported(m))
        if any(dep == b or dep.startswith(b + ".") for b in BACKENDS) and dep not in allowed
    ]
    assert not wrong, "\n".join(wrong)
    doc = DOC.read_text()
    assert "`rollout/` and `eval/` see policies and environments only through" in doc


def test_only_the_commands_import_the_commands():
    wrong = [
        f"{m} imports {dep}"
        for m in modules()
        if package(m) != "sage_rl.cli"
        for dep in imported(m)
        if package(dep) == "sage_rl.cli"
    ]
    assert not wrong, "\n".join(wrong)


# ------------------------------------------------------------------ the checker checks
@pytest.mark.parametrize(
    ("low", "high"),
    [
        ("sage_rl.rollout.chain", "sage_rl.build"),
        ("sage_rl.envs.base", "sage_rl.policies.base"),
        ("sage_rl.build", "sage_rl.runs.train"),
        ("sage_rl.runs.train", "sage_rl.recipe.pipeline"),
        ("sage_rl.integrations.verl.bridge", "sage_rl.integrations.verl.main"),
        ("sage_rl.train.loop", "sage_rl.integrations.verl.bridge"),
    ],
)
def test_the_rule_is_checked_the_right_way_round(low, high):
    assert height(high) < height(low)


def test_from_sage_rl_import_x_is_resolved(tmp_path, monkeypatch):
    """``from sage_rl import recipe`` is an import of ``sage_rl.recipe``, not of the package."""
    fake = tmp_path / "probe.py"
    fake.write_text("from sage_rl import recipe, types\nfrom . import config\nfrom .rollout import batch\n")
    monkeypatch.setattr(f"{__name__}._source", lambda m: fake)
    imported.cache_clear()
    try:
        assert imported("sage_rl.probe") == {
            "sage_rl.recipe",
            "sage_rl.types",
            "sage_rl.config",
            "sage_rl.rollout.batch",
        }
    finally:
        imported.cache_clear()


def test_a_cycle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
