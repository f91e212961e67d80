"""``sage-rl view`` (issue 15): pages of real runs (a scripted evaluation, a collection, a tiny
training run) read back through an HTML parser. Every trajectory is there, every link resolves,
and a skill's maker and users link to the right tasks; bad input is named and loses nothing."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from fuzzing import fuzz
from hypothesis import given
from hypothesis import strategies as st

from sage_rl.types import Chain, Outcome, Turn
from sage_rl.view.chains import ChainOptions, section_view
from sage_rl.view.read import ChainSection

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "sage_rl.cli"]
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


def _cli(*args, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


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
    r = _cli("view", str(run), *args, "--out", str(out), "--json")
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


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("view") / "eval"
    r = _cli("eval", "policy.kind=scripted", "limit_scenarios=3", f"out_dir={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def eval_page(eval_run) -> Page:
    return view(eval_run)[0]


def test_every_trajectory_is_on_the_page_and_every_link_resolves(eval_run, eval_page):
    page = eval_page
    recs = records(chains_of(eval_run / "trajectories.same_scenario.jsonl"), "same_scenario")
    assert len(recs) == 9
    assert page.trajs == {tid: t.task.task_id for tid, t in recs.items()}
    assert_links_resolve(page)
    for tab in ("tab-overview", "tab-a-chains", "tab-a-skills"):
        assert tab in page.ids


def test_skill_users_link_to_the_task_that_made_the_skill(eval_run, eval_page):
    page = eval_page
    recs = records(chains_of(eval_run / "trajectories.same_scenario.jsonl"), "same_scenario")
    uses = [a for a in page.links if a.traj and "use" in a.cls.split() and "-def-" in a.target]
    # each use of a library skill (trajectory header and each cell's call records) is a link
    assert len({(a.traj, a.target) for a in uses}) == sum(len(t.skills_used) for t in recs.values()) > 0
    for a in uses:
        user, maker = recs[a.traj], recs[page.ids[a.target]]
        name = a.target.rsplit("-def-", 1)[1]
        assert name in user.skills_used and name in maker.skills_saved
        assert maker.task.scenario_id == user.task.scenario_id and maker.task.position < user.task.position
    # the Skills tab: each skill's entry links to its maker's definition and to every user
    for tid, t in recs.items():
        chain = tid.rsplit("-k", 1)[0]
        for name in t.skills_used:
            links = [a for a in page.links if a.skill == f"{chain}-skill-{name}"]
            assert tid in {a.target for a in links}
            assert any(a.target.endswith(f"-def-{name}") for a in links)


def test_large_runs_are_cut_into_pages_and_links_still_resolve(eval_run):
    page, _ = build(eval_run, page_size=3)
    assert page.templates == 2 * 2  # 3 scenarios of 3 tasks: 3 pages per tab, 2 of them parked
    assert len(page.trajs) == 9
    assert_links_resolve(page)


def test_compare_two_runs_task_by_task(eval_run, tmp_path):
    other = tmp_path / "no_skills"
    r = _cli(
        "eval", "policy.kind=scripted", "limit_scenarios=3", "skills.use_skills=false", f"out_dir={other}"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    page, _ = view(eval_run, str(other))
    assert len(page.trajs) == 18 and "tab-compare" in page.ids
    assert_links_resolve(page)
    b = {
        k.replace("a-", "b-", 1): t
        for k, t in records(chains_of(other / "trajectories.same_scenario.jsonl"), "same_scenario").items()
    }
    assert {k: t.task.task_id for k, t in b.items()} == {
        k: v for k, v in page.trajs.items() if k.startswith("b-")
    }
    compare_links = [a for a in page.links if a.traj is None and a.skill is None and a.target in page.trajs]
    by_side = {
        side: {page.trajs[a.target] for a in compare_links if a.target.startswith(side)} for side in "ab"
    }
    assert by_side["a"] == by_side["b"] == {t.task.task_id for t in b.values()}


def test_rewards_and_advantages_of_a_training_group_match_hand_worked_numbers(eval_run):
    """Two chains of one task sequence (K=2). Chain 0 solves both and task 2 uses task 1's skill;
    chain 1 scores 0.5 then 0. Skill-integrated rewards: chain 0 (1+1, 1+1) = (2, 2), chain 1
    (0.5, 0). Advantages, mean baseline per position: (2 - 1.25, 0.5 - 1.25) = (0.75, -0.75) and
    (2 - 1, 0 - 1) = (1, -1)."""
    real = chains_of(eval_run / "trajectories.same_scenario.jsonl")[0]
    two = dataclasses.replace(real, trajectories=real.trajectories[:2], used_from=((), (0,)))
    fail = [Outcome(0.5, False), Outcome(0.0, False)]
    worse = dataclasses.replace(
        two,
        chain_index=1,
        used_from=((), ()),
        trajectories=tuple(
            dataclasses.replace(t, outcome=o, skills_used=())
            for t, o in zip(two.trajectories, fail, strict=True)
        ),
    )
    cfg = {"rollout": {"chain_length": 2, "group_size": 2}}
    opts = ChainOptions.from_config(cfg, train=True, problems=[])
    view_ = section_view(ChainSection("step 1", "s1", Path("x"), (two, worse), step=1), "a", opts, [])
    got = [(t.reward, t.advantage) for c in view_.groups[0].chains for t in c.trajectories]
    assert got == [(2.0, 0.75), (2.0, 1.0), (0.5, -0.75), (0.0, -1.0)]
    # a group missing one of its G chains (an unreadable line) keeps rewards, drops advantages
    partial = section_view(ChainSection("step 1", "s1", Path("x"), (two,), step=1), "a", opts, [])
    assert [(t.reward, t.advantage) for t in partial.groups[0].chains[0].trajectories] == [(2.0, None)] * 2


def test_start_library_skills_and_hostile_text_are_shown_safely(eval_run, tmp_path):
    """A skill from a start library (``eval library_store=...``) has no maker in the run: users link
    to its Skills entry. Agent-written text is escaped, whatever it holds."""
    from sage_rl.text import dumps

    chain = chains_of(eval_run / "trajectories.same_scenario.jsonl")[0]
    first, *rest = chain.trajectories
    hostile = "</pre></template><script>alert(1)</script>"
    # built through Turn.from_dict from the plain layout, which it keeps reading
    turn = Turn.from_dict(
        {
            "gen_ids": [],
            "gen_logprobs": [],
            "text": hostile,
            "code": f"print({hostile!r})",
            "observation": hostile,
        }
    )
    first = dataclasses.replace(
        first, library_in=("stored",), skills_used=("stored",), turns=(turn, *first.turns[1:])
    )
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text((eval_run / "config.yaml").read_text())
    (run / "trajectories.same_scenario.jsonl").write_text(
        dumps(dataclasses.replace(chain, trajectories=(first, *rest)))
    )
    page, html = build(run)
    assert_links_resolve(page)
    stored = [a for a in page.links if a.target.endswith("-skill-stored")]
    assert stored and all(a.traj == "a-same_scenario-g0-c0-k0" for a in stored)
    assert "start library" in html and hostile not in html and html.count("<script>") == 1


@pytest.fixture(scope="module")
def collect_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("view") / "collect"
    r = _cli("collect", "num_scenarios=3", "scripted_fail_rate=0.3", f"out_dir={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_a_collection_shows_every_task_and_the_kept_conversations(collect_run):
    out = collect_run
    page, text = build(out)
    ledger = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()[1:]]
    tasks = [t for job in ledger for t in job["tasks"]]
    assert sorted(page.trajs.values()) == sorted(t["task_id"] for t in tasks)
    assert_links_resolve(page)
    assert text.count("kept in the dataset") == sum(t["reason"] is None for t in tasks)
    for reason in {t["reason"] for t in tasks} - {None}:
        assert f"dropped: {reason}" in text


@pytest.fixture(scope="module")
def train_run(tmp_path_factory, tiny) -> Path:
    from sage_rl.models import save_plain

    model, tok = tiny
    d = tmp_path_factory.mktemp("tiny_view")
    save_plain(model, d / "model")
    tok.save_pretrained(d / "model")
    out = d / "train"
    r = _cli(
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


def test_a_training_run_shows_each_step_with_rewards_and_advantages(train_run):
    page, text = build(train_run)
    recs = {}
    for step in (1, 2):
        recs |= records(chains_of(train_run / "rollouts" / f"step_{step:06d}.jsonl"), f"s{step}")
    assert page.trajs == {k: t.task.task_id for k, t in recs.items()} and len(recs) == 2 * 2 * 2
    assert_links_resolve(page)
    # the random tiny model writes no code: R = -1 (no-code penalty) and A = 0 for every sample
    assert text.count('"badge">R -1.00<') == len(recs) and text.count('"badge">A +0.00<') == len(recs)
    assert "Evaluation on train_val, before and after training" in text and "data:image/svg+xml;base64," in text
    # eval.keep=best: the random model scores 0 at every evaluation, so the start (step 0) is kept
    assert "kept model" in text and "step 0: TGC 0.0%, SGC 0.0% on train_val (best/)" in text


def test_bad_input_is_named_in_one_sentence_and_readable_lines_are_still_shown(eval_run, tmp_path):
    r = _cli("view", str(tmp_path))
    assert r.returncode == 2 and "is not a sage-rl run folder" in r.stderr and len(r.stderr.splitlines()) == 1
    bad = tmp_path / "bad"
    shutil.copytree(eval_run, bad)
    f = bad / "trajectories.same_scenario.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    f.write_text(lines[0] + lines[1] + lines[2][:200])  # a crash mid-write: the last line is cut off
    r = _cli("view", str(bad), "--out", str(tmp_path / "bad.html"))
    assert r.returncode == 0, r.stderr
    assert f"{f} line 3 is cut off" in r.stderr
    page = Page((tmp_path / "bad.html").read_text())
    assert len(page.trajs) == 6  # the two readable chains
    assert "line 3 is cut off" in (tmp_path / "bad.html").read_text()


def test_corrupted_files_never_stop_the_viewer(eval_run, tmp_path):
    """Cut, flipped bytes, a deleted line, a line of the wrong JSON type, in any file of the run:
    the page is still built, every link resolves, and what was lost is said."""
    rng = random.Random(0)
    files = ["trajectories.same_scenario.jsonl", "config.yaml", "metrics.json"]
    for i in range(12):  # each kind of damage to each file
        run = tmp_path / f"r{i}"
        shutil.copytree(eval_run, run)
        f = run / files[i % len(files)]
        data = bytearray(f.read_bytes())
        kind = i // len(files) % 4
        if kind == 0:
            data = data[: rng.randrange(len(data))]
        elif kind == 1:
            for _ in range(5):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 2:
            lines = bytes(data).split(b"\n")
            lines.pop(rng.randrange(len(lines)))
            data = bytearray(b"\n".join(lines))
        else:
            data = bytearray(b'[1, "x"]\n') + data
        f.write_bytes(bytes(data))
        page, _ = build(run)
        assert_links_resolve(page)
        if f.suffix == ".jsonl" and (kind == 3 or (kind == 0 and not data.endswith(b"\n"))):
            assert page.problems_shown, f"corruption {i} of {f.name} went unreported"


FILES = {
    "eval": ("config.yaml", "metrics.json", "trajectories.same_scenario.jsonl"),
    "train": ("config.yaml", "metrics.jsonl", "summary.json", "rollouts/step_000001.jsonl"),
    "collect": ("config.yaml", "progress.jsonl", "sage_expert.jsonl"),
}
OTHER = st.sampled_from([None, "x", "", -1, 1.5, True, [], [1, "a"], {}, {"a": None}, 10**30])
RETYPES = st.lists(st.tuples(st.integers(0, 3), st.floats(0, 1), OTHER), min_size=1, max_size=3)


def _paths(value, at=()):
    yield at
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield from _paths(v, (*at, k))


def retyped(value, retypes):
    """``value`` with values replaced: each retype is (the deepest level, which path, new value),
    level 0 being ``value`` itself."""
    for depth, where, new in retypes:
        paths = [p for p in _paths(value) if len(p) <= depth]
        *parents, last = paths[min(int(where * len(paths)), len(paths) - 1)] or (None,)
        if last is None:
            value = copy.deepcopy(new)
            continue
        inner = value
        for k in parents:
            inner = inner[k]
        inner[last] = copy.deepcopy(new)  # a value drawn twice is two values
    return value


@fuzz(24)
@given(kind=st.sampled_from(sorted(FILES)), pick=st.floats(0, 1), line=st.floats(0, 1), retypes=RETYPES)
def test_values_of_another_type_anywhere_in_a_run_never_stop_the_viewer(
    eval_run, train_run, collect_run, tmp_path, kind, pick, line, retypes
):
    """Valid JSON and YAML holding a value of another type at any depth of any file (another
    version, a hand edit): the page is built and every link resolves. Before, 21 of 1,500 random
    such runs raised (a metrics value plotted, ``strategies: 5``, ``rollout: 3``)."""
    run = tmp_path / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree({"eval": eval_run, "train": train_run, "collect": collect_run}[kind], run)
    f = run / FILES[kind][min(int(pick * len(FILES[kind])), len(FILES[kind]) - 1)]
    if f.suffix == ".yaml":
        f.write_text(yaml.safe_dump(retyped(yaml.safe_load(f.read_text()), retypes)))
    elif f.suffix == ".json":
        f.write_text(json.dumps(retyped(json.loads(f.read_text()), retypes)))
    else:
        lines = f.read_text().splitlines()
        n = min(int(line * len(lines)), len(lines) - 1)
        lines[n] = json.dumps(retyped(json.loads(lines[n]), retypes))
        f.write_text("\n".join(lines) + "\n")
    assert_links_resolve(build(run)[0])


def test_numbers_of_another_type_are_named_and_the_rest_is_shown(train_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(train_run, run)
    rows = (run / "metrics.jsonl").read_text().splitlines()
    row = json.loads(rows[1])
    (run / "metrics.jsonl").write_text("\n".join([rows[0], json.dumps({**row, "reward": [1]}), *rows[2:]]) + "\n")
    summary = json.loads((run / "summary.json").read_text())
    summary["after"]["tgc"], summary["wall_s"], summary["before"] = "x", {}, 5
    (run / "summary.json").write_text(json.dumps(summary))
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["rollout"], config["policy"] = 3, "x"
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    page, text = build(run)
    assert_links_resolve(page)
    text = unescape(text)
    assert f"{run / 'metrics.jsonl'} line 2 is not a metrics row (ValueError: 'reward' holds [1], not a" in text
    assert f'{run / "summary.json"}: wall_s = {{}}; before = 5; after.tgc = "x": not of the type written' in text
    assert len(page.trajs) == 2 * 2 * 2  # every chain is still shown


@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="needs Debian's chromium (apt-get install chromium)"
)
def test_the_page_renders_in_headless_chromium_and_links_open_parked_pages(eval_run, tmp_path):
    _, text = build(eval_run, page_size=3)
    html = tmp_path / "view.html"
    html.write_text(text)
    target = "a-same_scenario-g2-c0-k1"  # on the third page: parked in a <template> until needed
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,900"]
    dom = subprocess.run(
        [*base, "--dump-dom", f"file://{html}#{target}"], capture_output=True, text=True, timeout=120
    ).stdout
    page = Page(dom)
    assert page.opened == {target}  # found, its page taken out of the template, and opened
    assert page.templates == 2 * 2 - 1 and target not in page.parked
    png = tmp_path / "shot.png"
    subprocess.run([*base, f"--screenshot={png}", f"file://{html}"], capture_output=True, timeout=120)
    from PIL import Image

    gray = Image.open(png).convert("L")
    assert gray.size == (1200, 900) and len(set(gray.getdata())) > 20  # not a blank page
