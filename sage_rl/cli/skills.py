"""``sage-rl skills``: list, show, search, stats, export and import over a skill store file.

Every command takes ``--store PATH`` (default ``$SAGE_SKILL_STORE`` or ``skills.db``). With
``--json`` a command prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from sage_rl.skills.record import Skill, SkillError, Tier

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Skill stores: list, show, search, stats, export, import.",
)

StoreOpt = Annotated[
    Path, typer.Option("--store", envvar="SAGE_SKILL_STORE", help="SQLite skill store file.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


def _open(path: Path, readonly: bool = True):
    from sage_rl.skills.store import SkillStore, StoreError

    try:
        return SkillStore(path, readonly=readonly)
    except StoreError as e:
        Console(stderr=True).print(Text(f"error: {e}", style="red"))
        raise typer.Exit(2) from None


def _summary(s: Skill) -> dict[str, Any]:
    p = s.provenance
    return {
        "name": s.name, "version": s.version, "tier": s.tier.label, "uses": s.uses, "successes": s.successes,
        "scenario_id": p.scenario_id, "task_id": p.task_id, "signature": s.signature,
    }  # fmt: skip


def _table(skills: list[Skill], title: str) -> Table:
    t = Table(title=title)
    for col in ("name", "v", "tier", "uses", "ok", "scenario", "signature"):
        t.add_column(col)
    for s in skills:
        p = s.provenance
        row = (
            s.name,
            str(s.version),
            s.tier.label,
            str(s.uses),
            str(s.successes),
            p.scenario_id,
            s.signature,
        )
        t.add_row(*map(Text, row))  # Text: "list[str]" must not be read as rich markup
    return t


@app.command("list")
def list_(
    store: StoreOpt = Path("skills.db"),
    min_tier: Annotated[
        str, typer.Option(help="Least tier: parsed, defined, called_ok, task_success, verified.")
    ] = "parsed",
    scenario: Annotated[str | None, typer.Option(help="Only skills made in this scenario.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the current version of every skill."""
    try:
        tier = Tier.parse(min_tier)
    except SkillError as e:
        raise typer.BadParameter(str(e), param_hint="--min-tier") from None
    with _open(store) as st:
        skills = [
            s
            for s in st.current()
            if s.tier >= tier and (scenario is None or s.provenance.scenario_id == scenario)
        ]
    if as_json:
        print(json.dumps({"skills": [_summary(s) for s in skills]}))
    else:
        Console().print(_table(skills, f"{len(skills)} skills in {store}"))


@app.command()
def show(
    name: str,
    store: StoreOpt = Path("skills.db"),
    version: Annotated[int | None, typer.Option(help="A stored version (default: current).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show one skill: provenance, counters and code."""
    with _open(store) as st:
        s = st.get(name, version)
        versions = [h.version for h in st.history(name)]
    if s is None:
        Console(stderr=True).print(
            Text(f"error: no skill {name!r}" + (f" version {version}" if version else ""), style="red")
        )
        raise typer.Exit(1)
    if as_json:
        print(json.dumps({"skill": s.to_dict(), "versions": versions}))
        return
    c = Console()
    head = f"{s.name} v{s.version} (versions {versions}) tier={s.tier.label} uses={s.uses} successes={s.successes}"
    c.print(Text(head, style="bold"))
    c.print(
        Text(
            f"provenance: {json.dumps(s.provenance.__dict__)}   depends_on: {', '.join(s.depends_on) or '-'}"
        )
    )
    c.print(Syntax(s.code, "python"))


@app.command()
def search(
    query: str,
    store: StoreOpt = Path("skills.db"),
    k: Annotated[int, typer.Option("-k", help="Number of results.")] = 5,
    strategy: Annotated[str, typer.Option(help="bm25 or skill_embedding (packaged MiniLM).")] = "bm25",
    as_json: JsonOpt = False,
) -> None:
    """Find skills matching a task instruction."""
    from sage_rl.skills.retrieval import RetrievalConfig, TaskContext, make_retriever

    if strategy not in ("bm25", "skill_embedding"):
        raise typer.BadParameter(
            f"strategy must be bm25 or skill_embedding, not {strategy!r}", param_hint="--strategy"
        )
    with _open(store) as st:
        lib = st.load_library()
    found = make_retriever(RetrievalConfig(strategy=strategy, k=k)).retrieve(TaskContext(query), lib)  # type: ignore[arg-type]
    if as_json:
        print(json.dumps({"query": query, "skills": [_summary(s) for s in found]}))
    else:
        Console().print(_table(found, f"{len(found)} skills for {query!r}"))


@app.command()
def stats(store: StoreOpt = Path("skills.db"), as_json: JsonOpt = False) -> None:
    """Counts: skills, versions, tiers, scenarios, uses and successes."""
    with _open(store) as st:
        s = st.stats()
    d = s.__dict__
    if as_json:
        print(json.dumps(d))
        return
    t = Table(title=f"skill store {store}")
    t.add_column("metric")
    t.add_column("value")
    for key, value in d.items():
        t.add_row(
            key, ", ".join(f"{a}={b}" for a, b in value.items()) if isinstance(value, dict) else str(value)
        )
    Console().print(t)


@app.command()
def export(
    out: Annotated[Path, typer.Argument(help="A .jsonl file, or a folder for --format folder.")],
    store: StoreOpt = Path("skills.db"),
    fmt: Annotated[str, typer.Option("--format", help="jsonl or folder (one .py file per skill).")] = "jsonl",
    all_versions: Annotated[
        bool, typer.Option(help="Every version, not only the current ones (jsonl only).")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Export the store as JSON Lines or as a folder of .py files."""
    from sage_rl.skills.io import write_folder, write_jsonl

    if fmt not in ("jsonl", "folder"):
        raise typer.BadParameter(f"format must be jsonl or folder, not {fmt!r}", param_hint="--format")
    with _open(store) as st:
        skills = st.all_versions() if all_versions and fmt == "jsonl" else st.current()
    n = write_jsonl(skills, out) if fmt == "jsonl" else write_folder(skills, out)
    if as_json:
        print(json.dumps({"exported": n, "path": str(out), "format": fmt}))
    else:
        Console().print(f"exported {n} skills to {out}")


@app.command("import")
def import_(
    path: Annotated[Path, typer.Argument(help="A .jsonl file or a folder of .py skill files.")],
    store: StoreOpt = Path("skills.db"),
    as_json: JsonOpt = False,
) -> None:
    """Import skills; bad records are reported by line and skipped, good ones are imported.
    Exit code 1 when any record was bad."""
    from sage_rl.skills.io import read_folder, read_jsonl

    if not path.exists():
        raise typer.BadParameter(f"{path} does not exist", param_hint="PATH")
    report = read_folder(path) if path.is_dir() else read_jsonl(path)
    with _open(store, readonly=False) as st:
        results = st.put_many(report.skills)
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    if as_json:
        print(
            json.dumps(
                {
                    "imported": counts,
                    "errors": [{"path": e.path, "line": e.line, "message": e.message} for e in report.errors],
                }
            )
        )
    else:
        Console().print(f"imported {len(results)} skills into {store}: {counts}")
        err = Console(stderr=True)
        for e in report.errors:
            err.print(Text(f"bad record {e}", style="red"))
    if report.errors:
        raise typer.Exit(1)
