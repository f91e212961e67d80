"""Helpers and run folders of the viewer's tests (``test_view.py``, ``test_view_damage.py``): real
runs made once a session (a scripted evaluation and collection, a tiny training run) and a page read
back through an HTML parser."""

from __future__ import annotations

import dataclasses
import json
import os
from html.parser import HTMLParser
from pathlib import Path

import pytest
from cli_server import run_cli

from sage_rl.types import Chain

ROOT = Path(__file__).resolve().parents[1]
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


def cli(*args, timeout=600):
    return run_cli(list(args), ROOT, {**os.environ, "OMP_NUM_THREADS": "1"}, timeout=timeout)


@dataclasses.dataclass(frozen=True)
class A:
    target: str
    cls: str
    traj: str | None  # the trajectory element the link sits in
    skill: str | None  # the Skills-tab entry the link sits in


class Page(HTMLParser):
    """Ids (with the trajectory each sits in), links, trajectories, templates of one page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.stack: list[tuple[str, str | None, str | None]] = []
        self.ids: dict[str, str | None] = {}
        self.links: list[A] = []
        self.trajs: dict[str, str] = {}  # element id -> data-task
        self.opened: set[str] = set()  # trajectories shown open
        self.parked: set[str] = set()  # ids inside a <template> (pages not shown yet)
        self.templates = 0
        self.problems_shown = False  # the page's box of reading problems
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        cls = a.get("class", "").split()
        traj, skill = self.stack[-1][1:] if self.stack else (None, None)
        if tag == "details" and "traj" in cls:
            traj = a["id"]
            self.trajs[traj] = a["data-task"]
            if "open" in a:
                self.opened.add(traj)
        self.problems_shown |= tag == "div" and "problems" in cls
        if tag == "div" and "skill" in cls:
            skill = a["id"]
        if "id" in a:
            assert a["id"] not in self.ids, f"duplicate id {a['id']}"
            self.ids[a["id"]] = traj
            if any(t == "template" for t, _, _ in self.stack):
                self.parked.add(a["id"])
        if tag == "a" and a.get("href", "").startswith("#"):
            self.links.append(A(a["href"][1:], a.get("class", ""), traj, skill))
        self.templates += tag == "template"
        if tag not in VOID:
            self.stack.append((tag, traj, skill))

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()[0] != tag:
            pass


def chains_of(path: Path) -> list[Chain]:
    return [Chain.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def records(chains: list[Chain], section: str) -> dict:
    """Page id -> trajectory record, by the id scheme of sage_rl/view/model.py."""
    return {
        f"a-{section}-g{c.group_index}-c{c.chain_index}-k{k}": t
        for c in chains
        for k, t in enumerate(c.trajectories)
    }


def view(run: Path, *args: str) -> tuple[Page, Path]:
    out = run.parent / f"{run.name}-{len(args)}.html"
    r = cli("view", str(run), *args, "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["out"] == str(out)
    return Page(out.read_text()), out


def build(run: Path, other: Path | None = None, **kw) -> tuple[Page, str]:
    """The page built in process (the CLI's own path is tested by ``view``)."""
    from sage_rl.view import build_html

    html, _ = build_html(run, other, **kw)
    return Page(html), html


def assert_links_resolve(page: Page) -> None:
    missing = sorted({a.target for a in page.links} - set(page.ids))
    assert not missing, f"{len(missing)} links lead nowhere, e.g. {missing[:5]}"


def _scripted_run(tmp_path_factory, command: str, *overrides: str) -> Path:
    out = tmp_path_factory.mktemp("view") / command
    r = cli(command, *overrides, f"out_dir={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def eval_run(tmp_path_factory) -> Path:
    return _scripted_run(tmp_path_factory, "eval", "policy.kind=scripted", "limit_scenarios=3")


@pytest.fixture(scope="session")
def collect_run(tmp_path_factory) -> Path:
    return _scripted_run(tmp_path_factory, "collect", "num_scenarios=3", "scripted_fail_rate=0.3")


@pytest.fixture(scope="session")
def train_run(tmp_path_factory, tiny) -> Path:
    from sage_rl.models import save_plain

    model, tok = tiny
    d = tmp_path_factory.mktemp("tiny_view")
    save_plain(model, d / "model")
    tok.save_pretrained(d / "model")
    out = d / "train"
    r = cli(
        "train",
        "configs/quickstart.yaml",
        f"policy.model={d / 'model'}",
        "steps=2",
        "rollout.group_size=2",
        "eval.scenarios=1",
        "eval.split=train_val",
        "eval.keep=best",
        f"out_dir={out}",
        "init_from=null",
        "agent.max_steps=2",
        "agent.max_tokens_per_turn=12",
        "agent.context_limit=4096",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return out
