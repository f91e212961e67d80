"""``sage-rl world``: list, show, run, verify and play PocketWorld tasks."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from sage_rl.envs.pocketworld import tasks as pw
from sage_rl.envs.pocketworld.env import PocketWorldEnv
from sage_rl.envs.pocketworld.executor import IN_PROCESS, Executors
from sage_rl.text import to_jsonable
from sage_rl.types import Outcome, Task, cell_origin

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="PocketWorld: list, show, run and verify tasks."
)
console = Console()
JsonOpt = Annotated[bool, typer.Option("--json", help="print exactly one JSON object")]
SPLITS = pw.split_names()
SplitOpt = Annotated[str, typer.Option("--split", help=f"one of {', '.join(SPLITS)}")]


def _emit(obj: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(obj), sort_keys=True) + "\n")


def _task(task_id: str) -> Task:
    try:
        return pw.task_by_id(task_id)
    except KeyError as e:
        raise typer.BadParameter(str(e.args[0]), param_hint="TASK_ID") from None


def _split_tasks(split: str) -> tuple[Task, ...]:
    if split not in SPLITS:
        raise typer.BadParameter(f"unknown split {split!r}; splits are {list(SPLITS)}", param_hint="--split")
    return pw.split_tasks(split)


@contextlib.contextmanager
def _executors(in_process: bool) -> Iterator[Executors]:
    """The sandbox by default (issue 3), started once for the command and closed at its end;
    ``--in-process`` only for debugging world code."""
    if in_process:
        yield IN_PROCESS
        return
    from sage_rl.envs.pocketworld.sandboxed import SandboxExecutors
    from sage_rl.sandbox import Sandbox

    with Sandbox() as sandbox:
        print(f"[sage-rl] {sandbox.isolation.line() if sandbox.isolation else ''}", file=sys.stderr)
        yield SandboxExecutors(sandbox)


InProcessOpt = Annotated[
    bool, typer.Option("--in-process", help="run the cell in this process, not the sandbox")
]


async def _run(executors: Executors, task: Task, code: str | None) -> tuple[str, bool, Outcome]:
    env = PocketWorldEnv(executors)
    await env.reset(task)
    observation, completed = "", False
    if code is not None:
        r = await env.execute(code, cell_origin(1))
        observation, completed = r.observation, r.completed
    outcome = await env.evaluate()
    await env.close()
    return observation, completed, outcome


def _print_outcome(o: Outcome) -> None:
    for c in o.checks:
        mark = "[green]PASS[/]" if c.passed else "[red]FAIL[/]"
        console.print(f"  {mark} {c.name}" + (f"  [dim]{c.detail}[/]" if c.detail else ""))
    console.print(f"score {o.score:.2f}  success {o.success}")


@app.command()
def stats(as_json: JsonOpt = False) -> None:
    """Apps, APIs, scenarios per split and tasks per split."""
    s = pw.stats()
    if as_json:
        return _emit(s)
    console.print(f"{len(s['apps'])} apps, {s['num_apis']} APIs")
    for name, n in s["apps"].items():
        console.print(f"  {name:<12} {n} APIs")
    for split in SPLITS:
        console.print(f"  {split:<15} {s['scenarios'][split]} scenarios, {s['tasks'][split]} tasks")


@app.command("list")
def list_tasks(split: SplitOpt = "dev", as_json: JsonOpt = False) -> None:
    """List the tasks of a split (train: scenario seed 0 of every template)."""
    ts = _split_tasks(split)
    if as_json:
        return _emit({"split": split, "tasks": [{"task_id": t.task_id, "difficulty": t.difficulty, "apps": t.apps,
                                                  "instruction": t.instruction} for t in ts]})  # fmt: skip
    table = Table()
    for col in ("task_id", "diff", "apps", "instruction"):
        table.add_column(col, no_wrap=col == "task_id")
    for t in ts:
        table.add_row(t.task_id, str(t.difficulty), ",".join(t.apps), t.instruction)
    console.print(table)


@app.command()
def show(task_id: str) -> None:
    """Show a task: instruction, supervisor, difficulty, apps."""
    t = _task(task_id)
    profile = pw.world_for(t).db["supervisor"]["profile"]["me"]
    console.print(f"[bold]{t.task_id}[/] ({t.split}, difficulty {t.difficulty}, apps: {', '.join(t.apps)})")
    console.print(f"supervisor: {profile['first_name']} {profile['last_name']} <{profile['email']}>")
    console.print(f"instruction: {t.instruction}")


@app.command()
def run(
    task_id: str,
    code: Annotated[Path | None, typer.Option("--code", help="a Python file to run as one cell")] = None,
    solution: Annotated[bool, typer.Option("--solution", help="run the reference solution")] = False,
    noop: Annotated[bool, typer.Option("--noop", help="run nothing, just evaluate")] = False,
    as_json: JsonOpt = False,
    in_process: InProcessOpt = False,
) -> None:
    """Run a code file, the reference solution or nothing on a task; print the observation and evaluation."""
    if sum([code is not None, solution, noop]) != 1:
        raise typer.BadParameter("give exactly one of --code FILE, --solution, --noop")
    t = _task(task_id)
    source = None if noop else pw.reference_solution(t) if solution else code.read_text()  # type: ignore[union-attr]
    with _executors(in_process) as executors:
        observation, completed, outcome = asyncio.run(_run(executors, t, source))
    if as_json:
        return _emit(
            {"task_id": t.task_id, "observation": observation, "completed": completed, "outcome": outcome}
        )
    if observation:
        console.print(observation, markup=False, highlight=False, soft_wrap=True)
    console.print(f"completed: {completed}")
    _print_outcome(outcome)


@app.command()
def verify(split: SplitOpt = "dev", as_json: JsonOpt = False) -> None:
    """Run the reference and no-op solutions on every task of a split; report both pass rates."""
    ts = _split_tasks(split)
    with _executors(False) as executors:
        failures, ref_ok, noop_ok = asyncio.run(_verify(executors, ts))
    n = len(ts)
    result = {"split": split, "tasks": n, "reference_pass_rate": ref_ok / n, "noop_pass_rate": noop_ok / n,
              "reference_failures": failures}  # fmt: skip
    if as_json:
        return _emit(result)
    console.print(f"{split}: {n} tasks, reference {ref_ok}/{n} pass, no-op {noop_ok}/{n} pass")
    for f in failures:
        console.print(f"  [red]reference failed[/] {f}")


async def _verify(executors: Executors, ts: tuple[Task, ...]) -> tuple[list[str], int, int]:
    """(tasks whose reference solution failed, reference passes, no-op passes)."""
    failures: list[str] = []
    ref_ok = noop_ok = 0
    with Progress(console=Console(stderr=True), transient=True) as bar:
        job = bar.add_task(f"verifying {ts[0].split if ts else ''}", total=len(ts))
        for t in ts:
            ok = (await _run(executors, t, pw.reference_solution(t)))[2].success
            ref_ok += ok
            noop_ok += (await _run(executors, t, None))[2].success
            if not ok:
                failures.append(t.task_id)
            bar.advance(job)
    return failures, ref_ok, noop_ok


@app.command()
def play(task_id: str, in_process: InProcessOpt = False) -> None:
    """Solve a task by hand: type a cell, end it with a line '%%' (or EOF); stops when the task is completed."""
    t = _task(task_id)
    console.print(
        f"[bold]{t.instruction}[/]\n[dim]End each cell with a line '%%'. Call apis.supervisor.complete_task() to finish.[/]"
    )
    with _executors(in_process) as executors:
        outcome = asyncio.run(_play(executors, t))
    _print_outcome(outcome)


async def _play(executors: Executors, t: Task) -> Outcome:
    env = PocketWorldEnv(executors)
    await env.reset(t)
    index, lines = 1, []
    for line in itertools.chain(sys.stdin, ["%%\n"]):  # lazy: each cell runs as soon as it ends
        if line.rstrip("\n") != "%%":
            lines.append(line)
            continue
        if "".join(lines).strip():
            r = await env.execute("".join(lines), cell_origin(index))
            console.print(r.observation, markup=False, highlight=False, end="", soft_wrap=True)
            index, lines = index + 1, []
            if r.completed:
                break
    outcome = await env.evaluate()
    await env.close()
    return outcome
